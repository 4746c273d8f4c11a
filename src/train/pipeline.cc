// Pipeline parallelism: schedules and one stage's step.
#include "train/pipeline.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/check.h"
#include "core/error.h"
#include "core/timer.h"

namespace tessera::train {

std::vector<PipelineOp> pipeline_schedule(PipelineSchedule schedule, int stages, int stage, int micro_batches) {
  CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1);
  std::vector<PipelineOp> ops;
  const int m = micro_batches;
  if (schedule == PipelineSchedule::kGPipe) {
    for (int b = 0; b < m; ++b) ops.push_back({true, b});
    for (int b = 0; b < m; ++b) ops.push_back({false, b});
    return ops;
  }
  const int warmup = std::min(stages - stage - 1, m);
  for (int b = 0; b < warmup; ++b) ops.push_back({true, b});
  for (int b = warmup; b < m; ++b) {
    ops.push_back({true, b});
    ops.push_back({false, b - warmup});
  }
  for (int b = m - warmup; b < m; ++b) ops.push_back({false, b});
  return ops;
}

int pipeline_in_flight(PipelineSchedule schedule, int stages, int stage, int micro_batches) {
  int live = 0, most = 0;
  for (const PipelineOp& op : pipeline_schedule(schedule, stages, stage, micro_batches)) {
    live += op.forward ? 1 : -1;
    most = std::max(most, live);
  }
  return most;
}

PipelineStageRunner::PipelineStageRunner(const model::ModelLayout& layout, int64_t micro_batch, int threads,
                                         int64_t recompute_every, bool bf16, PipelineSchedule schedule,
                                         int micro_batches, comm::ProcessGroup* group, comm::Millis timeout,
                                         kernels::Backend& backend)
    : layout_(layout), schedule_(schedule), micro_batches_(micro_batches), group_(group) {
  const model::PipelineStage& st = layout.stage();
  CHECK((group == nullptr) == (st.size == 1));
  CHECK(group == nullptr || (group->size() == st.size && group->rank() == st.rank));
  options_.timeout = timeout;
  const int n = pipeline_in_flight(schedule, st.size, st.rank, micro_batches);
  for (int i = 0; i < n; ++i) {
    models_.push_back(std::make_unique<model::Llama>(layout, micro_batch, threads, recompute_every, bf16, backend));
    slots_.emplace_back();
    slots_.back().inputs.resize(static_cast<size_t>(micro_batch * layout.config().seq_len));
  }
  activation_floats_ = models_.front()->stage_floats();
}

size_t PipelineStageRunner::activation_bytes() const {
  size_t n = 0;
  for (const auto& m : models_) n += m->activation_bytes();
  return n;
}

void PipelineStageRunner::finish_send(Slot& s) {
  if (!s.send) return;
  const double t0 = now_seconds();
  try {
    s.send->wait();
    blocked_seconds_ += now_seconds() - t0;
  } catch (const comm::CollectiveError& e) {
    const int rank = layout_.stage().rank;
    throw comm::CollectiveError(fmt::format("pipeline stage {}: sending micro-batch {}'s {} to stage {} failed: {}",
                                            rank, s.micro_batch, s.sending_gradient ? "input gradient" : "activations",
                                            s.sending_gradient ? rank - 1 : rank + 1, e.what()));
  }
  s.send.reset();
}

void PipelineStageRunner::receive(float* data, int peer, int micro_batch, bool gradient) {
  const double t0 = now_seconds();
  try {
    group_
        ->recv(data, activation_floats_, comm::DType::kF32, peer, static_cast<uint32_t>(2 * micro_batch + gradient),
               options_)
        ->wait();
    blocked_seconds_ += now_seconds() - t0;
  } catch (const comm::CollectiveError& e) {
    throw comm::CollectiveError(fmt::format("pipeline stage {}: micro-batch {}'s {} from stage {} did not arrive: {}",
                                            layout_.stage().rank, micro_batch,
                                            gradient ? "output gradient" : "activations", peer, e.what()));
  }
}

void PipelineStageRunner::forward(model::ParamSource& params, int slot, int micro_batch, const data::Loader::Batch& b,
                                  bool with_grads, float grad_scale, model::LossSum* loss) {
  Slot& s = slots_[slot];
  finish_send(s);  // the slot's buffers are about to be overwritten
  s.micro_batch = micro_batch;
  std::copy(b.inputs, b.inputs + s.inputs.size(), s.inputs.begin());
  model::Llama& m = *models_[slot];
  const int stage = layout_.stage().rank;
  if (!layout_.has_embedding()) receive(m.stage_input(), stage - 1, micro_batch, false);
  const model::LossSum part = with_grads ? m.forward(params, s.inputs.data(), b.targets, grad_scale)
                                         : m.forward_loss(params, s.inputs.data(), b.targets);
  loss->sum += part.sum;
  loss->count += part.count;
  if (!layout_.has_head()) {
    s.send = group_->send(m.stage_output(), activation_floats_, comm::DType::kF32, stage + 1,
                          static_cast<uint32_t>(2 * micro_batch), options_);
    s.sending_gradient = false;
  }
}

void PipelineStageRunner::backward(model::ParamSource& params, int slot, int micro_batch) {
  Slot& s = slots_[slot];
  CHECK(s.micro_batch == micro_batch);
  finish_send(s);
  model::Llama& m = *models_[slot];
  const int stage = layout_.stage().rank;
  if (!layout_.has_head()) receive(m.stage_output_grad(), stage + 1, micro_batch, true);
  m.backward(params, s.inputs.data());
  if (!layout_.has_embedding()) {
    s.send = group_->send(m.stage_input_grad(), activation_floats_, comm::DType::kF32, stage - 1,
                          static_cast<uint32_t>(2 * micro_batch + 1), options_);
    s.sending_gradient = true;
  }
}

model::LossSum PipelineStageRunner::step(model::ParamSource& params, const BatchSource& batch, const Hooks& hooks,
                                         float grad_scale) {
  const model::PipelineStage& st = layout_.stage();
  model::LossSum loss;
  // Micro-batch b lives in slot b mod slots from its forward to its backward: the schedule never
  // holds more than slots() at once, in order, so the slot is free again when b + slots() comes.
  for (const PipelineOp& op : pipeline_schedule(schedule_, st.size, st.rank, micro_batches_)) {
    const int slot = op.micro_batch % slots();
    if (hooks.before) hooks.before(op);
    if (op.forward) {
      forward(params, slot, op.micro_batch, batch(op.micro_batch), true, grad_scale, &loss);
    } else {
      backward(params, slot, op.micro_batch);
    }
    if (hooks.after) hooks.after(op, op.forward ? models_[slot]->head_backward_seconds() : 0.0);
  }
  for (Slot& s : slots_) finish_send(s);
  return loss;
}

model::LossSum PipelineStageRunner::forward_only(model::ParamSource& params, const BatchSource& batch) {
  model::LossSum loss;
  for (int b = 0; b < micro_batches_; ++b) forward(params, 0, b, batch(b), false, 0.0f, &loss);
  finish_send(slots_[0]);
  return loss;
}

}  // namespace tessera::train
