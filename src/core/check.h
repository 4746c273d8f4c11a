// CHECK (always on) and DCHECK (debug only): broken invariants abort with file and line.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace tessera::detail {
[[noreturn]] inline void check_failed(const char* expr, const char* file, int line, const char* msg) {
  std::fprintf(stderr, "CHECK failed: %s at %s:%d%s%s\n", expr, file, line, msg[0] ? ": " : "", msg);
  std::fflush(stderr);
  std::abort();
}
}  // namespace tessera::detail

#define CHECK_MSG(cond, msg) \
  ((cond) ? (void)0 : ::tessera::detail::check_failed(#cond, __FILE__, __LINE__, msg))
#define CHECK(cond) CHECK_MSG(cond, "")

#ifdef NDEBUG
#define DCHECK(cond) ((void)0)
#else
#define DCHECK(cond) CHECK(cond)
#endif
