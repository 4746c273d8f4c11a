#!/usr/bin/env bash
# Checkpoint faults of RELIABILITY.md, end to end through `tessera train` (tiny model, synthetic
# tokens, one thread per rank, so every run is deterministic):
#   exact resume for every strategy (a run killed mid-save and resumed equals the uninterrupted
#   one: per-step losses and final parameters bitwise), row 4 (kill -9 during a save at three
#   points), 5 (flipped byte: named, fall back), 6 (truncations), 7 (I/O error during a save),
#   15 (resume at another world size), 18 (SIGTERM), plus verify, reshard and the mirror.
# usage: checkpoint_test.sh TESSERA_BINARY
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
tessera=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

common=(--set model.preset=tiny --set data.synthetic=true --set train.max_steps=12 --set train.eval_interval=0
        --set train.threads=1 --set train.batch_size=12 --set checkpoint.interval_steps=4
        --set checkpoint.interval_minutes=0 --set parallel.timeout_ms=20000)
train() { "$tessera" train "${common[@]}" "$@"; }

latest() { cat "$1/checkpoints/latest"; }

# --- exact resume for every strategy: kill -9 rank 0 half-way through writing its shard of step 8
for spec in "1 full_shard 0" "2 full_shard 0" "2 shard_grad_op 0" "4 hybrid_shard 2" "2 no_shard 0"; do
  read -r n strategy group <<<"$spec"
  name="$strategy-$n"
  par=(--nproc "$n" --set parallel.strategy="$strategy" --set parallel.shard_group_size="$group")
  train "${par[@]}" --run-dir "$dir/ref-$name" 2>"$dir/ref-$name.log" || { cat "$dir/ref-$name.log"; fail "$name: reference run"; }
  if TESSERA_FAULT=0:8:checkpoint.shard:kill train "${par[@]}" --run-dir "$dir/$name" 2>"$dir/$name.log"; then
    fail "$name: the run with a kill during the save of step 8 exited 0"
  fi
  [[ $(latest "$dir/$name") == step_00000004 ]] || fail "$name: latest is $(latest "$dir/$name"), expected step_00000004"
  orphan=$(du -sb "$dir/$name/checkpoints/step_00000008" | cut -f1)
  train "${par[@]}" --run-dir "$dir/$name" --resume auto 2>"$dir/$name.resume.log" ||
    { cat "$dir/$name.resume.log"; fail "$name: resume"; }
  grep -q "removed .*step_00000008" "$dir/$name.resume.log" || fail "$name: the partial step 8 was not cleaned up"
  grep -q "resumed from .*step_00000004" "$dir/$name.resume.log" || fail "$name: did not resume from step 4"
  same_run "$dir/ref-$name" "$dir/$name" "$name resumed"
  echo "ok: $name killed mid-shard at step 8: resumed from step 4 (4 steps lost, $orphan orphaned bytes removed), bitwise equal"
done
ref=$dir/ref-full_shard-1

# --- row 4, the other two points: before and after the manifest rename (one process)
for point in manifest commit; do
  run=$dir/kill-$point
  if TESSERA_FAULT=0:8:checkpoint.$point:kill train --run-dir "$run" 2>"$run.log"; then fail "kill at $point: exit 0"; fi
  [[ $(latest "$run") == step_00000004 ]] || fail "kill at $point: latest is $(latest "$run")"
  if [[ $point == manifest ]]; then
    [[ -e $run/checkpoints/step_00000008/manifest.json ]] && fail "kill before the rename: a manifest exists"
    [[ -e $run/checkpoints/step_00000008/manifest.json.tmp ]] || fail "kill before the rename: no temporary manifest"
  else
    [[ -e $run/checkpoints/step_00000008/manifest.json ]] || fail "kill after the rename: no manifest"
  fi
  train --run-dir "$run" --resume auto 2>"$run.resume.log" || { cat "$run.resume.log"; fail "kill at $point: resume"; }
  grep -q "resumed from .*step_00000004" "$run.resume.log" || fail "kill at $point: did not resume from latest"
  same_run "$ref" "$run" "kill at $point"
  echo "ok: kill -9 at checkpoint.$point: step_00000004 stayed latest; resumed bitwise equal"
done

# --- row 5: one flipped byte is named (file and tensor); resume falls back to the previous one
run=$dir/flip
TESSERA_FAULT=0:12:checkpoint.shard:kill train --run-dir "$run" 2>/dev/null && fail "flip: exit 0"
shard=$run/checkpoints/step_00000008/shard_00000.bin
$py - "$shard" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) // 2] ^= 0x10; open(p, "wb").write(b)
PY
set +e
"$tessera" checkpoint verify "$run/checkpoints/step_00000008" >"$dir/verify.out" 2>&1; rc=$?
set -e
[[ $rc == 3 ]] || { cat "$dir/verify.out"; fail "verify of a flipped byte exited $rc, expected 3"; }
grep -q "$shard: checksum" "$dir/verify.out" || fail "verify does not name the damaged file"
grep -q "tensor .* fails its checksum" "$dir/verify.out" || fail "verify does not name the damaged tensor"
"$tessera" checkpoint verify "$run/checkpoints/step_00000004" >/dev/null || fail "verify rejects a sound checkpoint"
set +e
train --run-dir "$run" --resume auto --set checkpoint.fallback=false 2>"$run.nofallback.log"; rc=$?
set -e
[[ $rc == 3 ]] || fail "resume from a damaged checkpoint without fallback exited $rc, expected 3"
grep -q "fails its checksum" "$run.nofallback.log" || fail "the resume error does not name the damage"
train --run-dir "$run" --resume auto 2>"$run.resume.log" || { cat "$run.resume.log"; fail "flip: resume with fallback"; }
grep -q "falling back to the previous checkpoint .*step_00000004" "$run.resume.log" || fail "flip: no fallback message"
same_run "$ref" "$run" "fallback after a flipped byte"
echo "ok: flipped byte named by verify (exit 3) and on resume; fell back to step 4; bitwise equal"

# --- row 6: truncated shard or manifest: a typed error (exit 3) naming the file, never a crash
good=$dir/ref-full_shard-1/checkpoints/step_00000012
for file in shard_00000.bin manifest.json; do
  size=$(stat -c %s "$good/$file")
  for n in 0 7 8 $((size - 1)); do
    cut=$dir/trunc-$file-$n
    cp -r "$good" "$cut"
    truncate -s "$n" "$cut/$file"
    set +e
    "$tessera" checkpoint verify "$cut" >"$cut.out" 2>&1; rc=$?
    set -e
    [[ $rc == 3 ]] || { cat "$cut.out"; fail "$file truncated to $n bytes: verify exited $rc, expected 3"; }
    grep -q "$cut/$file" "$cut.out" || { cat "$cut.out"; fail "$file truncated to $n bytes: the file is not named"; }
  done
done
echo "ok: shard and manifest truncated to 0, 7, 8 and N-1 bytes: exit 3 naming the file"

# --- row 7: an I/O error on rank 1 during the save of step 8: all ranks agree the save failed, the
# previous checkpoint is intact, training goes on (or stops with exit 10 when configured so)
par=(--nproc 2 --set parallel.strategy=full_shard)
run=$dir/iofail
TESSERA_FAULT=1:8:checkpoint.shard:io train "${par[@]}" --run-dir "$run" 2>"$run.log" || { cat "$run.log"; fail "io: run"; }
grep -q "checkpoint step 8 failed: rank 1: cannot write .*No space left" "$run.log" || fail "io: rank 0 did not report rank 1's failure"
grep -q "\[rank 1\].*checkpoint step 8 failed" "$run.log" || fail "io: rank 1 did not learn the outcome"
[[ -e $run/checkpoints/step_00000008 ]] && fail "io: the failed step 8 directory is left behind"
cmp -s "$run/checkpoints/step_00000004/shard_00000.bin" "$dir/ref-full_shard-2/checkpoints/step_00000004/shard_00000.bin" ||
  fail "io: the previous checkpoint changed"
[[ $(latest "$run") == step_00000012 ]] || fail "io: training did not go on to commit step 12"
same_run "$dir/ref-full_shard-2" "$run" "training on after a failed save"
set +e
TESSERA_FAULT=1:8:checkpoint.shard:io train "${par[@]}" --set checkpoint.on_failure=stop --run-dir "$run-stop" 2>"$run-stop.log"
rc=$?
set -e
[[ $rc == 10 ]] || { tail "$run-stop.log"; fail "io with on_failure=stop exited $rc, expected 10"; }
[[ $(latest "$run-stop") == step_00000004 ]] || fail "io stop: latest is $(latest "$run-stop")"
"$tessera" checkpoint verify "$run-stop" >/dev/null || fail "io stop: the committed checkpoints do not verify"
echo "ok: I/O error on rank 1: both ranks agree, step 4 intact, training goes on; on_failure=stop exits 10"

# --- row 15: saved at world size 4, resumed at 2 and at 3 (no sample repeated or skipped: the data
# position is the global sample count; parameters and moments re-cut exactly, tested in
# tessera_checkpoint_tests); the losses continue within float rounding of the 4-rank run
for n in 2 3; do
  run=$dir/w4-to-$n
  TESSERA_FAULT=0:8:checkpoint.shard:kill train --nproc 4 --run-dir "$run" 2>/dev/null && fail "w4: exit 0"
  train --nproc "$n" --run-dir "$run" --resume auto 2>"$run.log" || { cat "$run.log"; fail "resume at $n ranks"; }
  grep -q "resumed from .*step_00000004.*data position 48" "$run.log" || fail "w4 -> $n: wrong step or data position"
  $py - "$dir/ref-full_shard-1" "$run" <<'PY' || fail "w4 -> $n: losses diverge"
import json, sys
a, b = ([json.loads(l) for l in open(f"{d}/metrics.jsonl")] for d in sys.argv[1:3])
assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 13))
for x, y in zip(a, b):
    assert abs(x["loss"] - y["loss"]) <= 1e-5 * abs(x["loss"]), (x["step"], x["loss"], y["loss"])
    assert x["tokens"] == y["tokens"]
PY
done
"$tessera" checkpoint reshard "$dir/ref-full_shard-2" "$dir/resharded" --nproc 4 --set parallel.strategy=hybrid_shard \
  --set parallel.shard_group_size=2 >/dev/null || fail "reshard"
"$tessera" checkpoint verify "$dir/resharded" | grep -q "world 4, hybrid_shard" || fail "the resharded checkpoint does not verify"
echo "ok: saved at 4 ranks, resumed at 2 and 3 ranks from data position 48; offline reshard 2 -> 4 (hybrid) verifies"

# --- row 18: SIGTERM finishes the step, saves and exits 0; the resumed run equals an uninterrupted one
# The signals go out once 3 steps are logged; 100 steps leave a fast machine (a few ms a step) 97
# steps to receive them in.
steps=100
long=(--set train.max_steps=$steps --set checkpoint.interval_steps=0 --set checkpoint.save_final=true)
for n in 1 2; do
  run=$dir/sigterm-$n
  train --nproc "$n" "${long[@]}" --run-dir "$dir/sigterm-ref-$n" 2>/dev/null || fail "sigterm reference"
  "$tessera" train "${common[@]}" --nproc "$n" "${long[@]}" --run-dir "$run" 2>"$run.log" &
  pid=$!  # tessera itself, not a subshell
  wait_step "$run" 3
  t0=$(date +%s.%N)
  # Several in a row: only the first counts, and none may land inside a GEMM (see core/signals.h).
  for _ in 1 2 3 4 5; do kill -TERM "$pid" 2>/dev/null || true; sleep 0.02; done
  rc=0
  wait "$pid" || rc=$?
  [[ $rc == 0 ]] || { cat "$run.log"; fail "SIGTERM ($n ranks): exit code $rc"; }
  t1=$(date +%s.%N)
  grep -q "stop requested" "$run.log" || fail "SIGTERM ($n ranks): no stop message"
  step=$(sed 's/step_0*//' "$run/checkpoints/latest")
  (( step > 0 && step < steps )) || fail "SIGTERM ($n ranks): latest is step $step"
  train --nproc "$n" "${long[@]}" --run-dir "$run" --resume auto 2>"$run.resume.log" || fail "SIGTERM: resume"
  same_run "$dir/sigterm-ref-$n" "$run" "SIGTERM with $n rank(s)"
  echo "ok: SIGTERM at step $step with $n rank(s): saved and exited 0 in $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}') s; resumed bitwise equal"
done

# --- mirror: a verified copy of each commit under the run's name (MIRROR/RUN_NAME); runs sharing
# a mirror never prune each other's copies; resume from it when the local checkpoints are gone
run=$dir/mirrored
mirror=(--set checkpoint.mirror_dir="$dir/mirror" --set checkpoint.keep=2)
train "${mirror[@]}" --run-dir "$run" 2>"$run.log" || fail "mirror run"
grep -q "mirrored to $dir/mirror/mirrored " "$run.log" || fail "mirror: no copy to $dir/mirror/mirrored reported"
train "${mirror[@]}" --set train.max_steps=8 --run-dir "$dir/other" 2>"$dir/other.log" || fail "mirror: second run"
[[ $(cat "$dir/mirror/mirrored/latest") == step_00000012 ]] || fail "mirror: latest is not step 12"
[[ $(cat "$dir/mirror/other/latest") == step_00000008 ]] || fail "mirror: the second run's latest is not step 8"
[[ $(ls "$dir/mirror/mirrored") == $'latest\nstep_00000008\nstep_00000012' ]] ||
  fail "mirror: the second run changed the first one's copies: $(ls "$dir/mirror/mirrored" | tr '\n' ' ')"
"$tessera" checkpoint verify "$dir/mirror/mirrored" >/dev/null || fail "mirror: the copies do not verify"
rm -rf "$run"  # the node and its disk are gone; a fresh run of the same name must not restart over the mirror
set +e
train "${mirror[@]}" --run-dir "$run" 2>"$run.fresh.log"; rc=$?
set -e
((rc == 2)) && grep -q "$dir/mirror/mirrored already holds checkpoints (latest: step_00000012), this run's mirror" \
  "$run.fresh.log" || { cat "$run.fresh.log"; fail "mirror: a fresh run over its mirror was not refused (exit $rc)"; }
[[ $(cat "$dir/mirror/mirrored/latest") == step_00000012 ]] || fail "mirror: the refused run changed the mirror"
train "${mirror[@]}" --set train.max_steps=16 --run-dir "$run" --resume auto 2>"$run.resume.log" ||
  fail "mirror: resume"
grep -q "resuming from the mirror $dir/mirror/mirrored" "$run.resume.log" || fail "mirror: did not resume from the mirror"
echo "ok: mirror holds verified copies under the run's name; a second run on it leaves them alone; a fresh run over them is refused; resume reads it when the local checkpoints are gone"

# --- a fresh run never overwrites a run directory with checkpoints
set +e
train --run-dir "$ref" 2>"$dir/again.log"; rc=$?
set -e
[[ $rc == 2 ]] && grep -q "already holds checkpoints" "$dir/again.log" || fail "a fresh run into a used run directory: exit $rc"
echo "ok: a fresh run refuses a run directory that holds checkpoints"
echo "checkpoint tests passed"
