// Layer checkpoint: file formats (shard files, manifests, safetensors, Hugging Face), the
// checkpointer and its commit protocol, resume and reshard. It must not know the trainer, fsdp or
// how processes were started.
//
// Sharded, asynchronous, atomically committed checkpoints of a training run (ARCHITECTURE.md,
// "Checkpoints"); resume.h loads them back at any world size or strategy. What is saved arrives as
// a RankShards view (this rank's shards of the parameters and moments) and a TrainingState; this
// layer knows neither the trainer nor how the processes were started.
//
// Save: the step loop copies this rank's shards (fp32 master parameters, AdamW moments) into a
// host buffer and goes on; a writer thread writes and fsyncs RUN/checkpoints/step_N/shard_K.bin
// (one file per shard rank: replicas hold the same shard, so only the first replica writes) and
// reports to rank 0 through the store, under keys of this attempt (parallel::Distributed::attempt). Rank 0
// commits once every rank has reported success and every shard file read back has the size and
// checksum its rank reported, unless a later attempt owns the directory (ROOT/.attempt, written
// at start-up: the fence): manifest.json written to a temporary name, fsynced, renamed, then
// `latest` replaced the same way; then it tells every rank the outcome, so all agree whether the
// save failed. A directory
// without a manifest is never loaded and is removed. Checkpoints must live on a file system every
// rank of the job sees (the local disk of a single node, or a shared one); `checkpoint.mirror_dir`
// receives a verified copy of each committed checkpoint in the background.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/directory.h"
#include "checkpoint/object_tier.h"
#include "checkpoint/shard_file.h"
#include "checkpoint/state.h"
#include "config/config.h"
#include "parallel/job.h"

namespace tessera::checkpoint {

// How long a rank waits for another that reads or writes slow storage (loads a checkpoint, lists
// the object-store tier, uploads): parallel.timeout_ms, but at least 30 minutes, since a rank's
// load or upload may take that much longer than its peers' (an object store throttling some
// prefixes, a slower node) where no collective would. A hung rank is the launch agent's to find:
// --hang-timeout counts the bytes a worker moves.
comm::Millis storage_wait(const config::Config& config);

class Checkpointer {
 public:
  // root: the checkpoint directory (RUN/checkpoints), created if missing. Rank 0 removes the
  // directories of saves that never committed, and mirrors each commit to checkpoint::mirror_root().
  Checkpointer(const config::Config& config, const std::string& root, const parallel::Distributed& dist);
  ~Checkpointer();  // waits for the save in flight and the mirror copy
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Starts saving the training state after step state.step: waits for the previous save, copies
  // this rank's shards to host memory and hands them to the writer thread. Returns the seconds
  // the step loop stalled. Every rank calls it after the same step.
  double save(const RankShards& shards, const TrainingState& state);
  // Waits for the save in flight, if any; true when it committed (all ranks get the same answer).
  bool wait();
  // Whether a save or (rank 0) an upload to the object-store tier has failed since the last call
  // (all ranks learn a save's outcome, not at the same step; only rank 0 an upload's).
  bool take_failure();
  // Whether a save has failed since take_failure(), without taking it. Every rank gives the same
  // answer after wait() (a save's outcome is the job's), unless some rank has taken it since.
  bool save_failure_pending();

  // The save policy (checkpoint.interval_minutes, interval_steps, on_failure), decided alike on
  // every rank. Before a step each rank says what it asks of the job; the step's all-reduce ORs
  // the asks over ranks.
  struct Asks {
    bool save_due = false;         // checkpoint.interval_minutes have passed since the last save
    bool failed_and_stop = false;  // a save failed and checkpoint.on_failure = stop
  };
  Asks asks();
  // After step state.step, with the job's OR of the asks and of stop requests: saves when a stop
  // was requested, the time or step interval came, or `last` is the run's last step (checkpointing
  // on); never once a save failed with on_failure = stop (the run then ends on its last committed
  // one), whether the job was told of the failure or it came after this step's asks(). Returns the
  // seconds the step loop stalled, 0 when nothing was saved.
  double maybe_save(const RankShards& shards, const TrainingState& state, const Asks& job, bool stop_requested,
                    bool last);
  // Rank 0, with an object-store tier: the run resumed from its own committed step `step`. When
  // the tier holds neither it nor a newer step (its upload failed, or the last run ended before
  // it landed), it is uploaded in the background, by rank 0 alone as one node object, unless a
  // newer commit comes first. Does nothing on other ranks or without a tier.
  void upload_if_missing(int64_t step);
  // With an object-store tier: waits until rank 0's uploads of every commit so far (and of the
  // step the run resumed from) have ended, and returns the newest committed step the tier lacks,
  // or -1. Every rank calls it at the end of the run and gets rank 0's answer (through the
  // store). -1 at once without a tier.
  int64_t step_missing_from_tier();
  // The step of the newest save this process started, or -1.
  int64_t last_saved_step() const { return last_started_; }
  const std::string& root() const { return root_; }
  const std::string& mirror() const { return mirror_root_; }  // "" without checkpoint.mirror_dir
  // Uploads to the object-store tier that failed for good (rank 0; 0 elsewhere).
  int64_t upload_failures() {
    std::lock_guard<std::mutex> lock(mu_);
    return upload_failures_;
  }

 private:
  struct Pending {
    int64_t step = -1;
    checkpoint::Manifest manifest;  // everything but the files
    std::string refused;            // why this rank will not write it (a non-finite value); "" to write
  };
  // On the training thread: the shards into the pinned host buffer (device-to-host where the
  // backend is a GPU), and what the save's manifest says of the run.
  void copy_to_host(const RankShards& shards);
  checkpoint::Manifest manifest_of(const TrainingState& state) const;
  // No checkpoint may hold a non-finite value (RELIABILITY.md row 14): the first one in the host
  // copy, named, or "". This rank then refuses, and the save fails on every rank as an I/O error
  // does (the previous checkpoint stays latest).
  std::string first_non_finite(int64_t step) const;
  void writer_loop();
  // On the writer thread: every rank writes its shard and reports it in the store; rank 0
  // collects the reports, verifies the files, commits and publishes the outcome everyone
  // returns. The steps below return "" or what failed.
  bool write_and_commit(const Pending& job);
  std::string write_own_shard(const Pending& job, const std::string& dir, FileDigest* digest);
  bool await_outcome(int64_t step);  // ranks other than 0
  // Awaits every other rank's report (so none still writes when a failed save is removed) and
  // fills the digests of the shard files the others wrote.
  std::string collect_reports(int64_t step, std::vector<FileDigest>* digests);
  // The shard files: one per (pp, tp, dp_shard) coordinate (numbered by file_number), written by
  // the first replica; the file global rank `rank` writes, -1 for none.
  int files() const;
  int file_of_rank(int rank) const;
  std::string file_name(int file) const;
  std::string verify_files(const std::string& dir, const std::vector<FileDigest>& digests) const;
  std::string commit(const Pending& job, const std::string& dir, const std::vector<FileDigest>& digests);
  void abandon(int64_t step, const std::string& dir, const std::string& failure) const;  // logs, removes dir
  std::string store_key(int64_t step, const std::string& what) const;
  void publish(int64_t step, const std::string& what, const std::string& value);
  std::string fence_path() const;             // ROOT/.attempt: the attempt that owns the directory
  std::string fenced() const;                 // why this attempt may not commit or delete; "" if it may
  void mirror_loop();
  // On the mirror thread: copies committed step `step` to the mirror (resumed: the step the run
  // resumed from, uploaded only where the tier lacks it); true when the mirror holds it.
  bool mirror_step(int64_t step, bool resumed);
  // The object-store tier over several nodes (checkpoint/object_tier.h): rank 0 numbers each
  // upload (a job) in the tier store, sends node 0's object, awaits the other nodes' reports and
  // commits; node k's first rank sends node k's object for each job and reports.
  TierUploadStats upload_to_tier(int64_t step);
  void node_upload_loop(int node);
  std::string tier_key(int64_t job, const std::string& what) const;
  // checkpoint.keep and s3_prefixes, with the node of each shard file (empty: all on node 0).
  TierUpload tier_upload(std::vector<int> node_of_file) const;

  config::Config config_;
  std::string root_;
  std::string mirror_root_;  // "" without checkpoint.mirror_dir
  parallel::Distributed dist_;
  // param, exp_avg, exp_avg_sq of every unit's shard: host memory the backend copies into at full
  // speed (pinned on a GPU), so a save's stall is that copy.
  kernels::Memory host_;
  std::vector<checkpoint::TensorView> views_;  // into host_, in file order
  int64_t last_started_ = -1;
  double last_save_time_;  // when the last save started (or this checkpointer was made), for the time interval

  std::mutex mu_;
  std::condition_variable cv_;
  Pending job_;          // the save in flight (step -1: none)
  bool busy_ = false;    // job_ is being written
  bool outcome_ = true;  // of the last finished save
  bool save_failed_ = false;    // a save failed since take_failure()
  bool upload_failed_ = false;  // (rank 0) an upload to the object-store tier failed since take_failure()
  bool stop_ = false;
  // Rank 0's mirror thread: the commits to copy, the step the run resumed from (-1: none), whether
  // it is copying one; the newest step committed or resumed from, the newest the tier holds.
  std::deque<int64_t> mirror_queue_;
  int64_t resumed_upload_ = -1;
  bool mirroring_ = false;
  int64_t newest_commit_ = -1, newest_in_tier_ = -1;
  std::atomic<int64_t> uploading_{-1};  // the step the mirror thread copies (or copied last)
  std::vector<int> node_of_file_;  // by shard file number: the node of the rank that writes it
  int nodes_ = 1;                  // nodes with an uploader of their own (1: rank 0 sends every object)
  int64_t next_job_ = 0;           // rank 0: the number of the next upload job
  int64_t upload_failures_ = 0;    // object-store uploads that failed for good
  std::thread writer_, mirror_;  // last: they start after everything above
};

}  // namespace tessera::checkpoint
