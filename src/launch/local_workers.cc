// The local multi-process start.
#include "launch/local_workers.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/signals.h"

namespace tessera::launch {

int run_local_workers(int nproc, const std::function<int(int rank)>& worker) {
  std::vector<pid_t> pids;
  std::fflush(nullptr);
  for (int rank = 0; rank < nproc; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) {
      for (pid_t p : pids) kill(p, SIGTERM);
      log::error("cannot start worker {}: fork failed", rank);
      return kExitFailure;
    }
    if (pid == 0) {
      log::set_rank(rank);
      int rc = kExitFailure;
      try {
        rc = worker(rank);
      } catch (const Error& e) {
        log::error("{}", e.what());
        rc = e.exit_code();
      } catch (const std::exception& e) {
        log::error("unexpected error: {}", e.what());
      }
      std::fflush(nullptr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  // SIGTERM or SIGINT to this process is passed on to every worker still running (each finishes
  // its step, saves and exits 0).
  std::mutex mu;
  std::vector<bool> exited(nproc, false);
  const StopSignals forward([&](int signo) {
    std::lock_guard<std::mutex> lock(mu);
    log::warn("signal {}: passing it to the workers", signo);
    for (int r = 0; r < nproc; ++r) {
      if (!exited[r]) kill(pids[r], signo);
    }
  });
  int first_failure = 0, alive = nproc;
  while (alive > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) break;
    --alive;
    const int rank = static_cast<int>(std::find(pids.begin(), pids.end(), pid) - pids.begin());
    std::lock_guard<std::mutex> lock(mu);
    if (rank < nproc) exited[rank] = true;
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (rc != 0 && first_failure == 0) {
      first_failure = rc;
      // The others are killed outright: a graceful stop would wait on collectives with the lost rank.
      log::error("worker {} (pid {}) failed with {} {}; stopping the others", rank, pid,
                 WIFEXITED(status) ? "exit code" : "signal", WIFEXITED(status) ? rc : WTERMSIG(status));
      for (int r = 0; r < nproc; ++r) {
        if (!exited[r]) kill(pids[r], SIGKILL);
      }
    }
  }
  return first_failure;
}

}  // namespace tessera::launch
