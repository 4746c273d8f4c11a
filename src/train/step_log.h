// The record of each training step, as it happens (docs/metrics.md): RUN/metrics.jsonl, the
// progress line or periodic log lines, the Prometheus endpoint, and straggler warnings. The HTML
// page drawn from metrics.jsonl afterwards is metrics/report.
#pragma once

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "metrics/gpu.h"
#include "metrics/mfu.h"
#include "metrics/prometheus.h"
#include "train/device.h"
#include "train/trainer.h"

namespace tessera::train {

// 1234 -> "1.2k", 3.4e6 -> "3.40M".
std::string format_count(double n);

// The job's peak FLOP/s for MFU: metrics.peak_flops per rank when set; on a GPU its datasheet
// dense peak for the compute precision (bf16, fp32, or tf32 with model.allow_tf32); otherwise
// every rank measures its own (metrics::calibrate_cpu_peak) and the ranks sum them (a collective).
metrics::Peak job_peak(const config::Config& config, const parallel::Distributed& dist, const ComputeDevice& device);

// RELIABILITY row 17: a rank whose busy time stays above `factor` x the median of the other
// ranks' for `steps` steps in a row is a straggler (its peers spend that time waiting for it).
class StragglerWatch {
 public:
  StragglerWatch(double factor, int64_t steps, int world) : factor_(factor), steps_(steps), run_(world, 0) {}
  // The ranks flagged after this step; `newly` gets those flagged for the first time in a row.
  std::vector<int> update(const std::vector<double>& busy, std::vector<int>* newly);
  double median_of_others(const std::vector<double>& busy, int rank);

 private:
  double factor_;
  int64_t steps_;
  std::vector<int64_t> run_;  // consecutive slow steps per rank
  std::vector<double> others_;
};

// Every rank keeps one (all know every rank's figures after a step); rank 0 writes.
class StepLog {
 public:
  // Opens RUN/metrics.jsonl (keeping the records up to `first_step` of a resumed run) and, with
  // metrics.prometheus_port set, the endpoint.
  // `device`'s GPU reading (none on the CPU) goes into each record's "gpu" and the page's
  // DCGM_FI_DEV_* families.
  StepLog(const config::Config& config, const std::string& run_dir, const parallel::Distributed& dist,
          const metrics::Peak& peak, int64_t first_step, const ComputeDevice& device);
  ~StepLog();

  // What happened around the step besides Trainer::step.
  struct Extra {
    std::optional<double> val_loss;  // on evaluation steps
    int64_t val_tokens = 0;          // the validation targets it counted
    double eval_s = 0.0;
    double checkpoint_s = 0.0;  // the step loop's stall for a save after the step
    // Uploads to the object-store tier that failed for good so far (rank 0); -1: no such tier.
    int64_t upload_failures = -1;
  };
  void record(const Trainer& trainer, const StepStats& s, const Extra& extra);
  // Ends the progress line; throws IoError if metrics.jsonl could not be written.
  void finish();

 private:
  struct Rates {  // of the step just taken
    double elapsed = 0.0, tokens_per_s = 0.0, flops = 0.0, eta = 0.0;
    std::optional<double> mfu;
  };
  nlohmann::ordered_json metrics_record(const Trainer& trainer, const StepStats& s, const Extra& extra,
                                        const std::vector<int>& stragglers, const Rates& r) const;
  void print(const StepStats& s, const Extra& extra, const Rates& r);  // progress line, log lines
  std::string prometheus_page(const Trainer& trainer, const StepStats& s, const Extra& extra,
                              const std::vector<int>& stragglers, double eta) const;

  const config::Config& config_;
  std::string metrics_path_;
  bool leader_;
  metrics::Peak peak_;
  double flops_per_token_;
  int64_t first_step_;
  double start_;
  bool terminal_;  // rank 0's stdout is a terminal: the progress line
  double last_progress_ = 0.0;
  std::ofstream metrics_;
  std::unique_ptr<metrics::PrometheusServer> prometheus_;
  StragglerWatch stragglers_;
  std::vector<int> new_stragglers_;
  std::optional<double> last_val_loss_;
  const ComputeDevice& device_;
  const std::string host_;                       // the GPU families' Hostname label
  std::optional<metrics::GpuReading> last_gpu_;  // read at this step's record
  StepTimes total_;  // summed over this process's steps, for the _total counters
  double total_checkpoint_s_ = 0.0;
};

}  // namespace tessera::train
