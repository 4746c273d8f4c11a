// Reading a launched worker's environment.
#include "launch/worker_env.h"

#include <fmt/format.h>

#include <cstdlib>

#include "comm/store.h"
#include "core/error.h"

namespace tessera::launch {

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
  parallel::JobAddress& job = e.job;
  job.world = env_int(world_var, 1, 1 << 20);
  job.rank = env_int(rank_var, 0, job.world - 1);
  e.local_rank = std::getenv(local_var) != nullptr ? env_int(local_var, 0, job.world - 1) : 0;
  for (const char* v : {"TESSERA_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE"}) {
    if (std::getenv(v) != nullptr && job.ranks_per_node == 0) job.ranks_per_node = env_int(v, 1, job.world);
  }
  e.restart_count = std::getenv("TESSERA_RESTART_COUNT") != nullptr ? env_int("TESSERA_RESTART_COUNT", 0, 1 << 20) : 0;
  // torchrun-style without TESSERA_RDZV: rank 0 serves a TCP store at MASTER_ADDR:MASTER_PORT.
  job.store = env_or("TESSERA_RDZV", std::getenv("MASTER_ADDR") == nullptr
                                          ? ""
                                          : "tcp://" + env_or("MASTER_ADDR", "") + ":" +
                                                std::to_string(env_int("MASTER_PORT", 1, 65535)));
  comm::parse_store_url(job.store);  // ConfigError naming the URL
  job.token = env_or("TESSERA_JOB_TOKEN", "");
  if (job.token.empty())
    throw ConfigError("environment variable TESSERA_JOB_TOKEN is not set: every rank of a job needs the job's token");
  job.round = env_or("TESSERA_ROUND", env_or("SLURM_JOB_ID", "0") + "." + std::to_string(e.restart_count));
  e.heartbeat = env_or("TESSERA_HEARTBEAT", "");
  job.host = env_or("TESSERA_HOST", "127.0.0.1");
  *out = e;
  return true;
}

}  // namespace tessera::launch
