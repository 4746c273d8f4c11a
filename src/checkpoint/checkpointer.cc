// Sharded asynchronous checkpoints: the save policy, the writer thread, the commit (the mirror
// thread and the object-store tier: checkpointer_mirror.cc).
#include "checkpoint/checkpointer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/check.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/file_io.h"
#include "core/log.h"
#include "core/timer.h"
#include "parallel/job.h"
#include "storage/object_url.h"

namespace tessera::checkpoint {
namespace {

namespace fs = std::filesystem;

using comm::bytes_of;
using comm::string_of;

IoError injected(const std::string& what) {
  return IoError(fmt::format("cannot write {}: No space left on device (injected fault)", what));
}

}  // namespace

comm::Millis storage_wait(const config::Config& config) {
  constexpr int64_t kAtLeastMs = 30 * 60 * 1000;
  return comm::Millis(std::max<int64_t>(config.parallel.timeout_ms, kAtLeastMs));
}

Checkpointer::Checkpointer(const config::Config& config, const std::string& root, const parallel::Distributed& dist)
    : config_(config),
      root_(root),
      mirror_root_(mirror_root(config.checkpoint.mirror_dir, root)),
      dist_(dist),
      last_save_time_(now_seconds()) {
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) throw IoError(fmt::format("cannot create checkpoint directory {}: {}", root_, ec.message()));
  if (dist_.rank() == 0) {
    // The fence first: from here on a process of an earlier attempt can neither commit nor delete.
    if (!dist_.attempt.empty()) write_file_atomic(fence_path(), dist_.attempt + "\n");
    remove_uncommitted(root_);
  }
  if (dist_.world() != nullptr) {  // no rank writes a checkpoint before the cleanup is done
    dist_.world()->barrier({comm::Millis(config_.parallel.timeout_ms)})->wait();
  }
  // The object-store tier: node k's object is sent by its first rank (k x ranks_per_node), rank 0
  // commits; without a store to agree through, rank 0 sends them all.
  const bool tier = storage::is_s3(mirror_root_);
  const int per_node = tier && dist_.ranks_per_node > 0 && dist_.tier_store != nullptr ? dist_.ranks_per_node : 0;
  nodes_ = per_node > 0 ? (dist_.world_size() + per_node - 1) / per_node : 1;
  node_of_file_.assign(static_cast<size_t>(files()), 0);
  for (int r = 0; r < dist_.world_size(); ++r) {
    if (const int f = file_of_rank(r); f >= 0 && per_node > 0) node_of_file_[static_cast<size_t>(f)] = r / per_node;
  }
  const bool node_uploader = per_node > 0 && dist_.rank() % per_node == 0;
  writer_ = std::thread([this] { writer_loop(); });
  if (!mirror_root_.empty() && dist_.rank() == 0) {
    mirror_ = std::thread([this] { mirror_loop(); });
  } else if (node_uploader) {
    mirror_ = std::thread([this, node = dist_.rank() / per_node] { node_upload_loop(node); });
  }
}

Checkpointer::~Checkpointer() {
  wait();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  writer_.join();
  if (mirror_.joinable()) mirror_.join();
  // Every upload has ended only now: failures after the last step's metrics record (the run can
  // outpace the uploader) are counted here, once (rank 0 counts them).
  if (upload_failures_ > 0) {
    log::warn("{} checkpoint upload(s) to {} failed during the run", upload_failures_, mirror_root_);
  }
  if (storage::is_s3(mirror_root_) && dist_.rank() == 0 && newest_commit_ > newest_in_tier_) {
    log::warn("checkpoint {} is not in {}: a run resumed from it (--resume auto) uploads it",
              step_dir_name(newest_commit_), mirror_root_);
  }
}

double Checkpointer::save(const RankShards& shards, const TrainingState& state) {
  const double t0 = now_seconds();
  wait();  // the host buffer and the store keys belong to the previous save until it is done
  copy_to_host(shards);
  Pending job;
  job.step = state.step;
  job.manifest = manifest_of(state);
  job.refused = first_non_finite(state.step);
  if (!job.refused.empty()) log::error("{}", job.refused);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = std::move(job);
    busy_ = true;
  }
  cv_.notify_all();
  last_started_ = state.step;
  last_save_time_ = now_seconds();
  return now_seconds() - t0;
}

void Checkpointer::copy_to_host(const RankShards& shards) {
  const model::ModelLayout& layout = *shards.layout;
  CHECK(shards.units.size() == static_cast<size_t>(layout.num_units()));
  if (views_.empty()) {
    size_t total = 0;
    for (const UnitShard& u : shards.units) total += 3 * static_cast<size_t>(u.range.size);
    host_ = shards.backend->allocate_host(sizeof(float) * total);
    float* host = reinterpret_cast<float*>(host_.get());
    size_t at = 0;
    for (int u = 0; u < layout.num_units(); ++u) {
      for (const char* kind : Manifest::kKinds) {
        const auto n = static_cast<uint64_t>(shards.units[u].range.size);
        views_.push_back({Manifest::tensor_name(layout.units()[u].name, kind), host + at, n});
        at += n;
      }
    }
  }
  size_t at = 0;  // the same order as views_
  for (const UnitShard& u : shards.units) {
    const auto n = static_cast<size_t>(u.range.size);
    for (const float* from : {u.param, u.exp_avg, u.exp_avg_sq}) {
      shards.backend->to_host(reinterpret_cast<float*>(host_.get()) + at, from, sizeof(float) * n);
      at += n;
    }
  }
}

std::string Checkpointer::first_non_finite(int64_t step) const {
  for (const TensorView& v : views_) {
    for (uint64_t i = 0; i < v.count; ++i) {
      if (!std::isfinite(v.data[i])) {
        return fmt::format("not saving step {}: {}[{}] of this rank's shard is {}", step, v.name, i, v.data[i]);
      }
    }
  }
  return "";
}

Manifest Checkpointer::manifest_of(const TrainingState& state) const {
  Manifest m;
  m.step = state.step;
  m.optimizer_steps = state.optimizer_steps;
  m.tokens = state.tokens;
  m.sampler_position = state.sampler_position;
  m.seed = static_cast<uint64_t>(config_.train.seed);
  m.lr = config_.train.lr;
  m.min_lr = config_.train.min_lr;
  m.warmup_steps = config_.train.warmup_steps;
  m.total_steps = config_.train.max_steps;
  m.decay = config::name(config_.train.lr_decay);
  m.decay_steps = config_.train.lr_decay_steps;
  m.world = dist_.world_size();
  m.shard_size = dist_.mesh->size(parallel::Dim::kDpShard);
  m.tensor_parallel = dist_.mesh->size(parallel::Dim::kTp);
  m.pipeline_parallel = dist_.mesh->size(parallel::Dim::kPp);
  m.strategy = config::name(config_.parallel.strategy);
  m.config_toml = config::to_toml(config_);
  m.created = utc_now();
  // Every stage's units (rank 0, which commits, holds only its own stage's), as the trainer lays
  // them out.
  const int P = m.pipeline_parallel;
  for (int p = 0; p < P; ++p) {
    const model::ModelLayout stage(config_.model, 16 * m.shard_size, {m.tensor_parallel, 0},
                                   model::pipeline_stage(config_.model, P, p, config_.parallel.pipeline_layers));
    for (const model::UnitLayout& u : stage.units()) m.units.push_back(manifest_unit(u, p));
  }
  return m;
}

bool Checkpointer::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !busy_; });
  return outcome_;
}

bool Checkpointer::take_failure() {
  std::lock_guard<std::mutex> lock(mu_);
  const bool failed = save_failed_ || upload_failed_;
  save_failed_ = upload_failed_ = false;
  return failed;
}

bool Checkpointer::save_failure_pending() {
  std::lock_guard<std::mutex> lock(mu_);
  return save_failed_;
}

Checkpointer::Asks Checkpointer::asks() {
  const config::CheckpointConfig& c = config_.checkpoint;
  Asks a;
  a.save_due = c.interval_minutes > 0 && now_seconds() - last_save_time_ >= c.interval_minutes * 60;
  a.failed_and_stop = take_failure() && c.on_failure == config::OnFailure::kStop;
  return a;
}

double Checkpointer::maybe_save(const RankShards& shards, const TrainingState& state, const Asks& job,
                                bool stop_requested, bool last) {
  if (job.failed_and_stop) return 0.0;
  const config::CheckpointConfig& c = config_.checkpoint;
  const char* why = stop_requested                                               ? "stop"
                    : job.save_due                                               ? "time interval"
                    : c.interval_steps > 0 && state.step % c.interval_steps == 0 ? "step interval"
                    : last && c.enabled()                                        ? "end"
                                                                                 : nullptr;
  if (why == nullptr) return 0.0;
  // A save can fail in the background after this step's asks(), so no rank has acted on it yet.
  // Once it is done every rank knows its outcome: with on_failure = stop all skip this save alike,
  // and the run ends on the failure (train/loop.cc asks after the last step).
  if (c.on_failure == config::OnFailure::kStop) {
    wait();
    if (save_failure_pending()) return 0.0;
  }
  if (stop_requested) log::warn("stop requested (signal) at step {}: saving a checkpoint and exiting", state.step);
  const double stall = save(shards, state);
  log::info("checkpoint step {} ({}): step loop stalled {:.1f} ms; writing in the background", state.step, why,
            stall * 1e3);
  return stall;
}

void Checkpointer::writer_loop() {
  for (;;) {
    Pending job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || (busy_ && job_.step >= 0); });
      if (stop_ && !busy_) return;
      job = job_;
    }
    const double t0 = now_seconds();
    const bool ok = write_and_commit(job);
    if (ok && dist_.rank() == 0) {
      log::info("checkpoint step {} committed in {:.2f}s: {}/{}", job.step, now_seconds() - t0, root_,
                step_dir_name(job.step));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
      job_.step = -1;
      outcome_ = ok;
      save_failed_ = save_failed_ || !ok;
      if (ok) newest_commit_ = std::max(newest_commit_, job.step);
      if (ok && dist_.rank() == 0 && mirror_.joinable()) mirror_queue_.push_back(job.step);
    }
    cv_.notify_all();
  }
}

std::string Checkpointer::fence_path() const { return root_ + "/.attempt"; }

std::string Checkpointer::fenced() const {
  if (dist_.attempt.empty()) return "";
  std::ifstream in(fence_path());
  std::string owner;
  std::getline(in, owner);
  if (owner == dist_.attempt) return "";
  return fmt::format("fenced: attempt {} of this job now owns {} (this process belongs to attempt {})",
                     owner.empty() ? "(unreadable)" : owner, root_, dist_.attempt);
}

std::string Checkpointer::store_key(int64_t step, const std::string& what) const {
  // Keys of this attempt only: an earlier attempt in the same store round left its own reports.
  return fmt::format("checkpoint.{}.{}.{}", dist_.attempt, step, what);
}

void Checkpointer::publish(int64_t step, const std::string& what, const std::string& value) {
  if (dist_.store == nullptr) return;
  // Store calls run on the writer thread: a store error must end in a failed save, not
  // std::terminate.
  try {
    dist_.store->set(store_key(step, what), bytes_of(value));
  } catch (const Error& e) {
    log::error("checkpoint step {}: cannot publish {} in the store: {}", step, store_key(step, what), e.what());
  }
}

int Checkpointer::files() const {
  const parallel::Mesh& mesh = *dist_.mesh;
  return mesh.size(parallel::Dim::kPp) * mesh.size(parallel::Dim::kTp) * mesh.size(parallel::Dim::kDpShard);
}

int Checkpointer::file_of_rank(int rank) const {
  const parallel::ParallelDims& d = dist_.mesh->dims();
  if (parallel::coordinate(d, rank, parallel::Dim::kDpReplicate) != 0) return -1;  // the others hold the same
  return file_number(
      {parallel::coordinate(d, rank, parallel::Dim::kPp), parallel::coordinate(d, rank, parallel::Dim::kTp),
       parallel::coordinate(d, rank, parallel::Dim::kDpShard)},
      d.tp, d.dp_shard);
}

std::string Checkpointer::file_name(int file) const {
  const parallel::ParallelDims& d = dist_.mesh->dims();
  const FileCoord c = file_coord(file, d.tp, d.dp_shard);
  return shard_file_name(c.shard_rank, c.tp_rank, d.tp, c.pp_rank, d.pp);
}

bool Checkpointer::write_and_commit(const Pending& job) {
  const int rank = dist_.rank();
  const std::string dir = root_ + "/" + step_dir_name(job.step);
  FileDigest digest;
  const std::string error = write_own_shard(job, dir, &digest);
  publish(job.step, fmt::format("rank{}", rank),
          error.empty() ? fmt::format("ok {} {}", digest.bytes, hex64(digest.xxh64)) : "error " + error);
  if (rank != 0) return await_outcome(job.step);  // rank 0 decides; everyone learns its answer
  std::vector<FileDigest> digests(static_cast<size_t>(files()));
  digests[0] = digest;
  std::string failure = error.empty() ? "" : fmt::format("rank 0: {}", error);
  const std::string reports = collect_reports(job.step, &digests);  // awaited even after a failure
  if (failure.empty()) failure = reports;
  if (failure.empty()) failure = verify_files(dir, digests);
  if (failure.empty()) failure = fenced();
  if (failure.empty()) failure = commit(job, dir, digests);
  publish(job.step, "outcome", failure.empty() ? "committed" : failure);
  if (!failure.empty()) abandon(job.step, dir, failure);
  return failure.empty();
}

std::string Checkpointer::write_own_shard(const Pending& job, const std::string& dir, FileDigest* digest) {
  const int rank = dist_.rank();
  try {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw IoError(fmt::format("cannot create {}: {}", dir, ec.message()));
    if (!job.refused.empty()) throw IoError(job.refused);
    // The first replica writes; the others hold the same shards.
    if (const int file = file_of_rank(rank); file >= 0) {
      const std::string path = dir + "/" + file_name(file);
      const size_t half = views_.size() / 2;
      *digest = write_shard_file(path, views_, [&](size_t i) {
        if (i == half && fault::point("checkpoint.shard", rank, job.step) == fault::Kind::kIo) throw injected(path);
      });
      sync_parent_dir(path);
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool Checkpointer::await_outcome(int64_t step) {
  std::string outcome;
  try {
    outcome = string_of(dist_.store->get(store_key(step, "outcome"), comm::Millis(config_.parallel.timeout_ms)));
  } catch (const Error& e) {
    outcome = fmt::format("no outcome from rank 0: {}", e.what());
  }
  if (outcome != "committed") log::warn("checkpoint step {} failed: {}", step, outcome);
  return outcome == "committed";
}

std::string Checkpointer::collect_reports(int64_t step, std::vector<FileDigest>* digests) {
  // Every report is awaited, even after a failure, so that no rank still writes into the
  // directory when it is removed.
  std::string failure;
  for (int r = 1; r < dist_.world_size(); ++r) {
    std::string report;
    try {
      report = string_of(
          dist_.store->get(store_key(step, fmt::format("rank{}", r)), comm::Millis(config_.parallel.timeout_ms)));
    } catch (const Error& e) {
      if (failure.empty()) failure = fmt::format("rank {} did not report: {}", r, e.what());
      break;
    }
    std::istringstream in(report);
    std::string word, hex;
    in >> word;
    if (!failure.empty()) continue;
    if (word != "ok") {
      failure = fmt::format("rank {}: {}", r, report.substr(std::min<size_t>(report.size(), 6)));
    } else if (const int file = file_of_rank(r);
               file >= 0 && !(in >> (*digests)[file].bytes >> hex && parse_hex64(hex, &(*digests)[file].xxh64))) {
      failure = fmt::format("rank {} sent a malformed report \"{}\"", r, report);
    }
  }
  return failure;
}

std::string Checkpointer::verify_files(const std::string& dir, const std::vector<FileDigest>& digests) const {
  // The files must be what their ranks reported, read back from disk, before anything commits.
  for (size_t k = 0; k < digests.size(); ++k) {
    const std::string path = dir + "/" + file_name(static_cast<int>(k));
    try {
      const FileDigest d = digest_file(path);
      if (d.bytes != digests[k].bytes || d.xxh64 != digests[k].xxh64) {
        return fmt::format("{} holds {} bytes with checksum {}, but its rank reported {} bytes with {}", path, d.bytes,
                           hex64(d.xxh64), digests[k].bytes, hex64(digests[k].xxh64));
      }
    } catch (const Error& e) {
      return e.what();
    }
  }
  return "";
}

std::string Checkpointer::commit(const Pending& job, const std::string& dir, const std::vector<FileDigest>& digests) {
  try {
    Manifest m = job.manifest;
    for (int k = 0; k < static_cast<int>(digests.size()); ++k) {
      const FileCoord c = file_coord(k, m.tensor_parallel, m.shard_size);
      m.files.push_back({file_name(k), c.pp_rank, c.tp_rank, c.shard_rank, digests[k].bytes, digests[k].xxh64});
    }
    const std::string manifest = dir + "/manifest.json";
    write_file_atomic(manifest + ".tmp", to_json(m));  // durable under a temporary name
    if (fault::point("checkpoint.manifest", dist_.rank(), job.step) == fault::Kind::kIo) throw injected(manifest);
    if (::rename((manifest + ".tmp").c_str(), manifest.c_str()) != 0) {
      throw IoError(fmt::format("cannot rename {}.tmp to {}: {}", manifest, manifest, std::strerror(errno)));
    }
    sync_parent_dir(manifest);  // committed
    fault::point("checkpoint.commit", dist_.rank(), job.step);
    write_latest(root_, job.step);
    prune(root_, static_cast<int>(config_.checkpoint.keep), uploading_);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void Checkpointer::abandon(int64_t step, const std::string& dir, const std::string& failure) const {
  int64_t latest = -1;
  try {
    latest = read_latest(root_);
  } catch (const Error&) {  // named when a resume reads it
  }
  log::error("checkpoint step {} failed: {}; {}", step, failure,
             latest >= 0 ? fmt::format("{} stays the latest", step_dir_name(latest))
                         : std::string("there is no earlier checkpoint"));
  std::error_code ec;
  // Only this attempt's own uncommitted directory; a fenced process leaves it to the owner.
  if (fenced().empty() && !fs::exists(dir + "/manifest.json", ec) && ec.value() == 0) fs::remove_all(dir, ec);
}

}  // namespace tessera::checkpoint
