// `tessera plan` and `tessera train --dry-run`: memory and speed before running anything.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/json.h"
#include "core/threads.h"
#include "model/model_config.h"
#include "plan/search.h"

namespace tessera::cli {
namespace {

constexpr const char* kUsage =
    "usage: tessera plan [CONFIG] [--set key=value]... --hardware NAME|FILE.toml [--nodes N]\n"
    "                    [--gpus-per-node G] [--tokens N] [--search] [--json]\n"
    "  memory per device and step time of CONFIG's model and layout on N nodes of G devices each\n"
    "  (parallel.nproc becomes N x G); --hardware: a100-40gb, a100-80gb, h100-80gb, h200, cpu (this\n"
    "  machine, measured in a few seconds), or a TOML table (docs/plan.md); --tokens: a budget\n"
    "  (2T, 500B, 1e9) to time; --search: every layout that fits, fastest first\n";

// "2T", "500B", "20M", "1e9" -> tokens.
double parse_tokens(const std::string& text) {
  if (text.empty()) return 0.0;
  double scale = 1.0;
  std::string number = text;
  switch (text.back()) {
    case 'K':
    case 'k':
      scale = 1e3;
      break;
    case 'M':
      scale = 1e6;
      break;
    case 'B':
    case 'G':
      scale = 1e9;
      break;
    case 'T':
      scale = 1e12;
      break;
    default:
      break;
  }
  if (scale != 1.0) number.pop_back();
  try {
    size_t used = 0;
    const double v = std::stod(number, &used);
    if (used == number.size() && v > 0 && std::isfinite(v)) return v * scale;
  } catch (const std::exception&) {
  }
  throw ConfigError(fmt::format("--tokens {}: expected a positive count such as 2T, 500B, 20M or 1e9", text));
}

std::string duration(double s) {
  if (s >= 86400) return fmt::format("{:.1f} days", s / 86400);
  if (s >= 3600) return fmt::format("{:.1f} hours", s / 3600);
  if (s >= 60) return fmt::format("{:.1f} minutes", s / 60);
  return fmt::format("{:.2f} s", s);
}

std::string layout_text(const config::Config& c, const parallel::ParallelDims& dims) {
  std::string s = fmt::format("{} ({}), micro-batch {} x {} tokens, {} per step, {}", config::name(c.parallel.strategy),
                              dims.to_string(), c.micro_batch(), c.model.seq_len,
                              c.accumulation_steps() == 1 ? std::string("1 micro-batch")
                                                          : fmt::format("{} micro-batches", c.accumulation_steps()),
                              config::name(c.parallel.param_dtype));
  if (c.sequence_parallel()) s += ", sequence parallel";
  if (c.parallel.activation_checkpointing > 0) {
    s += fmt::format(", recompute every {} block(s)", c.parallel.activation_checkpointing);
  }
  return s;
}

nlohmann::ordered_json memory_json(const plan::MemoryPlan& m, uint64_t capacity) {
  return {{"stage", m.stage},
          {"params_bytes", m.params},
          {"grads_bytes", m.grads},
          {"optimizer_bytes", m.optimizer},
          {"buffers_bytes", m.buffers},
          {"comm_workspace_bytes", m.comm_workspace},
          {"activation_bytes", m.activations},
          {"activation_slots", m.activation_slots},
          {"reserved_bytes", m.reserved},
          {"total_bytes", m.total()},
          {"capacity_bytes", capacity},
          {"fits", m.total() <= capacity}};
}

nlohmann::ordered_json hardware_json(const plan::Hardware& h) {
  return {{"name", h.name},
          {"source", h.source},
          {"memory_bytes", h.memory_bytes},
          {"reserved_bytes", h.reserved_bytes},
          {"peak_bf16_flops", h.peak_bf16},
          {"peak_fp32_flops", h.peak_fp32},
          {"gemm_efficiency", h.gemm_efficiency},
          {"attention_efficiency", h.attention_efficiency},
          {"memory_bandwidth", h.memory_bandwidth},
          {"intra_bandwidth", h.intra_bandwidth},
          {"intra_latency_s", h.intra_latency},
          {"inter_bandwidth", h.inter_bandwidth},
          {"inter_latency_s", h.inter_latency},
          {"kernel_overhead_s", h.kernel_overhead},
          {"unit_overhead_s", h.unit_overhead}};
}

nlohmann::ordered_json step_json(const plan::StepPlan& s) {
  return {{"step_s", s.step_s},
          {"compute_s", s.compute_s},
          {"memory_bound_s", s.memory_bound_s},
          {"overhead_s", s.overhead_s},
          {"runtime_s", s.runtime_s},
          {"optimizer_s", s.optimizer_s},
          {"dp_comm_s", s.dp_comm_s},
          {"dp_exposed_s", s.dp_exposed_s},
          {"tp_comm_s", s.tp_comm_s},
          {"pp_comm_s", s.pp_comm_s},
          {"pipeline_bubble", s.bubble},
          {"tokens_per_s", s.tokens_per_s},
          {"tokens_per_s_per_device", s.tokens_per_s_per_device},
          {"mfu", s.mfu}};
}

// Per-device tokens/s at N nodes over the same per-device work on one node (the data-parallel
// degree shrinks with the nodes, the global batch with it); nullopt when one node cannot hold
// the model's tensor and pipeline degrees or N is 1.
std::optional<double> scaling_efficiency(const plan::Planned& p, const plan::Cluster& cluster, int threads) {
  if (cluster.nodes == 1) return std::nullopt;
  plan::Cluster one = cluster;
  one.nodes = 1;
  config::Config c = p.config;
  const int64_t model_ranks = p.dims.tp * p.dims.pp;
  if (one.world() % model_ranks != 0) return std::nullopt;
  const int64_t dp1 = one.world() / model_ranks;
  c.train.batch_size = p.config.train.batch_size * dp1 / p.dims.dp();
  c.train.micro_batch_size = p.config.micro_batch();
  if (c.parallel.strategy == config::Strategy::kHybridShard) c.parallel.shard_group_size = 0;
  try {
    const plan::Planned single = plan::plan_config(c, one, threads);
    return p.step.tokens_per_s_per_device / single.step.tokens_per_s_per_device;
  } catch (const ConfigError&) {
    return std::nullopt;
  }
}

void print_plan(const plan::Planned& p, const plan::Cluster& cluster, double tokens, int threads, bool json) {
  const plan::Hardware& h = cluster.hardware;
  const plan::MemoryPlan m = plan::peak_memory_plan(p.stages);
  const std::optional<double> scaling = scaling_efficiency(p, cluster, threads);
  if (json) {
    nlohmann::ordered_json out = {
        {"model", p.config.model.preset},
        {"params", model::parameter_count(p.config.model)},
        {"hardware", hardware_json(h)},
        {"nodes", cluster.nodes},
        {"devices_per_node", cluster.devices_per_node},
        {"layout", p.dims.to_string()},
        {"strategy", config::name(p.config.parallel.strategy)},
        {"micro_batch", p.config.micro_batch()},
        {"micro_batches", p.config.accumulation_steps()},
        {"memory", memory_json(m, h.memory_bytes)},
        {"memory_per_stage", nlohmann::json::array()},
        {"step", step_json(p.step)},
    };
    for (const plan::MemoryPlan& s : p.stages) out["memory_per_stage"].push_back(memory_json(s, h.memory_bytes));
    if (scaling) out["scaling_efficiency"] = *scaling;
    if (tokens > 0) out["seconds_to_tokens"] = tokens / p.step.tokens_per_s;
    fmt::print("{}\n", dump_json(out));
    return;
  }
  const config::Config& c = p.config;
  fmt::print("model {}: {} parameters, {} layers, dim {}, seq {}\n", c.model.preset, model::parameter_count(c.model),
             c.model.n_layers, c.model.dim, c.model.seq_len);
  fmt::print("hardware {}: {} node(s) x {} device(s); {}\n", h.name, cluster.nodes, cluster.devices_per_node,
             h.description);
  fmt::print(
      "  {}: peak {:.4g} TFLOP/s bf16, {:.4g} fp32; GEMMs at {:.0f}%, attention at {:.0f}% of it; memory-bound "
      "{:.4g} GB/s; links {:.4g} GB/s inside a node, {:.4g} GB/s per node between nodes\n",
      h.source, h.peak_bf16 / 1e12, h.peak_fp32 / 1e12, 100 * h.gemm_efficiency, 100 * h.attention_efficiency,
      h.memory_bandwidth / 1e9, h.intra_bandwidth / 1e9, h.inter_bandwidth / 1e9);
  fmt::print("layout: {}\n", layout_text(c, p.dims));
  const bool fits = m.total() <= h.memory_bytes;
  fmt::print("\nmemory per device{}:\n", p.stages.size() > 1 ? fmt::format(" (stage {}, the largest)", m.stage) : "");
  const std::pair<const char*, uint64_t> rows[] = {{"parameters (fp32 shards)", m.params},
                                                   {"gradients (fp32 shards)", m.grads},
                                                   {"optimizer (AdamW moments)", m.optimizer},
                                                   {"gathered units and buffers", m.buffers},
                                                   {"collectives' workspace", m.comm_workspace},
                                                   {"activations", m.activations},
                                                   {"reserved (runtime)", m.reserved}};
  for (const auto& [what, bytes] : rows) fmt::print("  {:<28} {:>12}\n", what, plan::format_bytes(bytes));
  fmt::print(
      "  activations hold {} micro-batch(es) in flight; the arenas, what tessera train allocates at "
      "start-up: {:.1f} MiB\n",
      m.activation_slots, static_cast<double>(m.arenas()) / (1 << 20));
  fmt::print("  {:<28} {:>12} of {}: {}\n", "total", plan::format_bytes(m.total()), plan::format_bytes(h.memory_bytes),
             fits ? "fits" : fmt::format("does NOT fit (short by {})", plan::format_bytes(m.total() - h.memory_bytes)));
  const plan::StepPlan& s = p.step;
  fmt::print(
      "\nstep {:.4g} s: compute {:.4g} s, memory-bound {:.4g} s, kernel overhead {:.4g} s, per-unit runtime {:.4g} s, "
      "optimizer {:.4g} s,\n",
      s.step_s, s.compute_s, s.memory_bound_s, s.overhead_s, s.runtime_s, s.optimizer_s);
  fmt::print(
      "  data-parallel communication {:.4g} s ({:.4g} s exposed), tensor-parallel {:.4g} s, pipeline sends "
      "{:.4g} s, bubble {:.4g} s ({:.0f}%)\n",
      s.dp_comm_s, s.dp_exposed_s, s.tp_comm_s, s.pp_comm_s, s.bubble_s, 100 * s.bubble);
  fmt::print("throughput {:.6g} tokens/s ({:.6g} per device), MFU {:.1f}%\n", s.tokens_per_s, s.tokens_per_s_per_device,
             100 * s.mfu);
  if (scaling) fmt::print("scaling efficiency against one node: {:.1f}%\n", 100 * *scaling);
  if (tokens > 0) fmt::print("time to {:.4g} tokens: {}\n", tokens, duration(tokens / s.tokens_per_s));
}

void print_search(const std::vector<plan::Candidate>& all, const plan::Cluster& cluster, bool json) {
  if (json) {
    nlohmann::ordered_json out = nlohmann::json::array();
    for (const plan::Candidate& c : all) {
      out.push_back({{"strategy", config::name(c.config.parallel.strategy)},
                     {"layout", c.dims.to_string()},
                     {"tensor", c.dims.tp},
                     {"pipeline", c.dims.pp},
                     {"shard_group", c.dims.dp_shard},
                     {"micro_batch", c.config.micro_batch()},
                     {"recompute", c.config.parallel.activation_checkpointing},
                     {"fits", c.fits},
                     {"memory", memory_json(c.memory, cluster.hardware.memory_bytes)},
                     {"step", step_json(c.step)},
                     {"why_not", c.why_not}});
    }
    fmt::print("{}\n", dump_json(out));
    return;
  }
  size_t fitting = 0;
  for (const plan::Candidate& c : all) fitting += c.fits ? 1 : 0;
  fmt::print("{} layout(s) considered, {} fit in {} per device; fastest first:\n", all.size(), fitting,
             plan::format_bytes(cluster.hardware.memory_bytes));
  fmt::print("  {:>4}  {:<14} {:>3} {:>3} {:>6} {:>3} {:>9} {:>11} {:>10} {:>7} {:>6}\n", "#", "strategy", "tp", "pp",
             "shard", "mb", "recompute", "memory", "step s", "tok/s/dev", "MFU");
  int shown = 0;
  for (const plan::Candidate& c : all) {
    if (!c.fits || ++shown > 10) continue;
    fmt::print("  {:>4}  {:<14} {:>3} {:>3} {:>6} {:>3} {:>9} {:>11} {:>10.4g} {:>7.0f} {:>5.1f}%\n", shown,
               config::name(c.config.parallel.strategy), c.dims.tp, c.dims.pp, c.dims.dp_shard, c.config.micro_batch(),
               c.config.parallel.activation_checkpointing > 0 ? "yes" : "no", plan::format_bytes(c.memory.total()),
               c.step.step_s, c.step.tokens_per_s_per_device, 100 * c.step.mfu);
  }
  if (fitting > 10) fmt::print("  ... and {} more that fit (--json lists all)\n", fitting - 10);
  if (fitting < all.size()) {
    fmt::print("{} do not fit, e.g. (least memory first):\n", all.size() - fitting);
    int listed = 0;
    for (const plan::Candidate& c : all) {
      if (c.fits || ++listed > 5) continue;
      fmt::print("  {} tp {} pp {} micro-batch {}{}: {}\n", config::name(c.config.parallel.strategy), c.dims.tp,
                 c.dims.pp, c.config.micro_batch(), c.config.parallel.activation_checkpointing > 0 ? " recompute" : "",
                 c.why_not);
    }
  }
}

// Threads per rank of `ranks` on this machine, as `tessera launch` gives them: train.threads, or
// the cores shared out; sets this process's count to it (the calibration runs on them).
int rank_threads(const config::Config& c, int ranks) {
  if (c.train.threads > 0) {
    set_num_threads(static_cast<int>(c.train.threads));
  } else {
    set_num_threads(0);
    set_num_threads(std::max(1, num_threads() / std::max(1, ranks)));
  }
  return num_threads();
}

// A short real run on this machine: `tessera bench` of a one-layer model at the plan's process
// and thread counts and strategy, the median of 30 timed steps.
struct ProbeRun {
  config::Config config;  // what it ran
  nlohmann::json result;  // its JSON line
};

ProbeRun run_probe(const config::Config& c, int nproc, int threads) {
  ProbeRun probe;
  const config::Strategy strategy =
      c.parallel.strategy == config::Strategy::kHybridShard ? config::Strategy::kFullShard : c.parallel.strategy;
  const std::string overrides = fmt::format(
      "--set model.n_layers=1 --set train.threads={} --set parallel.strategy={} --set parallel.param_dtype={} "
      "--set metrics.log_level=error --set parallel.host_transport={}",
      threads, config::name(strategy), config::name(c.parallel.param_dtype), config::name(c.parallel.host_transport));
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();  // (popen runs sh)
  const std::string command =
      fmt::format("'{}' bench --preset tiny --steps 32 --nproc {} {} 2>/dev/null", self, nproc, overrides);
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) throw Error(fmt::format("cannot run {}", command), kExitFailure);
  std::string text;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) text.append(buffer, n);
  const int status = ::pclose(pipe);
  probe.result = parse_json(text);
  if (status != 0 || !probe.result.is_object() || !probe.result.contains("arena_bytes")) {
    throw Error(fmt::format("measuring this machine's runtime failed: `{}` exited with status {}", command, status),
                kExitFailure);
  }
  // The same config as bench builds it (cmd_bench): micro-batch 4 per rank.
  config::Overrides set = {{"model.preset", "tiny"},
                           {"model.n_layers", "1"},
                           {"train.batch_size", std::to_string(4 * nproc)},
                           {"train.micro_batch_size", "4"},
                           {"train.threads", std::to_string(threads)},
                           {"parallel.nproc", std::to_string(nproc)},
                           {"parallel.strategy", config::name(strategy)},
                           {"parallel.param_dtype", config::name(c.parallel.param_dtype)}};
  probe.config = config::load("", set);
  return probe;
}

// The `cpu` hardware for `nproc` local ranks of `threads` threads, measured: calibrate_cpu's
// kernels and links, and from a probe run the two things only a real run shows: a rank's
// resident memory besides its arenas (code, libraries, threads, JIT kernels, the MFU
// calibration's buffers), and its per-step cost per unit beyond the modelled work (collective
// calls under load, per-unit optimizer and bookkeeping).
plan::Hardware this_machine(const config::Config& c, int nproc, int threads) {
  plan::Hardware h = plan::calibrate_cpu(nproc, threads, c.model, c.parallel.param_dtype == config::Precision::kBf16);
  if (c.parallel.host_transport == config::HostTransport::kTcp) {  // one node's ranks talk as between nodes
    h.intra_bandwidth = h.inter_bandwidth;
    h.intra_latency = h.inter_latency;
  }
  ProbeRun probe = run_probe(c, nproc, threads);
  probe.config.parallel.host_transport = c.parallel.host_transport;
  const plan::Cluster one{h, 1, nproc};
  const plan::Planned modelled = plan::plan_config(probe.config, one, threads);
  // What the probe's ranks held besides their arenas and the host groups' buffers (which the plan
  // counts for the config planned).
  h.reserved_bytes = static_cast<uint64_t>(std::max<int64_t>(
      0, probe.result["peak_rss_bytes_per_rank"].get<int64_t>() - probe.result["arena_bytes"].get<int64_t>() -
             static_cast<int64_t>(modelled.stages.front().comm_workspace)));
  const double units = static_cast<double>(probe.config.model.n_layers + 2);  // embedding, block, head
  h.unit_overhead = std::max(0.0, probe.result["median_step_s"].get<double>() - modelled.step.step_s) / units;
  return h;
}

// Exit 2 for a layout that does not fit, naming the keys that shrink it.
void refuse_if_too_big(const plan::Planned& p, const plan::Cluster& cluster) {
  const plan::MemoryPlan m = plan::peak_memory_plan(p.stages);
  if (m.total() <= cluster.hardware.memory_bytes) return;
  throw ConfigError(fmt::format(
      "model {} does not fit this layout: {} per device of {}; lower train.micro_batch_size, set "
      "parallel.activation_checkpointing, raise parallel.tensor or parallel.pipeline, or add --nodes "
      "(tessera plan --search lists what fits)",
      p.config.model.preset, plan::format_bytes(m.total()), plan::format_bytes(cluster.hardware.memory_bytes)));
}

}  // namespace

int dry_run(const config::Config& config) {
  const int nproc = static_cast<int>(config.parallel.nproc);
  const int threads = rank_threads(config, nproc);
  plan::Cluster cluster{this_machine(config, nproc, threads), 1, nproc};
  const plan::Planned p = plan::plan_config(config, cluster, threads);
  print_plan(p, cluster, 0.0, threads, false);
  refuse_if_too_big(p, cluster);
  return kExitOk;
}

int cmd_plan(const Args& args) {
  const ParsedArgs a =
      parse_args(args, {"--hardware", "--nodes", "--gpus-per-node", "--tokens"}, {}, {"--search", "--json"});
  if (a.help) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  const bool search = a.flags.count("--search") > 0, json = a.flags.count("--json") > 0;
  if (!a.flags.count("--hardware")) throw ConfigError(std::string("--hardware is required\n") + kUsage);
  const std::string hardware = a.get("--hardware", "");
  const long long nodes = a.get_int("--nodes", 1);
  if (nodes < 1) throw ConfigError(fmt::format("--nodes {}: must be at least 1", nodes));
  if (a.flags.count("--gpus-per-node") && a.get_int("--gpus-per-node", 0) < 1) {
    throw ConfigError(fmt::format("--gpus-per-node {}: must be at least 1", a.get("--gpus-per-node", "")));
  }
  // The devices per node: --gpus-per-node, else the hardware's; on this machine a device is a
  // rank, parallel.nproc of them. The config is validated at the cluster's world size.
  const bool cpu = hardware == "cpu";
  std::optional<plan::Hardware> table;
  if (!cpu) table = plan::resolve_hardware(hardware);
  long long per_node = a.get_int("--gpus-per-node", cpu ? 0 : table->devices_per_node);
  ParsedArgs with_world = a;
  if (per_node > 0) with_world.overrides.emplace_back("parallel.nproc", std::to_string(nodes * per_node));
  config::Config c = load_config(with_world);
  if (per_node == 0) per_node = c.parallel.nproc;
  // Threads per rank: a GPU rank's host threads do not enter the plan.
  const int threads = cpu ? rank_threads(c, static_cast<int>(per_node)) : 1;
  plan::Cluster cluster{cpu ? this_machine(c, static_cast<int>(per_node), threads) : *table, static_cast<int>(nodes),
                        static_cast<int>(per_node)};
  const double tokens = parse_tokens(a.get("--tokens", ""));
  if (search) {
    const std::vector<plan::Candidate> all = plan::search(c, cluster, threads);
    if (all.empty()) {
      throw ConfigError(
          fmt::format("no layout of model {} divides train.batch_size = {} over {} devices; raise "
                      "train.batch_size to a multiple of the data-parallel degree",
                      c.model.preset, c.train.batch_size, cluster.world()));
    }
    print_search(all, cluster, json);
    if (!all.front().fits) {
      throw ConfigError(
          fmt::format("model {} fits no layout on {} x {} {}: the smallest needs {} per device "
                      "(--nodes, --hardware)",
                      c.model.preset, cluster.nodes, cluster.devices_per_node, cluster.hardware.name,
                      plan::format_bytes(all.front().memory.total())));
    }
    return kExitOk;
  }
  const plan::Planned p = plan::plan_config(c, cluster, threads);
  print_plan(p, cluster, tokens, threads, json);
  refuse_if_too_big(p, cluster);
  return kExitOk;
}

}  // namespace tessera::cli
