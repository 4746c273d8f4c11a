// Joining a job: the rendezvous store and the mesh of process groups a rank needs, and the local launcher that `tessera
// train
// --nproc N` uses: N forked workers on this machine, rendezvous through a file store.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "train/trainer.h"

namespace tessera::train {

class ProcessGroups {
 public:
  // Rank `rank` of a job laid out as `dims` joins round `round` of job `token` through the store
  // `store_dir` names: a store URL (file://DIR, etcd://HOST:PORT/PREFIX) or a directory for a
  // file store; one key prefix per group (parallel::Mesh).
  ProcessGroups(const std::string& store_dir, const std::string& token, const std::string& round, int rank,
                const parallel::ParallelDims& dims, comm::Millis timeout, const std::string& host = "127.0.0.1");
  ~ProcessGroups();
  Distributed view() const;

 private:
  std::unique_ptr<parallel::Mesh> mesh_;
  std::unique_ptr<comm::Store> checkpoint_store_;  // used by the checkpoint writer thread only
  std::string attempt_;                            // Distributed::attempt
};

// A worker of a job started by something else: `tessera launch` (TESSERA_RANK, TESSERA_WORLD_SIZE,
// TESSERA_LOCAL_RANK, TESSERA_RDZV, TESSERA_JOB_TOKEN, TESSERA_ROUND, TESSERA_RESTART_COUNT,
// TESSERA_HEARTBEAT, TESSERA_HOST), Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, with
// TESSERA_RDZV naming a store all ranks see) or torchrun-style variables (RANK, WORLD_SIZE,
// LOCAL_RANK, and MASTER_ADDR/MASTER_PORT, where rank 0 then serves a TCP store, or
// TESSERA_RDZV); all need TESSERA_JOB_TOKEN.
struct WorkerEnv {
  int rank = 0, local_rank = 0, world = 1, restart_count = 0;
  std::string rdzv;  // the store: file://DIR, etcd://HOST:PORT/PREFIX or tcp://HOST:PORT
  std::string job_token;
  std::string round = "0";         // the rendezvous round the worker's keys live under
  std::string heartbeat;           // a file the worker rewrites after every step ("" for none)
  std::string host = "127.0.0.1";  // this node's address for collectives
};
// Reads the worker environment; false when this process is not such a worker. Throws
// ConfigError naming the variable that is missing or malformed.
bool worker_env(WorkerEnv* out);

// Forks `nproc` workers that each call worker(rank) and exit with its return value (or the exit
// code of the tessera::Error it throws); waits for all. When one fails, the others are killed
// (SIGKILL). SIGTERM and SIGINT to the caller are passed on to the workers. Returns the first
// failure's exit code (by time), or 0.
int run_local_workers(int nproc, const std::function<int(int rank)>& worker);

}  // namespace tessera::train
