// The fully sharded data-parallel ParamSource.
#include "fsdp/sharded_params.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "core/bf16.h"
#include "core/check.h"
#include "core/error.h"
#include "core/timer.h"
#include "fsdp/row_sparse.h"
#include "model/init.h"

namespace tessera::fsdp {

namespace {

// Tied embeddings under pipeline parallelism: the first stage receives the last stage's copy's
// gradient shard (join_tied_gradients) into a buffer of its state arena.
bool receives_tied_gradient(const model::ModelLayout& layout) {
  return layout.config().tied_embeddings && layout.stage().size > 1 && layout.stage().first();
}

// The embedding table's gradient holds the lookup's rows only (no LM head tied to it on this
// stage), in host memory: it may be reduced row-sparse (row_sparse.h).
bool reduces_table_rows(const model::ModelLayout& layout, const kernels::Backend& backend) {
  return backend.device() == kernels::Device::kCpu && layout.has_embedding() &&
         !(layout.config().tied_embeddings && layout.has_head());
}

}  // namespace

struct ShardedParams::Unit {
  int64_t padded = 0;               // L
  parallel::ShardRange range;       // this rank's elements of the unit: L/S of them
  float *master = nullptr, *grad = nullptr;  // this rank's shard
  float* full = nullptr;          // resident full parameters (master itself when S = 1)
  std::unique_ptr<comm::Work> gather;
  int refs = 0;                   // acquired and not yet released
  bool backward_done = false;     // shard_grad_op frees after the unit's backward
  float* full_grad = nullptr;     // full-size gradient being accumulated (S > 1)
  std::unique_ptr<comm::Work> reduce;
  std::unique_ptr<comm::Work> replica_reduce;  // the gradient shard's all-reduce over the replicas
  // bf16 communication: the master shard rounded for sending (S = 1 with param_dtype bf16: the
  // bf16 image that acquire_bf16 hands out); the reduced gradient shard before widening.
  uint16_t* send16 = nullptr;
  uint16_t* recv16 = nullptr;
  bool widened = false;           // bf16 gather: full holds the companion widened to fp32
  bool image_fresh = false;       // param_dtype bf16: send16 holds the master rounded, as it is now
  // The embedding's row-sparse reduction in flight (row_sparse.h): the rows packed at the front of
  // the gradient (full_grad, or grad when S = 1) and being reduced; unpacked when it completes.
  bool row_sparse = false;
  std::vector<int64_t> packed_rows;
};

ShardedParams::ShardedParams(const model::ModelLayout& layout, uint64_t seed, Strategy strategy,
                             const parallel::Mesh& mesh, int64_t accumulation, comm::Millis timeout,
                             comm::DType param_dtype, comm::DType reduce_dtype, kernels::Backend& backend)
    : layout_(layout),
      backend_(backend),
      strategy_(strategy),
      shard_rank_(mesh.rank(parallel::Dim::kDpShard)),
      shards_(mesh.size(parallel::Dim::kDpShard)),
      shard_group_(mesh.device_group(parallel::Dim::kDpShard)),
      replica_group_(mesh.device_group(parallel::Dim::kDpReplicate)),
      host_shard_group_(mesh.group(parallel::Dim::kDpShard)),
      tp_group_(mesh.device_group(parallel::Dim::kTp)),
      host_tp_group_(mesh.group(parallel::Dim::kTp)),
      pp_group_(mesh.device_group(parallel::Dim::kPp)),
      host_pp_group_(mesh.group(parallel::Dim::kPp)),
      accumulation_(accumulation),
      param_dtype_(param_dtype),
      reduce_dtype_(reduce_dtype) {
  const int S = shards_;
  CHECK(accumulation >= 1);
  CHECK_MSG(layout_.tensor_parallel().size == mesh.size(parallel::Dim::kTp) &&
                layout_.tensor_parallel().rank == mesh.rank(parallel::Dim::kTp),
            "the layout's tensor-parallel block is not the mesh's");
  CHECK_MSG(
      layout_.stage().size == mesh.size(parallel::Dim::kPp) && layout_.stage().rank == mesh.rank(parallel::Dim::kPp),
      "the layout's pipeline stage is not the mesh's");
  options_.timeout = timeout;
  options_.after = backend.stream();  // a collective follows the compute that wrote its inputs
  const ArenaBytes plan = planned_bytes(layout_, strategy_, S, accumulation_, param_dtype_, reduce_dtype_);
  const int n = layout_.num_units() + (layout_.tied_copy() != nullptr ? 1 : 0);
  const bool bf16 = S > 1 && (param_dtype_ == comm::DType::kBF16 || reduce_dtype_ == comm::DType::kBF16);
  const bool image16 = S == 1 && param_dtype_ == comm::DType::kBF16;  // nothing gathered: only the image
  state_memory_ = backend_.allocate(plan.state);
  state_ = Arena(state_memory_.get(), plan.state);
  int64_t max_padded = 0;
  std::vector<float> init;  // a shard initialized on the host
  for (int i = 0; i < n; ++i) {
    auto u = std::make_unique<Unit>();
    u->padded = layout_.unit(i).padded;
    max_padded = std::max(max_padded, u->padded);
    u->range = parallel::shard_range(u->padded, S, shard_rank_);
    u->master = state_.take<float>(u->range.size);
    u->grad = state_.take<float>(u->range.size);
    init.assign(static_cast<size_t>(u->range.size), 0.0f);
    model::init_unit_slice(layout_, i, seed, u->range.begin, u->range.end(), init.data());
    backend_.to_device(u->master, init.data(), sizeof(float) * init.size());
    if (S == 1) u->full = u->master;
    if (bf16) {
      u->send16 = state_.take<uint16_t>(u->range.size);
      u->recv16 = state_.take<uint16_t>(u->range.size);
    }
    if (image16) u->send16 = state_.take<uint16_t>(u->range.size);
    units_.push_back(std::move(u));
  }
  if (receives_tied_gradient(layout_)) tied_recv_ = state_.take<float>(units_[layout_.embedding_unit()]->range.size);
  if (reduces_table_rows(layout_, backend_) && (S > 1 || replica_group_ != nullptr)) {
    const std::vector<int64_t>& shape = layout_.units()[layout_.embedding_unit()].tensors.at(0).shape;
    table_rows_ = shape.at(0);
    table_width_ = shape.at(1);
  }
  if (S > 1) {
    pool_memory_ = backend_.allocate(plan.buffers);
    pool_ = Arena(pool_memory_.get(), plan.buffers);
    auto take = [&](std::vector<float*>* free_list) {
      float* f = pool_.take<float>(max_padded);
      free_list->push_back(f);
      if (bf16) companion_[f] = pool_.take<uint16_t>(max_padded);
    };
    for (int i = 0; i < plan.param_buffers; ++i) take(&free_param_buffers_);
    for (int i = 0; i < plan.grad_buffers; ++i) take(&free_grad_buffers_);
  }
}

ArenaBytes ShardedParams::planned_bytes(const model::ModelLayout& layout, Strategy strategy, int S,
                                        int64_t accumulation, comm::DType param_dtype, comm::DType reduce_dtype) {
  // The layout's units, and the tied copy of the embedding after them (layout.h).
  const int n = layout.num_units() + (layout.tied_copy() != nullptr ? 1 : 0);
  ArenaBytes b;
  int64_t max_padded = 0;
  for (int i = 0; i < n; ++i) {
    const model::UnitLayout& u = layout.unit(i);
    CHECK(u.padded % (16 * S) == 0);
    b.shard_elements += static_cast<uint64_t>(u.padded / S);
    max_padded = std::max(max_padded, u.padded);
  }
  const uint64_t shard_total = b.shard_elements;
  const bool bf16 = S > 1 && (param_dtype == comm::DType::kBF16 || reduce_dtype == comm::DType::kBF16);
  const bool image16 = S == 1 && param_dtype == comm::DType::kBF16;
  // Per unit: master and gradient (fp32), and bf16 send and receive companions or the S = 1 image;
  // each take may pad to the arena's alignment.
  b.state = 2 * sizeof(float) * shard_total + n * 4 * Arena::kAlign + (bf16 ? 2 * sizeof(uint16_t) * shard_total : 0) +
            (image16 ? sizeof(uint16_t) * shard_total : 0);
  // Tied embeddings' first stage: where the last stage's copy's gradient shard arrives.
  if (receives_tied_gradient(layout)) {
    b.state += sizeof(float) * layout.unit(layout.embedding_unit()).padded / S + Arena::kAlign;
  }
  if (S == 1) return b;
  // Full parameters: shard_grad_op keeps every unit from forward to backward; the others need
  // the unit in use and the one prefetched, plus the embedding that a tied head reads.
  const int tied = layout.config().tied_embeddings ? 1 : 0;
  b.param_buffers = strategy == Strategy::kShardGradOp ? n : std::min(n, 2 + tied);
  // Gradients: with accumulation every unit keeps its own until the last micro-batch; otherwise
  // the unit in backward and one reduction in flight (a third unit waits for the oldest
  // reduction), plus a tied embedding, which collects gradients all through backward.
  b.grad_buffers = accumulation > 1 ? n : std::min(n, 2 + tied);
  // With bf16 communication every pooled buffer has a bf16 companion that the collective reads
  // or writes; fp32 is widened from it or rounded into it around the collective.
  const size_t companion = bf16 ? sizeof(uint16_t) * max_padded + Arena::kAlign : 0;
  b.buffers = (b.param_buffers + b.grad_buffers) * (sizeof(float) * max_padded + Arena::kAlign + companion);
  return b;
}

ShardedParams::~ShardedParams() = default;

void ShardedParams::wait(comm::Work& work) {
  const double t0 = now_seconds();
  work.wait();
  exposed_seconds_ += now_seconds() - t0;
}

double ShardedParams::exposed_comm_seconds() const {
  // Gathers are the waits on the device (finish_gather).
  return exposed_seconds_ + (shard_group_ != nullptr ? shard_group_->device_wait_seconds() : 0.0);
}

void ShardedParams::wait_tp(comm::Work& work) {
  const double before = exposed_seconds_;
  wait(work);
  tp_seconds_ += exposed_seconds_ - before;
}

void ShardedParams::issue_gather(int unit) {
  Unit& u = *units_[unit];
  CHECK_MSG(!free_param_buffers_.empty(), "no free parameter buffer");
  u.full = free_param_buffers_.back();
  free_param_buffers_.pop_back();
  u.backward_done = false;
  u.widened = false;
  if (param_dtype_ == comm::DType::kBF16) {
    refresh_image(u);
    u.gather = shard_group_->all_gather(u.send16, companion_.at(u.full), u.range.size, comm::DType::kBF16, options_);
  } else {
    u.gather = shard_group_->all_gather(u.master, u.full, u.range.size, comm::DType::kF32, options_);
  }
}

void ShardedParams::finish_gather(Unit& u) {
  if (!u.gather) return;
  if (options_.after != nullptr) {
    // On the device: the compute stream waits for the gather, the host goes on launching (a
    // gather past the timeout is ended by the NCCL group's watchdog and fails the next wait).
    u.gather->wait_on_device(options_.after);
  } else {
    wait(*u.gather);
  }
  u.gather.reset();
}

void ShardedParams::free_params(int unit) {
  Unit& u = *units_[unit];
  if (shards_ == 1 || u.full == nullptr) return;
  finish_gather(u);  // a prefetch that was never used
  free_param_buffers_.push_back(u.full);
  u.full = nullptr;
}

void ShardedParams::maybe_free_params(int unit) {
  const Unit& u = *units_[unit];
  if (u.refs > 0) return;
  if (strategy_ != Strategy::kShardGradOp || u.backward_done) free_params(unit);
}

const float* ShardedParams::acquire(int unit) {
  Unit& u = *units_[unit];
  acquire_unit(unit);
  // A bf16 gather lands in the buffer's companion; widened for fp32 readers, once per gather
  // (bf16 compute reads the companion itself, through acquire_bf16).
  if (shards_ > 1 && param_dtype_ == comm::DType::kBF16 && !u.widened) {
    backend_.from_bf16(u.full, companion_.at(u.full), u.padded);
    u.widened = true;
  }
  return u.full;
}

const uint16_t* ShardedParams::acquire_bf16(int unit) {
  if (param_dtype_ != comm::DType::kBF16) return nullptr;
  Unit& u = *units_[unit];
  // S = 1 gathers nothing: the image is the master rounded (by the last update, or here when the
  // master was written otherwise).
  if (shards_ == 1) refresh_image(u);
  acquire_unit(unit);
  return shards_ == 1 ? u.send16 : companion_.at(u.full);
}

void ShardedParams::refresh_image(Unit& u) {
  if (u.image_fresh) return;
  backend_.to_bf16(u.send16, u.master, u.range.size);
  u.image_fresh = true;
}

void ShardedParams::acquire_unit(int unit) {
  Unit& u = *units_[unit];
  if (recording_) order_.push_back(unit);
  ++cursor_;
  if (u.full == nullptr) issue_gather(unit);
  finish_gather(u);
  ++u.refs;
  // Prefetch: the unit acquired next in the recorded order starts gathering now, so its
  // all-gather overlaps this unit's compute.
  if (!recording_ && cursor_ < order_.size()) {
    Unit& next = *units_[order_[cursor_]];
    if (next.full == nullptr && !free_param_buffers_.empty()) issue_gather(order_[cursor_]);
  }
}

void ShardedParams::release(int unit) {
  Unit& u = *units_[unit];
  CHECK(u.refs > 0);
  --u.refs;
  maybe_free_params(unit);
}

void ShardedParams::complete_oldest_reduction() {
  CHECK_MSG(!pending_.empty(), "no gradient buffer free and no reduction in flight");
  const int pending_unit = pending_.front();
  Unit& u = *units_[pending_unit];
  pending_.erase(pending_.begin());
  wait(*u.reduce);
  u.reduce.reset();
  if (u.row_sparse) {
    finish_row_sparse(u);
    backend_.copy(u.grad, u.full_grad + u.range.begin, sizeof(float) * u.range.size);
  } else if (reduce_dtype_ == comm::DType::kBF16) {
    backend_.from_bf16(u.grad, u.recv16, u.range.size);
  }
  free_grad_buffers_.push_back(u.full_grad);
  u.full_grad = nullptr;
  issue_replica_reduction(pending_unit);
}

void ShardedParams::issue_replica_reduction(int unit) {
  if (replica_group_ == nullptr) return;
  Unit& u = *units_[unit];
  u.replica_reduce = replica_group_->all_reduce(u.grad, u.range.size, comm::DType::kF32, options_);
  replica_pending_.push_back(unit);
}

float* ShardedParams::grads(int unit) {
  Unit& u = *units_[unit];
  if (shards_ == 1) return u.grad;  // the shard is the whole unit
  if (u.full_grad == nullptr) {
    if (free_grad_buffers_.empty()) complete_oldest_reduction();
    u.full_grad = free_grad_buffers_.back();
    free_grad_buffers_.pop_back();
    backend_.zero(u.full_grad, sizeof(float) * u.padded);
  }
  return u.full_grad;
}

void ShardedParams::grads_ready(int unit) {
  Unit& u = *units_[unit];
  u.backward_done = true;
  if (poison_) {  // before any reduction reads the gradient, as a NaN from the backward would be
    constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
    backend_.to_device(shards_ == 1 ? u.grad : u.full_grad, &kNaN, sizeof kNaN);
    poison_ = false;
  }
  if (micro_ == accumulation_ - 1) {
    const bool row_sparse = unit == layout_.embedding_unit() && table_rows_ > 0 && issue_row_sparse_reduction(unit);
    if (!row_sparse && shards_ == 1) issue_replica_reduction(unit);  // DDP's bucket
    if (!row_sparse && shards_ > 1) issue_shard_reduction(unit);
  }
  if (strategy_ == Strategy::kShardGradOp) maybe_free_params(unit);
}

void ShardedParams::issue_shard_reduction(int unit) {
  Unit& u = *units_[unit];
  // Sum over the shard group straight into this rank's gradient shard (bf16: rounded into the
  // buffer's companion, reduced into a staging shard that is widened on completion).
  if (reduce_dtype_ == comm::DType::kBF16) {
    uint16_t* h = companion_.at(u.full_grad);
    backend_.to_bf16(h, u.full_grad, u.padded);
    u.reduce = shard_group_->reduce_scatter(h, u.recv16, u.range.size, comm::DType::kBF16, options_);
  } else {
    u.reduce = shard_group_->reduce_scatter(u.full_grad, u.grad, u.range.size, comm::DType::kF32, options_);
  }
  pending_.push_back(unit);
}

bool ShardedParams::issue_row_sparse_reduction(int unit) {
  Unit& u = *units_[unit];
  comm::ProcessGroup& group = shards_ > 1 ? *shard_group_ : *replica_group_;
  float* g = shards_ > 1 ? u.full_grad : u.grad;
  const std::vector<uint32_t> mine = nonzero_rows(g, table_rows_, table_width_);
  const int64_t words = static_cast<int64_t>(mine.size());
  std::vector<uint32_t> masks(static_cast<size_t>(words * group.size()));
  // Masks travel as bits in f32 slots: an all-gather copies them.
  wait(*group.all_gather(mine.data(), masks.data(), words, comm::DType::kF32, options_));
  std::vector<int64_t> rows = union_rows(masks.data(), group.size(), words, table_rows_);
  table_rows_reduced_ = static_cast<int64_t>(rows.size());
  // An all-reduce of K rows sends 2 (n - 1) / n of them; the whole table's reduce-scatter
  // (n - 1) / n of all rows: past half the table, the dense reduction is the cheaper (no_shard's
  // dense all-reduce only past the whole table; one rule for both).
  if (2 * table_rows_reduced_ > table_rows_) {
    table_rows_reduced_ = table_rows_;
    return false;
  }
  pack_rows(g, rows, table_width_);
  const int64_t n = table_rows_reduced_ * table_width_;
  u.row_sparse = true;
  u.packed_rows = std::move(rows);
  if (shards_ == 1) {  // no_shard (or one-rank shard groups): the replicas' all-reduce is the reduction
    u.replica_reduce = group.all_reduce(g, n, comm::DType::kF32, options_);
    replica_pending_.push_back(unit);
    return true;
  }
  if (reduce_dtype_ == comm::DType::kBF16) {  // rounded into the buffer's companion, widened on completion
    uint16_t* h = companion_.at(u.full_grad);
    backend_.to_bf16(h, g, n);
    u.reduce = group.all_reduce(h, n, comm::DType::kBF16, options_);
  } else {
    u.reduce = group.all_reduce(g, n, comm::DType::kF32, options_);
  }
  pending_.push_back(unit);
  return true;
}

void ShardedParams::finish_row_sparse(Unit& u) {
  float* g = shards_ > 1 ? u.full_grad : u.grad;
  if (shards_ > 1 && reduce_dtype_ == comm::DType::kBF16) {
    backend_.from_bf16(g, companion_.at(g), table_width_ * static_cast<int64_t>(u.packed_rows.size()));
  }
  unpack_rows(g, u.packed_rows, table_width_, table_rows_);
  u.row_sparse = false;
  u.packed_rows.clear();
}

void ShardedParams::tp_all_reduce(float* data, int64_t count) {
  CHECK(tp_group_ != nullptr);
  wait_tp(*tp_group_->all_reduce(data, count, comm::DType::kF32, options_));
}

void ShardedParams::tp_all_gather(const float* in, float* out, int64_t count) {
  CHECK(tp_group_ != nullptr);
  wait_tp(*tp_group_->all_gather(in, out, count, comm::DType::kF32, options_));
}

void ShardedParams::tp_all_gather_bf16(const uint16_t* in, uint16_t* out, int64_t count) {
  CHECK(tp_group_ != nullptr);
  wait_tp(*tp_group_->all_gather(in, out, count, comm::DType::kBF16, options_));
}

void ShardedParams::tp_reduce_scatter(const float* in, float* out, int64_t count) {
  CHECK(tp_group_ != nullptr);
  wait_tp(*tp_group_->reduce_scatter(in, out, count, comm::DType::kF32, options_));
}

void ShardedParams::begin_step() {
  for (auto& u : units_) backend_.zero(u->grad, sizeof(float) * u->range.size);
  cursor_ = 0;
  micro_ = 0;
}

double ShardedParams::finish_step() {
  while (!pending_.empty()) complete_oldest_reduction();
  CHECK_MSG(replica_group_ == nullptr || replica_pending_.size() == units_.size(),
            "a unit's gradients were never marked ready: its replicas would not be reduced");
  for (int unit : replica_pending_) {
    Unit& u = *units_[unit];
    wait(*u.replica_reduce);
    u.replica_reduce.reset();
    if (u.row_sparse) finish_row_sparse(u);
  }
  replica_pending_.clear();
  join_tied_gradients();
  // Replicas hold identical shards, so the norm sums over one shard group only, then over the
  // tp ranks' blocks and the pipeline's stages.
  float sum = static_cast<float>(local_sum_squares());
  for (comm::ProcessGroup* g : {host_shard_group_, host_tp_group_, host_pp_group_}) {
    if (g != nullptr) wait(*g->all_reduce(&sum, 1, comm::DType::kF32, options_));
  }
  recording_ = false;
  return std::sqrt(static_cast<double>(sum));
}

double ShardedParams::local_sum_squares() const {
  double sum = 0.0;
  const bool counts_replicated = layout_.tensor_parallel().rank == 0;
  for (int i = 0; i < layout_.num_units(); ++i) {
    const Unit& u = *units_[i];
    if (counts_replicated) {
      sum += backend_.sum_squares(u.grad, u.range.size);
      continue;
    }
    // Another tp rank counts only its blocks of split tensors: a replicated tensor's gradient is
    // the same on every tp rank (computed from complete sums), counted by tp rank 0.
    for (const model::TensorSpec& t : layout_.units()[i].tensors) {
      const int64_t lo = std::max(u.range.begin, t.offset), hi = std::min(u.range.end(), t.offset + t.numel());
      if (t.split_dim >= 0 && lo < hi) sum += backend_.sum_squares(u.grad + (lo - u.range.begin), hi - lo);
    }
  }
  return sum;
}

void ShardedParams::apply_update(optim::AdamW& adamw, double lr, int64_t step, double grad_scale) {
  for (int i = 0; i < layout_.num_units(); ++i) {
    Unit& u = *units_[i];
    // The clip factor scales the gradient as AdamW reads it; with bf16 parameters the same pass
    // writes the next step's bf16 image of the master.
    optim::UpdateOptions options{grad_scale, param_dtype_ == comm::DType::kBF16 ? u.send16 : nullptr};
    adamw.update(layout_.units()[i], i, u.range.begin, u.master, u.grad, lr, step, options);
    u.image_fresh = options.image != nullptr;
  }
  sync_tied_copy();
}

// Tied embeddings under pipeline parallelism: the first and the last stage of a pipeline group
// (the same data and tensor coordinates) hold the same shard of the table and of its copy.
int ShardedParams::tied_peer() const {
  const model::PipelineStage& st = layout_.stage();
  if (!layout_.config().tied_embeddings || st.size == 1) return -1;
  return st.first() ? st.size - 1 : st.last() ? 0 : -1;
}

// Tags of the two messages, apart from the pipeline's activations (2 x micro-batch + 0 or 1).
constexpr uint32_t kTiedGradientTag = 1u << 24, kTiedValuesTag = kTiedGradientTag + 1;

void ShardedParams::join_tied_gradients() {
  const int peer = tied_peer();
  if (peer < 0) return;
  // The copy's gradient (its shard, summed over the data-parallel ranks) joins the table's.
  if (layout_.stage().last()) {
    const Unit& copy = *units_[layout_.num_units()];
    wait(*pp_group_->send(copy.grad, copy.range.size, comm::DType::kF32, peer, kTiedGradientTag, options_));
    return;
  }
  Unit& table = *units_[layout_.embedding_unit()];
  wait(*pp_group_->recv(tied_recv_, table.range.size, comm::DType::kF32, peer, kTiedGradientTag, options_));
  backend_.add_inplace(table.grad, tied_recv_, table.range.size);
}

void ShardedParams::sync_tied_copy() {
  const int peer = tied_peer();
  if (peer < 0) return;
  if (layout_.stage().first()) {
    const Unit& table = *units_[layout_.embedding_unit()];
    wait(*pp_group_->send(table.master, table.range.size, comm::DType::kF32, peer, kTiedValuesTag, options_));
  } else {
    Unit& copy = *units_[layout_.num_units()];
    wait(*pp_group_->recv(copy.master, copy.range.size, comm::DType::kF32, peer, kTiedValuesTag, options_));
    copy.image_fresh = false;
  }
}

std::vector<int64_t> ShardedParams::shard_sizes() const {
  std::vector<int64_t> sizes;  // the layout's units: the tied copy has no optimizer state
  for (int i = 0; i < layout_.num_units(); ++i) sizes.push_back(units_[i]->range.size);
  return sizes;
}

std::vector<model::NamedTensor> ShardedParams::gather_named_tensors() { return gather_named(&Unit::master); }
std::vector<model::NamedTensor> ShardedParams::gather_named_gradients() { return gather_named(&Unit::grad); }

std::vector<model::NamedTensor> ShardedParams::gather_named(float* Unit::*shard) {
  const int T = layout_.tensor_parallel().size;
  std::vector<model::NamedTensor> out;
  std::vector<float> mine, full, blocks;
  for (int i = 0; i < layout_.num_units(); ++i) {
    Unit& u = *units_[i];
    const float* p = u.*shard;
    if (backend_.device() != kernels::Device::kCpu) {  // this rank's shard, to the host
      mine.resize(u.range.size);
      backend_.to_host(mine.data(), p, sizeof(float) * u.range.size);
      p = mine.data();
    }
    if (shards_ > 1) {  // over the host group: the whole model is wanted in host memory
      full.resize(u.padded);
      host_shard_group_->all_gather(p, full.data(), u.range.size, comm::DType::kF32, options_)->wait();
      p = full.data();
    }
    // Every tp rank's unit has the same layout, its own blocks: gathered whole, each tensor is
    // put together from the blocks.
    if (T > 1) {
      blocks.resize(static_cast<size_t>(T * u.padded));
      host_tp_group_->all_gather(p, blocks.data(), u.padded, comm::DType::kF32, options_)->wait();
    }
    for (const model::TensorSpec& t : layout_.units()[i].tensors) {
      model::NamedTensor named{t.name, t.full_shape, std::vector<float>(static_cast<size_t>(t.full_numel()))};
      if (T == 1) {
        std::copy_n(p + t.offset, t.numel(), named.data.data());
      } else {
        for (int r = 0; r < T; ++r) copy_block_in(t, r, blocks.data() + r * u.padded + t.offset, named.data.data());
      }
      out.push_back(std::move(named));
    }
  }
  return out;
}

void ShardedParams::load_tensors(const std::vector<model::NamedTensor>& tensors, const std::string& origin) {
  std::map<std::string, const model::NamedTensor*> by_name;
  for (const auto& t : tensors) by_name[t.name] = &t;
  const int tp_rank = layout_.tensor_parallel().rank;
  std::vector<float> block, shard;
  for (int i = 0; i < layout_.num_units(); ++i) {
    Unit& u = *units_[i];
    const int64_t begin = u.range.begin, end = u.range.end();
    // The shard is put together on the host, padding included (zero), then copied in whole.
    shard.assign(static_cast<size_t>(u.range.size), 0.0f);
    for (const model::TensorSpec& spec : layout_.units()[i].tensors) {
      auto it = by_name.find(spec.name);
      if (it == by_name.end()) throw DataError(fmt::format("{}: tensor {} is missing", origin, spec.name));
      if (it->second->shape != spec.full_shape) {
        throw DataError(fmt::format("{}: tensor {} has shape [{}], the model expects [{}]", origin, spec.name,
                                    fmt::join(it->second->shape, ", "), fmt::join(spec.full_shape, ", ")));
      }
      block.resize(static_cast<size_t>(spec.numel()));
      copy_block_out(spec, tp_rank, it->second->data.data(), block.data());
      // The part of this rank's block that falls in its shard.
      const int64_t lo = std::max(begin, spec.offset), hi = std::min(end, spec.offset + spec.numel());
      for (int64_t e = lo; e < hi; ++e) shard[e - begin] = block[e - spec.offset];
    }
    backend_.to_device(u.master, shard.data(), sizeof(float) * shard.size());
    u.image_fresh = false;
  }
  sync_tied_copy();
}

parallel::ShardRange ShardedParams::shard_range(int unit) const { return units_[unit]->range; }
float* ShardedParams::master_shard(int unit) {
  units_[unit]->image_fresh = false;  // the caller may write it
  return units_[unit]->master;
}

StateBytes ShardedParams::state_bytes() const {
  StateBytes b;
  for (const auto& u : units_) {
    b.params += sizeof(float) * u->range.size;
    b.grads += sizeof(float) * u->range.size;
  }
  return b;
}

}  // namespace tessera::fsdp
