// The `tessera` subcommands.
#include "cli/commands.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "checkpoint/directory.h"
#include "cli/args.h"
#include "core/error.h"
#include "core/json.h"
#include "core/log.h"
#include "core/threads.h"
#include "core/timer.h"
#include "kernels/cpu/matmul.h"
#include "kernels/profiling_backend.h"
#include "launch/agent.h"
#include "launch/local_workers.h"
#include "launch/worker_env.h"
#include "metrics/memory.h"
#include "model/model_config.h"
#include "parallel/job.h"
#include "tessera/build_config.h"
#include "train/loop.h"
#include "train/run.h"
#include "train/step_log.h"
#include "train/trainer.h"
#if TESSERA_CUDA
#include "kernels/cuda/cublaslt.h"
#include "kernels/cuda/device.h"
#include "metrics/mfu.h"
#endif

namespace tessera::cli {
namespace {

constexpr const char* kUsage = R"(tessera: train Llama-family language models

usage: tessera <command> [options]

commands:
  train [CONFIG] [--set key=value]... [--run-dir DIR] [--nproc N] [--resume auto|PATH] [--dry-run]
                 train the model that CONFIG (TOML) describes; without CONFIG, the default
                 model on the bundled corpus (tokenized on first use); --nproc N: N local
                 data-parallel workers (parallel.strategy: full_shard, shard_grad_op,
                 hybrid_shard, no_shard); --resume auto: continue from DIR's latest
                 checkpoint (any world size); SIGTERM saves a checkpoint and exits 0
  launch --nnodes MIN[:MAX] --nproc-per-node N --rdzv URL --run-id ID [CONFIG] [options]
                 one agent per node: rendezvous, workers, hang watchdog, restarts from the
                 latest checkpoint (tessera launch --help)
  plan [CONFIG] [--set key=value]... --hardware NAME [--nodes N] [--gpus-per-node G] [--tokens N]
       [--search] [--json]
                 memory per device and step time on a cluster before renting it (a100-40gb,
                 a100-80gb, h100-80gb, h200, cpu, or a TOML table); --search: every layout
                 that fits, fastest first; train --dry-run: the plan on this machine
  bench --preset NAME --steps N [--nproc N] [--checkpoint-dir DIR] [--profile-ops] [--set key=value]...
                 time N training steps on synthetic tokens (and checkpoint saves into DIR);
                 prints one JSON object (--profile-ops: with the step's time by op)
  config [CONFIG] [--set key=value]... [--nproc N]
                 print the resolved configuration (every key) after validation, and the
                 parallel layout: the dimensions and which ranks form each group
  tokenizer train --input FILE... --vocab-size N --out MODEL
                 train a SentencePiece BPE tokenizer on text files (plain or .zst)
  tokenizer encode|decode --tokenizer FILE (--text TEXT | --ids IDS | --jsonl IN)
                 text to token ids and back, with a SentencePiece model or a tokenizer.json
  prepare --input FILE/GLOB... --tokenizer FILE --out DIR [--workers K] [--val-fraction F]
                 tokenize text into a dataset of token shards, K worker processes
  generate --checkpoint PATH --prompt TEXT [--prompt TEXT]... [--prompts-file FILE] [--max-tokens N]
           [--temperature T] [--top-k K] [--top-p P] [--seed S] [--threads N] [--bf16] [--no-kv-cache]
           [--token-ids]
                 continue prompts with a trained model (PATH: a run directory, a checkpoint
                 directory or a weights file), as one batch with a key/value cache
  eval --checkpoint PATH [--data DIR]
                 validation loss and perplexity of a trained model
  checkpoint export --format hf SRC OUT [--max-shard-size SIZE]
                 a trained model (run directory, checkpoint or weights file) as a Hugging Face Llama
                 directory (config.json, safetensors, tokenizer.model)
  checkpoint import --format hf HF_DIR OUT_DIR
                 a Hugging Face Llama directory as OUT_DIR/model.safetensors for generate,
                 eval and train.init_from
  checkpoint verify DIR | reshard SRC DST --nproc N
                 check a sharded checkpoint's checksums; re-cut it for another world size
  report RUN_DIR [--out FILE]
                 the run's metadata, summary and plots (loss, throughput, MFU, step time
                 split, memory, ranks) as one self-contained HTML page (default
                 RUN_DIR/report.html)
  info           version, build options, CPU features, GEMM library, threads, CUDA devices

exit codes: 0 done, 2 bad command line or config, 3 bad data, 4 health check failed
            before step 0, 10 I/O error, 11 non-finite loss, 12 lost peer or collective timeout
)";

std::string cpu_model_and_flags(std::string* flags_out) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model, flags;
  while (std::getline(in, line) && (model.empty() || flags.empty())) {
    auto value = [&] { return line.substr(line.find(':') + 2); };
    if (model.empty() && line.starts_with("model name")) model = value();
    if (flags.empty() && line.starts_with("flags")) flags = value();
  }
  std::istringstream words(flags);
  std::string w, picked;
  static const char* kInteresting[] = {"avx2",        "fma",         "avx512f",  "avx512bw", "avx512vl",
                                       "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16"};
  while (words >> w) {
    if (std::find(std::begin(kInteresting), std::end(kInteresting), w) != std::end(kInteresting)) {
      picked += (picked.empty() ? "" : " ") + w;
    }
  }
  *flags_out = picked.empty() ? "(none of avx2/avx512/amx)" : picked;
  return model.empty() ? "unknown" : model;
}

// runs/YYYYmmdd-HHMMSS (UTC), with runs/latest pointing at it: every run gets its own directory.
std::string new_run_dir() {
  namespace fs = std::filesystem;
  const std::string stamp = utc_now("%Y%m%d-%H%M%S");
  std::string name = stamp;
  std::error_code ec;
  for (int i = 2; fs::exists(fs::path("runs") / name, ec); ++i) name = fmt::format("{}-{}", stamp, i);
  fs::create_directories(fs::path("runs") / name, ec);
  if (ec) throw IoError(fmt::format("cannot create runs/{}: {}", name, ec.message()));
  const fs::path link = "runs/latest";
  if (fs::is_symlink(link, ec) || !fs::exists(link, ec)) {
    fs::remove(link, ec);
    fs::create_directory_symlink(name, link, ec);
  } else {
    log::warn("runs/latest is a directory, not a link: it keeps pointing at an older run");
  }
  return (fs::path("runs") / name).string();
}

}  // namespace

int cmd_info(const Args& args) {
  const ParsedArgs a = parse_args(args, {});
  if (a.help || !a.positional.empty()) {
    std::fputs("usage: tessera info\n", a.help ? stdout : stderr);
    return a.help ? kExitOk : kExitConfig;
  }
  std::string flags;
  const std::string cpu = cpu_model_and_flags(&flags);
  set_num_threads(0);
  fmt::print("tessera {}\n", TESSERA_VERSION);
  fmt::print("build:        {} {}, CUDA {}{}\n", TESSERA_BUILD_TYPE, TESSERA_CXX_COMPILER, TESSERA_CUDA ? "on" : "off",
             std::string(TESSERA_SANITIZE).empty() ? "" : fmt::format(", sanitizers {}", TESSERA_SANITIZE));
  fmt::print("cpu:          {}\n", cpu);
  fmt::print("cpu features: {}\n", flags);
  fmt::print("gemm:         {}\n", kernels::cpu::gemm_library());
  fmt::print("threads:      {} (default: one per available core; set train.threads)\n", num_threads());
#if TESSERA_CUDA
  std::string error;
  const auto devices = kernels::cuda::devices(&error);
  fmt::print("cuda:         runtime {}, driver {}\n", kernels::cuda::runtime_version(),
             kernels::cuda::driver_version());
  if (devices.empty()) fmt::print("cuda devices: none ({})\n", error.empty() ? "no device" : error);
  for (const auto& d : devices) {
    fmt::print("cuda device {}: {}, compute {}.{}, {} SMs, {:.1f} GiB\n", d.index, d.name, d.major, d.minor,
               d.multiprocessors, static_cast<double>(d.total_memory) / (1 << 30));
    const std::optional<double> peak = metrics::gpu_peak_flops(d.name, "bf16");
    fmt::print("cuda device {}: {}\n", d.index,
               peak ? fmt::format("MFU peak (datasheet, dense bf16) {:.1f} TFLOP/s", *peak / 1e12)
                    : std::string("not in the MFU peak table: set metrics.peak_flops for MFU"));
  }
  if (!devices.empty()) {  // opened only where a GPU is: loading it costs 0.3 s (kernels/cuda/cublaslt.h)
    std::string lt;
    try {
      lt = kernels::cuda::cublaslt_description();
    } catch (const std::runtime_error& e) {
      lt = fmt::format("cannot be loaded: {}", e.what());
    }
    fmt::print("cublaslt:     {}\n", lt);
  }
#else
  fmt::print("cuda:         not built (configure with -DTESSERA_CUDA=ON where nvcc exists)\n");
#endif
  return kExitOk;
}

int cmd_config(const Args& args) {
  ParsedArgs a = parse_args(args, {"--nproc"});
  if (a.help) {
    std::fputs("usage: tessera config [CONFIG] [--set key=value]... [--nproc N]\n", stdout);
    return kExitOk;
  }
  if (a.flags.count("--nproc")) a.overrides.emplace_back("parallel.nproc", a.flags["--nproc"]);
  const config::Config c = load_config(a);
  fmt::print("{}", config::to_toml(c));
  // The layout, as TOML comments: the output stays a config file.
  const int world = static_cast<int>(c.parallel.nproc);
  const parallel::ParallelDims dims = parallel::dims_for(c, world);
  fmt::print("\n# parallel layout at {} rank(s): {}\n", world, dims.to_string());
  if (world > 1) fmt::print("# rank order, innermost first: tp, dp_shard, dp_replicate, pp\n");
  for (const std::string& line : parallel::describe_layout(dims)) fmt::print("# {}\n", line);
  return kExitOk;
}

int cmd_train(const Args& args) {
  ParsedArgs a = parse_args(args, {"--run-dir", "--nproc", "--resume"}, {}, {"--dry-run"});
  if (a.help) {
    std::fputs(
        "usage: tessera train [CONFIG] [--set key=value]... [--run-dir DIR] [--nproc N] [--resume auto|PATH] "
        "[--dry-run]\n  --dry-run: print the memory and speed plan on this machine (tessera plan) and exit\n",
        stdout);
    return kExitOk;
  }
  if (a.flags.count("--nproc")) a.overrides.emplace_back("parallel.nproc", a.flags["--nproc"]);
  const config::Config c = load_config(a);
  if (a.flags.count("--dry-run")) return dry_run(c);
  const std::string resume = a.get("--resume", "");
  if (launch::WorkerEnv env; launch::worker_env(&env)) {  // one rank of a launched job
    if (!a.flags.count("--run-dir")) throw ConfigError("a launched worker needs --run-dir (shared by every rank)");
    train::run_worker(c, a.get("--run-dir", ""), env.job, env.heartbeat, resume.empty() ? "auto" : resume);
    return kExitOk;
  }
  if (resume == "none") throw ConfigError("--resume none is for workers started by an agent; omit --resume instead");
  std::string run_dir = a.get("--run-dir", "");
  if (run_dir.empty()) run_dir = resume.empty() ? new_run_dir() : "runs/latest";
  log::info("run directory {}", run_dir);
  if (c.parallel.nproc == 1) {
    train::run_training(c, run_dir, resume);
    return kExitOk;
  }
  const int rc = launch::run_local_job(c, run_dir, resume);
  if (rc != 0) {
    throw Error(
        fmt::format("training with {} workers failed (exit code {}); the lines above say why", c.parallel.nproc, rc),
        static_cast<ExitCode>(rc));
  }
  return kExitOk;
}

namespace {

double median_of_tail(std::vector<double> v) {
  // Median of steps 3..N (1-based): the first two warm caches and record the prefetch order.
  std::vector<double> tail(v.begin() + 2, v.end());
  std::sort(tail.begin(), tail.end());
  const size_t n = tail.size();
  return n % 2 ? tail[n / 2] : 0.5 * (tail[n / 2 - 1] + tail[n / 2]);
}

// With checkpoint_dir: after the timed steps, three checkpoints, each followed by one step that
// overlaps its background write. Seconds: the step loop's stall, save() to commit, and the step.
struct SaveTimes {
  std::vector<double> stall, commit, step_during;
  uint64_t bytes = 0;
};

SaveTimes bench_saves(train::Trainer& trainer, const std::string& checkpoint_dir, const parallel::Distributed& dist) {
  SaveTimes t;
  checkpoint::Checkpointer checkpointer(trainer.config(), checkpoint_dir, dist);
  for (int i = 0; i < 3; ++i) {
    const double t0 = now_seconds();
    t.stall.push_back(checkpointer.save(trainer.shards(), trainer.state()));
    t.step_during.push_back(trainer.step().seconds);
    if (!checkpointer.wait()) throw IoError(fmt::format("benchmark checkpoint in {} failed", checkpoint_dir));
    t.commit.push_back(now_seconds() - t0);
  }
  const std::string dir = checkpoint_dir + "/" + checkpoint::step_dir_name(trainer.steps_done() - 1);
  for (const auto& f : checkpoint::read_manifest(dir).files) t.bytes += f.bytes;
  return t;
}

// The ops of steps 3..N by time, per step: {"op": {"calls", "seconds", "share"}} (share of the ops'
// total), the largest first.
nlohmann::ordered_json op_breakdown(const kernels::OpProfile& profile, long long steps) {
  const auto totals = profile.totals();
  std::vector<std::pair<std::string, kernels::OpProfile::Total>> ops(totals.begin(), totals.end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double all = 0.0;
  for (const auto& op : ops) all += op.second.seconds;
  const double per_step = 1.0 / static_cast<double>(steps - 2);
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [name, t] : ops) {
    out[name] = {{"calls", static_cast<double>(t.calls) * per_step},
                 {"seconds", t.seconds * per_step},
                 {"share", all > 0.0 ? t.seconds / all : 0.0}};
  }
  return out;
}

// Runs c.train.max_steps steps; rank 0 prints the JSON line. profile_ops: the ops run one at a time
// and timed (kernels/profiling_backend.h), their breakdown in the line as "ops".
void bench_worker(const config::Config& c, long long steps, const parallel::Distributed& dist,
                  const train::ComputeDevice& device, const std::string& checkpoint_dir, bool profile_ops) {
  train::log_device(c, device);
  kernels::OpProfile profile;
  const std::unique_ptr<kernels::Backend> profiled =
      profile_ops ? kernels::make_profiling_backend(device.backend(), profile) : nullptr;
  train::Trainer trainer(c, "", dist, profiled ? *profiled : device.backend());
  const metrics::Peak peak = train::job_peak(c, dist, device);
  std::vector<double> times, exposed;
  std::map<std::string, std::vector<double>> split;
  nlohmann::json losses = nlohmann::json::array();
  train::LoopHooks hooks;  // the loop of `tessera train` (c.train.max_steps = steps), without saves
  hooks.observe = [&](const train::StepStats& s, const train::StepLog::Extra&) {
    times.push_back(s.seconds);
    // Every wait on communication in the step: gathers, reductions, and the step's all-reduce of
    // the loss (behind which no_shard's last gradient all-reduce may be queued on one group).
    exposed.push_back(s.times.comm);
    losses.push_back(s.loss);
    split["data_wait"].push_back(s.times.data_wait);
    split["forward"].push_back(s.times.forward);
    split["backward"].push_back(s.times.backward);
    split["comm"].push_back(s.times.comm);
    split["optimizer"].push_back(s.times.optimizer);
    if (times.size() == 2) profile.reset();  // the breakdown, as the median, of steps 3..N
    log::debug("bench step {}: {:.3f}s loss {}", s.step, s.seconds, s.loss);
  };
  train::run_steps(trainer, nullptr, hooks);
  const double median = median_of_tail(times);
  const double tokens_per_s = static_cast<double>(c.tokens_per_step()) / median;
  const SaveTimes saves = checkpoint_dir.empty() ? SaveTimes{} : bench_saves(trainer, checkpoint_dir, dist);
  // Peak RSS of every rank, gathered to report the largest.
  const int W = dist.world_size();
  std::vector<float> rss(W, 0.0f);
  const float mine = static_cast<float>(metrics::process_memory().peak) / (1 << 20);
  if (dist.world() != nullptr) {
    dist.world()->all_gather(&mine, rss.data(), 1, comm::DType::kF32, {comm::Millis(c.parallel.timeout_ms)})->wait();
  } else {
    rss[0] = mine;
  }
  if (dist.rank() != 0) return;
  nlohmann::ordered_json out = {
      {"impl", "tessera"},
      {"device", device.description()},
      {"preset", c.model.preset},
      {"params", model::parameter_count(c.model)},
      {"tokens_per_step", c.tokens_per_step()},
      {"steps", steps},
      {"median_step_s", median},
      {"tokens_per_s", tokens_per_s},
      {"model_flops_per_s", tokens_per_s * model::flops_per_token(c.model)},
      {"peak_flops_per_s", peak.flops_per_s},
      {"mfu", peak.known() ? tokens_per_s * model::flops_per_token(c.model) / peak.flops_per_s : 0.0},
      {"nproc", W},
      {"strategy", W > 1 ? config::name(c.parallel.strategy) : "single process"},
      {"tensor_parallel", c.parallel.tensor},
      {"sequence_parallel", c.sequence_parallel()},
      {"pipeline_parallel", c.parallel.pipeline},
      {"param_dtype", config::name(c.parallel.param_dtype)},
      {"threads", num_threads()},
      {"exposed_comm_s", median_of_tail(exposed)},
      {"median_split_s", nlohmann::json::object()},
      {"peak_rss_bytes", metrics::process_memory().peak},
      {"peak_rss_bytes_per_rank", static_cast<int64_t>(*std::max_element(rss.begin(), rss.end()) * (1 << 20))},
      {"state_bytes_per_rank", trainer.state_bytes()},
      {"activation_bytes", trainer.activation_bytes()},
      {"arena_bytes", trainer.arena_bytes().total()},
      {"gemm", kernels::cpu::gemm_library()},
      {"step_s", times},
      {"losses", losses},
  };
  for (const auto& [phase, seconds] : split) out["median_split_s"][phase] = median_of_tail(seconds);
  if (profile_ops) {
    out["ops_note"] = "each op run alone between two synchronizations, so profiled steps are slower than plain ones";
    out["ops"] = op_breakdown(profile, steps);
  }
  if (device.cuda()) {
    // What the GPU holds after the steps (the saves' pinned buffers are host memory) against the
    // arenas planned at start-up: nothing is allocated during a step, so in use is the peak.
    const kernels::Backend::DeviceMemory m = device.backend().device_memory();
    out["device_bytes_in_use"] = m.in_use;
    out["device_bytes_total"] = m.total;
    out["device_bytes_over_plan"] = static_cast<double>(m.in_use) / static_cast<double>(trainer.arena_bytes().total());
  }
  if (!checkpoint_dir.empty()) {
    auto median3 = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    out["checkpoint_bytes"] = saves.bytes;
    out["save_stall_s"] = median3(saves.stall);
    out["save_commit_s"] = median3(saves.commit);
    out["step_s_during_save"] = median3(saves.step_during);
  }
  fmt::print("{}\n", dump_json(out));
  std::fflush(stdout);
}

}  // namespace

int cmd_bench(const Args& args) {
  const ParsedArgs a = parse_args(args, {"--preset", "--steps", "--nproc", "--checkpoint-dir"}, {}, {"--profile-ops"});
  if (a.help) {
    std::fputs(
        "usage: tessera bench --preset NAME --steps N [--nproc N] [--checkpoint-dir DIR] [--profile-ops]\n"
        "                     [--set key=value]...\n"
        "  --checkpoint-dir: then three checkpoints into DIR, timed (stall, commit, overlapped step)\n"
        "  --profile-ops: each op run alone and timed; the step's breakdown by op in the line (\"ops\")\n",
        stdout);
    return kExitOk;
  }
  const bool profile_ops = a.flags.count("--profile-ops") > 0;
  const std::string checkpoint_dir = a.get("--checkpoint-dir", "");
  const long long steps = a.get_int("--steps", 12);
  if (steps < 3) throw ConfigError(fmt::format("--steps {}: need at least 3 (the median skips the first 2)", steps));
  const long long nproc = a.get_int("--nproc", 1);
  if (nproc < 1) throw ConfigError(fmt::format("--nproc {}: need at least 1", nproc));
  // BENCHMARKS.md: the preset's micro-batch per rank, AdamW lr 3e-4, betas 0.9/0.95, wd 0.1, clip 1.0.
  const std::string preset = a.get("--preset", "bench");
  const int64_t micro_batch = model::bench_micro_batch(preset);
  config::Overrides o = {{"model.preset", preset},
                         {"train.batch_size", std::to_string(micro_batch * nproc)},
                         {"train.micro_batch_size", std::to_string(micro_batch)},
                         {"parallel.nproc", std::to_string(nproc)},
                         {"train.max_steps", std::to_string(steps)},
                         {"train.lr", "3e-4"},
                         {"train.warmup_steps", "0"},
                         {"checkpoint.save_final", "false"},
                         {"data.synthetic", "true"},
                         {"train.eval_interval", "0"}};
  o.insert(o.end(), a.overrides.begin(), a.overrides.end());
  ParsedArgs with_defaults = a;
  with_defaults.overrides = o;
  config::Config c = load_config(with_defaults);
  const int world = static_cast<int>(c.parallel.nproc);
  if (world == 1) {
    train::configure_threads(c);
    const train::ComputeDevice device(c, 1);
    bench_worker(c, steps, {}, device, checkpoint_dir, profile_ops);
    return kExitOk;
  }
  if (c.train.threads == 0) c.train.threads = 1;  // one thread per rank unless told otherwise
  const std::string store = fmt::format("/tmp/tessera-bench-{}", getpid());
  const int rc = launch::run_local_workers(world, [&](int rank) {
    train::ComputeDevice device(c, world, rank, world);  // one node: rank i on GPU i
    device.bind_cpus(c, rank, world);
    train::configure_threads(c);
    parallel::JobAddress address{store, "bench", "0", rank, world};
    address.transport = parallel::host_transport(c);
    const parallel::Job job(address, parallel::dims_for(c, world), comm::Millis(c.parallel.timeout_ms),
                            device.nccl_device());
    bench_worker(c, steps, job.view(), device, checkpoint_dir, profile_ops);
    return 0;
  });
  std::error_code ec;
  std::filesystem::remove_all(store, ec);
  return rc;
}

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return kExitConfig;
  }
  const std::string command = argv[1];
  const Args args(argv + 2, argv + argc);
  try {
    if (command == "info") return cmd_info(args);
    if (command == "train") return cmd_train(args);
    if (command == "bench") return cmd_bench(args);
    if (command == "plan") return cmd_plan(args);
    if (command == "config") return cmd_config(args);
    if (command == "tokenizer") return cmd_tokenizer(args);
    if (command == "prepare") return cmd_prepare(args);
    if (command == "generate") return cmd_generate(args);
    if (command == "eval") return cmd_eval(args);
    if (command == "checkpoint") return cmd_checkpoint(args);
    if (command == "launch") return cmd_launch(args);
    if (command == "report") return cmd_report(args);
    if (command == "--version" || command == "version") {
      fmt::print("tessera {}\n", TESSERA_VERSION);
      return kExitOk;
    }
    if (command == "-h" || command == "--help" || command == "help") {
      std::fputs(kUsage, stdout);
      return kExitOk;
    }
    fmt::print(stderr, "tessera: unknown command '{}'\n\n{}", command, kUsage);
    return kExitConfig;
  } catch (const Error& e) {
    log::error("{}", e.what());
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    log::error("out of memory; the planned sizes are printed at start-up (try a smaller train.micro_batch_size)");
    return kExitFailure;
  }
}

}  // namespace tessera::cli
