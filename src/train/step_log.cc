// The record of each training step: metrics.jsonl, the log and Prometheus (docs/metrics.md).
#include "train/step_log.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "core/file_io.h"
#include "core/host.h"
#include "core/json.h"
#include "core/log.h"
#include "core/threads.h"
#include "core/timer.h"
#include "tessera/build_config.h"

namespace tessera::train {
namespace {

// Keeps the records of steps up to `step` (a resumed run rewrites the ones after it).
void truncate_metrics(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string line, kept;
  while (std::getline(in, line)) {
    const nlohmann::json r = parse_json(line);
    if (r.is_object() && r.contains("step") && r["step"].is_number_integer() && r["step"].get<int64_t>() <= step) {
      kept += line + "\n";
    }
  }
  write_file_atomic(path, kept);
}

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(std::max(0.0, seconds) + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, s / 60 % 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

}  // namespace

std::string format_count(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

metrics::Peak job_peak(const config::Config& config, const parallel::Distributed& dist, const ComputeDevice& device) {
  const int world = dist.world_size();
  const double configured = config.metrics.peak_flops;
  if (configured < 0) return {};
  if (configured > 0) {
    return {configured * world,
            fmt::format("configured: metrics.peak_flops = {:.4g} FLOP/s per rank x {} rank(s)", configured, world)};
  }
  const std::string dtype = config::name(config.parallel.param_dtype);
  if (device.cuda()) {
    const std::string gemm = dtype == "fp32" && config.model.allow_tf32 ? "tf32" : dtype;
    const std::optional<double> peak = metrics::gpu_peak_flops(device.gpu_name(), gemm);
    if (!peak) {
      log::warn("no datasheet {} peak for {}: set metrics.peak_flops for MFU", gemm, device.gpu_name());
      return {};
    }
    return {*peak * world, fmt::format("datasheet: dense {} peak of {} x {} rank(s)", gemm, device.gpu_name(), world)};
  }
  // Training runs on the CPU: each rank measures its GEMM throughput, all at once.
  const double t0 = now_seconds();
  float sum = static_cast<float>(metrics::calibrate_cpu_peak(dtype));
  if (dist.world() != nullptr) {
    dist.world()->all_reduce(&sum, 1, comm::DType::kF32, {comm::Millis(config.parallel.timeout_ms)})->wait();
  }
  metrics::Peak peak{sum, fmt::format("measured: best {} GEMM 1024^3 on {} thread(s) per rank, summed over {} "
                                      "rank(s)",
                                      dtype, num_threads(), world)};
  log::info("MFU peak: {:.1f} GFLOP/s ({}; {:.2f}s)", peak.flops_per_s / 1e9, peak.source, now_seconds() - t0);
  return peak;
}

std::vector<int> StragglerWatch::update(const std::vector<double>& busy, std::vector<int>* newly) {
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

double StragglerWatch::median_of_others(const std::vector<double>& busy, int rank) {
  others_.clear();
  for (int o = 0; o < static_cast<int>(busy.size()); ++o) {
    if (o != rank) others_.push_back(busy[o]);
  }
  std::nth_element(others_.begin(), others_.begin() + others_.size() / 2, others_.end());
  return others_[others_.size() / 2];
}

StepLog::StepLog(const config::Config& config, const std::string& run_dir, const parallel::Distributed& dist,
                 const metrics::Peak& peak, int64_t first_step, const ComputeDevice& device)
    : config_(config),
      metrics_path_(run_dir + "/metrics.jsonl"),
      leader_(dist.rank() == 0),
      peak_(peak),
      flops_per_token_(model::flops_per_token(config.model)),
      first_step_(first_step),
      start_(now_seconds()),
      terminal_(leader_ && ::isatty(STDOUT_FILENO) == 1),
      stragglers_(config.metrics.straggler_factor, config.metrics.straggler_steps, dist.world_size()),
      device_(device),
      host_(host_name()) {
  if (!leader_) return;
  if (first_step > 0) truncate_metrics(metrics_path_, first_step);
  metrics_.open(metrics_path_, first_step > 0 ? std::ios::app : std::ios::trunc);
  if (!metrics_) throw IoError(fmt::format("cannot write {}", metrics_path_));
  if (config.metrics.prometheus_port > 0) {
    prometheus_ = std::make_unique<metrics::PrometheusServer>(config.metrics.prometheus_host,
                                                              static_cast<int>(config.metrics.prometheus_port));
  }
}

StepLog::~StepLog() {
  if (terminal_) log::progress("");
}

void StepLog::record(const Trainer& trainer, const StepStats& s, const Extra& extra) {
  const std::vector<double>& busy = trainer.rank_busy_seconds();
  const std::vector<int> slow = stragglers_.update(busy, &new_stragglers_);
  if (!leader_) return;
  for (const int r : new_stragglers_) {
    log::warn(
        "rank {} is a straggler: busy {:.3f} s per step against {:.3f} s (median of the others) for {} "
        "steps in a row (metrics.straggler_factor {}, metrics.straggler_steps {})",
        r, busy[r], stragglers_.median_of_others(busy, r), config_.metrics.straggler_steps,
        config_.metrics.straggler_factor, config_.metrics.straggler_steps);
  }
  if (extra.val_loss) last_val_loss_ = extra.val_loss;
  last_gpu_ = device_.gpu_reading();
  const StepTimes& t = s.times;
  total_.data_wait += t.data_wait;
  total_.forward += t.forward;
  total_.backward += t.backward;
  total_.comm += t.comm;
  total_.optimizer += t.optimizer;
  total_checkpoint_s_ += extra.checkpoint_s;
  Rates r;
  r.elapsed = now_seconds() - start_;
  r.tokens_per_s = static_cast<double>(s.tokens) / s.seconds;
  r.flops = r.tokens_per_s * flops_per_token_;
  r.mfu = metrics::mfu(r.flops, peak_);
  r.eta = r.elapsed / static_cast<double>(s.step - first_step_) *
          static_cast<double>(std::max<int64_t>(config_.train.max_steps - s.step, 0));
  metrics_ << dump_json(metrics_record(trainer, s, extra, slow, r)) << '\n';
  metrics_.flush();
  if (prometheus_) prometheus_->publish(prometheus_page(trainer, s, extra, slow, r.eta));
  print(s, extra, r);
}

nlohmann::ordered_json StepLog::metrics_record(const Trainer& trainer, const StepStats& s, const Extra& extra,
                                               const std::vector<int>& stragglers, const Rates& r) const {
  const StepTimes& t = s.times;
  nlohmann::ordered_json record = {
      {"step", s.step},
      {"time", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
      {"elapsed_s", r.elapsed},
      {"loss", s.loss},
      {"lr", s.lr},
      {"grad_norm", s.grad_norm},
      {"tokens", trainer.state().tokens},
      {"step_s", s.seconds},
      {"data_wait_s", t.data_wait},
      {"forward_s", t.forward},
      {"backward_s", t.backward},
      {"comm_s", t.comm},
      {"optimizer_s", t.optimizer},
      {"other_s", s.seconds - t.accounted()},
      {"checkpoint_s", extra.checkpoint_s},
      {"tokens_per_s", r.tokens_per_s},
      {"model_flops_per_s", r.flops}};
  if (r.mfu) record["mfu"] = *r.mfu;
  if (config_.parallel.tensor > 1) record["comm_tp_s"] = t.comm_tp;
  if (const int64_t P = config_.parallel.pipeline; P > 1) {
    record["comm_pp_s"] = t.comm_pp;
    record["pipeline_bubble"] = static_cast<double>(P - 1) / static_cast<double>(config_.accumulation_steps() + P - 1);
  }
  if (extra.upload_failures >= 0) record["checkpoint_upload_failures"] = extra.upload_failures;
  record["rss_bytes"] = trainer.memory().resident;
  record["peak_rss_bytes"] = trainer.memory().peak;
  if (extra.val_loss) {
    record["val_loss"] = *extra.val_loss;
    record["val_tokens"] = extra.val_tokens;
    record["eval_s"] = extra.eval_s;
  }
  if (trainer.rank_busy_seconds().size() > 1) {
    record["rank_busy_s"] = trainer.rank_busy_seconds();
    record["rank_rss_bytes"] = trainer.rank_resident_bytes();
  }
  if (!stragglers.empty()) record["stragglers"] = stragglers;
  if (s.skipped) record["skipped"] = true;
  if (s.skipped_total > 0) record["skipped_steps"] = s.skipped_total;
  if (last_gpu_) record["gpu"] = metrics::gpu_json(*last_gpu_);
  return record;
}

void StepLog::print(const StepStats& s, const Extra& extra, const Rates& r) {
  const std::string mfu_text = r.mfu ? fmt::format(" MFU {:.1f}%", *r.mfu * 100) : "";
  const bool last = s.step >= config_.train.max_steps;
  if (terminal_ && (last || now_seconds() - last_progress_ >= 0.1)) {  // at most 10 redraws a second
    last_progress_ = now_seconds();
    log::progress(fmt::format("step {}/{} loss {:.4f}{} | {} tok/s{} | eta {}", s.step, config_.train.max_steps, s.loss,
                              last_val_loss_ ? fmt::format(" val {:.4f}", *last_val_loss_) : "",
                              format_count(r.tokens_per_s), mfu_text, format_duration(r.eta)));
  }
  if (s.step % config_.metrics.log_interval == 0 || last || extra.val_loss) {
    const std::string line = fmt::format(
        "step {:>5}/{} loss {:.4f}{} lr {:.2e} grad_norm {:.3f} {} tok/s {:.1f} GFLOP/s{} eta {}", s.step,
        config_.train.max_steps, s.loss, extra.val_loss ? fmt::format(" val_loss {:.4f}", *extra.val_loss) : "", s.lr,
        s.grad_norm, format_count(r.tokens_per_s), r.flops / 1e9, mfu_text, format_duration(r.eta));
    // Evaluations stay on the terminal; the progress line stands for the rest.
    if (extra.val_loss) {
      log::info("{}", line);
    } else {
      log::detail("{}", line);
    }
  }
}

std::string StepLog::prometheus_page(const Trainer& trainer, const StepStats& s, const Extra& extra,
                                     const std::vector<int>& stragglers, double eta) const {
  metrics::Exposition e;
  const config::Config& c = config_;
  const double tokens_per_s = static_cast<double>(s.tokens) / s.seconds;
  e.gauge("tessera_info", "What runs: Tessera's version, the model preset, the sharding strategy and precision.", 1,
          {{"version", TESSERA_VERSION},
           {"preset", c.model.preset},
           {"strategy", c.parallel.nproc > 1 ? config::name(c.parallel.strategy) : "single"},
           {"param_dtype", config::name(c.parallel.param_dtype)}});
  e.gauge("tessera_world_size", "Ranks in the job.", c.parallel.nproc);
  e.gauge("tessera_step", "The last optimizer step taken.", static_cast<double>(s.step));
  e.gauge("tessera_max_steps", "train.max_steps.", static_cast<double>(c.train.max_steps));
  e.counter("tessera_steps_total", "Optimizer steps taken (a resumed run starts at its checkpoint's step).",
            static_cast<double>(s.step));
  e.counter("tessera_tokens_total", "Training tokens seen.", static_cast<double>(trainer.state().tokens));
  e.counter("tessera_skipped_steps_total", "Updates skipped as non-finite.", static_cast<double>(s.skipped_total));
  e.counter("tessera_checkpoint_upload_failures_total",
            "Checkpoint uploads to the object-store tier that failed for good (0 without one).",
            static_cast<double>(std::max<int64_t>(extra.upload_failures, 0)));
  e.gauge("tessera_loss", "The last step's mean training loss (nats/token).", s.loss);
  if (last_val_loss_) e.gauge("tessera_validation_loss", "The last validation loss (nats/token).", *last_val_loss_);
  e.gauge("tessera_learning_rate", "The last step's learning rate.", s.lr);
  e.gauge("tessera_grad_norm", "The last step's gradient norm before clipping.", s.grad_norm);
  e.gauge("tessera_tokens_per_second", "The last step's global training throughput.", tokens_per_s);
  e.gauge("tessera_model_flops_per_second", "The last step's model FLOP/s (docs/metrics.md).",
          tokens_per_s * flops_per_token_);
  if (peak_.known()) {
    e.gauge("tessera_peak_flops_per_second", "The job's peak FLOP/s that MFU is measured against.", peak_.flops_per_s);
    e.gauge("tessera_mfu_ratio", "Model FLOP utilization: model FLOP/s / peak.",
            tokens_per_s * flops_per_token_ / peak_.flops_per_s);
  }
  e.gauge("tessera_step_duration_seconds", "The last step's wall time on rank 0.", s.seconds);
  const StepTimes& t = s.times;
  const struct {
    const char* name;
    double last, total;
  } phases[] = {{"data_wait", t.data_wait, total_.data_wait}, {"forward", t.forward, total_.forward},
                {"backward", t.backward, total_.backward},    {"comm", t.comm, total_.comm},
                {"optimizer", t.optimizer, total_.optimizer}, {"checkpoint", extra.checkpoint_s, total_checkpoint_s_}};
  const char* split_help = "The last step's time split by phase (docs/metrics.md).";
  for (const auto& p : phases) {
    e.gauge("tessera_step_phase_seconds", split_help, p.last, {{"phase", p.name}});
    e.counter("tessera_phase_seconds_total", "Step time by phase, summed over this process's steps.", p.total,
              {{"phase", p.name}});
  }
  // "other" is bookkeeping, noise around zero: not summed.
  e.gauge("tessera_step_phase_seconds", split_help, s.seconds - t.accounted(), {{"phase", "other"}});
  e.gauge("tessera_eta_seconds", "Estimated seconds to train.max_steps.", eta);
  if (last_gpu_) metrics::expose_gpus(e, {*last_gpu_}, host_);
  // Per rank (families stay together in the page whatever the order they are added in).
  const std::vector<double>& busy = trainer.rank_busy_seconds();
  for (size_t r = 0; r < busy.size(); ++r) {
    const metrics::Labels rank = {{"rank", std::to_string(r)}};
    const bool flagged = std::find(stragglers.begin(), stragglers.end(), static_cast<int>(r)) != stragglers.end();
    e.gauge("tessera_rank_busy_seconds", "Each rank's last forward and backward compute time.", busy[r], rank);
    e.gauge("tessera_rank_resident_memory_bytes", "Each rank's resident memory.",
            static_cast<double>(trainer.rank_resident_bytes()[r]), rank);
    e.gauge("tessera_rank_peak_resident_memory_bytes", "Each rank's peak resident memory.",
            static_cast<double>(trainer.rank_peak_resident_bytes()[r]), rank);
    e.gauge("tessera_rank_straggler", "1 while the rank is flagged as a straggler.", flagged ? 1 : 0, rank);
  }
  return e.text();
}

void StepLog::finish() {
  if (terminal_) log::progress("");
  if (leader_ && !metrics_) throw IoError(fmt::format("cannot write {}", metrics_path_));
}

}  // namespace tessera::train
