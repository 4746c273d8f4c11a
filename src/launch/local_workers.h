// The local multi-process start: N forked workers on this machine.
#pragma once

#include <functional>

namespace tessera::launch {

// Forks `nproc` workers that each call worker(rank) and exit with its return value (or the exit
// code of the tessera::Error it throws); waits for all. When one fails, the others are killed
// (SIGKILL). SIGTERM and SIGINT to the caller are passed on to the workers. Returns the first
// failure's exit code (by time), or 0.
int run_local_workers(int nproc, const std::function<int(int rank)>& worker);

}  // namespace tessera::launch
