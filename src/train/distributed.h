// Joining a data-parallel job: the rendezvous store and the process groups a rank needs (all
// ranks; its shard group; its replica group), and the local launcher that `tessera train
// --nproc N` uses: N forked workers on this machine, rendezvous through a file store.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/process_group.h"
#include "train/trainer.h"

namespace tessera::train {

class ProcessGroups {
 public:
  // Rank `rank` of `world` joins round `round` of job `token` through the file store in
  // store_dir. Shard group k is ranks [k S, (k+1) S); replica group j is ranks j, j+S, ...
  ProcessGroups(const std::string& store_dir, const std::string& token, const std::string& round, int rank,
                int world, int shard_size, dist::Millis timeout);
  ~ProcessGroups();
  Distributed view() const;

 private:
  fsdp::Topology topology_;
  std::vector<std::unique_ptr<dist::Store>> stores_;  // one key prefix per group
  std::unique_ptr<dist::ProcessGroup> world_, shard_, replica_;
  std::unique_ptr<dist::Store> checkpoint_store_;  // used by the checkpoint writer thread only
};

// Shard group size a config asks for at `world` ranks.
int shard_size_of(const config::Config& config, int world);

// Forks `nproc` workers that each call worker(rank) and exit with its return value (or the exit
// code of the tessera::Error it throws); waits for all. When one fails, the others are killed
// (SIGKILL). SIGTERM and SIGINT to the caller are passed on to the workers. Returns the first
// failure's exit code (by time), or 0.
int run_local_workers(int nproc, const std::function<int(int rank)>& worker);

}  // namespace tessera::train
