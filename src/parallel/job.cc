// Joining a job: the mesh, the checkpoint writer's store and the agreed attempt.
#include "parallel/job.h"

#include "comm/job_auth.h"
#include "config/config.h"
#include "core/check.h"

namespace tessera::parallel {

comm::HostTransport host_transport(const config::Config& config) {
  switch (config.parallel.host_transport) {
    case config::HostTransport::kTcp:
      return comm::HostTransport::kTcp;
    case config::HostTransport::kShm:
      return comm::HostTransport::kShm;
    case config::HostTransport::kAuto:
      break;
  }
  return comm::HostTransport::kAuto;
}

Job::Job(const JobAddress& address, const ParallelDims& dims, comm::Millis timeout, int nccl_device)
    : ranks_per_node_(address.ranks_per_node) {
  CHECK_MSG(dims.world() == address.world, "the layout's world size must be the job's");
  if (dims.world() == 1) {
    mesh_ = std::make_unique<Mesh>();
    return;
  }
  // A URL (file://DIR, etcd://HOST:PORT/PREFIX, tcp://HOST:PORT) or a plain directory for the file store.
  auto store = [&](const std::string& name) {
    const std::string round = address.round + "." + name;
    return address.store.find("://") != std::string::npos
               ? comm::make_store(address.store, address.token, round, timeout)
               : comm::make_file_store(address.store, address.token, round);
  };
  mesh_ = std::make_unique<Mesh>(dims, address.rank, store, timeout, address.host, nccl_device, address.transport);
  attempt_ = comm::broadcast_string(*mesh_->group(Dim::kWorld), address.rank == 0 ? comm::auth::random_hex(8) : "",
                                    0, {timeout});
  checkpoint_store_ = store("checkpoint");
  tier_store_ = store("tier");
}

Job::~Job() = default;

}  // namespace tessera::parallel
