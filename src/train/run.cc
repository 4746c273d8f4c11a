// `tessera train`: the step loop.
#include "train/run.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/directory.h"
#include "core/check.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/log.h"
#include "core/parallel.h"
#include "core/signals.h"
#include "core/timer.h"
#include "train/bundled.h"
#include "train/checkpointer.h"
#include "train/distributed.h"
#include "train/health.h"
#include "train/trainer.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;

std::ofstream open_for_write(const std::string& path) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) throw IoError(fmt::format("cannot write {}: {}", path, std::strerror(errno)));
  return out;
}

std::string format_count(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

}  // namespace

std::string resolve_dataset(const config::Config& config) {
  if (config.data.synthetic) return "";
  if (config.data.dataset == "bundled") return ensure_bundled_dataset(config.data.cache_dir, config.model.vocab_size);
  if (!fs::exists(fs::path(config.data.dataset) / "manifest.json")) {
    throw DataError(fmt::format("data.dataset = {}: no manifest.json there (prepare one with `tessera prepare`)",
                                config.data.dataset));
  }
  return config.data.dataset;
}

TrainedModel load_trained(const std::string& checkpoint, const std::string& tokenizer) {
  TrainedModel out;
  const fs::path path(checkpoint);
  const bool is_dir = fs::is_directory(path);
  const std::string weights = is_dir ? (path / "model.safetensors").string() : checkpoint;
  const std::string sharded = is_dir && !fs::exists(weights) ? checkpoint::checkpoint_in(checkpoint) : "";
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
  const fs::path beside = dir / "tokenizer.model";
  out.tokenizer_path = !tokenizer.empty() ? tokenizer : fs::exists(beside) ? beside.string() : "";
  if (std::ifstream in(dir / "run.json"); in) {
    const nlohmann::json info = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (info.is_object() && info.contains("dataset") && info["dataset"].is_string()) out.dataset = info["dataset"];
  }
  return out;
}

namespace {

// Signals a rank raises in Trainer::step; all ranks act on their OR after the same step.
enum : uint32_t { kStopRequested = 1, kSaveDue = 2, kSaveFailed = 4 };

// Keeps the records of steps up to `step` (a resumed run rewrites the ones after it).
void truncate_metrics(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string line, kept;
  while (std::getline(in, line)) {
    const nlohmann::json r = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (r.is_object() && r.contains("step") && r["step"].is_number_integer() && r["step"].get<int64_t>() <= step) {
      kept += line + "\n";
    }
  }
  write_file_atomic(path, kept);
}

// The step a worker has reached, for its agent's hang watchdog: "STEP\n" rewritten in place after
// every step (no fsync: the agent reads it through the page cache). Inert without a path.
class Heartbeat {
 public:
  explicit Heartbeat(const std::string& path) {
    if (!path.empty()) fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (!path.empty() && fd_ < 0) log::warn("cannot write the heartbeat file {}: {}", path, std::strerror(errno));
  }
  ~Heartbeat() {
    if (fd_ >= 0) ::close(fd_);
  }
  void beat(int64_t step) {
    if (fd_ < 0) return;
    const std::string text = fmt::format("{:<20}\n", step);
    if (::pwrite(fd_, text.data(), text.size(), 0) < 0) log::debug("heartbeat write failed: {}", std::strerror(errno));
  }

 private:
  int fd_ = -1;
};

// RELIABILITY row 17: a rank whose busy time stays above `factor` x the median of the other
// ranks' for `steps` steps in a row is a straggler (its peers spend that time waiting for it).
class StragglerWatch {
 public:
  StragglerWatch(double factor, int64_t steps, int world) : factor_(factor), steps_(steps), run_(world, 0) {}
  // The ranks flagged after this step; `newly` gets those flagged for the first time in a row.
  std::vector<int> update(const std::vector<double>& busy, std::vector<int>* newly) {
    std::vector<int> flagged;
    newly->clear();
    const int world = static_cast<int>(busy.size());
    for (int r = 0; r < world && world > 1; ++r) {
      run_[r] = busy[r] > factor_ * median_of_others(busy, r) ? run_[r] + 1 : 0;
      if (run_[r] >= steps_) flagged.push_back(r);
      if (run_[r] == steps_) newly->push_back(r);
    }
    return flagged;
  }
  double median_of_others(const std::vector<double>& busy, int rank) {
    others_.clear();
    for (int o = 0; o < static_cast<int>(busy.size()); ++o) {
      if (o != rank) others_.push_back(busy[o]);
    }
    std::nth_element(others_.begin(), others_.begin() + others_.size() / 2, others_.end());
    return others_[others_.size() / 2];
  }

 private:
  double factor_;
  int64_t steps_;
  std::vector<int64_t> run_;  // consecutive slow steps per rank
  std::vector<double> others_;
};

// One worker's training loop; rank 0 writes the run's files and logs job-wide figures.
void train_worker(const config::Config& config, const std::string& dataset, const std::string& run_dir,
                  const std::string& resume, const Distributed& dist, const std::string& heartbeat_path = "") {
  Heartbeat heartbeat(heartbeat_path);
  std::error_code ec;
  const bool leader = dist.topology.rank == 0;
  const std::string config_toml = config::to_toml(config);
  Trainer trainer(config, dataset, dist);
  if (!leader) log::set_level(std::max(log::level(), log::Level::kWarn));
  health_check(dist, config);  // every rank, before any time goes into training
  const model::ModelConfig& m = config.model;
  log::info("model {}: {} parameters ({} layers, dim {}, {} heads / {} kv, ffn {}, vocab {}, seq {})", m.preset,
            format_count(static_cast<double>(model::parameter_count(m))), m.n_layers, m.dim, m.n_heads, m.n_kv_heads,
            m.ffn_hidden, m.vocab_size, m.seq_len);
  log::info("batch {} sequences = {} tokens/step; {} process(es) x {} thread(s), {} ({} micro-batches of {} per "
            "rank); memory per rank: state {} MB, activations {} MB",
            config.train.batch_size, config.tokens_per_step(), dist.topology.world, num_threads(),
            dist.topology.world > 1 ? config.parallel.strategy : "single process",
            config.accumulation_steps(), config.micro_batch(),
            trainer.state_bytes() >> 20, trainer.activation_bytes() >> 20);

  nlohmann::ordered_json run_info = {{"config", "config.toml"}};
  const data::DatasetManifest* manifest = trainer.dataset();
  if (manifest != nullptr && leader) {
    const fs::path tokenizer = fs::path(dataset) / manifest->tokenizer_file;
    fs::copy_file(tokenizer, fs::path(run_dir) / "tokenizer.model", fs::copy_options::overwrite_existing, ec);
    if (ec) throw IoError(fmt::format("cannot copy {} into {}: {}", tokenizer.string(), run_dir, ec.message()));
    run_info["dataset"] = fs::absolute(dataset).string();
    run_info["tokenizer"] = "tokenizer.model";
    log::info("data: {} ({} train / {} validation tokens); unigram entropy {:.4f} nats/token", dataset,
              format_count(static_cast<double>(manifest->train.tokens)),
              format_count(static_cast<double>(manifest->val.tokens)), manifest->unigram_entropy);
  } else {
    log::info("data: synthetic tokens (seed {})", config.train.seed);
  }
  if (config.checkpoint.save_final) run_info["weights"] = "model.safetensors";
  const std::string root = run_dir + "/checkpoints";
  std::vector<std::string> candidates;
  if (!resume.empty()) {
    candidates = resume_candidates(config, root, resume);
  } else if (const int64_t latest = checkpoint::read_latest(root); latest >= 0) {
    throw ConfigError(fmt::format("{} already holds checkpoints (latest: {}); continue it with --resume auto, or "
                                  "train in another --run-dir",
                                  root, checkpoint::step_dir_name(latest)));
  }
  Checkpointer checkpointer(config, root, dist);
  if (!candidates.empty()) {
    const double t0 = now_seconds();
    const std::string loaded = resume_from(trainer, candidates);
    if (leader) checkpoint::remove_newer(root, trainer.steps_done());
    log::info("resumed from {} in {:.2f}s: step {}, {} tokens seen, data position {}", loaded, now_seconds() - t0,
              trainer.steps_done(), format_count(static_cast<double>(trainer.state().tokens)),
              trainer.state().sampler_position);
  } else if (resume == "auto") {
    log::info("no checkpoint in {}: starting from step 0", root);
  }
  std::ofstream metrics;
  if (leader) {
    open_for_write(run_dir + "/run.json") << run_info.dump(2) << '\n';
    if (trainer.steps_done() > 0) {
      truncate_metrics(run_dir + "/metrics.jsonl", trainer.steps_done());
      metrics.open(run_dir + "/metrics.jsonl", std::ios::app);
      if (!metrics) throw IoError(fmt::format("cannot append to {}/metrics.jsonl", run_dir));
    } else {
      metrics = open_for_write(run_dir + "/metrics.jsonl");
    }
  }
  const double flops_per_token = model::flops_per_token(m);
  const config::CheckpointConfig& ckpt = config.checkpoint;
  const int64_t first_step = trainer.steps_done();
  double val_loss = NAN, last_save = now_seconds();
  const double start = now_seconds();
  auto finished = [&] {
    return trainer.steps_done() >= config.train.max_steps ||
           (config.train.max_tokens > 0 && trainer.state().tokens >= config.train.max_tokens);
  };
  auto save = [&](const char* why) {
    const double stall = checkpointer.save(trainer);
    last_save = now_seconds();
    log::info("checkpoint step {} ({}): step loop stalled {:.1f} ms; writing in the background", trainer.steps_done(),
              why, stall * 1e3);
  };
  bool stopped = false;
  StragglerWatch stragglers(config.metrics.straggler_factor, config.metrics.straggler_steps, dist.topology.world);
  std::vector<int> new_stragglers;
  while (!finished()) {
    uint32_t raise = 0;
    if (StopSignals::received() != 0) raise |= kStopRequested;
    if (ckpt.interval_minutes > 0 && now_seconds() - last_save >= ckpt.interval_minutes * 60) raise |= kSaveDue;
    if (checkpointer.take_failure() && ckpt.on_failure == "stop") raise |= kSaveFailed;
    const StepStats s = trainer.step(raise);
    heartbeat.beat(s.step);
    const int64_t tokens = trainer.state().tokens;
    const bool last = finished();
    const bool eval = config.train.eval_interval > 0 && (s.step % config.train.eval_interval == 0 || last);
    if (eval) val_loss = trainer.evaluate();
    const double tokens_per_s = static_cast<double>(s.tokens) / s.seconds;
    nlohmann::ordered_json record = {{"step", s.step},
                                     {"loss", s.loss},
                                     {"lr", s.lr},
                                     {"grad_norm", s.grad_norm},
                                     {"tokens", tokens},
                                     {"step_s", s.seconds},
                                     {"tokens_per_s", tokens_per_s},
                                     {"model_flops_per_s", tokens_per_s * flops_per_token}};
    if (eval) record["val_loss"] = val_loss;
    const std::vector<double>& busy = trainer.rank_busy_seconds();
    if (busy.size() > 1) {
      record["rank_busy_s"] = busy;
      const std::vector<int> slow = stragglers.update(busy, &new_stragglers);
      if (!slow.empty()) record["stragglers"] = slow;
      for (const int r : leader ? new_stragglers : std::vector<int>{}) {
        log::warn("rank {} is a straggler: busy {:.3f} s per step against {:.3f} s (median of the others) for {} "
                  "steps in a row (metrics.straggler_factor {}, metrics.straggler_steps {})",
                  r, busy[r], stragglers.median_of_others(busy, r), config.metrics.straggler_steps,
                  config.metrics.straggler_factor, config.metrics.straggler_steps);
      }
    }
    if (s.skipped_total > 0) record["skipped_steps"] = s.skipped_total;
    if (s.skipped) record["skipped"] = true;
    if (leader) {
      metrics << record.dump() << '\n';
      metrics.flush();
    }
    if (s.step % config.metrics.log_interval == 0 || eval || last) {
      const double elapsed = now_seconds() - start;
      const double eta = elapsed / static_cast<double>(s.step - first_step) *
                         static_cast<double>(config.train.max_steps - s.step);
      log::info("step {:>5}/{} loss {:.4f}{} lr {:.2e} grad_norm {:.3f} {} tok/s {:.1f} GFLOP/s eta {:.0f}s", s.step,
                config.train.max_steps, s.loss, eval ? fmt::format(" val_loss {:.4f}", val_loss) : "", s.lr,
                s.grad_norm, format_count(tokens_per_s), tokens_per_s * flops_per_token / 1e9, eta);
    }
    if (s.signals & kSaveFailed) {
      throw IoError(fmt::format("step {}: a checkpoint save failed and checkpoint.on_failure = stop; the last "
                                "committed checkpoint is intact",
                                s.step));
    }
    if (s.signals & kStopRequested) {
      log::warn("stop requested (signal) at step {}: saving a checkpoint and exiting", s.step);
      save("stop");
      stopped = true;
      break;
    }
    if ((s.signals & kSaveDue) || (ckpt.interval_steps > 0 && s.step % ckpt.interval_steps == 0) ||
        (last && ckpt.enabled())) {
      save(s.signals & kSaveDue ? "time interval" : last ? "end" : "step interval");
    }
  }
  if (!checkpointer.wait()) {
    if (stopped || ckpt.on_failure == "stop") {
      throw IoError("the last checkpoint save failed (see above); the previous committed checkpoint is intact");
    }
  }
  if (leader && !metrics) throw IoError(fmt::format("cannot write {}/metrics.jsonl", run_dir));
  if (stopped) {
    log::info("stopped at step {} with checkpoint {}", trainer.steps_done(),
              checkpoint::step_dir_name(trainer.steps_done()));
    return;
  }
  if (config.checkpoint.save_final) {
    auto tensors = trainer.params().gather_named_tensors();  // a collective: every rank takes part
    if (leader) {
      const std::string path = run_dir + "/model.safetensors";
      checkpoint::write_safetensors(path, tensors, {{"tessera_config", config_toml}});
      log::info("wrote {}", path);
    }
  }
  log::info("done: {} steps, {} tokens in {:.1f}s", trainer.steps_done(),
            format_count(static_cast<double>(trainer.state().tokens)), now_seconds() - start);
  if (manifest != nullptr && !std::isnan(val_loss)) {
    log::info("validation loss {:.4f} nats/token (perplexity {:.1f}) vs unigram entropy {:.4f} ({})", val_loss,
              std::exp(val_loss), manifest->unigram_entropy,
              val_loss < manifest->unigram_entropy ? fmt::format("{:.2f} below", manifest->unigram_entropy - val_loss)
                                                   : std::string("not below"));
  }
}

}  // namespace

void run_training(const config::Config& config, const std::string& run_dir, const std::string& resume) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) throw IoError(fmt::format("cannot create run directory {}: {}", run_dir, ec.message()));
  open_for_write(run_dir + "/config.toml") << config::to_toml(config);
  const std::string dataset = resolve_dataset(config);  // once, before any worker starts
  // Several local workers are the single-node case of `tessera launch` (launch::run_local_job).
  CHECK_MSG(config.parallel.nproc == 1, "run_training runs one process; launch::run_local_job runs several");
  const StopSignals stop;  // before the first thread starts
  configure_threads(config);
  train_worker(config, dataset, run_dir, resume, {});
}

void run_worker(const config::Config& config, const std::string& run_dir, const WorkerEnv& env,
                std::string resume) {
  const StopSignals stop;  // before the first thread starts
  if (resume == "none") resume.clear();
  log::set_rank(env.rank);
  if (config.parallel.nproc != env.world) {
    throw ConfigError(fmt::format("parallel.nproc = {} but this job has {} ranks (set parallel.nproc = {})",
                                  config.parallel.nproc, env.world, env.world));
  }
  if (env.rank == 0) {
    std::error_code ec;
    fs::create_directories(run_dir, ec);
    if (ec) throw IoError(fmt::format("cannot create run directory {}: {}", run_dir, ec.message()));
    // Atomically: the other workers may be reading this very file as their CONFIG right now
    // (`tessera train --nproc N` starts them on RUN/config.toml).
    write_file_atomic(run_dir + "/config.toml", config::to_toml(config));
  }
  const std::string dataset = resolve_dataset(config);
  configure_threads(config);
  // torchrun-style: rank 0 serves the job's TCP store at MASTER_ADDR:MASTER_PORT.
  std::unique_ptr<dist::TcpStoreServer> server;
  const dist::StoreUrl url = dist::parse_store_url(env.rdzv);
  if (url.kind == dist::StoreUrl::Kind::kTcp && env.rank == 0) {
    const size_t colon = url.endpoint.rfind(':');
    server = std::make_unique<dist::TcpStoreServer>(url.endpoint.substr(0, colon),
                                                    std::stoi(url.endpoint.substr(colon + 1)));
  }
  ProcessGroups groups(env.rdzv, env.job_token, env.round, env.rank, env.world, shard_size_of(config, env.world),
                       dist::Millis(config.parallel.timeout_ms), env.host);
  train_worker(config, dataset, run_dir, resume, groups.view(), env.heartbeat);
  // The store may still be read (a checkpoint outcome) until every rank is done.
  if (url.kind == dist::StoreUrl::Kind::kTcp && groups.view().world != nullptr) {
    groups.view().world->barrier({dist::Millis(config.parallel.timeout_ms)})->wait();
  }
}

}  // namespace tessera::train
