// The device mesh: process groups per parallel dimension.
#include "parallel/mesh.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <set>

#if TESSERA_HAS_NCCL
#include "comm/nccl_group.h"
#endif

namespace tessera::parallel {

namespace {

std::unique_ptr<comm::ProcessGroup> make_nccl(comm::Store& store, int rank, int size, int device, comm::Millis timeout,
                                              std::string* version) {
#if TESSERA_HAS_NCCL
  *version = comm::nccl_version();
  return comm::make_nccl_group(store, rank, size, device, timeout);
#else
  (void)store, (void)rank, (void)size, (void)device, (void)timeout, (void)version;
  throw comm::CollectiveError("NCCL process groups need a build with CUDA (TESSERA_CUDA on)");
#endif
}

}  // namespace

Mesh::Mesh(const ParallelDims& dims, int rank, const StoreFactory& make_store, comm::Millis timeout,
           const std::string& host, int nccl_device, comm::HostTransport transport)
    : dims_(dims), rank_(rank) {
  dims_.validate(dims.world());
  // Groups already made, by their ranks: the host group and its device twin.
  std::map<std::vector<int>, std::pair<comm::ProcessGroup*, comm::ProcessGroup*>> by_ranks;
  for (const Dim d : kAllDims) {
    if (size(d) == 1) continue;
    const std::vector<int> members = ranks(d);
    auto it = by_ranks.find(members);
    if (it == by_ranks.end()) {
      const std::string prefix = fmt::format("{}-{}", name(d), members.front());
      stores_.push_back(make_store(prefix));
      owned_.push_back(comm::make_host_group(*stores_.back(), this->rank(d), size(d), host, timeout, transport));
      comm::ProcessGroup* host_group = owned_.back().get();
      if (nccl_device >= 0) {
        stores_.push_back(make_store(prefix + ".nccl"));
        owned_.push_back(make_nccl(*stores_.back(), this->rank(d), size(d), nccl_device, timeout, &device_transport_));
      }
      it = by_ranks.emplace(members, std::pair{host_group, owned_.back().get()}).first;
    }
    groups_[static_cast<size_t>(d)] = it->second.first;
    device_groups_[static_cast<size_t>(d)] = it->second.second;
  }
}

Mesh::~Mesh() = default;

std::string Mesh::host_transport() const {
  std::vector<std::string> parts;
  std::set<const comm::ProcessGroup*> seen;
  for (const Dim d : kAllDims) {
    const comm::ProcessGroup* g = group(d);
    if (g != nullptr && seen.insert(g).second) parts.push_back(fmt::format("{}: {}", name(d), g->transport()));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

const Mesh& Mesh::single() {
  static const Mesh mesh;
  return mesh;
}

std::vector<std::string> describe_layout(const ParallelDims& dims) {
  std::vector<std::string> lines;
  for (const Dim d : kAllDims) {
    if (dims.size(d) == 1) continue;
    std::set<std::vector<int>> groups;
    for (int r = 0; r < dims.world(); ++r) groups.insert(group_ranks(dims, r, d));
    std::string text =
        fmt::format("{} ({} group{} of {}):", name(d), groups.size(), groups.size() == 1 ? "" : "s", dims.size(d));
    for (const std::vector<int>& g : groups) text += fmt::format(" [{}]", fmt::join(g, " "));
    lines.push_back(text);
  }
  return lines;
}

}  // namespace tessera::parallel
