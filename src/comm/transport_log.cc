// NCCL's debug log, read for its choice of network and transports. The lines it writes (NCCL's
// src/debug.cc, src/init.cc, src/transport/*.cc), after "host:pid:tid [cudaDev] NCCL INFO ":
//   Using network IB
//   NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.0.1<0>
//   comm 0x5581 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0
//   Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
//   Channel 02/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA
//   Channel 02/0 : 0[0] -> 8[0] [send] via NET/IB/0(1)/GDRDMA(PCI)
//   Channel 00 : 0[0] -> 1[1] via SHM/direct
// and WARN lines as "host:pid:tid [dev] file.cc:123 NCCL WARN message".
#include "comm/transport_log.h"

#include <fmt/format.h>
#include <strings.h>

#include <algorithm>
#include <cstdlib>

#include "core/text.h"

namespace tessera::comm {

namespace {

bool set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0';
}

// Whether `line` holds `marker`; *rest is the text after it.
bool after(std::string_view line, std::string_view marker, std::string_view* rest) {
  const size_t at = line.find(marker);
  if (at == std::string_view::npos) return false;
  *rest = line.substr(at + marker.size());
  return true;
}

bool digit(char c) { return c >= '0' && c <= '9'; }

// "NET/IB/0(1)/GDRDMA(PCI)/Shared" -> "NET/IB/GDRDMA(PCI)/Shared"; "P2P/indirect/3[3]" ->
// "P2P/indirect": the device and proxy numbers differ per connection, the kind does not. (By hand:
// GCC 12 warns falsely inside std::regex at -O1, which the ASan build uses.)
std::string transport_kind(std::string_view via) {
  via = trim(via);
  std::string out;
  size_t i = 0;
  while (i < via.size()) {
    if (via[i] != '/' || i + 1 >= via.size() || !digit(via[i + 1])) {
      out += via[i++];
      continue;
    }
    size_t j = i + 1;  // "/N", then an optional "(N)" or "[N]"
    while (j < via.size() && digit(via[j])) ++j;
    if (j < via.size() && (via[j] == '(' || via[j] == '[')) {
      const char close = via[j] == '(' ? ')' : ']';
      size_t k = j + 1;
      while (k < via.size() && digit(via[k])) ++k;
      if (k > j + 1 && k < via.size() && via[k] == close) j = k + 1;
    }
    i = j;
  }
  return out;
}

}  // namespace

std::string capture_nccl_debug_log(const std::string& path, std::string* note) {
  auto say = [&](std::string text) {
    if (note != nullptr) *note = std::move(text);
    return std::string();
  };
  if (!set("NCCL_DEBUG")) {
    ::setenv("NCCL_DEBUG", "INFO", 1);
    if (!set("NCCL_DEBUG_SUBSYS")) ::setenv("NCCL_DEBUG_SUBSYS", "INIT,NET", 1);
  } else {
    // NCCL's levels, least verbose first: VERSION, WARN, INFO, ABORT, TRACE.
    const std::string level = std::getenv("NCCL_DEBUG");
    const bool info = strcasecmp(level.c_str(), "INFO") == 0 || strcasecmp(level.c_str(), "ABORT") == 0 ||
                      strcasecmp(level.c_str(), "TRACE") == 0;
    if (!info) return say(fmt::format("NCCL_DEBUG={} logs no transports", level));
  }
  if (!set("NCCL_DEBUG_FILE")) {
    ::setenv("NCCL_DEBUG_FILE", path.c_str(), 1);
    return path;
  }
  const std::string theirs = std::getenv("NCCL_DEBUG_FILE");
  if (theirs.find('%') != std::string::npos) return say(fmt::format("NCCL's log goes to NCCL_DEBUG_FILE={}", theirs));
  return theirs;
}

NcclTransports parse_nccl_log(std::string_view text) {
  NcclTransports t;
  std::map<std::string, std::string> devices;  // per network plugin that initialized
  while (!text.empty()) {
    const size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);

    std::string_view m;
    if (after(line, " NCCL WARN ", &m)) {
      t.warnings.emplace_back(trim(m));
      continue;
    }
    if (!after(line, " NCCL INFO ", &m)) continue;
    std::string_view rest;
    if (m.starts_with("Using network ")) {
      t.network = std::string(trim(m.substr(14)));
    } else if (m.starts_with("NET/") && after(m, " : Using", &rest)) {
      const std::string_view name = m.substr(4, m.find(" : Using") - 4);  // may hold spaces
      devices[std::string(name)] = std::string(trim(rest.substr(0, rest.find(';'))));
    } else if (m.starts_with("Channel ") && after(m, " via ", &rest)) {
      ++t.connections[transport_kind(rest)];
    } else if (m.starts_with("comm ") && after(m, " nNodes ", &rest)) {  // "comm 0x.. rank 0 nRanks 16 nNodes 2"
      t.nodes = std::max(t.nodes, std::atoi(std::string(rest.substr(0, rest.find(' '))).c_str()));
    }
  }
  // NCCL may initialize several networks (IB finds no device, then Socket): the devices of the
  // one in use.
  if (auto it = devices.find(t.network); it != devices.end()) t.network_devices = it->second;
  return t;
}

std::string describe(const NcclTransports& t) {
  std::string text = "network " + (t.network.empty() ? std::string("not logged") : t.network);
  if (!t.network_devices.empty()) text += " (" + t.network_devices + ")";
  if (t.nodes > 0) text += fmt::format(", {} node{}", t.nodes, t.nodes == 1 ? "" : "s");
  if (t.connections.empty()) return text + "; no connections logged";
  text += "; connections:";
  const char* sep = " ";
  for (const auto& [kind, n] : t.connections) {
    text += fmt::format("{}{} {}", sep, n, kind);
    sep = ", ";
  }
  return text;
}

std::string slow_network(const NcclTransports& t) {
  if (t.nodes < 2) return {};
  int sockets = 0;
  for (const auto& [kind, n] : t.connections) {
    if (kind.starts_with("NET/Socket")) sockets += n;
  }
  if (sockets == 0 && t.network != "Socket") return {};
  return fmt::format(
      "NCCL carries traffic between the job's {} nodes over TCP sockets ({} NET/Socket connection{}), not RDMA: "
      "expect a fraction of the fabric's bandwidth. Check that the RDMA devices are visible in the container "
      "(NCCL_IB_HCA), or for EFA that the aws-ofi-nccl plugin loads (NCCL_NET_PLUGIN)",
      t.nodes, sockets, sockets == 1 ? "" : "s");
}

}  // namespace tessera::comm
