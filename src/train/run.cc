// `tessera train`: the step loop.
#include "train/run.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "checkpoint/checkpointer.h"
#include "checkpoint/directory.h"
#include "checkpoint/resume.h"
#include "comm/job_auth.h"
#include "comm/transport_log.h"
#include "core/check.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/heartbeat.h"
#include "core/host.h"
#include "core/io_progress.h"
#include "core/json.h"
#include "core/log.h"
#include "core/run_lock.h"
#include "core/signals.h"
#include "core/threads.h"
#include "core/timer.h"
#include "data/bundled.h"
#include "data/tokenizer.h"
#include "storage/s3_client.h"
#include "tessera/build_config.h"
#include "train/health.h"
#include "train/loop.h"
#include "train/step_log.h"
#include "train/trainer.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;

}  // namespace

std::string resolve_dataset(const config::Config& config) {
  return data::resolve_dataset(config.data.synthetic, config.data.dataset, config.data.cache_dir,
                               config.model.vocab_size);
}

TrainedModel load_trained(const std::string& checkpoint, const std::string& tokenizer) {
  TrainedModel out;
  const fs::path path(checkpoint);
  const bool is_dir = fs::is_directory(path) || storage::is_s3(checkpoint);  // an object-store tier: its checkpoints
  const std::string weights = is_dir ? (path / "model.safetensors").string() : checkpoint;
  const std::string sharded =
      is_dir && (storage::is_s3(checkpoint) || !fs::exists(weights)) ? checkpoint::checkpoint_in(checkpoint) : "";
  std::string config_text;
  fs::path dir = is_dir ? path : path.parent_path();
  if (!sharded.empty()) {
    checkpoint::CheckpointReader reader(sharded);
    out.weights_path = sharded;
    out.tensors = reader.parameters();
    config_text = reader.manifest().config_toml;
    // RUN/checkpoints/step_N: the run directory is two levels up.
    for (fs::path p = fs::path(sharded); !p.empty() && p != p.parent_path(); p = p.parent_path()) {
      if (fs::exists(p / "run.json")) {
        dir = p;
        break;
      }
    }
  } else {
    out.weights_path = weights;
    if (!fs::exists(out.weights_path)) throw DataError(fmt::format("checkpoint {} not found", out.weights_path));
    std::map<std::string, std::string> metadata;
    out.tensors = checkpoint::read_safetensors(out.weights_path, &metadata);
    auto it = metadata.find("tessera_config");
    if (it == metadata.end()) {
      throw DataError(
          fmt::format("{}: no tessera_config in its metadata (not written by tessera train)", out.weights_path));
    }
    config_text = it->second;
  }
  try {
    out.config = config::load_text(config_text, out.weights_path, {});
  } catch (const ConfigError& e) {
    throw DataError(fmt::format("{}: its stored config is invalid: {}", out.weights_path, e.what()));
  }
  out.tokenizer_path = !tokenizer.empty() ? tokenizer : data::tokenizer_in(dir.string());
  if (const FileBytes text = try_read_file((dir / "run.json").string())) {
    const nlohmann::json info = parse_json(text.bytes);
    if (info.is_object() && info.contains("dataset") && info["dataset"].is_string()) out.dataset = info["dataset"];
  }
  return out;
}

namespace {

// A worker's heartbeat file, for its agent's hang watchdog (core/heartbeat.h): the step line
// rewritten after every step ("STEP finishing" once the steps are done) and, from a thread of its
// own every second, the bytes moved through storage and, on a GPU once a step is made, its
// utilization. Inert without a path.
class Heartbeat {
 public:
  Heartbeat(const std::string& path, const ComputeDevice& device) : device_(device) {
    if (!path.empty()) fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (!path.empty() && fd_ < 0) log::warn("cannot write the heartbeat file {}: {}", path, std::strerror(errno));
    if (fd_ < 0) return;
    write(0, heartbeat::step_line(0));  // as the agent wrote it; a file of its own starts empty
    pulse_ = std::thread([this] { pulse(); });
  }
  ~Heartbeat() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (pulse_.joinable()) pulse_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  void beat(int64_t step) {
    if (fd_ < 0) return;
    write(0, heartbeat::step_line(step));
    std::lock_guard lock(mutex_);
    stepped_ = true;
  }
  void finishing(int64_t step) {
    if (fd_ >= 0) write(0, heartbeat::step_line(step, /*finishing=*/true));
  }

 private:
  void write(int64_t at, const std::string& text) {
    if (::pwrite(fd_, text.data(), text.size(), at) < 0) log::debug("heartbeat write failed: {}", std::strerror(errno));
  }
  void pulse() {  // once more as the worker ends: the file's last figures are its last
    std::unique_lock lock(mutex_);
    for (bool last = false;; last = wake_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; })) {
      std::optional<double> gpu_util;
      if (stepped_) {  // start-up idles the GPU; the agent's GPU rule waits for a step anyway
        const std::optional<metrics::GpuReading> gpu = device_.gpu_reading();
        if (gpu) gpu_util = gpu->gpu_util_pct;
      }
      write(heartbeat::kPulseAt, heartbeat::pulse_lines(io_progress::seen(), gpu_util));
      if (last) return;
    }
  }
  const ComputeDevice& device_;
  int fd_ = -1;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false, stepped_ = false;
  std::thread pulse_;
};

void log_model_and_batch(const config::Config& config, const parallel::Distributed& dist, const Trainer& trainer) {
  const model::ModelConfig& m = config.model;
  log::info("model {}: {} parameters ({} layers, dim {}, {} heads / {} kv, ffn {}, vocab {}, seq {})", m.preset,
            format_count(static_cast<double>(model::parameter_count(m))), m.n_layers, m.dim, m.n_heads, m.n_kv_heads,
            m.ffn_hidden, m.vocab_size, m.seq_len);
  const std::string layout =
      dist.world_size() == 1
          ? "single process"
          : fmt::format("{}{}{}", config::name(config.parallel.strategy),
                        config.parallel.tensor > 1
                            ? fmt::format(" x tensor {}{}", config.parallel.tensor,
                                          config.sequence_parallel() ? " (sequence parallel)" : "")
                            : "",
                        config.parallel.pipeline > 1
                            ? fmt::format(" x pipeline {} ({}, blocks {})", config.parallel.pipeline,
                                          config::name(config.parallel.pipeline_schedule),
                                          fmt::join(model::stage_layers(config.model,
                                                                        static_cast<int>(config.parallel.pipeline),
                                                                        config.parallel.pipeline_layers),
                                                    " + "))
                            : "");
  log::info(
      "batch {} sequences = {} tokens/step; {} process(es) x {} thread(s), {} ({} micro-batches of {} per "
      "data-parallel rank)",
      config.train.batch_size, config.tokens_per_step(), dist.world_size(), num_threads(), layout,
      config.accumulation_steps(), config.micro_batch());
  // The arenas as allocated, which `tessera plan` predicts to the byte (plan_test, FsdpBytes).
  const Trainer::ArenaBytes a = trainer.arena_bytes();
  const auto mib = [](uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  log::info(
      "memory per rank (planned, allocated once): {:.1f} MiB = shards {:.1f} + gathered units {:.1f} + optimizer "
      "{:.1f} + activations {:.1f} (tessera plan / train --dry-run)",
      mib(a.total()), mib(a.shards), mib(a.buffers), mib(a.optimizer), mib(a.activations));
  if (const model::PipelineStage& st = trainer.layout().stage(); st.size > 1) {  // each rank, in its log file
    log::info("pipeline stage {} of {}: blocks {}..{}{}{}", st.rank, st.size, st.first_layer,
              st.first_layer + st.layers - 1, st.first() ? ", the embedding" : "", st.last() ? ", the LM head" : "");
  }
}

// RUN/run.json: what the run used (dataset, tokenizer, layout, peak). Rank 0 also copies the
// dataset's tokenizer into RUN.
nlohmann::ordered_json describe_run(const config::Config& config, const std::string& dataset,
                                    const std::string& run_dir, const parallel::Distributed& dist,
                                    const Trainer& trainer, const metrics::Peak& peak) {
  nlohmann::ordered_json run_info = {{"config", "config.toml"}};
  if (const data::DatasetManifest* manifest = trainer.dataset(); manifest != nullptr) {
    // Under the dataset's name for it (tokenizer.model or tokenizer.json: plain_file_name checked).
    const std::string tokenizer = dataset + "/" + manifest->tokenizer_file;
    const std::string copy = (fs::path(run_dir) / manifest->tokenizer_file).string();
    std::error_code ec;
    if (dist.rank() == 0 && storage::is_s3(dataset)) {
      write_file_atomic(copy, storage::default_s3_client().get(storage::parse_s3(tokenizer, "data.dataset")));
    } else if (dist.rank() == 0) {
      fs::copy_file(tokenizer, copy, fs::copy_options::overwrite_existing, ec);
    }
    if (ec) throw IoError(fmt::format("cannot copy {} into {}: {}", tokenizer, run_dir, ec.message()));
    run_info["dataset"] = storage::is_s3(dataset) ? dataset : fs::absolute(dataset).string();
    run_info["tokenizer"] = manifest->tokenizer_file;
    log::info("data: {} ({} train / {} validation tokens); unigram entropy {:.4f} nats/token", dataset,
              format_count(static_cast<double>(manifest->train.tokens)),
              format_count(static_cast<double>(manifest->val.tokens)), manifest->unigram_entropy);
  } else {
    log::info("data: synthetic tokens (seed {})", config.train.seed);
  }
  if (config.checkpoint.save_final) run_info["weights"] = "model.safetensors";
  const model::ModelConfig& m = config.model;
  run_info.update({{"version", TESSERA_VERSION},
                   {"started", utc_now()},
                   {"host", host_name()},
                   {"world_size", dist.world_size()},
                   {"strategy", dist.world_size() > 1 ? config::name(config.parallel.strategy) : "single"},
                   {"tensor_parallel", config.parallel.tensor},
                   {"sequence_parallel", config.sequence_parallel()},
                   {"pipeline_parallel", config.parallel.pipeline},
                   {"param_dtype", config::name(config.parallel.param_dtype)},
                   {"threads", num_threads()},
                   {"preset", m.preset},
                   {"parameters", model::parameter_count(m)},
                   {"flops_per_token", model::flops_per_token(m)},
                   {"tokens_per_step", config.tokens_per_step()},
                   {"max_steps", config.train.max_steps}});
  if (peak.known()) run_info.update({{"peak_flops_per_s", peak.flops_per_s}, {"peak_source", peak.source}});
  return run_info;
}

// Continues from the checkpoint `resume` names ("auto": the run's latest, if any), every rank
// from the same one.
void resume_trainer(Trainer& trainer, const std::string& root, const std::string& resume,
                    const std::vector<std::string>& candidates) {
  if (candidates.empty()) {
    if (resume == "auto") log::info("no checkpoint in {}: starting from step 0", root);
    return;
  }
  const double t0 = now_seconds();
  TrainingState state;
  const std::string loaded =
      checkpoint::resume_from(trainer.shards(), trainer.config(), trainer.distributed(), candidates, &state);
  trainer.restore(state);
  if (trainer.distributed().rank() == 0) checkpoint::remove_newer(root, trainer.steps_done());
  log::info("resumed from {} in {:.2f}s: step {}, {} tokens seen, data position {}", loaded, now_seconds() - t0,
            trainer.steps_done(), format_count(static_cast<double>(trainer.state().tokens)),
            trainer.state().sampler_position);
}

void log_final_validation(const data::DatasetManifest& manifest, const LoopEnd& end) {
  const double v = end.final_eval->loss;
  log::info(
      "validation loss {:.4f} nats/token (perplexity {:.1f}) over the whole validation split ({} tokens, "
      "{:.1f}s) vs unigram entropy {:.4f} ({})",
      v, std::exp(v), format_count(static_cast<double>(end.final_eval->targets)), end.final_eval_s,
      manifest.unigram_entropy,
      v < manifest.unigram_entropy ? fmt::format("{:.2f} below", manifest.unigram_entropy - v)
                                   : std::string("not below"));
}

// NCCL's choice of network and transports, which it names only in its debug log: the log is asked
// for in RUN/logs/nccl_rank_R.log before the job's groups are made (NCCL reads its settings once),
// and read after the first step, when every group has connected for every collective it runs.
class NcclTransportReport {
 public:
  NcclTransportReport(const std::string& run_dir, int rank) {
    std::error_code ec;  // NCCL writes no file where it cannot, and the report says so
    fs::create_directories(fs::path(run_dir) / "logs", ec);
    path_ = comm::capture_nccl_debug_log(fmt::format("{}/logs/nccl_rank_{}.log", run_dir, rank), &note_);
  }

  // Once: the network, the connections per transport, NCCL's warnings; a warning when traffic
  // between nodes goes over sockets.
  void log_once() {
    if (done_) return;
    done_ = true;
    if (path_.empty()) return log::info("NCCL transports not read: {}", note_);
    const FileBytes text = try_read_file(path_);
    if (!text) return log::warn("NCCL transports not read: cannot read NCCL's log {}: {}", path_, text.reason());
    const comm::NcclTransports t = comm::parse_nccl_log(text.bytes);
    log::info("NCCL after the first step: {} (NCCL's log: {})", comm::describe(t), path_);
    for (const std::string& w : t.warnings) log::warn("NCCL warned: {}", w);
    if (const std::string slow = comm::slow_network(t); !slow.empty()) log::warn("{}", slow);
  }

 private:
  std::string path_, note_;
  bool done_ = false;
};

// One worker's run: start-up checks and figures, resume, the step loop, final weights; rank 0
// writes the run's files and logs job-wide figures. `nccl` is null where the job has no NCCL
// groups.
void train_worker(const config::Config& config, const std::string& dataset, const std::string& run_dir,
                  const std::string& resume, const parallel::Distributed& dist, const ComputeDevice& device,
                  const std::string& heartbeat_path = "", NcclTransportReport* nccl = nullptr) {
  const bool leader = dist.rank() == 0;
  // Every rank logs to its own file; on the console, rank 0 logs job-wide figures and the others
  // only what goes wrong.
  // Under tensor or pipeline parallelism every line names the rank's coordinates too.
  const parallel::Mesh& mesh = *dist.mesh;
  if (mesh.size(parallel::Dim::kTp) > 1 || mesh.size(parallel::Dim::kPp) > 1) {
    log::set_rank(dist.rank(), fmt::format("pp{} tp{} dp{}", mesh.rank(parallel::Dim::kPp),
                                           mesh.rank(parallel::Dim::kTp), mesh.rank(parallel::Dim::kDp)));
  }
  std::error_code logs_ec;  // open_file warns when it cannot write there
  fs::create_directories(fs::path(run_dir) / "logs", logs_ec);
  log::open_file(fmt::format("{}/logs/rank_{}.log", run_dir, dist.rank()));
  if (!leader) log::set_console_level(log::Level::kWarn);
  log_device(config, device);
  if (dist.world() != nullptr) log::info("host collectives: {}", mesh.host_transport());
  if (!mesh.device_transport().empty()) {
    log::info(
        "collectives: FSDP's and tensor parallelism's in device memory over {}, the rest over Gloo "
        "(NCCL's choice of network and transports follows the first step)",
        mesh.device_transport());
  }
  Heartbeat heartbeat(heartbeat_path, device);
  Trainer trainer(config, dataset, dist, device.backend());
  health_check(dist, config, device.backend(), device.gpu_reading());  // every rank, before any time goes into training
  log_model_and_batch(config, dist, trainer);
  const metrics::Peak peak = job_peak(config, dist, device);  // before step 0: a collective, and the cores busy
  nlohmann::ordered_json run_info = describe_run(config, dataset, run_dir, dist, trainer, peak);
  run_info["device"] = device.description();

  const std::string root = run_dir + "/checkpoints";
  std::vector<std::string> candidates;
  if (!resume.empty()) candidates = checkpoint::agreed_resume_candidates(config, root, resume, dist);
  checkpoint::Checkpointer checkpointer(config, root, dist);
  resume_trainer(trainer, root, resume, candidates);
  if (!candidates.empty()) checkpointer.upload_if_missing(trainer.steps_done());  // the last run's may have failed
  if (leader) write_file_atomic(run_dir + "/run.json", dump_json(run_info, 2) + "\n");

  StepLog step_log(config, run_dir, dist, peak, trainer.steps_done(), device);
  const double start = now_seconds();
  LoopHooks hooks;
  hooks.stepped = [&](int64_t step) { heartbeat.beat(step); };
  hooks.finishing = [&](int64_t step) { heartbeat.finishing(step); };
  hooks.observe = [&](const StepStats& s, const StepLog::Extra& extra) {
    step_log.record(trainer, s, extra);
    if (nccl != nullptr) nccl->log_once();
  };
  const LoopEnd end = run_steps(trainer, &checkpointer, hooks);
  step_log.finish();
  if (end.stopped) {
    log::info("stopped at step {} with checkpoint {}", trainer.steps_done(),
              checkpoint::step_dir_name(trainer.steps_done()));
    return;
  }
  if (config.checkpoint.save_final) {
    auto tensors = trainer.whole_model_tensors();  // a collective: every rank takes part
    if (leader) {
      const std::string path = run_dir + "/model.safetensors";
      checkpoint::write_safetensors(path, tensors, {{"tessera_config", config::to_toml(config)}});
      log::info("wrote {}", path);
    }
  }
  log::info("done: {} steps, {} tokens in {:.1f}s", trainer.steps_done(),
            format_count(static_cast<double>(trainer.state().tokens)), now_seconds() - start);
  if (trainer.dataset() != nullptr && end.final_eval) log_final_validation(*trainer.dataset(), end);
}

}  // namespace

void run_training(const config::Config& config, const std::string& run_dir, const std::string& resume) {
  const RunLock lock(run_dir, "");
  if (resume.empty()) checkpoint::refuse_fresh_run_over_checkpoints(run_dir, config.checkpoint.mirror_dir);
  write_file_atomic(run_dir + "/config.toml", config::to_toml(config));
  const std::string dataset = resolve_dataset(config);  // once, before any worker starts
  // Several local workers are the single-node case of `tessera launch` (launch::run_local_job).
  CHECK_MSG(config.parallel.nproc == 1, "run_training runs one process; launch::run_local_job runs several");
  const StopSignals stop;  // before the first thread starts
  configure_threads(config);
  const ComputeDevice device(config, 1);
  train_worker(config, dataset, run_dir, resume, {}, device);
}

void run_worker(const config::Config& config, const std::string& run_dir, const parallel::JobAddress& job,
                const std::string& heartbeat, std::string resume) {
  const StopSignals stop;  // before the first thread starts
  if (resume == "none") resume.clear();
  log::set_rank(job.rank);
  if (config.parallel.nproc != job.world) {
    throw ConfigError(fmt::format("parallel.nproc = {} but this job has {} ranks (set parallel.nproc = {})",
                                  config.parallel.nproc, job.world, job.world));
  }
  // An agent holds the run directory's lock for its workers; ranks started without one (Slurm,
  // torchrun-style) share it as one job: the same token and round.
  std::optional<RunLock> lock;
  if (heartbeat.empty()) lock.emplace(run_dir, comm::auth::job_namespace(job.token) + "." + job.round);
  if (resume.empty()) checkpoint::refuse_fresh_run_over_checkpoints(run_dir, config.checkpoint.mirror_dir);
  if (job.rank == 0) {
    std::error_code ec;
    fs::create_directories(run_dir, ec);
    if (ec) throw IoError(fmt::format("cannot create run directory {}: {}", run_dir, ec.message()));
    // Atomically: the other workers may be reading this very file as their CONFIG right now
    // (`tessera train --nproc N` starts them on RUN/config.toml).
    write_file_atomic(run_dir + "/config.toml", config::to_toml(config));
  }
  const std::string dataset = resolve_dataset(config);
  // torchrun-style: rank 0 serves the job's TCP store at MASTER_ADDR:MASTER_PORT.
  std::unique_ptr<comm::TcpStoreServer> server;
  const comm::StoreUrl url = comm::parse_store_url(job.store);
  if (url.kind == comm::StoreUrl::Kind::kTcp && job.rank == 0) {
    const size_t colon = url.endpoint.rfind(':');
    server = std::make_unique<comm::TcpStoreServer>(url.endpoint.substr(0, colon),
                                                    std::stoi(url.endpoint.substr(colon + 1)), job.token);
  }
  // Local rank i computes on GPU i (nodes hold contiguous ranks); the device comes first, since a
  // GPU job's groups are made on it.
  const int per_node = job.ranks_per_node > 0 ? job.ranks_per_node : job.world;
  const int local_rank = job.rank % per_node;
  ComputeDevice device(config, job.world, local_rank, per_node);
  // Before the compute threads start. Ranks an agent started share its CPUs and are split here;
  // ranks that srun or torchrun started are placed by them (srun --cpu-bind).
  if (!heartbeat.empty()) device.bind_cpus(config, local_rank, per_node);
  configure_threads(config);
  std::optional<NcclTransportReport> nccl;
  if (device.nccl_device() >= 0 && job.world > 1) nccl.emplace(run_dir, job.rank);
  parallel::JobAddress address = job;
  address.transport = parallel::host_transport(config);
  const parallel::Job joined(address, parallel::dims_for(config, job.world), comm::Millis(config.parallel.timeout_ms),
                             device.nccl_device());
  train_worker(config, dataset, run_dir, resume, joined.view(), device, heartbeat, nccl ? &*nccl : nullptr);
  // The store may still be read (a checkpoint outcome) until every rank is done.
  if (url.kind == comm::StoreUrl::Kind::kTcp && joined.view().world() != nullptr) {
    joined.view().world()->barrier({comm::Millis(config.parallel.timeout_ms)})->wait();
  }
}

}  // namespace tessera::train
