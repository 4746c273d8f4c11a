// Leveled logging to stderr with an optional rank prefix.
#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace tessera::log {
namespace {
std::atomic<Level> g_level{Level::kInfo};
std::atomic<int> g_rank{-1};
std::mutex g_mutex;
}  // namespace

void set_level(Level l) { g_level = l; }
Level level() { return g_level; }
void set_rank(int rank) { g_rank = rank; }

bool parse_level(std::string_view name, Level* out) {
  static constexpr std::pair<std::string_view, Level> kNames[] = {
      {"debug", Level::kDebug}, {"info", Level::kInfo}, {"warn", Level::kWarn}, {"error", Level::kError}};
  for (const auto& [n, l] : kNames) {
    if (n == name) {
      *out = l;
      return true;
    }
  }
  return false;
}

void write(Level l, std::string_view message) {
  static constexpr const char* kTags[] = {"debug", "info", "warn", "error"};
  const int rank = g_rank;
  std::lock_guard lock(g_mutex);
  if (rank >= 0) {
    std::fprintf(stderr, "[rank %d] %s: %.*s\n", rank, kTags[static_cast<int>(l)], static_cast<int>(message.size()),
                 message.data());
  } else {
    std::fprintf(stderr, "%s: %.*s\n", kTags[static_cast<int>(l)], static_cast<int>(message.size()), message.data());
  }
}

}  // namespace tessera::log
