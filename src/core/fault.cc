// Fault injection: parses TESSERA_FAULT once.
#include "core/fault.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/log.h"

namespace tessera::fault {
namespace {

struct Spec {
  bool active = false;
  int rank = -1;      // -1: any
  int64_t step = -1;  // -1: any
  std::string phase;
  Kind kind = Kind::kNone;
  std::string kind_name;
};

Spec parse() {
  Spec s;
  const char* env = std::getenv("TESSERA_FAULT");
  if (env == nullptr || *env == '\0') return s;
  const char* restarts = std::getenv("TESSERA_RESTART_COUNT");
  const char* always = std::getenv("TESSERA_FAULT_ALWAYS");
  const bool first_attempt = restarts == nullptr || std::string(restarts) == "0";
  if (!first_attempt && !(always != nullptr && std::string(always) == "1")) return s;
  std::string parts[4];
  int n = 0;
  for (const char* p = env; *p != '\0'; ++p) {
    if (*p == ':' && n < 3) {
      ++n;
    } else {
      parts[n] += *p;
    }
  }
  static const std::pair<const char*, Kind> kKinds[] = {
      {"kill", Kind::kKill}, {"exit", Kind::kExit}, {"hang", Kind::kHang}, {"slow", Kind::kSlow}, {"io", Kind::kIo}};
  for (const auto& [name, kind] : kKinds) {
    if (parts[3] == name) s.kind = kind;
  }
  if (n != 3 || s.kind == Kind::kNone || parts[2].empty()) {
    std::fprintf(stderr, "TESSERA_FAULT=%s: expected RANK:STEP:PHASE:KIND (kind kill, exit, hang, slow or io)\n", env);
    std::exit(2);
  }
  s.rank = parts[0] == "*" ? -1 : std::atoi(parts[0].c_str());
  s.step = parts[1] == "*" ? -1 : std::atoll(parts[1].c_str());
  s.phase = parts[2];
  s.kind_name = parts[3];
  s.active = true;
  return s;
}

}  // namespace

Kind point(const char* phase, int rank, int64_t step) {
  static const Spec spec = parse();
  if (!spec.active || spec.phase != phase || (spec.rank >= 0 && spec.rank != rank) ||
      (spec.step >= 0 && spec.step != step)) {
    return Kind::kNone;
  }
  log::warn("fault injection: {} at {} (rank {}, step {})", spec.kind_name, phase, rank, step);
  switch (spec.kind) {
    case Kind::kKill:
      std::fflush(nullptr);
      ::kill(::getpid(), SIGKILL);
      break;
    case Kind::kExit:
      std::fflush(nullptr);
      ::_exit(1);
    case Kind::kHang:
      for (;;) ::pause();
    case Kind::kSlow:
      ::sleep(2);
      return Kind::kNone;
    case Kind::kIo:
      return Kind::kIo;
    case Kind::kNone:
      break;
  }
  return Kind::kNone;
}

}  // namespace tessera::fault
