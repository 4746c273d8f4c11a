// A save refuses non-finite values (RELIABILITY.md row 14): the rank holding one reports it, every
// rank agrees the save failed, and the previous checkpoint stays latest.
#include "train/checkpointer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "checkpoint/directory.h"
#include "comm/test_util.h"
#include "parallel/job.h"
#include "train/trainer.h"

namespace tessera::train {
namespace {

// The tiny model on synthetic tokens, one thread, no timed saves; `extra` on top.
config::Config tiny_config(config::Overrides extra = {}) {
  config::Overrides o = {{"model.preset", "tiny"},
                         {"data.synthetic", "true"},
                         {"train.batch_size", "8"},
                         {"train.threads", "1"},
                         {"checkpoint.interval_minutes", "0"}};
  o.insert(o.end(), extra.begin(), extra.end());
  return config::load("", o);
}

void checkpoint_ok_or_fail(Checkpointer& checkpointer, Trainer& trainer, bool expected) {
  checkpointer.save(trainer);
  EXPECT_EQ(checkpointer.wait(), expected) << "step " << trainer.steps_done();
}

TEST(Checkpointer, RefusesNonFiniteValuesOnEveryRank) {
  comm::test_util::TempDir dir;
  const std::string root = dir.path + "/checkpoints";
  const config::Config c = tiny_config({{"parallel.nproc", "2"}, {"parallel.timeout_ms", "20000"}});
  // Exit codes: 0 as expected, 1 the good save failed, 2 the poisoned save succeeded.
  const std::vector<int> status = comm::test_util::run_ranks(2, [&](int rank) {
    const parallel::Job job({dir.path + "/store", "job", "0", rank, 2}, parallel::ParallelDims{1, 1, 2, 1},
                            comm::Millis(20000));
    Trainer trainer(c, "", job.view());
    Checkpointer checkpointer(c, root, job.view());
    trainer.step();
    checkpointer.save(trainer);
    if (!checkpointer.wait()) return 1;
    trainer.step();
    if (rank == 1) trainer.optimizer().exp_avg_sq(1)[3] = std::numeric_limits<float>::infinity();
    checkpointer.save(trainer);
    return checkpointer.wait() ? 2 : 0;
  }, 60);
  comm::test_util::expect_all_ok(status);
  EXPECT_EQ(checkpoint::read_latest(root), 1);
  EXPECT_FALSE(std::filesystem::exists(root + "/" + checkpoint::step_dir_name(2)));
}

// Issue 12 item 7: once a later attempt of the job has taken the checkpoint directory (its
// fence, ROOT/.attempt), a process of the earlier attempt can neither commit there nor remove
// the directory it was writing; the later attempt commits as usual.
TEST(Checkpointer, AnEarlierAttemptIsFencedOff) {
  comm::test_util::TempDir dir;
  const std::string root = dir.path + "/checkpoints";
  const config::Config c = tiny_config();
  parallel::Distributed old_attempt, new_attempt;
  old_attempt.attempt = "0123456789abcdef";
  new_attempt.attempt = "fedcba9876543210";
  Trainer trainer(c, "", old_attempt);
  Checkpointer early(c, root, old_attempt);
  trainer.step();
  checkpoint_ok_or_fail(early, trainer, true);
  Checkpointer later(c, root, new_attempt);  // e.g. a Slurm requeue while the old rank 0 lingers
  trainer.step();
  checkpoint_ok_or_fail(early, trainer, false);
  EXPECT_EQ(checkpoint::read_latest(root), 1);
  EXPECT_TRUE(std::filesystem::exists(root + "/" + checkpoint::step_dir_name(2)))
      << "the fenced attempt removed a directory it no longer owns";
  trainer.step();
  checkpoint_ok_or_fail(later, trainer, true);
  EXPECT_EQ(checkpoint::read_latest(root), 3);
}

}  // namespace
}  // namespace tessera::train
