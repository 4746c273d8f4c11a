// NCCL's debug log read for its network and transports: logs in NCCL's line formats (its
// src/debug.cc prefix, src/init.cc and src/transport/*.cc messages) for the cases an operator
// meets: one NVLink node, two nodes over InfiniBand, two nodes fallen back to sockets, EFA.
#include "comm/transport_log.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>

namespace tessera::comm {
namespace {

const char* kOneNode = R"(gpu-a:4101:4101 [0] NCCL INFO Bootstrap: Using eth0:10.1.0.5<0>
gpu-a:4101:4101 [0] NCCL INFO NCCL version 2.27.3+cuda13.0
gpu-a:4101:4160 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:10.1.0.5<0>
gpu-a:4101:4160 [0] NCCL INFO Using network IB
gpu-a:4101:4160 [0] NCCL INFO comm 0x55d0c8e0 rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0
gpu-a:4101:4160 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
gpu-a:4101:4160 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read
gpu-a:4101:4160 [0] NCCL INFO Channel 00/0 : 0[0] -> 7[7] via P2P/CUMEM/read
gpu-a:4101:4160 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1
)";

const char* kTwoNodesIb = R"(node1:77:77 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB; OOB ib0:10.2.0.1<0>
node1:77:90 [0] NCCL INFO Using network IB
node1:77:90 [0] NCCL INFO comm 0x7f00 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0
node1:77:90 [0] NCCL INFO comm 0x7f80 rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0
node1:77:90 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
node1:77:90 [0] NCCL INFO Channel 02/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA
node1:77:90 [0] NCCL INFO Channel 02/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA
node1:77:90 [0] NCCL INFO Channel 03/0 : 0[0] -> 8[0] [send] via NET/IB/1(1)/GDRDMA(PCI)
)";

const char* kTwoNodesSockets = R"(node1:77:90 [0] NCCL INFO NET/IB : No device found.
node1:77:90 [0] NCCL INFO NET/Socket : Using [0]eth0:10.2.0.1<0>
node1:77:90 [0] NCCL INFO Using network Socket
node1:77:90 [0] NCCL INFO comm 0x7f00 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0
node1:77:90 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
node1:77:90 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/Socket/0
node1:77:90 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0
)";

TEST(NcclTransportLog, OneNodeOverNvlink) {
  const NcclTransports t = parse_nccl_log(kOneNode);
  EXPECT_EQ(t.network, "IB");
  EXPECT_EQ(t.network_devices, "[0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]");
  EXPECT_EQ(t.nodes, 1);
  EXPECT_EQ(t.connections, (std::map<std::string, int>{{"P2P/CUMEM/read", 3}}));
  EXPECT_TRUE(t.warnings.empty());
  EXPECT_EQ(describe(t), "network IB ([0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]), 1 node; connections: 3 P2P/CUMEM/read");
  EXPECT_EQ(slow_network(t), "");  // one node: the network carries nothing
}

TEST(NcclTransportLog, TwoNodesOverInfiniBandWithGpuDirect) {
  const NcclTransports t = parse_nccl_log(kTwoNodesIb);
  EXPECT_EQ(t.nodes, 2);  // the widest communicator
  EXPECT_EQ(t.connections,
            (std::map<std::string, int>{{"NET/IB/GDRDMA", 2}, {"NET/IB/GDRDMA(PCI)", 1}, {"P2P/CUMEM/read", 1}}));
  EXPECT_EQ(describe(t),
            "network IB ([0]mlx5_0:1/IB [1]mlx5_3:1/IB), 2 nodes; connections: 2 NET/IB/GDRDMA, 1 "
            "NET/IB/GDRDMA(PCI), 1 P2P/CUMEM/read");
  EXPECT_EQ(slow_network(t), "");
}

TEST(NcclTransportLog, TwoNodesFallenBackToSocketsAreFlagged) {
  const NcclTransports t = parse_nccl_log(kTwoNodesSockets);
  EXPECT_EQ(t.network, "Socket");
  EXPECT_EQ(t.network_devices, "[0]eth0:10.2.0.1<0>");  // the network in use, not IB's "No device"
  EXPECT_EQ(t.connections.at("NET/Socket"), 2);
  const std::string why = slow_network(t);
  EXPECT_NE(why.find("2 nodes over TCP sockets (2 NET/Socket connections)"), std::string::npos) << why;
  EXPECT_NE(why.find("NCCL_IB_HCA"), std::string::npos) << why;
  // Sockets within one node carry nothing between nodes: no warning.
  EXPECT_EQ(slow_network(parse_nccl_log(R"(h:1:1 [0] NCCL INFO Using network Socket
h:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0
h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct)")),
            "");
}

TEST(NcclTransportLog, EfaThroughTheLibfabricPluginIsFast) {
  const NcclTransports t = parse_nccl_log(R"(p4d:9:9 [3] NCCL INFO Using network Libfabric
p4d:9:9 [3] NCCL INFO comm 0x9 rank 3 nRanks 32 nNodes 4 localRanks 8 localRank 3 MNNVL 0
p4d:9:9 [3] NCCL INFO Channel 00/0 : 11[3] -> 3[3] [receive] via NET/Libfabric/1/GDRDMA
p4d:9:9 [3] NCCL INFO Channel 01/0 : 3[3] -> 4[4] via P2P/IPC/read)");
  EXPECT_EQ(t.nodes, 4);
  EXPECT_EQ(t.connections, (std::map<std::string, int>{{"NET/Libfabric/GDRDMA", 1}, {"P2P/IPC/read", 1}}));
  EXPECT_EQ(slow_network(t), "");
}

TEST(NcclTransportLog, WarningsTimestampsAndStrayLinesAndNothingLogged) {
  const NcclTransports t = parse_nccl_log(
      "[2026-12-04 10:00:01] h:1:2 [0] NCCL INFO Using network IB\n"
      "unrelated output from the program\n"
      "\n"
      "h:1:2 [0] transport/net_ib.cc:421 NCCL WARN NET/IB : Got async event : port error\n"
      "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/indirect/3[3]");  // no final newline
  EXPECT_EQ(t.network, "IB");
  EXPECT_EQ(t.warnings, (std::vector<std::string>{"NET/IB : Got async event : port error"}));
  EXPECT_EQ(t.connections, (std::map<std::string, int>{{"P2P/indirect", 1}}));

  const NcclTransports none = parse_nccl_log("");
  EXPECT_EQ(describe(none), "network not logged; no connections logged");
  EXPECT_EQ(slow_network(none), "");
}

// The NCCL_DEBUG* variables, restored after each test.
class CaptureNcclLog : public ::testing::Test {
 protected:
  static constexpr const char* kNames[] = {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"};
  void SetUp() override {
    for (const char* n : kNames) {
      const char* v = std::getenv(n);
      saved_.emplace_back(v == nullptr ? std::nullopt : std::optional<std::string>(v));
      ::unsetenv(n);
    }
  }
  void TearDown() override {
    for (size_t i = 0; i < saved_.size(); ++i) {
      if (saved_[i]) {
        ::setenv(kNames[i], saved_[i]->c_str(), 1);
      } else {
        ::unsetenv(kNames[i]);
      }
    }
  }
  static std::string env(const char* name) {
    const char* v = std::getenv(name);
    return v == nullptr ? "(unset)" : v;
  }
  std::vector<std::optional<std::string>> saved_;
};

TEST_F(CaptureNcclLog, UnsetVariablesSendInfoLinesToTheFile) {
  std::string note;
  EXPECT_EQ(capture_nccl_debug_log("/run/logs/nccl_rank_3.log", &note), "/run/logs/nccl_rank_3.log");
  EXPECT_EQ(env("NCCL_DEBUG"), "INFO");
  EXPECT_EQ(env("NCCL_DEBUG_SUBSYS"), "INIT,NET");
  EXPECT_EQ(env("NCCL_DEBUG_FILE"), "/run/logs/nccl_rank_3.log");
  EXPECT_EQ(note, "");
}

TEST_F(CaptureNcclLog, TheUsersSettingsWin) {
  ::setenv("NCCL_DEBUG", "INFO", 1);
  ::setenv("NCCL_DEBUG_SUBSYS", "ALL", 1);
  ::setenv("NCCL_DEBUG_FILE", "/scratch/nccl.log", 1);
  EXPECT_EQ(capture_nccl_debug_log("/run/logs/nccl_rank_0.log"), "/scratch/nccl.log");
  EXPECT_EQ(env("NCCL_DEBUG_SUBSYS"), "ALL");
  EXPECT_EQ(env("NCCL_DEBUG_FILE"), "/scratch/nccl.log");

  std::string note;
  ::setenv("NCCL_DEBUG_FILE", "/scratch/nccl.%h.%p.log", 1);
  EXPECT_EQ(capture_nccl_debug_log("/run/logs/nccl_rank_0.log", &note), "");
  EXPECT_EQ(note, "NCCL's log goes to NCCL_DEBUG_FILE=/scratch/nccl.%h.%p.log");

  ::setenv("NCCL_DEBUG", "WARN", 1);
  ::unsetenv("NCCL_DEBUG_FILE");
  EXPECT_EQ(capture_nccl_debug_log("/run/logs/nccl_rank_0.log", &note), "");
  EXPECT_EQ(note, "NCCL_DEBUG=WARN logs no transports");
  EXPECT_EQ(env("NCCL_DEBUG_FILE"), "(unset)");  // WARN lines stay where the user sees them
}

}  // namespace
}  // namespace tessera::comm
