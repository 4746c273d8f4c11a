// The shared step loop.
#include "train/loop.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/signals.h"
#include "core/timer.h"
#include "storage/object_url.h"

namespace tessera::train {
namespace {

// Signals a rank raises in Trainer::step; all ranks act on their OR after the same step.
constexpr uint32_t kStopRequested = 1, kSaveDue = 2, kSaveFailed = 4;

}  // namespace

std::optional<Trainer::Evaluation> Validator::maybe_evaluate(Trainer& trainer, int64_t step, bool last,
                                                             StepLog::Extra* extra) const {
  if (interval_ <= 0 || (step % interval_ != 0 && !last)) return std::nullopt;
  const double t0 = now_seconds();
  const Trainer::Evaluation e = trainer.evaluate(last ? trainer.validation_batches() : 0);
  extra->val_loss = e.loss;
  extra->val_tokens = e.targets;
  extra->eval_s = now_seconds() - t0;
  return e;
}

LoopEnd run_steps(Trainer& trainer, checkpoint::Checkpointer* checkpointer, const LoopHooks& hooks) {
  const config::Config& config = trainer.config();
  const Validator validator(config);
  auto finished = [&] {
    return trainer.steps_done() >= config.train.max_steps ||
           (config.train.max_tokens > 0 && trainer.state().tokens >= config.train.max_tokens);
  };
  LoopEnd end;
  while (!finished()) {
    uint32_t raise = StopSignals::received() != 0 ? kStopRequested : 0;
    if (checkpointer != nullptr) {
      const checkpoint::Checkpointer::Asks asks = checkpointer->asks();
      raise |= (asks.save_due ? kSaveDue : 0) | (asks.failed_and_stop ? kSaveFailed : 0);
    }
    const StepStats s = trainer.step(raise);
    if (hooks.stepped) hooks.stepped(s.step);
    const bool last = finished();
    StepLog::Extra extra;
    if (auto e = validator.maybe_evaluate(trainer, s.step, last, &extra); e && last) {
      end.final_eval = e;
      end.final_eval_s = extra.eval_s;
    }
    if (checkpointer != nullptr) {
      const checkpoint::Checkpointer::Asks job{(s.signals & kSaveDue) != 0, (s.signals & kSaveFailed) != 0};
      extra.checkpoint_s =
          checkpointer->maybe_save(trainer.shards(), trainer.state(), job, (s.signals & kStopRequested) != 0, last);
      if (storage::is_s3(config.checkpoint.mirror_dir)) extra.upload_failures = checkpointer->upload_failures();
    }
    if (hooks.observe) hooks.observe(s, extra);
    if (s.signals & kSaveFailed) {
      throw IoError(fmt::format(
          "step {}: a checkpoint save failed and checkpoint.on_failure = stop; the last committed checkpoint is intact",
          s.step));
    }
    if (s.signals & kStopRequested) {
      end.stopped = true;
      break;
    }
  }
  if (hooks.finishing) hooks.finishing(trainer.steps_done());
  if (checkpointer != nullptr) {
    const bool last_ok = checkpointer->wait();
    // With on_failure = stop, a save that failed after the last step's asks() (saves finish in the
    // background) ends the run too; once wait() returns, every rank gives the same answer.
    const bool stop_on_failure = config.checkpoint.on_failure == config::OnFailure::kStop;
    if ((!last_ok && end.stopped) || (stop_on_failure && checkpointer->save_failure_pending())) {
      throw IoError("a checkpoint save failed (see above); the last committed checkpoint is intact");
    }
    // So does an upload to the object-store tier that failed after the last step's asks(): the
    // run's last checkpoint would be on local disk only.
    if (const int64_t missing = stop_on_failure ? checkpointer->step_missing_from_tier() : -1; missing >= 0) {
      throw IoError(
          fmt::format("checkpoint {} is committed on local disk but not in {}: its upload failed (see above) and "
                      "checkpoint.on_failure = stop; a run resumed from it (--resume auto) uploads it",
                      checkpoint::step_dir_name(missing), checkpointer->mirror()));
    }
  }
  return end;
}

}  // namespace tessera::train
