// Joining a job: where a rank finds its job (the rendezvous store, the job's token and round),
// the mesh of process groups it builds there, and the view of both that every rank-aware
// component takes (Distributed). How the processes were started (a launcher's environment
// variables, fork) is the launch layer's business, not this one's.
#pragma once

#include <memory>
#include <string>

#include "comm/process_group.h"
#include "comm/store.h"
#include "parallel/mesh.h"

namespace tessera::config {
struct Config;
}

namespace tessera::parallel {

// The config's parallel.host_transport, as the comm layer names it.
comm::HostTransport host_transport(const config::Config& config);

// Where rank `rank` of `world` finds its job.
struct JobAddress {
  std::string store;  // a store URL (file://DIR, etcd://HOST:PORT/PREFIX, tcp://HOST:PORT) or a directory
  std::string token;  // the job token every rank of the job holds
  std::string round = "0";  // the rendezvous round the job's keys live under
  int rank = 0, world = 1;
  std::string host = "127.0.0.1";  // this node's address for collectives
  comm::HostTransport transport = comm::HostTransport::kAuto;  // how host collectives travel (Mesh)
  // Ranks per node, nodes holding contiguous ranks (node k: [k x n, (k + 1) x n)); 0: unknown,
  // taken as one node. The object-store checkpoint tier gathers each node's shards in one object.
  int ranks_per_node = 0;
};

// A rank's place in its job: the mesh (its coordinate, size and process group in each parallel
// dimension), the store the checkpoint writer agrees through, and the attempt. The default is a
// single process: the world-1 mesh, no store.
struct Distributed {
  const Mesh* mesh = &Mesh::single();
  comm::Store* store = nullptr;  // for agreement off the training thread (checkpoint commits)
  // The same for the object-store uploaders (a connection of their own), and the count of the bytes
  // they move, which the ranks awaiting them read (checkpoint/storage_progress.h).
  comm::Store* tier_store = nullptr;
  // This start of the job (random, agreed by all ranks at start-up): scopes the checkpoint commit
  // keys and fences the run directory, so that an earlier attempt's keys or processes (a Slurm
  // requeue or a torchrun restart reuses the store round) can neither commit nor delete.
  std::string attempt;
  int ranks_per_node = 0;  // JobAddress::ranks_per_node

  // The whole job: global rank, world size, the group of all ranks (null in a single process).
  int rank() const { return mesh->rank(); }
  int world_size() const { return mesh->size(); }
  comm::ProcessGroup* world() const { return mesh->group(Dim::kWorld); }
};

// The groups and stores of one rank's membership in a job, held for the job's lifetime.
class Job {
 public:
  // Joins the job at `address`, laid out as `dims` (dims.world() == address.world): one key
  // prefix per group (Mesh), a store for the checkpoint writer, and the attempt that rank 0 draws.
  // A world of 1 joins nothing. nccl_device >= 0: a GPU job, this rank on that CUDA device (the
  // mesh's device groups on NCCL). Throws StoreError or CollectiveError when a peer never comes.
  Job(const JobAddress& address, const ParallelDims& dims, comm::Millis timeout, int nccl_device = -1);
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  Distributed view() const {
    return {mesh_.get(), checkpoint_store_.get(), tier_store_.get(), attempt_, ranks_per_node_};
  }

 private:
  std::unique_ptr<Mesh> mesh_;
  std::unique_ptr<comm::Store> checkpoint_store_;  // used by the checkpoint writer thread only
  std::unique_ptr<comm::Store> tier_store_;        // the uploaders' (Distributed::tier_store)
  std::string attempt_;                            // Distributed::attempt
  int ranks_per_node_ = 0;
};

}  // namespace tessera::parallel
