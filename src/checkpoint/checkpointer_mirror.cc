// The checkpointer's mirror: rank 0's thread that copies each commit to checkpoint.mirror_dir
// (a directory, or the object-store tier: checkpoint/object_tier.h), the node uploaders of a tier
// over several nodes, and what the run learns of the tier at its start and end.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <utility>

#include "checkpoint/checkpointer.h"
#include "checkpoint/object_tier.h"
#include "checkpoint/storage_progress.h"
#include "core/check.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/file_io.h"
#include "core/log.h"
#include "core/timer.h"
#include "storage/object_url.h"
#include "storage/s3_client.h"

namespace tessera::checkpoint {
namespace {

namespace fs = std::filesystem;

using comm::bytes_of;
using comm::string_of;

// Copies a committed checkpoint to mirror_root and verifies the copy before committing it there.
void mirror_checkpoint(const std::string& root, int64_t step, const std::string& mirror_root, int keep) {
  const std::string name = step_dir_name(step);
  const std::string src = root + "/" + name, dst = mirror_root + "/" + name;
  const Manifest m = read_manifest(src);
  std::error_code ec;
  fs::create_directories(mirror_root, ec);
  remove_uncommitted(mirror_root);
  fs::remove_all(dst, ec);
  fs::create_directories(dst, ec);
  if (ec) throw IoError(fmt::format("cannot create {}: {}", dst, ec.message()));
  for (const ManifestFile& f : m.files) {
    const std::string to = dst + "/" + f.name;
    fs::copy_file(src + "/" + f.name, to, fs::copy_options::overwrite_existing, ec);
    if (ec) throw IoError(fmt::format("cannot copy {} to {}: {}", src + "/" + f.name, to, ec.message()));
    fsync_and_drop_cache(to);  // the digest below reads the disk's copy, not the page cache's
    const FileDigest d = digest_file(to);
    if (d.bytes != f.bytes || d.xxh64 != f.xxh64) {
      throw IoError(fmt::format("the copy {} differs from the checkpoint ({} bytes, checksum {}; expected {} and {})",
                                to, d.bytes, hex64(d.xxh64), f.bytes, hex64(f.xxh64)));
    }
  }
  sync_parent_dir(dst + "/x");
  write_file_atomic(dst + "/manifest.json", to_json(m));
  write_latest(mirror_root, step);
  prune(mirror_root, keep);
}

}  // namespace

void Checkpointer::mirror_loop() {
  for (;;) {
    int64_t step = -1;
    bool resumed = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !mirror_queue_.empty() || resumed_upload_ >= 0; });
      if (!mirror_queue_.empty()) {
        step = mirror_queue_.back();  // a newer commit supersedes older ones still queued, and the resumed one
        mirror_queue_.clear();
        resumed_upload_ = -1;
      } else if (resumed_upload_ >= 0) {
        step = std::exchange(resumed_upload_, -1);
        resumed = true;
      } else {
        break;  // stopping with nothing left to copy
      }
      uploading_ = step;  // the writer's prune leaves it until it is copied
      mirroring_ = true;
    }
    const bool held = mirror_step(step, resumed);
    {
      std::lock_guard<std::mutex> lock(mu_);
      mirroring_ = false;
      if (held) newest_in_tier_ = std::max(newest_in_tier_, step);
    }
    cv_.notify_all();
  }
  if (nodes_ > 1) {  // the node uploaders stop after the last job
    try {
      dist_.tier_store->set(tier_key(next_job_, ""), bytes_of("stop"));
    } catch (const Error& e) {
      log::warn("cannot tell the node uploaders to stop: {}", e.what());
    }
  }
}

bool Checkpointer::mirror_step(int64_t step, bool resumed) {
  const double t0 = now_seconds();
  if (!storage::is_s3(mirror_root_)) {
    try {
      mirror_checkpoint(root_, step, mirror_root_, static_cast<int>(config_.checkpoint.keep));
      log::info("checkpoint step {} mirrored to {} and verified in {:.2f}s", step, mirror_root_, now_seconds() - t0);
      return true;
    } catch (const Error& e) {
      log::warn("checkpoint step {} could not be mirrored: {}", step, e.what());
      return false;
    }
  }
  // For the ranks that await this upload.
  const PublishedProgress published(progress_counter(dist_));
  try {
    if (fault::point("checkpoint.upload", dist_.rank(), step) == fault::Kind::kIo) {
      throw IoError(fmt::format("cannot upload checkpoint step {} (injected fault)", step));
    }
    TierUploadStats sent;
    if (resumed) {
      storage::S3Client& s3 = storage::default_s3_client();
      const std::vector<int64_t> in_tier = tier_committed_steps(s3, mirror_root_);
      if (!in_tier.empty() && in_tier.back() >= step) {
        log::info("checkpoint step {}, resumed from, is in {}{}", step, mirror_root_,
                  in_tier.back() > step ? fmt::format(" with newer step {}", in_tier.back()) : std::string(""));
        return true;
      }
      // Its files may come from another world size: rank 0 sends them all, as one node object.
      sent = upload_checkpoint(s3, root_, step, mirror_root_, tier_upload({}));
    } else {
      sent = upload_to_tier(step);
    }
    log::info("checkpoint step {} uploaded to {} in {:.2f}s: {} node object(s), {} bytes, {} PUT request(s){}", step,
              mirror_root_, now_seconds() - t0, sent.objects, sent.bytes, sent.puts,
              resumed ? " (the run resumed from it; the tier lacked it)" : "");
    return true;
  } catch (const Error& e) {
    // The durable tier lacks this step: with on_failure = stop every rank learns it before its
    // next step (asks()), or at the end of the run (step_missing_from_tier), and the run ends
    // with exit 10; the next commit is uploaded otherwise.
    log::error("checkpoint step {} could not be uploaded to {}: {}", step, mirror_root_, e.what());
    std::lock_guard<std::mutex> lock(mu_);
    ++upload_failures_;
    upload_failed_ = true;
    return false;
  }
}

void Checkpointer::upload_if_missing(int64_t step) {
  if (dist_.rank() != 0 || !storage::is_s3(mirror_root_)) return;
  std::error_code ec;
  if (!fs::exists(root_ + "/" + step_dir_name(step) + "/manifest.json", ec)) return;  // resumed from the tier itself
  {
    std::lock_guard<std::mutex> lock(mu_);
    resumed_upload_ = step;
    newest_commit_ = std::max(newest_commit_, step);
  }
  cv_.notify_all();
}

int64_t Checkpointer::step_missing_from_tier() {
  if (!storage::is_s3(mirror_root_)) return -1;
  wait();                                        // the last save's commit queues its upload
  const std::string what = "missing_from_tier";  // under the last save's step: the same on every rank
  if (dist_.rank() == 0) {
    int64_t missing = -1;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return mirror_queue_.empty() && resumed_upload_ < 0 && !mirroring_; });
      if (newest_commit_ > newest_in_tier_) missing = newest_commit_;
    }
    publish(last_started_, what, std::to_string(missing));
    return missing;
  }
  CHECK(dist_.store != nullptr && dist_.tier_store != nullptr);  // ranks other than 0 are in a job with stores
  // Rank 0 may still be uploading the last checkpoint, or awaiting another node's object: for as
  // long as the uploads move bytes.
  try {
    return std::stoll(
        string_of(await_while_progressing(*dist_.store, store_key(last_started_, what), progress_counter(dist_),
                                          storage_wait(config_), "verdict of rank 0 on the last upload")));
  } catch (const std::exception& e) {
    throw IoError(
        fmt::format("cannot learn from rank 0 whether {} holds the last checkpoint: {}", mirror_root_, e.what()));
  }
}

TierUpload Checkpointer::tier_upload(std::vector<int> node_of_file) const {
  return {static_cast<int>(config_.checkpoint.keep), static_cast<int>(config_.checkpoint.s3_prefixes),
          std::move(node_of_file)};
}

std::string Checkpointer::tier_key(int64_t job, const std::string& what) const {
  return fmt::format("tier.{}.{}{}", dist_.attempt, job, what.empty() ? "" : "." + what);
}

TierUploadStats Checkpointer::upload_to_tier(int64_t step) {
  storage::S3Client& s3 = storage::default_s3_client();
  const TierUpload how = tier_upload(node_of_file_);
  if (nodes_ == 1) return upload_checkpoint(s3, root_, step, mirror_root_, how);
  // Every node's uploader sends its object of this step; rank 0 (node 0's) commits once all have.
  const int64_t job = next_job_;
  dist_.tier_store->set(tier_key(job, ""), bytes_of(std::to_string(step)));
  ++next_job_;  // published: the node uploaders will look for the next one
  std::string failure;
  TierUploadStats sent;
  try {
    sent = upload_node_object(s3, root_, step, mirror_root_, how, 0);
  } catch (const Error& e) {
    failure = fmt::format("node 0: {}", e.what());
  }
  const comm::Millis wait = storage_wait(config_);  // once the uploads stop moving bytes
  const ProgressCounter moved = progress_counter(dist_);
  for (int node = 1; node < nodes_; ++node) {  // every report awaited, so none still uploads after a drop
    std::string report;
    try {
      report = string_of(await_while_progressing(*dist_.tier_store, tier_key(job, fmt::format("node{}", node)), moved,
                                                 wait, fmt::format("report of node {}'s upload", node)));
    } catch (const Error& e) {
      report = fmt::format("error no report: {}", e.what());
    }
    std::istringstream in(report);
    std::string word;
    TierUploadStats theirs;
    in >> word >> theirs.objects >> theirs.bytes >> theirs.puts;
    if (word != "ok") {
      if (failure.empty())
        failure = fmt::format("node {}: {}", node, report.substr(std::min<size_t>(report.size(), 6)));
      continue;
    }
    sent.objects += theirs.objects;
    sent.bytes += theirs.bytes;
    sent.puts += theirs.puts;
  }
  if (!failure.empty()) {
    drop_upload(s3, step, mirror_root_, how, nodes_);
    throw IoError(failure);
  }
  const int64_t before = s3.counts().puts();
  commit_upload(s3, root_, step, mirror_root_, how);
  sent.puts += s3.counts().puts() - before;
  return sent;
}

void Checkpointer::node_upload_loop(int node) {
  storage::S3Client* s3 = nullptr;
  const TierUpload how = tier_upload(node_of_file_);
  double stopping_since = -1;
  for (int64_t job = 0;;) {
    std::string value;
    try {
      value = string_of(dist_.tier_store->get(tier_key(job, ""), comm::Millis(1000)));
    } catch (const Error&) {  // no job yet: go on waiting, unless the job is over and rank 0 gone quiet
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_ && stopping_since < 0) stopping_since = now_seconds();
      if (stopping_since >= 0 && now_seconds() - stopping_since > config_.parallel.timeout_ms / 1e3) return;
      continue;
    }
    if (value == "stop") return;
    const int64_t step = std::stoll(value);
    std::string report;
    try {
      if (s3 == nullptr) s3 = &storage::default_s3_client();
      if (fault::point("checkpoint.upload", dist_.rank(), step) == fault::Kind::kIo) {
        throw IoError(fmt::format("cannot upload node {}'s object (injected fault)", node));
      }
      const PublishedProgress published(progress_counter(dist_));  // for rank 0 and the waiting ranks
      const TierUploadStats sent = upload_node_object(*s3, root_, step, mirror_root_, how, node);
      report = fmt::format("ok {} {} {}", sent.objects, sent.bytes, sent.puts);
      log::info("checkpoint step {}: node {}'s object uploaded ({} bytes, {} PUT request(s))", step, node, sent.bytes,
                sent.puts);
    } catch (const Error& e) {
      report = fmt::format("error {}", e.what());
      log::error("checkpoint step {}: node {}'s object could not be uploaded: {}", step, node, e.what());
    }
    try {
      dist_.tier_store->set(tier_key(job, fmt::format("node{}", node)), bytes_of(report));
    } catch (const Error& e) {
      log::error("checkpoint step {}: cannot report node {}'s upload: {}", step, node, e.what());
    }
    ++job;
  }
}

}  // namespace tessera::checkpoint
