// Leveled logging to stderr and a log file, with an optional rank prefix and a progress line.
#include "core/log.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "core/timer.h"

namespace tessera::log {
namespace {
std::atomic<Level> g_level{Level::kInfo};
std::atomic<Level> g_console_level{Level::kDebug};
std::atomic<bool> g_progress_shown{false};
std::mutex g_mutex;  // guards the below and the output streams
std::FILE* g_file = nullptr;
std::string g_prefix;    // "[rank R ...]", empty without a rank
std::string g_progress;  // the progress line shown on stdout, if any

constexpr const char* kClearLine = "\r\033[K";
}  // namespace

void set_level(Level l) { g_level = l; }
Level level() { return g_level; }
void set_console_level(Level l) { g_console_level = l; }
void set_rank(int rank, std::string_view where) {
  std::lock_guard lock(g_mutex);
  g_prefix = rank < 0 ? std::string() : fmt::format("[rank {}{}{}]", rank, where.empty() ? "" : " ", where);
}
bool progress_active() { return g_progress_shown; }

namespace {
constexpr std::pair<const char*, Level> kLevelNames[] = {
    {"debug", Level::kDebug}, {"info", Level::kInfo}, {"warn", Level::kWarn}, {"error", Level::kError}};
}  // namespace

bool parse_level(std::string_view name, Level* out) {
  for (const auto& [n, l] : kLevelNames) {
    if (n == name) {
      *out = l;
      return true;
    }
  }
  return false;
}

const char* level_name(Level level) {
  for (const auto& [n, l] : kLevelNames) {
    if (l == level) return n;
  }
  return "?";
}

bool open_file(const std::string& path) {
  std::FILE* f = path.empty() ? nullptr : std::fopen(path.c_str(), "a");
  const int err = errno;
  {
    std::lock_guard lock(g_mutex);
    if (g_file != nullptr) std::fclose(g_file);
    g_file = f;
  }
  if (!path.empty() && f == nullptr) warn("cannot write the log file {}: {}", path, std::strerror(err));
  return path.empty() || f != nullptr;
}

void progress(std::string_view line) {
  std::lock_guard lock(g_mutex);
  if (line.empty()) {
    if (!g_progress.empty()) std::fputs("\n", stdout);
    g_progress.clear();
  } else {
    g_progress = line;
    std::fprintf(stdout, "%s%s", kClearLine, g_progress.c_str());
  }
  std::fflush(stdout);
  g_progress_shown = !g_progress.empty();
}

void write(Level l, std::string_view message, bool console) {
  static constexpr const char* kTags[] = {"debug", "info", "warn", "error"};
  const char* tag = kTags[static_cast<int>(l)];
  std::lock_guard lock(g_mutex);
  if (console && l >= g_console_level) {
    // The log line goes above the progress line: clear it, log, redraw it.
    if (!g_progress.empty()) std::fputs(kClearLine, stdout);
    std::fflush(stdout);
    std::fprintf(stderr, "%s%s%s: %.*s\n", g_prefix.c_str(), g_prefix.empty() ? "" : " ", tag,
                 static_cast<int>(message.size()), message.data());
    if (!g_progress.empty()) {
      std::fputs(g_progress.c_str(), stdout);
      std::fflush(stdout);
    }
  }
  if (g_file != nullptr) {
    std::fprintf(g_file, "%s %s %s: %.*s\n", utc_now().c_str(), g_prefix.empty() ? "[rank 0]" : g_prefix.c_str(), tag,
                 static_cast<int>(message.size()), message.data());
    std::fflush(g_file);
  }
}

}  // namespace tessera::log
