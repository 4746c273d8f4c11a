// Layer parallel: the parallel dimensions, the mesh of process groups over them, and joining a
// job. It must not know what is sharded or trained; every rank-aware layer above takes a Mesh.
//
// The device mesh: for each parallel dimension (parallel_dims.h), this rank's coordinate, the
// group's size and its process group, built once at start-up. Every rank-aware component takes
// the mesh and asks for the dimension it means: FSDP shards over dp_shard and all-reduces over
// dp_replicate, the trainer scales gradients and slices data by dp, and statistics of every
// process use world.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "parallel/parallel_dims.h"

namespace tessera::parallel {

class Mesh {
 public:
  // The store a group rendezvouses through, under its own key prefix (e.g. "dp_shard-4").
  using StoreFactory = std::function<std::unique_ptr<comm::Store>(const std::string& prefix)>;

  // A single process: every dimension of size 1, no groups.
  Mesh() = default;
  // Rank `rank` of a job laid out as `dims` joins one process group for each distinct set of
  // ranks its dimensions of size > 1 name (a dimension with the same ranks as another shares its
  // group: with dp_replicate = 1, dp_shard's group is dp's). Every rank creates its groups in
  // the same order (kAllDims), each through make_store(NAME-FIRST_RANK): for host memory, Gloo
  // over `host`, its collectives through shared memory as `transport` allows
  // (comm::make_host_group). With nccl_device >= 0 (a GPU job: every rank computes on its CUDA device) each
  // group also gets an NCCL twin on that device, through make_store(NAME-FIRST_RANK.nccl), for
  // tensors in device memory (device_group). Throws CollectiveError when NCCL is not built.
  Mesh(const ParallelDims& dims, int rank, const StoreFactory& make_store, comm::Millis timeout,
       const std::string& host = "127.0.0.1", int nccl_device = -1,
       comm::HostTransport transport = comm::HostTransport::kAuto);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  // A world-1 mesh, shared: what components default to outside a distributed job.
  static const Mesh& single();

  const ParallelDims& dims() const { return dims_; }
  int rank(Dim d = Dim::kWorld) const { return coordinate(dims_, rank_, d); }
  int size(Dim d = Dim::kWorld) const { return dims_.size(d); }
  // The process group of this rank's group in d, for host memory; nullptr when size(d) == 1.
  comm::ProcessGroup* group(Dim d) const { return groups_[static_cast<size_t>(d)]; }
  // The same group for tensors in the compute backend's memory: NCCL in a GPU job, else group(d).
  comm::ProcessGroup* device_group(Dim d) const { return device_groups_[static_cast<size_t>(d)]; }
  // What the device groups run on ("NCCL 2.27.3"); "" when they are the host groups.
  const std::string& device_transport() const { return device_transport_; }
  // What each host group's collectives travel over, e.g. "dp_shard: shared memory"; "" in a
  // single process.
  std::string host_transport() const;
  // The global ranks of this rank's group in d, by coordinate.
  std::vector<int> ranks(Dim d) const { return group_ranks(dims_, rank_, d); }

 private:
  ParallelDims dims_;
  int rank_ = 0;
  std::vector<std::unique_ptr<comm::Store>> stores_;
  std::vector<std::unique_ptr<comm::ProcessGroup>> owned_;
  std::vector<comm::ProcessGroup*> groups_ = std::vector<comm::ProcessGroup*>(std::size(kAllDims), nullptr);
  std::vector<comm::ProcessGroup*> device_groups_ = groups_;
  std::string device_transport_;
};

// Which ranks form each group of each dimension of size > 1, one line per dimension, e.g.
// "dp_shard (4 groups of 2): [0 1] [2 3] [4 5] [6 7]" (for `tessera config` and the start-up log).
std::vector<std::string> describe_layout(const ParallelDims& dims);

}  // namespace tessera::parallel
