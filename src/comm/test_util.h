// Helpers for the comm tests: temporary directories and ranks in forked processes.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/threads.h"

namespace tessera::comm::test_util {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/tessera_comm_test_XXXXXX";
    char* p = ::mkdtemp(tmpl);
    if (p == nullptr) std::abort();
    path = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Inside a child: report and return a nonzero status instead of asserting (gtest must never
// run in a child).
#define REQUIRE(cond)                                                                    \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "[rank %d] REQUIRE(%s) failed at line %d\n", rank, #cond, __LINE__); \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

// Runs body(rank) in `world` forked processes and returns their exit statuses (128 + signal
// when killed). A child that outlives `limit_s` gets SIGALRM from itself and SIGKILL from here.
// Ranks run their kernels on one thread: OpenMP's threads do not survive fork, and a child forked
// after this process ran a parallel region hangs in its own next one (libgomp), as it did when a
// whole test binary ran in one process.
inline std::vector<int> run_ranks(int world, const std::function<int(int)>& body, int limit_s = 15) {
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) std::abort();
    if (pid == 0) {
      ::alarm(static_cast<unsigned>(limit_s));
      set_num_threads(1);
      int rc = 99;
      try {
        rc = body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] unexpected exception: %s\n", r, e.what());
        rc = 98;
      }
      std::fflush(nullptr);
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  std::vector<int> status(world, -1);
  auto deadline = Clock::now() + std::chrono::seconds(limit_s + 2);
  int left = world;
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (status[r] != -1) continue;
      int ws = 0;
      pid_t got = ::waitpid(pids[r], &ws, WNOHANG);
      if (got == pids[r]) {
        status[r] = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
        --left;
      }
    }
    if (left > 0 && Clock::now() > deadline) {
      for (int r = 0; r < world; ++r)
        if (status[r] == -1) ::kill(pids[r], SIGKILL);
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return status;
}

inline void expect_all_ok(const std::vector<int>& status) {
  for (size_t r = 0; r < status.size(); ++r) EXPECT_EQ(status[r], 0) << "rank " << r;
}

}  // namespace tessera::comm::test_util
