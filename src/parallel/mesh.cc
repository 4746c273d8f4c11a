// The device mesh: process groups per parallel dimension.
#include "parallel/mesh.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <set>

namespace tessera::parallel {

Mesh::Mesh(const ParallelDims& dims, int rank, const StoreFactory& make_store, comm::Millis timeout,
           const std::string& host)
    : dims_(dims), rank_(rank) {
  dims_.validate(dims.world());
  std::map<std::vector<int>, comm::ProcessGroup*> by_ranks;  // groups already made, by their ranks
  for (const Dim d : kAllDims) {
    if (size(d) == 1) continue;
    const std::vector<int> members = ranks(d);
    auto it = by_ranks.find(members);
    if (it == by_ranks.end()) {
      stores_.push_back(make_store(fmt::format("{}-{}", name(d), members.front())));
      owned_.push_back(comm::make_gloo_group(*stores_.back(), this->rank(d), size(d), host, timeout));
      it = by_ranks.emplace(members, owned_.back().get()).first;
    }
    groups_[static_cast<size_t>(d)] = it->second;
  }
}

Mesh::~Mesh() = default;

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
