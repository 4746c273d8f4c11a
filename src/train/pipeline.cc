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
  options_.after = stream_ = backend.stream();  // a send follows the compute that wrote its buffer
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

double PipelineStageRunner::blocked_seconds() const {
  return blocked_seconds_ + (group_ != nullptr && stream_ != nullptr ? group_->device_wait_seconds() : 0.0);
}

void PipelineStageRunner::finish(InFlight& f) {
  if (!f.work) return;
  const double t0 = now_seconds();
  named(f, [&] { f.work->wait(); });
  blocked_seconds_ += now_seconds() - t0;
  f.work.reset();
}

void PipelineStageRunner::order(InFlight& f) {
  if (!f.work) return;
  if (stream_ == nullptr) return finish(f);
  named(f, [&] { f.work->wait_on_device(stream_); });
  ordered_.push_back(std::move(f));
  f = {};
}

void PipelineStageRunner::named(const InFlight& f, const std::function<void()>& wait) const {
  try {
    wait();
  } catch (const comm::CollectiveError& e) {
    throw comm::CollectiveError(
        fmt::format("pipeline stage {}: {} failed: {}", layout_.stage().rank, f.what, e.what()));
  }
}

std::optional<PipelineStageRunner::Transfer> PipelineStageRunner::incoming(const PipelineOp& op) {
  const int stage = layout_.stage().rank, b = op.micro_batch;
  model::Llama& m = *models_[slot_of(op)];
  if (op.forward && !layout_.has_embedding()) {
    return Transfer{{false, m.stage_input(), activation_floats_, comm::DType::kF32, stage - 1, uint32_t(2 * b)},
                    fmt::format("receiving micro-batch {}'s activations from stage {}", b, stage - 1)};
  }
  if (!op.forward && !layout_.has_head()) {
    return Transfer{
        {false, m.stage_output_grad(), activation_floats_, comm::DType::kF32, stage + 1, uint32_t(2 * b + 1)},
        fmt::format("receiving micro-batch {}'s output gradient from stage {}", b, stage + 1)};
  }
  return std::nullopt;
}

std::optional<PipelineStageRunner::Transfer> PipelineStageRunner::outgoing(const PipelineOp& op) {
  const int stage = layout_.stage().rank, b = op.micro_batch;
  model::Llama& m = *models_[slot_of(op)];
  if (op.forward && !layout_.has_head()) {
    return Transfer{
        {true, const_cast<float*>(m.stage_output()), activation_floats_, comm::DType::kF32, stage + 1, uint32_t(2 * b)},
        fmt::format("sending micro-batch {}'s activations to stage {}", b, stage + 1)};
  }
  if (!op.forward && !layout_.has_embedding()) {
    return Transfer{{true, const_cast<float*>(m.stage_input_grad()), activation_floats_, comm::DType::kF32, stage - 1,
                     uint32_t(2 * b + 1)},
                    fmt::format("sending micro-batch {}'s input gradient to stage {}", b, stage - 1)};
  }
  return std::nullopt;
}

void PipelineStageRunner::post(const PipelineOp* done, const PipelineOp* next) {
  const std::optional<Transfer> out = done ? outgoing(*done) : std::nullopt;
  const std::optional<Transfer> in = next ? incoming(*next) : std::nullopt;
  if (!in) {
    if (out) slots_[slot_of(*done)].send = {group_->send_recv({out->p2p}, options_), out->what};
    return;
  }
  // The buffers about to be received into must be sent first. On a device the group's one stream
  // runs the receive after the send anyway.
  order(slots_[slot_of(*next)].send);
  std::vector<comm::PointToPoint> batch{in->p2p};
  std::string what = in->what;
  if (out) {
    CHECK(out->p2p.data != in->p2p.data);
    batch.push_back(out->p2p);
    what += " (with " + out->what + ")";
  }
  incoming_ = {group_->send_recv(batch, options_), std::move(what)};
}

model::LossSum PipelineStageRunner::run(const std::vector<PipelineOp>& ops, model::ParamSource& params,
                                        const BatchSource& batch, const Hooks* hooks, float grad_scale) {
  model::LossSum loss;
  // Micro-batch b lives in slot b mod slots from its forward to its backward: the schedule never
  // holds more than slots() at once, in order, so the slot is free again when b + slots() comes.
  for (size_t i = 0; i < ops.size(); ++i) {
    const PipelineOp& op = ops[i];
    const int slot = slot_of(op);
    Slot& s = slots_[slot];
    model::Llama& m = *models_[slot];
    if (i == 0) post(nullptr, &op);
    order(incoming_);
    order(s.send);  // the slot's buffers are about to be overwritten
    if (hooks && hooks->before) hooks->before(op);
    if (op.forward) {
      const data::Loader::Batch b = batch(op.micro_batch);
      s.micro_batch = op.micro_batch;
      std::copy(b.inputs, b.inputs + s.inputs.size(), s.inputs.begin());
      const model::LossSum part = hooks ? m.forward(params, s.inputs.data(), b.targets, grad_scale)
                                        : m.forward_loss(params, s.inputs.data(), b.targets);
      loss.sum += part.sum;
      loss.count += part.count;
    } else {
      CHECK(s.micro_batch == op.micro_batch);
      m.backward(params, s.inputs.data());
    }
    if (hooks && hooks->after) hooks->after(op, op.forward ? m.head_backward_seconds() : 0.0);
    post(&op, i + 1 < ops.size() ? &ops[i + 1] : nullptr);
  }
  finish(incoming_);
  for (Slot& s : slots_) finish(s.send);
  for (InFlight& f : ordered_) finish(f);  // done, or failed: a failure surfaces here
  ordered_.clear();
  return loss;
}

model::LossSum PipelineStageRunner::step(model::ParamSource& params, const BatchSource& batch, const Hooks& hooks,
                                         float grad_scale) {
  const model::PipelineStage& st = layout_.stage();
  return run(pipeline_schedule(schedule_, st.size, st.rank, micro_batches_), params, batch, &hooks, grad_scale);
}

model::LossSum PipelineStageRunner::forward_only(model::ParamSource& params, const BatchSource& batch) {
  std::vector<PipelineOp> ops;
  for (int b = 0; b < micro_batches_; ++b) ops.push_back({true, b});
  return run(ops, params, batch, nullptr, 0.0f);
}

}  // namespace tessera::train
