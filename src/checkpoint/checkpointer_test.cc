// The checkpointer on its own (no trainer): a save round-trips exactly, a save refuses non-finite
// values (RELIABILITY.md row 14) on every rank, an earlier attempt is fenced off, the save policy,
// and the object-store tier's last upload (agreed on every rank, caught up by a resumed run).
#include "checkpoint/checkpointer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>

#include "checkpoint/directory.h"
#include "checkpoint/object_tier.h"
#include "checkpoint/resume.h"
#include "comm/test_util.h"
#include "parallel/job.h"
#include "storage/s3rver_test_util.h"

namespace tessera::checkpoint {
namespace {

// The tiny model, no timed saves; `extra` on top.
config::Config tiny_config(config::Overrides extra = {}) {
  config::Overrides o = {{"model.preset", "tiny"}, {"data.synthetic", "true"}, {"checkpoint.interval_minutes", "0"}};
  o.insert(o.end(), extra.begin(), extra.end());
  return config::load("", o);
}

// Rank r's shards of the tiny model cut among S ranks, in vectors this fixture owns; every value
// names its unit, kind and element, so that a slice read from the wrong place differs.
struct OwnedShards {
  model::ModelLayout layout;
  std::vector<std::vector<float>> data;  // param, exp_avg, exp_avg_sq of each unit
  RankShards view;

  OwnedShards(const config::Config& c, int S, int r, bool fill) : layout(c.model, 16 * S) {
    view.layout = &layout;
    for (int u = 0; u < layout.num_units(); ++u) {
      const parallel::ShardRange range = parallel::shard_range(layout.units()[u].padded, S, r);
      for (int kind = 0; kind < 3; ++kind) {
        std::vector<float>& d = data.emplace_back(range.size, 0.0f);
        for (int64_t i = 0; fill && i < range.size; ++i) {
          const int64_t e = range.begin + i;  // the padding past numel stays 0, as a checkpoint reads it
          d[i] = e < layout.units()[u].numel ? static_cast<float>(u * 1000003 + kind * 7919 + e) * 1e-3f : 0.0f;
        }
      }
    }
    for (int u = 0; u < layout.num_units(); ++u) {
      const parallel::ShardRange range = parallel::shard_range(layout.units()[u].padded, S, r);
      view.units.push_back({range, data[3 * u].data(), data[3 * u + 1].data(), data[3 * u + 2].data()});
    }
  }
};

// Runs `body` in 2 ranks of a job with a store under `dir`, each with its half of the shards and a
// checkpointer of `root`; what each rank's body returned.
std::vector<int> on_two_ranks(const std::string& dir, const config::Config& c, const std::string& root,
                              const std::function<int(int rank, Checkpointer&, OwnedShards&)>& body) {
  return comm::test_util::run_ranks(
      2,
      [&](int rank) {
        const parallel::Job job({dir + "/store", "job", "0", rank, 2}, parallel::ParallelDims{1, 1, 2, 1},
                                comm::Millis(20000));
        OwnedShards shards(c, 2, rank, true);
        Checkpointer checkpointer(c, root, job.view());
        return body(rank, checkpointer, shards);
      },
      60);
}

TEST(Checkpointer, SaveLoadsBackExactlyWithItsState) {
  comm::test_util::TempDir dir;
  const std::string root = dir.path + "/checkpoints";
  const config::Config c = tiny_config();
  OwnedShards saved(c, 1, 0, true);
  {
    Checkpointer checkpointer(c, root, {});
    checkpointer.save(saved.view, {7, 7 * 512, 56, 6});
    ASSERT_TRUE(checkpointer.wait());
  }
  OwnedShards loaded(c, 1, 0, false);
  const TrainingState s = load_checkpoint(root + "/" + step_dir_name(7), loaded.view, c);
  EXPECT_EQ(s.step, 7);
  EXPECT_EQ(s.tokens, 7 * 512);
  EXPECT_EQ(s.sampler_position, 56u);
  EXPECT_EQ(s.optimizer_steps, 6);
  ASSERT_EQ(loaded.data.size(), saved.data.size());
  for (size_t i = 0; i < saved.data.size(); ++i) EXPECT_EQ(loaded.data[i], saved.data[i]) << "array " << i;
}

TEST(Checkpointer, RefusesNonFiniteValuesOnEveryRank) {
  comm::test_util::TempDir dir;
  const std::string root = dir.path + "/checkpoints";
  const config::Config c = tiny_config({{"parallel.nproc", "2"}, {"parallel.timeout_ms", "20000"}});
  // Exit codes: 0 as expected, 1 the good save failed, 2 the poisoned save succeeded.
  const std::vector<int> status =
      on_two_ranks(dir.path, c, root, [](int rank, Checkpointer& checkpointer, OwnedShards& shards) {
        checkpointer.save(shards.view, {1, 0, 0, 1});
        if (!checkpointer.wait()) return 1;
        if (rank == 1) shards.view.units[1].exp_avg_sq[3] = std::numeric_limits<float>::infinity();
        checkpointer.save(shards.view, {2, 0, 0, 2});
        return checkpointer.wait() ? 2 : 0;
      });
  comm::test_util::expect_all_ok(status);
  EXPECT_EQ(read_latest(root), 1);
  EXPECT_FALSE(std::filesystem::exists(root + "/" + step_dir_name(2)));
}

// Issue 12 item 7: once a later attempt of the job has taken the checkpoint directory (its
// fence, ROOT/.attempt), a process of the earlier attempt can neither commit there nor remove
// the directory it was writing; the later attempt commits as usual.
TEST(Checkpointer, AnEarlierAttemptIsFencedOff) {
  comm::test_util::TempDir dir;
  const std::string root = dir.path + "/checkpoints";
  const config::Config c = tiny_config();
  OwnedShards shards(c, 1, 0, true);
  parallel::Distributed old_attempt, new_attempt;
  old_attempt.attempt = "0123456789abcdef";
  new_attempt.attempt = "fedcba9876543210";
  Checkpointer early(c, root, old_attempt);
  early.save(shards.view, {1, 0, 0, 1});
  EXPECT_TRUE(early.wait());
  Checkpointer later(c, root, new_attempt);  // e.g. a Slurm requeue while the old rank 0 lingers
  early.save(shards.view, {2, 0, 0, 2});
  EXPECT_FALSE(early.wait());
  EXPECT_EQ(read_latest(root), 1);
  EXPECT_TRUE(std::filesystem::exists(root + "/" + step_dir_name(2)))
      << "the fenced attempt removed a directory it no longer owns";
  later.save(shards.view, {3, 0, 0, 3});
  EXPECT_TRUE(later.wait());
  EXPECT_EQ(read_latest(root), 3);
}

// The save policy: which steps maybe_save saves after, from what the job asked.
TEST(Checkpointer, MaybeSaveFollowsThePolicy) {
  comm::test_util::TempDir dir;
  const std::string root = dir.path + "/checkpoints";
  const config::Config c = tiny_config({{"checkpoint.interval_steps", "3"}});
  OwnedShards shards(c, 1, 0, true);
  Checkpointer checkpointer(c, root, {});
  std::vector<int64_t> saved;
  const Checkpointer::Asks quiet, time_due{true, false}, failed{true, true};
  for (int64_t step = 1; step <= 8; ++step) {
    const Checkpointer::Asks& job = step == 4 ? time_due : step == 6 ? failed : quiet;
    checkpointer.maybe_save(shards.view, {step, 0, 0, step}, job, step == 5, step == 8);
    if (checkpointer.last_saved_step() == step) saved.push_back(step);
  }
  // 3 and 6 by the step interval (6 not: a save failed), 4 by time, 5 by a stop, 8 the last.
  EXPECT_EQ(saved, (std::vector<int64_t>{3, 4, 5, 8}));
  EXPECT_TRUE(checkpointer.wait());
}

// A save fails on the writer thread, after the last step's asks() (checkpoint_test.sh saw it: the
// save of step 8 failing while steps 9-12 ran). With on_failure = stop no later save is made and the
// failure waits to be taken at the end of the run (train/loop.cc); with continue the next is made.
TEST(Checkpointer, AFailureNoStepAskedAboutStopsLaterSavesUnderStop) {
  for (const char* policy : {"stop", "continue"}) {
    SCOPED_TRACE(policy);
    comm::test_util::TempDir dir;
    const std::string root = dir.path + "/checkpoints";
    const config::Config c = tiny_config({{"checkpoint.interval_steps", "4"}, {"checkpoint.on_failure", policy}});
    OwnedShards shards(c, 1, 0, true);
    parallel::Distributed old_attempt, new_attempt;
    old_attempt.attempt = "0123456789abcdef";
    new_attempt.attempt = "fedcba9876543210";
    Checkpointer early(c, root, old_attempt);
    Checkpointer later(c, root, new_attempt);  // takes the directory: every save of `early` fails
    early.maybe_save(shards.view, {4, 0, 0, 4}, {}, false, false);
    early.maybe_save(shards.view, {8, 0, 0, 8}, {}, false, true);  // the last step, no asks() between
    EXPECT_EQ(early.last_saved_step(), policy == std::string("stop") ? 4 : 8);
    early.wait();
    EXPECT_TRUE(early.save_failure_pending());
  }
}

// The last checkpoint's upload to the object-store tier fails (the server is down), after the
// run's last asks(): every rank learns from rank 0 which step the tier lacks. A run resumed from
// that step, at another world size, uploads it; once the tier holds it, a resumed run sends
// nothing. (The process's S3 client reads the environment at its first use: ctest runs each test
// in a process of its own.)
TEST(Checkpointer, TheTierLacksTheLastStepOnEveryRankUntilAResumedRunUploadsIt) {
  storage::test_util::S3rver server;  // started only once the first run is over
  ::setenv("AWS_ACCESS_KEY_ID", storage::test_util::S3rver::kAccessKey, 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", storage::test_util::S3rver::kSecretKey, 1);
  ::setenv("AWS_ENDPOINT_URL", server.endpoint().c_str(), 1);
  ::setenv("TESSERA_S3_ATTEMPTS", "1", 1);
  comm::test_util::TempDir dir;
  const std::string root = dir.path + "/run/checkpoints";
  const config::Config c = tiny_config({{"parallel.nproc", "2"},
                                        {"parallel.timeout_ms", "20000"},
                                        {"checkpoint.mirror_dir", "s3://tessera-test/tier"},
                                        {"checkpoint.on_failure", "stop"}});
  const std::string mirror = mirror_root(c.checkpoint.mirror_dir, root);
  // Exit codes: 0 as expected, 1 the save failed, 2 the wrong step said missing.
  const std::vector<int> status =
      on_two_ranks(dir.path, c, root, [](int, Checkpointer& checkpointer, OwnedShards& shards) {
        checkpointer.save(shards.view, {4, 0, 0, 4});
        if (!checkpointer.wait()) return 1;
        return checkpointer.step_missing_from_tier() == 4 ? 0 : 2;
      });
  comm::test_util::expect_all_ok(status);
  EXPECT_EQ(read_latest(root), 4);

  ASSERT_EQ(server.start(), "");
  storage::S3Client& s3 = storage::default_s3_client();
  {
    Checkpointer resumed(c, root, {});  // one process now: the two shard files in one node object
    resumed.upload_if_missing(4);
    EXPECT_EQ(resumed.step_missing_from_tier(), -1);
  }
  EXPECT_EQ(tier_committed_steps(s3, mirror), std::vector<int64_t>{4});
  EXPECT_EQ(tier_read_latest(s3, mirror), 4);
  const int64_t puts = s3.counts().puts();
  {
    Checkpointer again(c, root, {});
    again.upload_if_missing(4);
    EXPECT_EQ(again.step_missing_from_tier(), -1);
  }
  EXPECT_EQ(s3.counts().puts(), puts) << "a step the tier holds was sent again";
}

}  // namespace
}  // namespace tessera::checkpoint
