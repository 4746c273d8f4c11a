// Fault injection: parses TESSERA_FAULT once.
#include "core/fault.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "core/log.h"

namespace tessera::fault {
namespace {

// Kinds that only make sense where a caller acts on them name their phases; the others may
// stand anywhere a point is.
struct KindInfo {
  const char* name;
  Kind kind;
  const char* only_phase;  // nullptr: any phase
};
constexpr KindInfo kKinds[] = {
    {"kill", Kind::kKill, nullptr},  {"exit", Kind::kExit, nullptr}, {"hang", Kind::kHang, nullptr},
    {"slow", Kind::kSlow, nullptr},  {"io", Kind::kIo, nullptr},     {"nan", Kind::kNan, "backward"},
    {"fail", Kind::kFail, "health"}, {"gpu", Kind::kGpu, "health"},  {"allreduce", Kind::kAllReduce, "health"}};
constexpr const char* kPhases[] = {"health",
                                   "forward",
                                   "backward",
                                   "optimizer",
                                   "checkpoint.shard",
                                   "checkpoint.manifest",
                                   "checkpoint.commit",
                                   "checkpoint.upload",
                                   "checkpoint.load",
                                   "shm.attach"};

bool parse_int(const std::string& s, int64_t* out) {
  if (s.empty() || s.size() > 18) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

Spec from_environment() {
  Spec s;
  const char* env = std::getenv("TESSERA_FAULT");
  if (env == nullptr || *env == '\0') return s;
  const char* restarts = std::getenv("TESSERA_RESTART_COUNT");
  const char* always = std::getenv("TESSERA_FAULT_ALWAYS");
  const bool first_attempt = restarts == nullptr || std::string(restarts) == "0";
  if (!first_attempt && !(always != nullptr && std::string(always) == "1")) return s;
  std::string error;
  if (!parse(env, &s, &error)) {
    std::fprintf(stderr, "TESSERA_FAULT=%s: %s\n", env, error.c_str());
    std::exit(2);
  }
  return s;
}

}  // namespace

bool parse(const std::string& text, Spec* spec, std::string* error) {
  std::string parts[4];
  int n = 0;
  for (char c : text) {
    if (c == ':' && n < 3) {
      ++n;
    } else {
      parts[n] += c;
    }
  }
  Spec s;
  if (n != 3) {
    *error = "expected RANK:STEP:PHASE:KIND";
    return false;
  }
  int64_t v = 0;
  if (parts[0] != "*") {
    if (!parse_int(parts[0], &v) || v > 1 << 20) {
      *error = "RANK '" + parts[0] + "' is not a rank number or *";
      return false;
    }
    s.rank = static_cast<int>(v);
  }
  if (parts[1] != "*") {
    if (!parse_int(parts[1], &v)) {
      *error = "STEP '" + parts[1] + "' is not a step number or *";
      return false;
    }
    s.step = v;
  }
  bool known_phase = false;
  for (const char* p : kPhases) known_phase = known_phase || parts[2] == p;
  if (!known_phase) {
    *error = "PHASE '" + parts[2] + "' is not one of ";
    for (const char* p : kPhases) *error += std::string(p) + (p == kPhases[std::size(kPhases) - 1] ? "" : ", ");
    return false;
  }
  s.phase = parts[2];
  for (const KindInfo& k : kKinds) {
    if (parts[3] != k.name) continue;
    if (k.only_phase != nullptr && s.phase != k.only_phase) {
      *error = "KIND " + parts[3] + " acts at phase " + k.only_phase + " only, not at " + s.phase;
      return false;
    }
    s.kind = k.kind;
  }
  if (s.kind == Kind::kNone) {
    *error = "KIND '" + parts[3] + "' is not one of kill, exit, hang, slow, io, nan, fail";
    return false;
  }
  s.kind_name = parts[3];
  s.active = true;
  *spec = std::move(s);
  return true;
}

Kind point(const char* phase, int rank, int64_t step) {
  static const Spec spec = from_environment();
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
    case Kind::kNan:
    case Kind::kFail:
    case Kind::kGpu:
    case Kind::kAllReduce:
      return spec.kind;
    case Kind::kNone:
      break;
  }
  return Kind::kNone;
}

}  // namespace tessera::fault
