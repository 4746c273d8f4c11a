#!/usr/bin/env bash
# Mutation testing of the numerics tests (docs/testing.md): plants each bug of the table below in
# a scratch copy of the tree, builds only the test binary that should catch it, runs that test,
# and reports "killed" (the test failed, as it must) or "SURVIVED" (the test is blind to the bug).
# Not part of CI (a few minutes per mutation on two cores); run it before touching the numerics.
#
#   scripts/mutate.sh            every mutation
#   scripts/mutate.sh M4 M7      some of them
#   scripts/mutate.sh --list     the table
#
# The scratch copy lives in ${TESSERA_MUTATE_DIR:-/tmp/tessera-mutate} (tree/ and build/, kept
# between runs so only what a mutation touches is rebuilt). Exit status: 0 when every mutation
# ran was killed; 1 when one survived; 2 when one no longer applies (its text is not found exactly
# once: update the table with the code) or its build failed.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
scratch=${TESSERA_MUTATE_DIR:-/tmp/tessera-mutate}

# ID | file | exact text (once in the file) | its replacement | build target | test command (run
# in the build directory). Each names the test that must fail; docs/testing.md says why it can.
mutations=(
  "M1|src/fsdp/sharded_params.cc|float sum = static_cast<float>(local);|float sum = static_cast<float>(local) * static_cast<float>(topo_.replicas());|tessera_fsdp_tests|tests/tessera_fsdp_tests --gtest_filter=Strategies/Fsdp.MatchesOneProcess/hybrid_shard_w4_mb3:Strategies/Fsdp.MatchesOneProcess/no_shard_w2_mb6"
  "M2|src/train/trainer.cc|batch.targets, 1.0f / static_cast<float>(positions));|batch.targets, 1.0f / static_cast<float>(positions / world));|tessera_fsdp_tests|tests/tessera_fsdp_tests --gtest_filter=Strategies/Fsdp.MatchesOneProcess/full_shard_w2_mb6"
  "M3|src/train/trainer.cc|batch.targets, 1.0f / static_cast<float>(positions));|batch.targets, 1.0f / static_cast<float>(positions / world * dist_.topology.shard_size));|tessera_fsdp_tests|tests/tessera_fsdp_tests --gtest_filter=Strategies/Fsdp.MatchesOneProcess/hybrid_shard_w4_mb3"
  "M4|src/model/layout.cc|o.attention_norm = b.add(p + \"attention_norm.weight\", {C}, false);|o.attention_norm = b.add(p + \"attention_norm.weight\", {C}, true);|tessera_parity_tests|tests/tessera_parity_tests --gtest_filter=Variants/ModelParity.MatchesPyTorch/tiny"
  "M5|src/model/llama.cc|k::rms_norm_forward(a.xn2, a.rstd2, a.xmid, norm_weight(w, o.ffn_norm, 1), N_, C, eps);|k::rms_norm_forward(a.xn2, a.rstd2, a.xmid, norm_weight(w, o.attention_norm, 1), N_, C, eps);|tessera_parity_tests|tests/tessera_parity_tests --gtest_filter=Variants/ModelParity.MatchesPyTorch/tiny"
  "M6|src/model/llama.cc|bf16_to_f32(p.bf16 + offset, w, C);|bf16_to_f32(p.bf16 + (slot == 1 ? offset - C : offset), w, C);|tessera_unit_tests|src/tessera_unit_tests --gtest_filter=Tied/MixedPrecision.LossAndEveryGradientMatchFp32/untied"
  "M6b|src/model/llama.cc|bf16_to_f32(p.bf16 + offset, w, C);|bf16_to_f32(p.bf16 + (slot == 1 ? offset - C : offset), w, C);|tessera_fsdp_tests|tests/tessera_fsdp_tests --gtest_filter=Strategies/Fsdp.MatchesOneProcess/full_shard_w2_mb6_bf16"
  "M7|src/train/trainer.cc|params_->apply_update(optimizer_, schedule_.at(step_), optimizer_steps_,|params_->apply_update(optimizer_, schedule_.at(step_), step_,|tessera_parity_tests|tests/tessera_parity_tests --gtest_filter=OptimizerParity.*"
  "M8|src/train/trainer.cc|batch.targets, 1.0f / static_cast<float>(positions));|batch.targets, 1.0f / static_cast<float>(accum * world * std::max<int64_t>(1, model::count_valid_targets(batch.targets, positions / (accum * world)))));|tessera_fsdp_tests|tests/tessera_fsdp_tests --gtest_filter=Strategies/MaskedTargets.MatchOneProcess/full_shard_w2_mb3"
  "M9|src/train/trainer.cc|loss_sum = {sums[0], static_cast<int64_t>(std::llround(sums[1]))};|loss_sum.sum = sums[0];|tessera_fsdp_tests|tests/tessera_fsdp_tests --gtest_filter=Strategies/MaskedTargets.MatchOneProcess/full_shard_w2_mb3"
  "M10|src/optim/adamw.cc|return std::min(1.0, max_norm / (grad_norm + 1e-6));|return 1.0;|tessera_parity_tests|tests/tessera_parity_tests --gtest_filter=Variants/ModelParity.MatchesPyTorch/clip"
  "M11|src/model/llama.cc|return std::count_if(targets, targets + n, [](int32_t t) { return t >= 0; });|return n + 0 * (targets != nullptr);|tessera_parity_tests|tests/tessera_parity_tests --gtest_filter=Variants/ModelParity.MatchesPyTorch/ignored"
  "M12|src/kernels/cpu/attention.cc|gemm(true, false, c1 - c0, D, T - c0, 1.0f, P + c0 * T + c0, T, dO + c0 * out_stride, out_stride, beta,|gemm(true, false, c1 - c0, D, c1 - c0, 1.0f, P + c0 * T + c0, T, dO + c0 * out_stride, out_stride, beta,|tessera_unit_tests|src/tessera_unit_tests --gtest_filter=Threads/CpuVsRef.Attention/*"
  "M13|src/train/run.cc|trainer.evaluate(last ? trainer.validation_batches() : 0);|trainer.evaluate(0);|tessera|ctest -R '^e2e_train_test\$' --output-on-failure"
  "M14|src/checkpoint/checkpointer.cc|m.optimizer_steps = state.optimizer_steps;|m.optimizer_steps = state.step;|tessera|ctest -R '^faults_test\$' --output-on-failure"
  "M21|src/fsdp/sharded_params.cc|  if (poison_) {  // before any reduction|  if (poison_ && shards_ > 1) {  // before any reduction|tessera|ctest -R '^faults_test\$' --output-on-failure"
  "M22|src/kernels/cpu/adamw.cc|if constexpr (kImage) image[i] = f32_to_bf16(p);|if constexpr (kImage) image[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(p) >> 16);|tessera_unit_tests|src/tessera_unit_tests --gtest_filter=Threads/CpuVsRef.AdamW/*"
  "M23|src/kernels/cpu/cross_entropy.cc|inline void store(uint16_t* out, float v) { *out = f32_to_bf16(v); }|inline void store(uint16_t* out, float v) { *out = static_cast<uint16_t>(std::bit_cast<uint32_t>(v) >> 16); }|tessera_unit_tests|src/tessera_unit_tests --gtest_filter=Threads/CpuVsRef.CrossEntropy/*"
  "M24|src/kernels/cpu/attention_tiles.cc|const float p = j <= i0 ? exp_fast(s0[j] - l0) : 0.0f;|const float p = j < i0 ? exp_fast(s0[j] - l0) : 0.0f;|tessera_parity_tests|tests/tessera_parity_tests --gtest_filter=Variants/ModelParity.MatchesPyTorch/t130"
  "M25|src/kernels/cpu/attention_tiles.cc|p_pairs[j] = pair(p0, p1);|p_pairs[j] = pair(p1, p0);|tessera_unit_tests|src/tessera_unit_tests --gtest_filter=Threads/CpuVsRef.AttentionBf16/*"
)

field() { IFS='|' read -r -a f <<<"$1"; echo "${f[$2]}"; }

if [[ ${1:-} == --list ]]; then
  for m in "${mutations[@]}"; do printf '%-4s %-30s %s\n' "$(field "$m" 0)" "$(field "$m" 1)" "$(field "$m" 5)"; done
  exit 0
fi

# The working tree (tracked and untracked, not ignored) into the scratch tree, rewriting only the
# files whose content differs so that the scratch build stays incremental.
mkdir -p "$scratch/tree"
git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do
  [[ -f $f ]] || continue
  if ! cmp -s "$f" "$scratch/tree/$f"; then
    mkdir -p "$scratch/tree/$(dirname "$f")"
    cp "$f" "$scratch/tree/$f"
  fi
done
if [[ ! -f $scratch/build/build.ninja ]]; then
  scripts/setup.sh
  cmake -S "$scratch/tree" -B "$scratch/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=OFF \
    -DTESSERA_WERROR=OFF >/dev/null
fi

selected=("$@")
wanted() {
  [[ ${#selected[@]} -eq 0 ]] && return 0
  local s
  for s in "${selected[@]}"; do [[ $s == "$1" ]] && return 0; done
  return 1
}

status=0
results=()
for m in "${mutations[@]}"; do
  id=$(field "$m" 0) file=$(field "$m" 1) from=$(field "$m" 2) to=$(field "$m" 3)
  target=$(field "$m" 4) test=$(field "$m" 5)
  wanted "$id" || continue
  echo "== $id: $file: $from -> $to"
  if ! FROM=$from TO=$to python3 - "$scratch/tree/$file" <<'PY'; then
import os, sys
path = sys.argv[1]
text = open(path).read()
n = text.count(os.environ["FROM"])
if n != 1:
    print(f"mutate: the text occurs {n} times in {path}, not once")
    sys.exit(1)
open(path, "w").write(text.replace(os.environ["FROM"], os.environ["TO"]))
PY
    results+=("$id STALE (the table no longer matches $file)")
    status=2
    continue
  fi
  verdict=""
  if ! cmake --build "$scratch/build" --target "$target" >"$scratch/build.log" 2>&1; then
    tail -20 "$scratch/build.log"
    verdict="BUILD FAILED"
    status=2
  elif (cd "$scratch/build" && eval "timeout 900 $test") >"$scratch/test-$id.log" 2>&1; then
    verdict="SURVIVED"
    [[ $status == 0 ]] && status=1
  else
    verdict="killed"
  fi
  cp "$src/$file" "$scratch/tree/$file"  # restored with a new mtime: the next build recompiles it
  echo "   $verdict (test log: $scratch/test-$id.log)"
  results+=("$id $verdict: $test")
done

echo
printf '%s\n' "${results[@]}"
exit "$status"
