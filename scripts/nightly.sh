#!/usr/bin/env bash
# Nightly: the heavy variants of the fault tests, too slow or too random for every CI run (not
# run by scripts/test.sh or CI). Builds the release preset (scripts/build.sh release), then runs
#   - tests/kill_loop_test.sh with TESSERA_NIGHTLY_KILLS kills (default 30) for each seed in
#     TESSERA_NIGHTLY_SEEDS (default "1 2 3"); ctest runs 10 kills with seed 21;
#   - tests/launch_test.sh, tests/launch_3d_test.sh and tests/adversarial_test.sh,
#     TESSERA_NIGHTLY_REPEAT times each (default 3), to catch what fails one time in several
#     (timing, ports, races);
#   - the 3D equivalence matrix (tests/fsdp_equivalence_test.cc, nightly_matrix: every layout of
#     tensor {1,2,4} x pipeline {1,2,4} x data {1,2} up to 8 ranks, every strategy, schedule,
#     sequence parallelism, recompute and tied embeddings against one process), about 3 minutes;
#   - tests/plan_vs_bench_test.py on the `tiny` and `bench` presets (`tessera plan --hardware cpu`
#     beside `tessera bench`, every strategy at 1 and 2 processes), about 4 minutes;
#   - tools/cuda_emu/run.sh: the CUDA kernels, the model, the decoder and the trainer on the CUDA
#     backend against the CPU, several GPUs over NCCL, run unchanged under a CPU emulation of the
#     CUDA subset they use (no GPU here), about 5 minutes (scripts/test.sh runs it too);
#   - the shell suites that CI's sanitizer pass leaves out (ctest preset asan-nightly: parallel_cli,
#     e2e_train, launch_3d, metrics, launch and adversarial tests under ASan + UBSan), after
#     scripts/build.sh asan, about 21 minutes with the build;
#   - scripts/fuzz.sh: every file parser's libFuzzer target for TESSERA_NIGHTLY_FUZZ_SECONDS
#     (default 120) each, where scripts/test.sh gives them 10 s.
# Every test runs to the end even after a failure; each one's output goes to
# TESSERA_NIGHTLY_LOGS/NAME.log (default build/nightly/UTC-TIMESTAMP/), and a summary follows.
# Exit status: 0 when every run passed, 1 otherwise. TESSERA_NIGHTLY_SKIP_BUILD=1 uses the
# existing build/release as it is. Each 30-kill loop takes about 2.5 minutes on two cores; the whole
# run about 70 minutes (fuzzing 30 s a target: about 55).
# usage: scripts/nightly.sh
set -euo pipefail
cd "$(dirname "$0")/.."
kills=${TESSERA_NIGHTLY_KILLS:-30}
seeds=${TESSERA_NIGHTLY_SEEDS:-1 2 3}
repeat=${TESSERA_NIGHTLY_REPEAT:-3}
logs=${TESSERA_NIGHTLY_LOGS:-build/nightly/$(date -u +%Y%m%d-%H%M%S)}
[[ $kills =~ ^[1-9][0-9]*$ && $repeat =~ ^[0-9]+$ ]] ||
  { echo "TESSERA_NIGHTLY_KILLS must be a positive and TESSERA_NIGHTLY_REPEAT a non-negative integer" >&2; exit 2; }

[[ ${TESSERA_NIGHTLY_SKIP_BUILD:-0} == 1 ]] || scripts/build.sh release
tessera=$PWD/build/release/bin/tessera
io_faults=$PWD/build/release/tests/libtessera_io_faults.so
fsdp_tests=$PWD/build/release/tests/tessera_fsdp_tests
[[ -x $tessera && -f $io_faults && -x $fsdp_tests ]] || { echo "no release build (build/release): run scripts/build.sh release" >&2; exit 2; }
mkdir -p "$logs"

passed=0
failed=()
check() {  # check NAME COMMAND...: runs it, output in $logs/NAME.log; prints its verdict
  local name=$1 t0=$EPOCHREALTIME rc=0
  shift
  "$@" >"$logs/$name.log" 2>&1 || rc=$?
  local s
  s=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }')
  if ((rc == 0)); then
    passed=$((passed + 1))
    echo "pass  $name (${s} s)$(grep -m1 '^ok: [0-9]* kill' "$logs/$name.log" | sed 's/^ok:/:/')"
  else
    failed+=("$name")
    echo "FAIL  $name (exit $rc, ${s} s): $(grep -m1 '^FAIL' "$logs/$name.log" || tail -1 "$logs/$name.log")"
  fi
}

for seed in $seeds; do
  check "kill_loop-$kills-seed$seed" tests/kill_loop_test.sh "$tessera" "$kills" "$seed"
done
for ((i = 1; i <= repeat; i++)); do
  check "launch_test-$i" tests/launch_test.sh "$tessera"
  check "launch_3d_test-$i" tests/launch_3d_test.sh "$tessera"
  check "adversarial_test-$i" tests/adversarial_test.sh "$tessera" "$io_faults"
done
check equivalence_matrix env TESSERA_NIGHTLY_MATRIX=1 "$fsdp_tests" --gtest_filter='Nightly/*'
check cuda_emulation tools/cuda_emu/run.sh
check plan_vs_bench env TESSERA_PLAN_PRESETS="tiny bench" python3 tests/plan_vs_bench_test.py "$tessera"
check sanitizer_suites bash -c 'scripts/build.sh asan && ctest --preset asan-nightly -j "$(nproc)"'
check fuzz scripts/fuzz.sh "${TESSERA_NIGHTLY_FUZZ_SECONDS:-120}"

echo "nightly: $passed passed, ${#failed[@]} failed${failed[*]:+: ${failed[*]}}; logs in $logs"
((${#failed[@]} == 0))
