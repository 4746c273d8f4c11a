// The step loop that `tessera train` and `tessera bench` share, and the evaluation decision in it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "checkpoint/checkpointer.h"
#include "config/config.h"
#include "train/step_log.h"
#include "train/trainer.h"

namespace tessera::train {

// The evaluation decision: every train.eval_interval steps over the first train.eval_batches
// batches, and after the last step over the whole validation split, as `tessera eval` does, so
// that the two agree on the same weights. Never when train.eval_interval is 0.
class Validator {
 public:
  explicit Validator(const config::Config& config) : interval_(config.train.eval_interval) {}
  // Evaluates after `step` when due, filling extra's val_loss, val_tokens and eval_s.
  std::optional<Trainer::Evaluation> maybe_evaluate(Trainer& trainer, int64_t step, bool last,
                                                    StepLog::Extra* extra) const;

 private:
  int64_t interval_;
};

// How the loop ended.
struct LoopEnd {
  bool stopped = false;                           // by a stop request, after saving a checkpoint
  std::optional<Trainer::Evaluation> final_eval;  // the whole validation split after the last step
  double final_eval_s = 0.0;
};

struct LoopHooks {
  std::function<void(int64_t step)> stepped;  // right after each step, before evaluation and saving
  std::function<void(const StepStats&, const StepLog::Extra&)> observe;  // after each step's evaluation and save
  std::function<void(int64_t step)> finishing;  // once the steps are done, before the last checkpoint is awaited
};

// Steps until train.max_steps (or train.max_tokens) or a stop request (SIGTERM, SIGINT: that step
// finishes and a checkpoint is saved); every rank decides alike what to do after a step, from
// the OR over ranks of their signals. Evaluates as Validator decides and, with a checkpointer,
// saves as Checkpointer::maybe_save decides, then waits for the last save. Throws IoError when a
// save failed and checkpoint.on_failure = stop (the last committed checkpoint is intact).
LoopEnd run_steps(Trainer& trainer, checkpoint::Checkpointer* checkpointer, const LoopHooks& hooks);

}  // namespace tessera::train
