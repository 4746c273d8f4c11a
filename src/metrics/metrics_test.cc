#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "core/error.h"
#include "metrics/memory.h"
#include "metrics/mfu.h"
#include "metrics/prometheus.h"
#include "model/model_config.h"

namespace tessera::metrics {
namespace {

// A port nothing listens on now: bound to port 0, read back, let go.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  return ok ? ntohs(addr.sin_port) : -1;
}

TEST(Exposition, GroupsFamiliesWithHelpAndTypeAndEscapes) {
  Exposition e;
  e.gauge("tessera_rank_busy_seconds", "Busy.", 0.5, {{"rank", "0"}});
  e.counter("tessera_tokens_total", "Tokens\nseen \\ so far.", 2048);
  e.gauge("tessera_rank_busy_seconds", "Busy.", 0.25, {{"rank", "1"}});
  e.gauge("tessera_info", "Info.", 1, {{"preset", "a\"b\\c\nd"}, {"strategy", "full_shard"}});
  e.gauge("tessera_loss", "Loss.", std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(e.text(),
            "# HELP tessera_rank_busy_seconds Busy.\n"
            "# TYPE tessera_rank_busy_seconds gauge\n"
            "tessera_rank_busy_seconds{rank=\"0\"} 0.5\n"
            "tessera_rank_busy_seconds{rank=\"1\"} 0.25\n"
            "# HELP tessera_tokens_total Tokens\\nseen \\\\ so far.\n"
            "# TYPE tessera_tokens_total counter\n"
            "tessera_tokens_total 2048\n"
            "# HELP tessera_info Info.\n"
            "# TYPE tessera_info gauge\n"
            "tessera_info{preset=\"a\\\"b\\\\c\\nd\",strategy=\"full_shard\"} 1\n"
            "# HELP tessera_loss Loss.\n"
            "# TYPE tessera_loss gauge\n"
            "tessera_loss NaN\n");
}

TEST(Exposition, ValuesReadBackExactly) {
  Exposition e;
  e.gauge("tessera_x", "x", 0.1 + 0.2);
  const std::string text = e.text();
  const double back = std::stod(text.substr(text.rfind(' ') + 1));
  EXPECT_EQ(back, 0.1 + 0.2);
}

TEST(Mfu, KnownConfigArithmetic) {
  // BENCHMARKS.md: the "bench" model is 277.7 MFLOP per token: 6 x 42,082,816 matmul parameters
  // + 12 x 8 layers x 512 seq x 512 dim.
  model::ModelConfig bench;
  ASSERT_TRUE(model::model_preset("bench", &bench));
  EXPECT_EQ(model::matmul_parameter_count(bench), 42082816);
  EXPECT_DOUBLE_EQ(model::flops_per_token(bench), 6.0 * 42082816 + 12.0 * 8 * 512 * 512);
  // 2000 tokens/s on a 2-rank job whose ranks peak at 250 GFLOP/s each.
  const double flops = 2000 * model::flops_per_token(bench);
  const Peak peak{2 * 250e9, "configured"};
  ASSERT_TRUE(mfu(flops, peak).has_value());
  EXPECT_NEAR(*mfu(flops, peak), 2000 * 277662720.0 / 500e9, 1e-12);  // 1.1107
  EXPECT_FALSE(mfu(flops, Peak{}).has_value());
}

TEST(Mfu, GpuTableNamesDevicesAndRefusesUnknownOnes) {
  EXPECT_DOUBLE_EQ(*gpu_peak_flops("NVIDIA H100 80GB HBM3", "bf16"), 989.4e12);
  EXPECT_DOUBLE_EQ(*gpu_peak_flops("NVIDIA H100 PCIe", "bf16"), 756.5e12);
  EXPECT_DOUBLE_EQ(*gpu_peak_flops("NVIDIA H200", "bf16"), 989.4e12);
  EXPECT_DOUBLE_EQ(*gpu_peak_flops("NVIDIA A100-SXM4-80GB", "fp32"), 19.5e12);
  EXPECT_FALSE(gpu_peak_flops("NVIDIA GeForce GTX 1080", "bf16").has_value());
  EXPECT_FALSE(gpu_peak_flops("NVIDIA H100 80GB HBM3", "fp8").has_value());
}

TEST(Mfu, CpuCalibrationMeasuresAPlausibleGemmRate) {
  const double fp32 = calibrate_cpu_peak("fp32", 0.05, 256);
  const double bf16 = calibrate_cpu_peak("bf16", 0.05, 256);
  // At least 1 GFLOP/s, at most 100 TFLOP/s: a real measurement on any CPU this runs on.
  EXPECT_GT(fp32, 1e9);
  EXPECT_LT(fp32, 1e14);
  EXPECT_GT(bf16, 1e9);
  EXPECT_LT(bf16, 1e14);
}

TEST(Memory, ResidentBytesFollowTouchedPages) {
  const int64_t before = process_memory().resident;
  ASSERT_GT(before, 0);
  std::vector<char> block(64 << 20, 1);  // touched: resident
  const ProcessMemory after = process_memory();
  EXPECT_GE(after.resident - before, 48 << 20);
  EXPECT_GE(after.peak, after.resident);
  EXPECT_EQ(block[12345], 1);
}

TEST(PrometheusServer, ServesTheLastPublishedPage) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  PrometheusServer server("127.0.0.1", port);
  server.publish("tessera_step 1\n");
  server.publish("tessera_step 2\n");
  httplib::Client client("127.0.0.1", port);
  httplib::Result res = client.Get("/metrics");
  for (int i = 0; i < 50 && !res; ++i) res = client.Get("/metrics");  // the listener thread starting
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "tessera_step 2\n");
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  // A second server on the same port is refused with the config keys named.
  try {
    PrometheusServer clash("127.0.0.1", port);
    FAIL() << "bound a port in use";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.prometheus_port"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find(std::to_string(port)), std::string::npos);
  }
}

}  // namespace
}  // namespace tessera::metrics
