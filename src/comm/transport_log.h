// Which network and transports NCCL chose (the first founding document: verify that it picked
// the fast fabric, not sockets). NCCL reports its choice only in its debug log, so a GPU job asks
// for that log in a file of its own and reads it back once its groups have connected. Plain text
// handling: built and tested without CUDA.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::comm {

// Points NCCL's debug log at `path` unless NCCL_DEBUG_FILE is set, and sets NCCL_DEBUG=INFO with
// NCCL_DEBUG_SUBSYS=INIT,NET unless NCCL_DEBUG is set (so the lines go to the file, not stdout).
// NCCL reads these once, at its first log line: call before the process's first NCCL call.
// Returns the file NCCL will write its INFO lines to, or an empty string when that cannot be
// known here (a user's NCCL_DEBUG_FILE with %h or %p) or NCCL will write none (a user's
// NCCL_DEBUG below INFO); *note (when non-null) then says which.
std::string capture_nccl_debug_log(const std::string& path, std::string* note = nullptr);

// What one process's NCCL debug log says about its communicators' connections.
struct NcclTransports {
  std::string network;          // the network plugin in use: "IB", "Socket", "Libfabric", ...
  std::string network_devices;  // what it uses, as NCCL lists it: "[0]mlx5_0:1/IB [1]mlx5_1:1/IB"
  int nodes = 0;                // the most nodes any communicator spans (0: not logged)
  // Connections per transport, device numbers dropped: "P2P/CUMEM/read", "SHM/direct",
  // "NET/IB/GDRDMA", "NET/Socket".
  std::map<std::string, int> connections;
  std::vector<std::string> warnings;  // NCCL WARN messages, in order
};

// Reads NCCL's INFO and WARN lines ("host:pid:tid [dev] NCCL INFO ..."); other lines are ignored.
NcclTransports parse_nccl_log(std::string_view text);

// One line for the log: "network IB ([0]mlx5_0:1/IB), 2 nodes; connections: 16 NET/IB/GDRDMA, 8 P2P/CUMEM".
std::string describe(const NcclTransports& t);

// Why the fabric looks slow, or an empty string: a communicator spanning nodes whose traffic
// between them goes over TCP sockets (NET/Socket) rather than RDMA.
std::string slow_network(const NcclTransports& t);

}  // namespace tessera::comm
