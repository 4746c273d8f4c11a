// Monotonic wall-clock seconds, and the current UTC time as text.
#pragma once

#include <chrono>
#include <ctime>
#include <string>

namespace tessera {
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The current UTC time through strftime's `format` (default ISO 8601, e.g. 2026-11-30T09:41:09Z).
inline std::string utc_now(const char* format = "%Y-%m-%dT%H:%M:%SZ") {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[64];
  return std::string(text, std::strftime(text, sizeof(text), format, &tm));
}
}  // namespace tessera
