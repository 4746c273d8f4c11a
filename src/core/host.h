// This machine's host name, as run.json, run locks, the launcher and GPU verdicts name it.
#pragma once

#include <unistd.h>

#include <string>

namespace tessera {
inline std::string host_name() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}
}  // namespace tessera
