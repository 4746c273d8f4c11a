// Resuming: candidates, agreement, loading, fallback.
#include "checkpoint/resume.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint/object_tier.h"
#include "checkpoint/storage_progress.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/file_io.h"
#include "core/log.h"
#include "core/timer.h"
#include "storage/s3_client.h"

namespace tessera::checkpoint {

namespace fs = std::filesystem;

std::vector<std::string> resume_candidates(const config::Config& config, const std::string& root,
                                           const std::string& spec) {
  auto from_root = [&](const std::string& r) {
    std::vector<std::string> out;
    const bool tier = storage::is_s3(r);
    std::vector<int64_t> steps = tier ? tier_committed_steps(storage::default_s3_client(), r) : committed_steps(r);
    const int64_t latest = tier ? tier_read_latest(storage::default_s3_client(), r) : read_latest(r);
    if (latest >= 0 && std::find(steps.begin(), steps.end(), latest) != steps.end()) {
      out.push_back(r + "/" + step_dir_name(latest));
    } else if (latest >= 0) {
      log::warn("{}/latest names {}, which is not a committed checkpoint", r, step_dir_name(latest));
    }
    if (config.checkpoint.fallback || out.empty()) {
      for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
        if (*it < latest || latest < 0) out.push_back(r + "/" + step_dir_name(*it));
      }
    }
    if (!config.checkpoint.fallback && out.size() > 1) out.resize(1);
    return out;
  };
  if (spec != "auto") {
    std::error_code ec;
    if (fs::exists(fs::path(spec) / "manifest.json", ec)) return {spec};
    if (storage::is_s3(spec) && storage::parse_s3(spec, "--resume").name().rfind("step_", 0) == 0) return {spec};
    std::vector<std::string> out = from_root(spec);
    if (out.empty()) throw DataError(fmt::format("--resume {}: no committed checkpoint there", spec));
    return out;
  }
  std::vector<std::string> out = from_root(root);
  if (const std::string mirror = mirror_root(config.checkpoint.mirror_dir, root); out.empty() && !mirror.empty()) {
    out = from_root(mirror);
    if (!out.empty()) log::info("no checkpoint in {}; resuming from the mirror {}", root, mirror);
  }
  return out;
}

namespace {

// A resumed run follows its own config's learning-rate schedule. Where that differs from the one
// the checkpoint was trained with, the rate may jump at the resumed step (a cosine stretched by a
// larger train.max_steps is higher from there on; a warmup-stable-decay run whose decay has not
// started is not), so the keys that changed are named.
void warn_if_schedule_differs(const Manifest& m, const config::TrainConfig& t, const std::string& step_dir) {
  std::vector<std::string> changed;
  const auto compare = [&](const char* key, const auto& then, const auto& now) {
    if (then != now) changed.push_back(fmt::format("train.{} {} -> {}", key, then, now));
  };
  compare("lr", m.lr, t.lr);
  compare("min_lr", m.min_lr, t.min_lr);
  compare("warmup_steps", m.warmup_steps, t.warmup_steps);
  compare("max_steps", m.total_steps, t.max_steps);
  compare("lr_decay", m.decay, std::string(config::name(t.lr_decay)));
  compare("lr_decay_steps", m.decay_steps, t.lr_decay_steps);
  if (changed.empty()) return;
  log::warn("{} was trained with another learning-rate schedule ({}): from step {} on, the rates follow this run's",
            step_dir, fmt::join(changed, ", "), m.step + 1);
}

}  // namespace

TrainingState load_checkpoint(const std::string& step_dir, const RankShards& into, const config::Config& config) {
  CheckpointReader reader(step_dir);
  const Manifest& m = reader.manifest();
  const model::ModelLayout& layout = *into.layout;
  check_same_model(m, layout, step_dir);
  if (m.seed != static_cast<uint64_t>(config.train.seed)) {
    log::warn("{} was trained with train.seed = {}, this run has {}: the data order after it differs", step_dir, m.seed,
              config.train.seed);
  }
  warn_if_schedule_differs(m, config.train, step_dir);
  const int tp_rank = layout.tensor_parallel().rank;
  const bool on_host = into.backend->device() == kernels::Device::kCpu;
  std::vector<float> staging;  // a device backend's arrays are read here, then copied in
  for (int u = 0; u < layout.num_units(); ++u) {
    const UnitShard& shard = into.units[u];
    const model::UnitLayout& to = layout.units()[u];
    const int saved = reader.unit_index(to.name);  // a pipeline stage's units are some of them
    for (auto [kind, dst] : {std::pair{"param", shard.param}, std::pair{"exp_avg", shard.exp_avg},
                             std::pair{"exp_avg_sq", shard.exp_avg_sq}}) {
      staging.resize(on_host ? 0 : static_cast<size_t>(shard.range.size));
      reader.read_for(to, tp_rank, saved, kind, shard.range.begin, shard.range.size, on_host ? dst : staging.data());
      if (!on_host) into.backend->to_device(dst, staging.data(), sizeof(float) * staging.size());
    }
  }
  return {m.step, m.tokens, m.sampler_position, m.optimizer_steps};
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
  text = comm::broadcast_string(*dist.world(), text, 0, {storage_wait(config)});  // rank 0 lists the tier
  if (!text.empty() && text[0] == '\x01') throw DataError(text.substr(1));
  std::vector<std::string> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) out.push_back(line);
  return out;
}

std::string resume_from(const RankShards& into, const config::Config& config, const parallel::Distributed& dist,
                        const std::vector<std::string>& candidates, TrainingState* state) {
  std::string errors;
  const ProgressCounter moved = progress_counter(dist);  // the loads' bytes, for the ranks awaiting them
  for (size_t i = 0; i < candidates.size(); ++i) {
    std::string error;
    float outcome[2] = {0.0f, 0.0f};  // ranks that found it damaged, ranks that could not read it
    for (int attempt = 1;; ++attempt) {
      try {
        const PublishedProgress published(moved);
        if (fault::point("checkpoint.load", dist.rank(), 0) == fault::Kind::kIo) {
          throw IoError(fmt::format("cannot read {}: Input/output error (injected fault)", candidates[i]));
        }
        *state = load_checkpoint(candidates[i], into, config);
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
      // Every rank's load awaited: one may take much longer than the others (a slower node), and
      // its bytes show in this rank's heartbeat meanwhile.
      const RelayedProgress relayed(moved);
      dist.world()->all_reduce(outcome, 2, comm::DType::kF32, {storage_wait(config)})->wait();
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
  throw DataError(
      fmt::format("no checkpoint could be loaded (checkpoint.fallback = {}):{}", config.checkpoint.fallback, errors));
}

}  // namespace tessera::checkpoint
