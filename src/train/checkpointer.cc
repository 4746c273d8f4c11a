// Sharded asynchronous checkpoints: the writer and mirror threads, commit, resume.
#include "train/checkpointer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
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

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
namespace ck = tessera::checkpoint;

constexpr const char* kKinds[3] = {"param", "exp_avg", "exp_avg_sq"};

comm::Bytes bytes_of(const std::string& s) { return comm::Bytes(s.begin(), s.end()); }
std::string string_of(const comm::Bytes& b) { return std::string(b.begin(), b.end()); }

IoError injected(const std::string& what) {
  return IoError(fmt::format("cannot write {}: No space left on device (injected fault)", what));
}

// Copies a committed checkpoint to mirror_root and verifies the copy before committing it there.
void mirror_checkpoint(const std::string& root, int64_t step, const std::string& mirror_root, int keep) {
  const std::string name = ck::step_dir_name(step);
  const std::string src = root + "/" + name, dst = mirror_root + "/" + name;
  const ck::Manifest m = ck::read_manifest(src);
  std::error_code ec;
  fs::create_directories(mirror_root, ec);
  ck::remove_uncommitted(mirror_root);
  fs::remove_all(dst, ec);
  fs::create_directories(dst, ec);
  if (ec) throw IoError(fmt::format("cannot create {}: {}", dst, ec.message()));
  for (const ck::ManifestFile& f : m.files) {
    const std::string to = dst + "/" + f.name;
    fs::copy_file(src + "/" + f.name, to, fs::copy_options::overwrite_existing, ec);
    if (ec) throw IoError(fmt::format("cannot copy {} to {}: {}", src + "/" + f.name, to, ec.message()));
    fsync_and_drop_cache(to);  // the digest below reads the disk's copy, not the page cache's
    const ck::FileDigest d = ck::digest_file(to);
    if (d.bytes != f.bytes || d.xxh64 != f.xxh64) {
      throw IoError(fmt::format("the copy {} differs from the checkpoint ({} bytes, checksum {}; expected {} and {})",
                                to, d.bytes, ck::hex64(d.xxh64), f.bytes, ck::hex64(f.xxh64)));
    }
  }
  sync_parent_dir(dst + "/x");
  write_file_atomic(dst + "/manifest.json", ck::to_json(m));
  ck::write_latest(mirror_root, step);
  ck::prune(mirror_root, keep);
}

}  // namespace

Checkpointer::Checkpointer(const config::Config& config, const std::string& root, const parallel::Distributed& dist)
    : config_(config), root_(root), mirror_root_(ck::mirror_root(config.checkpoint.mirror_dir, root)), dist_(dist) {
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) throw IoError(fmt::format("cannot create checkpoint directory {}: {}", root_, ec.message()));
  if (dist_.rank() == 0) {
    // The fence first: from here on a process of an earlier attempt can neither commit nor delete.
    if (!dist_.attempt.empty()) write_file_atomic(fence_path(), dist_.attempt + "\n");
    ck::remove_uncommitted(root_);
  }
  if (dist_.world() != nullptr) {  // no rank writes a checkpoint before the cleanup is done
    dist_.world()->barrier({comm::Millis(config_.parallel.timeout_ms)})->wait();
  }
  writer_ = std::thread([this] { writer_loop(); });
  if (dist_.rank() == 0 && !mirror_root_.empty()) {
    mirror_ = std::thread([this] { mirror_loop(); });
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
}

double Checkpointer::save(Trainer& trainer) {
  const double t0 = now_seconds();
  wait();  // the host buffer and the store keys belong to the previous save until it is done
  fsdp::ShardedParams& params = trainer.params();
  const model::ModelLayout& layout = trainer.layout();
  if (views_.empty()) {
    size_t total = 0;
    for (int u = 0; u < layout.num_units(); ++u) total += 3 * static_cast<size_t>(params.shard_range(u).size);
    host_.resize(total);
    size_t at = 0;
    for (int u = 0; u < layout.num_units(); ++u) {
      for (const char* kind : kKinds) {
        const auto n = static_cast<uint64_t>(params.shard_range(u).size);
        views_.push_back({ck::Manifest::tensor_name(layout.units()[u].name, kind), host_.data() + at, n});
        at += n;
      }
    }
  }
  size_t at = 0;  // the same order as views_
  for (int u = 0; u < layout.num_units(); ++u) {
    const auto n = static_cast<size_t>(params.shard_range(u).size);
    for (const float* from : {params.master_shard(u), trainer.optimizer().exp_avg(u), trainer.optimizer().exp_avg_sq(u)}) {
      std::copy(from, from + n, host_.data() + at);
      at += n;
    }
  }
  Job job;
  // No checkpoint may hold a non-finite value (RELIABILITY.md row 14): this rank refuses, and
  // the save fails on every rank as an I/O error does (the previous checkpoint stays latest).
  for (size_t v = 0; v < views_.size() && job.refused.empty(); ++v) {
    const float* p = views_[v].data;
    for (uint64_t i = 0; i < views_[v].count; ++i) {
      if (!std::isfinite(p[i])) {
        job.refused = fmt::format("not saving step {}: {}[{}] of this rank's shard is {}", trainer.steps_done(),
                                  views_[v].name, i, p[i]);
        log::error("{}", job.refused);
        break;
      }
    }
  }
  const TrainingState state = trainer.state();
  ck::Manifest& m = job.manifest;
  job.step = m.step = state.step;
  m.optimizer_steps = state.optimizer_steps;
  m.tokens = state.tokens;
  m.sampler_position = state.sampler_position;
  m.seed = static_cast<uint64_t>(config_.train.seed);
  m.lr = config_.train.lr;
  m.min_lr = config_.train.min_lr;
  m.warmup_steps = config_.train.warmup_steps;
  m.total_steps = config_.train.max_steps;
  m.world = dist_.world_size();
  m.shard_size = dist_.mesh->size(parallel::Dim::kDpShard);
  m.strategy = config::name(config_.parallel.strategy);
  m.config_toml = config::to_toml(config_);
  m.created = utc_now();
  for (const model::UnitLayout& u : layout.units()) {
    ck::ManifestUnit unit{u.name, u.numel, u.padded, {}};
    for (const model::TensorSpec& t : u.tensors) unit.tensors.push_back({t.name, t.shape, t.offset});
    m.units.push_back(std::move(unit));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = std::move(job);
    busy_ = true;
  }
  cv_.notify_all();
  last_started_ = state.step;
  return now_seconds() - t0;
}

bool Checkpointer::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !busy_; });
  return outcome_;
}

bool Checkpointer::take_failure() {
  std::lock_guard<std::mutex> lock(mu_);
  const bool failed = failed_;
  failed_ = false;
  return failed;
}

void Checkpointer::writer_loop() {
  for (;;) {
    Job job;
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
                ck::step_dir_name(job.step));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
      job_.step = -1;
      outcome_ = ok;
      failed_ = failed_ || !ok;
      if (ok && mirror_.joinable()) mirror_queue_.push_back(job.step);
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

bool Checkpointer::write_and_commit(const Job& job) {
  // Shard file k is dp_shard coordinate k's, written by the first replica: global ranks 0..S-1
  // while the mesh has no tensor or pipeline dimension (files named by those coordinates too
  // come with them).
  CHECK(dist_.mesh->size(parallel::Dim::kTp) == 1 && dist_.mesh->size(parallel::Dim::kPp) == 1);
  const int rank = dist_.rank(), W = dist_.world_size(), S = dist_.mesh->size(parallel::Dim::kDpShard);
  const comm::Millis timeout(config_.parallel.timeout_ms);
  const std::string dir = root_ + "/" + ck::step_dir_name(job.step);
  // Keys of this attempt only: an earlier attempt in the same store round left its own reports.
  auto key = [&](const std::string& what) { return fmt::format("checkpoint.{}.{}.{}", dist_.attempt, job.step, what); };
  std::string error;
  ck::FileDigest digest;
  try {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw IoError(fmt::format("cannot create {}: {}", dir, ec.message()));
    if (!job.refused.empty()) throw IoError(job.refused);
    if (rank < S) {  // the first replica writes; the others hold the same shards
      const std::string path = dir + "/" + ck::shard_file_name(rank);
      const size_t half = views_.size() / 2;
      digest = ck::write_shard_file(path, views_, [&](size_t i) {
        if (i == half && fault::point("checkpoint.shard", rank, job.step) == fault::Kind::kIo) throw injected(path);
      });
      sync_parent_dir(path);
    }
  } catch (const Error& e) {
    error = e.what();
  }
  // Store calls run on this thread: a store error must end in a failed save, not std::terminate.
  auto publish = [&](const std::string& k, const std::string& value) {
    try {
      dist_.store->set(k, bytes_of(value));
    } catch (const Error& e) {
      log::error("checkpoint step {}: cannot publish {} in the store: {}", job.step, k, e.what());
    }
  };
  if (dist_.store != nullptr) {
    publish(key(fmt::format("rank{}", rank)),
            error.empty() ? fmt::format("ok {} {}", digest.bytes, ck::hex64(digest.xxh64)) : "error " + error);
  }
  if (rank != 0) {  // rank 0 decides; everyone learns its answer
    std::string outcome;
    try {
      outcome = string_of(dist_.store->get(key("outcome"), timeout));
    } catch (const Error& e) {
      outcome = fmt::format("no outcome from rank 0: {}", e.what());
    }
    if (outcome != "committed") log::warn("checkpoint step {} failed: {}", job.step, outcome);
    return outcome == "committed";
  }
  std::string failure;
  std::vector<ck::FileDigest> digests(S);
  digests[0] = digest;
  if (!error.empty()) failure = fmt::format("rank 0: {}", error);
  // Every report is awaited, even after a failure, so that no rank still writes into the
  // directory when it is removed.
  for (int r = 1; r < W; ++r) {
    std::string report;
    try {
      report = string_of(dist_.store->get(key(fmt::format("rank{}", r)), timeout));
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
    } else if (r < S && !(in >> digests[r].bytes >> hex && ck::parse_hex64(hex, &digests[r].xxh64))) {
      failure = fmt::format("rank {} sent a malformed report \"{}\"", r, report);
    }
  }
  // The files must be what their ranks reported, read back from disk, before anything commits.
  for (int k = 0; k < S && failure.empty(); ++k) {
    const std::string path = dir + "/" + ck::shard_file_name(k);
    try {
      const ck::FileDigest d = ck::digest_file(path);
      if (d.bytes != digests[k].bytes || d.xxh64 != digests[k].xxh64) {
        failure = fmt::format("{} holds {} bytes with checksum {}, but rank {} reported {} bytes with {}", path,
                              d.bytes, ck::hex64(d.xxh64), k, digests[k].bytes, ck::hex64(digests[k].xxh64));
      }
    } catch (const Error& e) {
      failure = e.what();
    }
  }
  if (failure.empty()) failure = fenced();
  if (failure.empty()) {
    try {
      ck::Manifest m = job.manifest;
      for (int k = 0; k < S; ++k) m.files.push_back({ck::shard_file_name(k), k, digests[k].bytes, digests[k].xxh64});
      const std::string manifest = dir + "/manifest.json";
      write_file_atomic(manifest + ".tmp", ck::to_json(m));  // durable under a temporary name
      if (fault::point("checkpoint.manifest", rank, job.step) == fault::Kind::kIo) throw injected(manifest);
      if (::rename((manifest + ".tmp").c_str(), manifest.c_str()) != 0) {
        throw IoError(fmt::format("cannot rename {}.tmp to {}: {}", manifest, manifest, std::strerror(errno)));
      }
      sync_parent_dir(manifest);  // committed
      fault::point("checkpoint.commit", rank, job.step);
      ck::write_latest(root_, job.step);
      ck::prune(root_, static_cast<int>(config_.checkpoint.keep));
    } catch (const Error& e) {
      failure = e.what();
    }
  }
  if (dist_.store != nullptr) publish(key("outcome"), failure.empty() ? "committed" : failure);
  if (!failure.empty()) {
    int64_t latest = -1;
    try {
      latest = ck::read_latest(root_);
    } catch (const Error&) {  // named when a resume reads it
    }
    log::error("checkpoint step {} failed: {}; {}", job.step, failure,
               latest >= 0 ? fmt::format("{} stays the latest", ck::step_dir_name(latest))
                           : std::string("there is no earlier checkpoint"));
    std::error_code ec;
    // Only this attempt's own uncommitted directory; a fenced process leaves it to the owner.
    if (fenced().empty() && !fs::exists(dir + "/manifest.json", ec) && ec.value() == 0) fs::remove_all(dir, ec);
  }
  return failure.empty();
}

void Checkpointer::mirror_loop() {
  for (;;) {
    int64_t step = -1;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !mirror_queue_.empty(); });
      if (mirror_queue_.empty()) return;  // stopping with nothing left to copy
      step = mirror_queue_.back();        // a newer commit supersedes older ones still queued
      mirror_queue_.clear();
    }
    const double t0 = now_seconds();
    try {
      mirror_checkpoint(root_, step, mirror_root_, static_cast<int>(config_.checkpoint.keep));
      log::info("checkpoint step {} mirrored to {} and verified in {:.2f}s", step, mirror_root_, now_seconds() - t0);
    } catch (const Error& e) {
      log::warn("checkpoint step {} could not be mirrored: {}", step, e.what());
    }
  }
}

std::vector<std::string> resume_candidates(const config::Config& config, const std::string& root,
                                           const std::string& spec) {
  auto from_root = [&](const std::string& r) {
    std::vector<std::string> out;
    std::vector<int64_t> steps = ck::committed_steps(r);
    const int64_t latest = ck::read_latest(r);
    if (latest >= 0 && std::find(steps.begin(), steps.end(), latest) != steps.end()) {
      out.push_back(r + "/" + ck::step_dir_name(latest));
    } else if (latest >= 0) {
      log::warn("{}/latest names {}, which is not a committed checkpoint", r, ck::step_dir_name(latest));
    }
    if (config.checkpoint.fallback || out.empty()) {
      for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
        if (*it < latest || latest < 0) out.push_back(r + "/" + ck::step_dir_name(*it));
      }
    }
    if (!config.checkpoint.fallback && out.size() > 1) out.resize(1);
    return out;
  };
  if (spec != "auto") {
    std::error_code ec;
    if (fs::exists(fs::path(spec) / "manifest.json", ec)) return {spec};
    std::vector<std::string> out = from_root(spec);
    if (out.empty()) throw DataError(fmt::format("--resume {}: no committed checkpoint there", spec));
    return out;
  }
  std::vector<std::string> out = from_root(root);
  if (const std::string mirror = ck::mirror_root(config.checkpoint.mirror_dir, root); out.empty() && !mirror.empty()) {
    out = from_root(mirror);
    if (!out.empty()) log::info("no checkpoint in {}; resuming from the mirror {}", root, mirror);
  }
  return out;
}

void load_checkpoint(Trainer& trainer, const std::string& step_dir) {
  ck::CheckpointReader reader(step_dir);
  const ck::Manifest& m = reader.manifest();
  const model::ModelLayout& layout = trainer.layout();
  auto mismatch = [&](const std::string& what) {
    return DataError(fmt::format("{} was written for another model: {}", step_dir, what));
  };
  if (m.units.size() != layout.units().size()) {
    throw mismatch(fmt::format("{} units, this model has {}", m.units.size(), layout.units().size()));
  }
  for (size_t i = 0; i < m.units.size(); ++i) {
    const ck::ManifestUnit& saved = m.units[i];
    const model::UnitLayout& mine = layout.units()[i];
    if (saved.name != mine.name || saved.numel != mine.numel || saved.tensors.size() != mine.tensors.size()) {
      throw mismatch(fmt::format("unit {} ({} floats) where this model has {} ({} floats)", saved.name, saved.numel,
                                 mine.name, mine.numel));
    }
    for (size_t t = 0; t < saved.tensors.size(); ++t) {
      const auto& a = saved.tensors[t];
      const auto& b = mine.tensors[t];
      if (a.name != b.name || a.shape != b.shape || a.offset != b.offset) {
        throw mismatch(fmt::format("tensor {} [{}] where this model has {} [{}]", a.name, fmt::join(a.shape, ", "),
                                   b.name, fmt::join(b.shape, ", ")));
      }
    }
  }
  if (m.seed != static_cast<uint64_t>(trainer.config().train.seed)) {
    log::warn("{} was trained with train.seed = {}, this run has {}: the data order after it differs", step_dir, m.seed,
              trainer.config().train.seed);
  }
  fsdp::ShardedParams& params = trainer.params();
  for (int u = 0; u < layout.num_units(); ++u) {
    const auto [begin, n] = params.shard_range(u);
    reader.read_slice(u, "param", begin, n, params.master_shard(u));
    reader.read_slice(u, "exp_avg", begin, n, trainer.optimizer().exp_avg(u));
    reader.read_slice(u, "exp_avg_sq", begin, n, trainer.optimizer().exp_avg_sq(u));
  }
  trainer.restore({m.step, m.tokens, m.sampler_position, m.optimizer_steps});
}

namespace {

// Moves a damaged checkpoint aside (STEP.damaged-TIME): out of every listing, kept for a person.
void quarantine(const std::string& step_dir) {
  const std::string aside = step_dir + ".damaged-" + utc_now("%Y%m%dT%H%M%S");
  std::error_code ec;
  fs::rename(step_dir, aside, ec);
  if (ec) {
    log::warn("cannot move the damaged checkpoint {} aside: {}", step_dir, ec.message());
    return;
  }
  log::warn("moved the damaged checkpoint {} aside to {}", step_dir, aside);
  try {
    sync_parent_dir(aside);
  } catch (const Error& e) {
    log::warn("{}", e.what());
  }
}

constexpr int kReadAttempts = 4;  // a failed read is retried after 0.5, 1 and 2 s

}  // namespace

std::vector<std::string> agreed_resume_candidates(const config::Config& config, const std::string& root,
                                                  const std::string& spec, const parallel::Distributed& dist) {
  if (dist.world() == nullptr) return resume_candidates(config, root, spec);
  std::string text;
  if (dist.rank() == 0) {
    try {
      for (const std::string& c : resume_candidates(config, root, spec)) text += c + "\n";
    } catch (const DataError& e) {
      text = std::string("\x01") + e.what();
    }
  }
  text = comm::broadcast_string(*dist.world(), text, 0, {comm::Millis(config.parallel.timeout_ms)});
  if (!text.empty() && text[0] == '\x01') throw DataError(text.substr(1));
  std::vector<std::string> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) out.push_back(line);
  return out;
}

std::string resume_from(Trainer& trainer, const std::vector<std::string>& candidates) {
  const parallel::Distributed& dist = trainer.distributed();
  std::string errors;
  for (size_t i = 0; i < candidates.size(); ++i) {
    std::string error;
    float outcome[2] = {0.0f, 0.0f};  // ranks that found it damaged, ranks that could not read it
    for (int attempt = 1;; ++attempt) {
      try {
        load_checkpoint(trainer, candidates[i]);
        error.clear();
        outcome[1] = 0.0f;
        break;
      } catch (const IoError& e) {
        error = e.what();
        outcome[1] = 1.0f;
        if (attempt == kReadAttempts) break;
        const double pause = 0.5 * (1 << (attempt - 1));
        log::warn("{} (attempt {} of {}); retrying in {:.1f} s", error, attempt, kReadAttempts, pause);
        std::this_thread::sleep_for(std::chrono::duration<double>(pause));
      } catch (const DataError& e) {
        error = e.what();
        outcome[0] = 1.0f;
        break;
      }
    }
    if (dist.world() != nullptr) {
      dist.world()
          ->all_reduce(outcome, 2, comm::DType::kF32, {comm::Millis(trainer.config().parallel.timeout_ms)})
          ->wait();
    }
    if (outcome[0] == 0.0f && outcome[1] == 0.0f) return candidates[i];
    if (!error.empty()) log::error("{}", error);
    if (outcome[1] > 0.0f) {
      throw IoError(
          fmt::format("cannot read the checkpoint {} ({}) after {} attempts; stopping without falling back "
                      "to an older one, since this one may be sound: nothing was deleted",
                      candidates[i], error.empty() ? "on another rank" : error, kReadAttempts));
    }
    errors += fmt::format("\n  {}: {}", candidates[i], error.empty() ? "damaged on another rank" : error);
    if (i + 1 < candidates.size()) {
      if (dist.rank() == 0) quarantine(candidates[i]);
      log::warn("falling back to the previous checkpoint {}", candidates[i + 1]);
    }
  }
  throw DataError(fmt::format("no checkpoint could be loaded (checkpoint.fallback = {}):{}",
                              trainer.config().checkpoint.fallback, errors));
}

std::string reshard(const std::string& src, const std::string& dst_root, const config::Config& target) {
  ck::CheckpointReader reader(src);
  ck::Manifest m = reader.manifest();
  config::Config stored;
  try {
    stored = config::load_text(m.config_toml, src + "/manifest.json", {});
  } catch (const ConfigError& e) {
    throw DataError(fmt::format("{}/manifest.json: its stored config is invalid: {}", src, e.what()));
  }
  stored.parallel.nproc = target.parallel.nproc;
  stored.parallel.strategy = target.parallel.strategy;
  stored.parallel.shard_group_size = target.parallel.shard_group_size;
  config::validate(stored);  // e.g. the batch must still divide among the new ranks
  const int world = static_cast<int>(target.parallel.nproc);
  const int S = parallel::dims_for(stored, world).dp_shard;
  const model::ModelLayout layout(stored.model, 16 * S);
  if (layout.units().size() != m.units.size()) {
    throw DataError(
        fmt::format("{}: {} units, its stored config describes {}", src, m.units.size(), layout.units().size()));
  }
  const std::string dir = dst_root + "/" + ck::step_dir_name(m.step);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError(fmt::format("cannot create {}: {}", dir, ec.message()));
  if (fs::exists(dir + "/manifest.json", ec)) throw IoError(fmt::format("{} already holds a checkpoint", dir));
  m.world = world;
  m.shard_size = S;
  m.strategy = config::name(stored.parallel.strategy);
  m.config_toml = config::to_toml(stored);
  m.files.clear();
  for (size_t u = 0; u < m.units.size(); ++u) m.units[u].padded = layout.units()[u].padded;
  for (int k = 0; k < S; ++k) {
    std::vector<std::vector<float>> buffers;
    std::vector<ck::TensorView> views;
    for (size_t u = 0; u < m.units.size(); ++u) {
      const parallel::ShardRange range = parallel::shard_range(m.units[u].padded, S, k);
      for (const char* kind : kKinds) {
        buffers.emplace_back(range.size);
        reader.read_slice(static_cast<int>(u), kind, range.begin, range.size, buffers.back().data());
        views.push_back({ck::Manifest::tensor_name(m.units[u].name, kind), buffers.back().data(),
                         static_cast<uint64_t>(range.size)});
      }
    }
    const std::string name = ck::shard_file_name(k);
    const ck::FileDigest d = ck::write_shard_file(dir + "/" + name, views);
    m.files.push_back({name, k, d.bytes, d.xxh64});
  }
  write_file_atomic(dir + "/manifest.json", ck::to_json(m));
  ck::write_latest(dst_root, m.step);
  return dir;
}

}  // namespace tessera::train
