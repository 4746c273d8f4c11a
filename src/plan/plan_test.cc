#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "comm/process_group.h"
#include "core/error.h"
#include "plan/search.h"
#include "train/trainer.h"

namespace tessera::plan {
namespace {

config::Config tiny(const config::Overrides& extra = {}) {
  config::Overrides o = {
      {"model.preset", "tiny"}, {"train.batch_size", "8"}, {"train.threads", "2"}, {"data.synthetic", "true"}};
  o.insert(o.end(), extra.begin(), extra.end());
  return config::load("", o);
}

// One process: the plan's arenas are the trainer's, to the byte (multi-rank layouts are checked
// in tessera_fsdp_tests' FsdpBytes, which builds every strategy, tp, pp and bf16 mix).
TEST(MemoryPlan, EqualsTheTrainersArenas) {
  const config::Overrides cases[] = {
      {{"train.micro_batch_size", "8"}, {"parallel.param_dtype", "fp32"}, {"parallel.activation_checkpointing", "0"}},
      {{"train.micro_batch_size", "4"}, {"parallel.param_dtype", "bf16"}, {"parallel.activation_checkpointing", "0"}},
      {{"train.micro_batch_size", "2"}, {"parallel.param_dtype", "fp32"}, {"parallel.activation_checkpointing", "1"}},
      {{"train.micro_batch_size", "8"}, {"model.tied_embeddings", "true"}, {"parallel.activation_checkpointing", "2"}},
  };
  for (const auto& overrides : cases) {
    const config::Config c = tiny(overrides);
    const train::Trainer trainer(c, "");
    const std::vector<MemoryPlan> plans = memory_plans(c, parallel::dims_for(c, 1), 2, Hardware{});
    ASSERT_EQ(plans.size(), 1u);
    const train::Trainer::ArenaBytes real = trainer.arena_bytes();
    std::string what;
    for (const auto& [key, value] : overrides) what += key + "=" + value + " ";
    EXPECT_EQ(plans[0].params + plans[0].grads, real.shards) << what;
    EXPECT_EQ(plans[0].buffers, real.buffers) << what;
    EXPECT_EQ(plans[0].optimizer, real.optimizer) << what;
    EXPECT_EQ(plans[0].activations, real.activations) << what;
    EXPECT_EQ(plans[0].arenas(), real.total()) << what;
  }
}

TEST(MemoryPlan, PipelineStagesHoldTheirSchedulesMicroBatches) {
  // 1F1B over 4 stages and 8 micro-batches: stage s keeps P - s in flight; GPipe all 8.
  config::Config c = tiny({{"train.micro_batch_size", "1"}, {"model.n_layers", "4"}});
  c.parallel.nproc = 4;
  c.parallel.pipeline = 4;
  const std::vector<MemoryPlan> plans = memory_plans(c, parallel::dims_for(c, 4), 1, Hardware{});
  ASSERT_EQ(plans.size(), 4u);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(plans[s].activation_slots, 4 - s);
  c.parallel.pipeline_schedule = config::PipelineSchedule::kGPipe;
  for (const MemoryPlan& m : memory_plans(c, parallel::dims_for(c, 4), 1, Hardware{})) {
    EXPECT_EQ(m.activation_slots, 8);
  }
}

TEST(MemoryPlan, HostGroupsHoldASegmentOnOneNodeAndGloosBufferAcross) {
  // Two CPU ranks, full_shard: one group (world = dp_shard). On one node it maps a shared-memory
  // segment; over TCP (by choice, or across nodes) it keeps Gloo's exchange buffer: the largest
  // unit, here the embedding (or LM head), in the reduce dtype.
  config::Config c = tiny({{"train.micro_batch_size", "1"}});
  c.parallel.nproc = 2;
  const parallel::ParallelDims dims = parallel::dims_for(c, 2);
  Hardware cpu;
  cpu.gloo = true;
  cpu.devices_per_node = 2;
  const model::ModelLayout layout = stage_layout(c, dims, 0);
  uint64_t largest = 0;
  for (int u = 0; u < layout.num_units(); ++u) largest = std::max<uint64_t>(largest, layout.unit(u).padded);
  EXPECT_EQ(memory_plans(c, dims, 1, cpu)[0].comm_workspace, comm::shm_segment_bytes(2));
  c.parallel.host_transport = config::HostTransport::kTcp;
  EXPECT_EQ(memory_plans(c, dims, 1, cpu)[0].comm_workspace, 4 * largest);
  c.parallel.reduce_dtype = config::Precision::kBf16;
  EXPECT_EQ(memory_plans(c, dims, 1, cpu)[0].comm_workspace, 2 * largest);
  c.parallel.host_transport = config::HostTransport::kAuto;
  cpu.devices_per_node = 1;  // one rank per node: the group spans two
  EXPECT_EQ(memory_plans(c, dims, 1, cpu)[0].comm_workspace, 2 * largest);
  cpu.gloo = false;  // NCCL's buffers are in the reserved figure
  EXPECT_EQ(memory_plans(c, dims, 1, cpu)[0].comm_workspace, 0u);
}

Hardware fast_links() {
  Hardware h = *hardware_preset("h100-80gb");
  h.intra_bandwidth = h.inter_bandwidth = 1e30;
  h.intra_latency = h.inter_latency = 0.0;
  return h;
}

TEST(StepPlan, RingCollectives) {
  // (n - 1) / n of the bytes over the link, plus a latency per step; an all-reduce is two.
  EXPECT_DOUBLE_EQ(ring_gather_seconds(8e9, 8, 1e9, 1e-5), 7.0 + 7e-5);
  EXPECT_DOUBLE_EQ(ring_all_reduce_seconds(8e9, 8, 1e9, 1e-5), 2 * (7.0 + 7e-5));
  EXPECT_EQ(ring_gather_seconds(8e9, 1, 1e9, 1e-5), 0.0);
}

config::Config llama7b(const config::Overrides& extra = {}) {
  config::Overrides o = {
      {"model.preset", "llama2-7b"},    {"train.batch_size", "64"},
      {"train.micro_batch_size", "1"},  {"parallel.nproc", "8"},  // validated at load; plan_config sets the world
      {"parallel.param_dtype", "bf16"}, {"parallel.reduce_dtype", "bf16"}};
  o.insert(o.end(), extra.begin(), extra.end());
  return config::load("", o);
}

TEST(StepPlan, ComputeAloneWhenLinksAreFree) {
  // With free links, a step is its compute, memory-bound passes, kernels and optimizer; the
  // model's FLOPs over the GEMM rate bound the compute from below.
  const Cluster cluster{fast_links(), 1, 8};
  const Planned p = plan_config(llama7b(), cluster, 1);
  const StepPlan& s = p.step;
  EXPECT_NEAR(s.step_s, s.compute_s + s.memory_bound_s + s.overhead_s + s.optimizer_s, 1e-9 * s.step_s);
  const double tokens_per_device = 64.0 * 4096 / 8;
  const double flops = model::flops_per_token(p.config.model) * tokens_per_device;
  const Hardware& h = cluster.hardware;
  EXPECT_GT(s.compute_s, flops / (h.peak_bf16 * h.gemm_efficiency));
  EXPECT_LT(s.compute_s, flops / (h.peak_bf16 * h.attention_efficiency));
  EXPECT_NEAR(s.mfu, s.tokens_per_s * model::flops_per_token(p.config.model) / (8 * h.peak_bf16), 1e-12);
}

TEST(StepPlan, CommunicationFollowsTheStrategyAndTheLinks) {
  Cluster one{*hardware_preset("a100-80gb"), 1, 8}, two{*hardware_preset("a100-80gb"), 2, 8};
  const StepPlan full = plan_config(llama7b(), two, 1).step;
  const StepPlan grad_op = plan_config(llama7b({{"parallel.strategy", "shard_grad_op"}}), two, 1).step;
  // shard_grad_op gathers once per micro-batch, full_shard twice (forward and backward).
  EXPECT_LT(grad_op.dp_comm_s, full.dp_comm_s);
  EXPECT_GT(grad_op.dp_comm_s, 0.5 * full.dp_comm_s);
  // Across two nodes the shard group's ring runs at the node's network over its 8 devices.
  const StepPlan inside = plan_config(llama7b({{"train.batch_size", "32"}}), one, 1).step;
  EXPECT_GT(full.dp_comm_s, 5 * inside.dp_comm_s);
  // Hybrid shards inside the node and all-reduces only the shards across nodes.
  const StepPlan hybrid =
      plan_config(llama7b({{"parallel.strategy", "hybrid_shard"}, {"parallel.shard_group_size", "8"}}), two, 1).step;
  EXPECT_LT(hybrid.dp_comm_s, full.dp_comm_s);
  // Tensor parallelism adds its (never hidden) collectives.
  const StepPlan tp = plan_config(llama7b({{"parallel.tensor", "2"}}), two, 1).step;
  EXPECT_GT(tp.tp_comm_s, 0.0);
  EXPECT_EQ(full.tp_comm_s, 0.0);
}

TEST(StepPlan, NoShardOverlapsItsAllReducesWithTheBackward) {
  // no_shard all-reduces each unit's gradients as its backward ends: across two nodes the
  // all-reduces of 7B's fp32 gradients take seconds, about as long as a backward of 16
  // sequences, so most hide behind it; at least the last unit's (the embedding's, after the
  // whole backward) is exposed.
  const Cluster two{*hardware_preset("a100-80gb"), 2, 8};
  const config::Config c =
      llama7b({{"parallel.strategy", "no_shard"}, {"train.batch_size", "256"}, {"train.micro_batch_size", "16"}});
  const StepPlan s = plan_config(c, two, 1).step;
  EXPECT_GT(s.dp_comm_s, 1.0);
  EXPECT_LT(s.dp_exposed_s, 0.5 * s.dp_comm_s);
  const model::ModelLayout layout(c.model);
  const Hardware& h = two.hardware;
  const double embedding = ring_all_reduce_seconds(4.0 * static_cast<double>(layout.unit(0).padded), 16,
                                                   std::min(h.intra_bandwidth, h.inter_bandwidth / 8), h.inter_latency);
  EXPECT_GE(s.dp_exposed_s, embedding);
}

TEST(StepPlan, GlooReducesTheTablesTouchedRows) {
  // On Gloo (CPU ranks) the embedding table's gradient is reduced as the rows the batches touched
  // (fsdp/row_sparse.h): `bench`'s 32000-row table, 4 sequences of 512 per rank, 2 ranks touch
  // 32000 (1 - e^(-4096 / 32000)) = 3845 rows, expected; NCCL reduces the whole table.
  Hardware h = *hardware_preset("a100-80gb");
  const Cluster nccl{h, 1, 2};
  h.gloo = true;
  const Cluster gloo{h, 1, 2};
  const double bw = h.intra_bandwidth, lat = h.intra_latency;
  const double rows = 32000.0 * (1.0 - std::exp(-4096.0 / 32000.0));
  for (const char* strategy : {"no_shard", "full_shard"}) {
    const config::Config c = config::load("", {{"model.preset", "bench"},
                                               {"train.batch_size", "8"},
                                               {"train.micro_batch_size", "4"},
                                               {"parallel.nproc", "2"},
                                               {"parallel.strategy", strategy}});
    const model::ModelLayout layout(c.model, 32);
    const double table = static_cast<double>(layout.unit(0).padded) * 4.0;
    // no_shard all-reduces the table; full_shard reduce-scatters it (half an all-reduce's bytes).
    const double dense = std::string(strategy) == "no_shard" ? ring_all_reduce_seconds(table, 2, bw, lat)
                                                             : ring_gather_seconds(table, 2, bw, lat);
    const double sparse =
        ring_gather_seconds(32000.0 / 8, 2, bw, lat) + ring_all_reduce_seconds(rows * 512 * 4.0, 2, bw, lat);
    const StepPlan a = plan_config(c, gloo, 1).step, b = plan_config(c, nccl, 1).step;
    EXPECT_NEAR(b.dp_comm_s - a.dp_comm_s, dense - sparse, 1e-9) << strategy;
    // Tied to the LM head, the table's gradient is dense: reduced whole on Gloo too.
    config::Config tied = c;
    tied.model.tied_embeddings = true;
    EXPECT_DOUBLE_EQ(plan_config(tied, gloo, 1).step.dp_comm_s, plan_config(tied, nccl, 1).step.dp_comm_s) << strategy;
  }
}

TEST(StepPlan, PipelineBubble) {
  const Cluster cluster{fast_links(), 1, 8};
  // pp 4 x dp 2, 16 micro-batches of 1 per dp rank: the bubble is (P - 1) / (m + P - 1).
  const StepPlan s = plan_config(llama7b({{"parallel.pipeline", "4"}, {"train.batch_size", "32"}}), cluster, 1).step;
  EXPECT_DOUBLE_EQ(s.bubble, 3.0 / 19.0);
  EXPECT_NEAR(s.bubble_s / (s.step_s - s.optimizer_s), 3.0 / 19.0, 0.01);
}

TEST(Search, Llama2_70bOn16NodesOfH100) {
  const config::Config base = config::load("", {{"model.preset", "llama2-70b"},
                                                {"train.batch_size", "256"},
                                                {"parallel.param_dtype", "bf16"},
                                                {"parallel.reduce_dtype", "bf16"}});
  const std::vector<Candidate> all = search(base, Cluster{*hardware_preset("h100-80gb"), 16, 8}, 1);
  ASSERT_FALSE(all.empty());
  ASSERT_TRUE(all.front().fits);
  EXPECT_LE(all.front().memory.total(), hardware_preset("h100-80gb")->memory_bytes);
  // Fastest first among those that fit; the rest say why, with the numbers.
  bool rejected = false;
  for (size_t i = 1; i < all.size(); ++i) {
    if (all[i].fits) {
      EXPECT_LE(all[i - 1].step.step_s, all[i].step.step_s);
    } else {
      rejected = true;
      EXPECT_NE(all[i].why_not.find("needs"), std::string::npos);
    }
  }
  EXPECT_TRUE(rejected);  // no_shard of 70B (16 bytes a parameter) fits no 80 GB device
}

TEST(Hardware, TablesNameTheirBadKeys) {
  const auto dir = std::filesystem::path(::testing::TempDir());
  auto table = [&](const std::string& name, const std::string& text) {
    const std::string path = (dir / name).string();
    std::ofstream(path) << text;
    return path;
  };
  const std::string good =
      "memory_gib = 96\npeak_bf16_tflops = 500\npeak_fp32_tflops = 60\nmemory_gbs = 3000\nintra_node_gbs = 300\n"
      "inter_node_gbs = 100\ngemm_efficiency = 0.6\n";
  const Hardware h = load_hardware(table("mine.toml", good));
  EXPECT_EQ(h.name, "mine");
  EXPECT_EQ(h.memory_bytes, uint64_t{96} << 30);
  EXPECT_DOUBLE_EQ(h.peak_bf16, 500e12);
  EXPECT_DOUBLE_EQ(h.attention_efficiency, 0.6);  // unset: as the GEMMs
  auto message = [&](const std::string& name, const std::string& text) {
    try {
      load_hardware(table(name, text));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("typo.toml", good + "memory_gbps = 1\n").find("unknown key memory_gbps"), std::string::npos);
  EXPECT_NE(message("missing.toml", "memory_gib = 1\n").find("peak_bf16_tflops is missing"), std::string::npos);
  EXPECT_NE(message("zero.toml", good + "devices_per_node = 0\n").find("devices_per_node"), std::string::npos);
  EXPECT_NE(message("eff.toml", "gemm_efficiency = 1.5\n" + good.substr(0, good.find("gemm"))).find("gemm_efficiency"),
            std::string::npos);
  try {
    resolve_hardware("h300");
    ADD_FAILURE() << "h300 resolved";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("h100-80gb"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::plan
