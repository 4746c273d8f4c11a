// What a worker started by a launcher learns from its environment: where its job is and what the
// launcher asks of it.
#pragma once

#include <string>

#include "parallel/job.h"

namespace tessera::launch {

// A worker of a job started by something else: `tessera launch` (TESSERA_RANK, TESSERA_WORLD_SIZE,
// TESSERA_LOCAL_RANK, TESSERA_LOCAL_WORLD_SIZE, TESSERA_RDZV, TESSERA_JOB_TOKEN, TESSERA_ROUND, TESSERA_RESTART_COUNT,
// TESSERA_HEARTBEAT, TESSERA_HOST), Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, with
// TESSERA_RDZV naming a store all ranks see) or torchrun-style variables (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, and MASTER_ADDR/MASTER_PORT, where rank 0 then serves a TCP store, or
// TESSERA_RDZV); all need TESSERA_JOB_TOKEN.
struct WorkerEnv {
  parallel::JobAddress job;  // the store is a URL: file://DIR, etcd://HOST:PORT/PREFIX or tcp://HOST:PORT
  int local_rank = 0, restart_count = 0;
  std::string heartbeat;  // a file the worker rewrites after every step ("" for none)
};

// Reads the worker environment; false when this process is not such a worker. Throws
// ConfigError naming the variable that is missing or malformed.
bool worker_env(WorkerEnv* out);

}  // namespace tessera::launch
