// Joining a data-parallel job, and the local launcher.
#include "train/distributed.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "comm/job_auth.h"
#include "core/error.h"
#include "core/log.h"
#include "core/signals.h"

namespace tessera::train {

ProcessGroups::ProcessGroups(const std::string& store_dir, const std::string& token, const std::string& round, int rank,
                             const parallel::ParallelDims& dims, comm::Millis timeout, const std::string& host) {
  if (dims.world() == 1) {
    mesh_ = std::make_unique<parallel::Mesh>();
    return;
  }
  // A URL (file://DIR, etcd://HOST:PORT/PREFIX) or a plain directory for the file store.
  auto store = [&](const std::string& name) {
    return store_dir.find("://") != std::string::npos ? comm::make_store(store_dir, token, round + "." + name, timeout)
                                                      : comm::make_file_store(store_dir, token, round + "." + name);
  };
  mesh_ = std::make_unique<parallel::Mesh>(dims, rank, store, timeout, host);
  attempt_ = comm::broadcast_string(*mesh_->group(parallel::Dim::kWorld), rank == 0 ? comm::auth::random_hex(8) : "", 0,
                                    {timeout});
  checkpoint_store_ = store("checkpoint");
}

ProcessGroups::~ProcessGroups() = default;

Distributed ProcessGroups::view() const { return {mesh_.get(), checkpoint_store_.get(), attempt_}; }

namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

int env_int(const char* name, int min, int max) {
  const std::string text = env_or(name, "");
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < min || v > max) {
    throw ConfigError(
        fmt::format("environment variable {}=\"{}\": expected an integer in [{}, {}]", name, text, min, max));
  }
  return static_cast<int>(v);
}

}  // namespace

bool worker_env(WorkerEnv* out) {
  const char *rank_var, *world_var, *local_var;
  if (std::getenv("TESSERA_RANK") != nullptr) {
    rank_var = "TESSERA_RANK", world_var = "TESSERA_WORLD_SIZE", local_var = "TESSERA_LOCAL_RANK";
  } else if (std::getenv("SLURM_PROCID") != nullptr && std::getenv("TESSERA_RDZV") != nullptr) {
    rank_var = "SLURM_PROCID", world_var = "SLURM_NTASKS", local_var = "SLURM_LOCALID";
  } else if (std::getenv("RANK") != nullptr &&
             (std::getenv("TESSERA_RDZV") != nullptr || std::getenv("MASTER_ADDR") != nullptr)) {
    rank_var = "RANK", world_var = "WORLD_SIZE", local_var = "LOCAL_RANK";
  } else {
    return false;
  }
  WorkerEnv e;
  e.world = env_int(world_var, 1, 1 << 20);
  e.rank = env_int(rank_var, 0, e.world - 1);
  e.local_rank = std::getenv(local_var) != nullptr ? env_int(local_var, 0, e.world - 1) : 0;
  e.restart_count = std::getenv("TESSERA_RESTART_COUNT") != nullptr ? env_int("TESSERA_RESTART_COUNT", 0, 1 << 20) : 0;
  // torchrun-style without TESSERA_RDZV: rank 0 serves a TCP store at MASTER_ADDR:MASTER_PORT.
  e.rdzv = env_or("TESSERA_RDZV",
                  std::getenv("MASTER_ADDR") == nullptr
                      ? ""
                      : "tcp://" + env_or("MASTER_ADDR", "") + ":" + std::to_string(env_int("MASTER_PORT", 1, 65535)));
  comm::parse_store_url(e.rdzv);  // ConfigError naming the URL
  e.job_token = env_or("TESSERA_JOB_TOKEN", "");
  if (e.job_token.empty())
    throw ConfigError("environment variable TESSERA_JOB_TOKEN is not set: every rank of a job needs the job's token");
  e.round = env_or("TESSERA_ROUND", env_or("SLURM_JOB_ID", "0") + "." + std::to_string(e.restart_count));
  e.heartbeat = env_or("TESSERA_HEARTBEAT", "");
  e.host = env_or("TESSERA_HOST", "127.0.0.1");
  *out = e;
  return true;
}

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

}  // namespace tessera::train
