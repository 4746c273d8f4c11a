#!/usr/bin/env bash
# Faults of RELIABILITY.md end to end through `tessera train --nproc 2` (tiny model, synthetic
# tokens, one thread per rank): the health check before step 0 (passes with figures; a failing
# rank is named, exit 4), row 14 (a NaN gradient on one rank: stop with exit 11 on both ranks,
# or skip the step leaving parameters and moments bitwise unchanged, no checkpoint holding a
# non-finite value), and the fault kinds at the step's phases (kill: prompt exit naming the
# dead worker; hang: the peer's collective times out naming the operation; exit), and a resume
# whose load is slow or fails on one rank.
# usage: faults_test.sh TESSERA_BINARY
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
tessera=$1
dir=$(mktemp -d)
trap '[[ -n ${KEEP:-} ]] || rm -rf "$dir"' EXIT

common=(--nproc 2 --set model.preset=tiny --set data.synthetic=true --set train.max_steps=6
        --set train.eval_interval=0 --set train.threads=1 --set train.batch_size=8
        --set checkpoint.interval_steps=1 --set checkpoint.keep=100 --set checkpoint.interval_minutes=0
        --set parallel.timeout_ms=20000)
train() { "$tessera" train "${common[@]}" "$@"; }
now() { date +%s.%N; }
since() { $py -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.2f}")' "$1" "$(now)"; }
# run NAME EXPECTED_RC [train args...]: runs with stderr in $dir/NAME.log, checks the exit code
run() {
  local name=$1 want=$2 rc=0 t0
  shift 2
  t0=$(now)
  train --run-dir "$dir/$name" "$@" 2>"$dir/$name.log" || rc=$?
  secs=$(since "$t0")
  [[ $rc == "$want" ]] || { tail -20 "$dir/$name.log"; fail "$name: exit code $rc, expected $want"; }
}
has() { grep -qE -- "$2" "$dir/$1.log" || { tail -20 "$dir/$1.log"; fail "$1: no line matching '$2'"; }; }
# Every value of every shard file of every checkpoint, and of model.safetensors, is finite.
all_finite() { $py - "$1" <<'PY'
import array, glob, json, math, struct, sys
run = sys.argv[1]
bad, n = [], 0
def check(path, name, raw):
    global n
    a = array.array("f"); a.frombytes(raw); n += len(a)
    if not all(math.isfinite(x) for x in a): bad.append(f"{path}:{name}")
for path in sorted(glob.glob(run + "/checkpoints/step_*/shard_*.bin")):
    b = open(path, "rb").read()
    assert b[:8] == b"TSRSHARD", path
    h = struct.unpack_from("<Q", b, 16)[0]
    data = (32 + h + 63) // 64 * 64
    for t in json.loads(b[32:32 + h])["tensors"]:
        check(path, t["name"], b[data + t["offset"]:data + t["offset"] + t["bytes"]])
path = run + "/model.safetensors"
b = open(path, "rb").read()
h = struct.unpack_from("<Q", b, 0)[0]
for name, t in json.loads(b[8:8 + h]).items():
    if name != "__metadata__":
        check(path, name, b[8 + h + t["data_offsets"][0]:8 + h + t["data_offsets"][1]])
if bad: sys.exit("non-finite values in " + ", ".join(bad))
print(f"{n} values finite")
PY
}

# --- health check: passes on a healthy run with figures (this run is also the reference below)
run ref 0
has ref '\[rank 0\] info: health check passed on 2 ranks in [0-9]+ ms: all-reduce of [0-9]+ known values exact; all-reduce of 4 MiB at [0-9.]+ GB/s bus bandwidth over shared memory'
has ref '\[rank 0\] info: host collectives: world: shared memory'
has ref 'GEMM 96x80x72 within tolerance'
echo "ok: health check passed ($(grep -oE '[0-9.]+ GB/s bus bandwidth over shared memory \(ranks [0-9.]+\.\.[0-9.]+\)' "$dir/ref.log")); run ${secs}s"

# --- health check: rank 1's part of the known all-reduce is corrupted; every rank sees wrong sums
TESSERA_FAULT=1:0:health:allreduce run allreduce 4
has allreduce 'health check before step 0 failed on 2 of 2 rank\(s\): rank 0 \(all-reduce result\), rank 1 \(all-reduce result\)'
has allreduce '\[rank 0\] error: health check: rank 0: all-reduce of 4099 known values: 1 wrong, the first at 2049'
echo "ok: a corrupted all-reduce stops the job before step 0 (exit 4)"

# --- health check: rank 1 fails its GEMM; every rank names rank 1, exit 4, no step taken
TESSERA_FAULT=1:0:health:fail run health 4
# Each rank throws the same error; the launcher kills the others at the first exit, so at least one says it.
has health '\[rank [01]\] error: health check before step 0 failed on 1 of 2 rank\(s\): rank 1 \(GEMM against the reference\)'
has health '\[rank 1\] error: health check: rank 1: GEMM 96x80x72 on cpu differs from the reference'
# The verdict names rank 1 only (the launcher's own summary names whichever worker exited first).
grep -q 'failed on 1 of 2 rank(s): rank 0 (' "$dir/health.log" && fail "health: rank 0 was named as failing"
[[ ! -e "$dir/health/checkpoints/step_00000001" ]] || fail "health: a step was taken"
echo "ok: health fault on rank 1: exit 4 in ${secs}s, rank 1 and the GEMM named"

# --- health check: rank 1's GPU verdict fails (XID 79 injected; a CPU run makes up its GPU):
# exit 4, every rank names rank 1, its GPU, the host and the XID
TESSERA_FAULT=1:0:health:gpu run health-gpu 4
has health-gpu "\[rank [01]\] error: health check before step 0 failed on 1 of 2 rank\(s\): rank 1 \(GPU 0 \(none: a CPU run, failed by TESSERA_FAULT\) on host $(hostname): failed: XID 79 \(GPU has fallen off the bus\)"
grep -q 'failed on 1 of 2 rank(s): rank 0 (' "$dir/health-gpu.log" && fail "health-gpu: rank 0 was named as failing"
echo "ok: GPU health fault on rank 1: exit 4 in ${secs}s, rank 1's GPU, host and XID named"

# --- row 14, stop: NaN gradient on rank 1 at step 3; exit 11, both ranks report step 3
TESSERA_FAULT=1:3:backward:nan run nan-stop 11
has nan-stop 'step 3: loss [0-9.]+ and gradient norm nan'
for r in 0 1; do
  grep -qE "\[rank $r\] error: step 3: loss .* and gradient norm nan" "$dir/nan-stop.log" ||
    echo "note: rank $r was stopped before it logged (the launcher kills the others at the first failure)"
done
[[ $(cat "$dir/nan-stop/checkpoints/latest") == step_00000002 ]] || fail "nan-stop: latest is not step 2"
"$tessera" checkpoint verify "$dir/nan-stop" >/dev/null 2>&1 || fail "nan-stop: checkpoint verify"
echo "ok: NaN on rank 1 at step 3 with on_nonfinite=stop: exit 11 in ${secs}s, step 2 stays latest"

# --- row 14, skip: the run finishes, step 3 is marked skipped, its checkpoint equals step 2's
TESSERA_FAULT=1:3:backward:nan run nan-skip 0 --set train.on_nonfinite=skip
has nan-skip '\[rank 0\] warn: step 3: loss [0-9.]+ and gradient norm nan: update skipped'
$py - "$dir/nan-skip/metrics.jsonl" <<'PY' || fail "nan-skip: metrics"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in recs] == [1, 2, 3, 4, 5, 6], recs
assert [r["step"] for r in recs if r.get("skipped")] == [3], recs
assert recs[2]["grad_norm"] is None and recs[-1]["skipped_steps"] == 1, recs
PY
"$tessera" checkpoint verify "$dir/nan-skip" >/dev/null 2>&1 || fail "nan-skip: checkpoint verify"
all_finite "$dir/nan-skip" >/dev/null || fail "nan-skip: non-finite values"
ck="$dir/nan-skip/checkpoints"
for f in "$ck"/step_00000002/shard_*.bin; do  # masters and moments: bitwise unchanged by step 3
  cmp -s "$f" "$ck/step_00000003/$(basename "$f")" || fail "nan-skip: $(basename "$f") of step 3 differs from step 2"
done
cmp -s "$ck/step_00000003/shard_00000.bin" "$ck/step_00000004/shard_00000.bin" && fail "nan-skip: step 4 did not update"
$py -c 'import json,sys; a, b = (json.load(open(p)) for p in sys.argv[1:])
assert b["step"] == 3 and b["tokens"] > a["tokens"], (a["tokens"], b["tokens"])
assert a["optimizer_steps"] == 2 and b["optimizer_steps"] == 2, "AdamW counted the skipped step"' \
  "$ck/step_00000002/manifest.json" "$ck/step_00000003/manifest.json" || fail "nan-skip: step 3's manifest"
# The first two steps equal the reference run's; the run goes on from step 2's parameters.
cmp -s "$dir/ref/checkpoints/step_00000002/shard_00000.bin" "$ck/step_00000002/shard_00000.bin" ||
  fail "nan-skip: step 2 differs from the reference run"
echo "ok: NaN on rank 1 at step 3 with on_nonfinite=skip: finished in ${secs}s, step 3 skipped, its checkpoint bitwise equals step 2's (AdamW's count too), all values finite, verify ok"

# --- the same under no_shard, whose replicas all-reduce each unit's gradients during the
# backward: the NaN enters before those reductions, so both replicas see it and skip step 3
TESSERA_FAULT=1:3:backward:nan run nan-skip-ddp 0 --set train.on_nonfinite=skip --set parallel.strategy=no_shard
$py - "$dir/nan-skip-ddp/metrics.jsonl" <<'PY' || fail "nan-skip-ddp: metrics"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in recs if r.get("skipped")] == [3], recs
PY
all_finite "$dir/nan-skip-ddp" >/dev/null || fail "nan-skip-ddp: non-finite values"
echo "ok: NaN on rank 1 at step 3 under no_shard: both replicas skipped step 3 in ${secs}s"

# --- skip, but every step non-finite: stops after max_skipped_steps in a row
TESSERA_FAULT='1:*:backward:nan' run nan-always 11 --set train.on_nonfinite=skip --set train.max_skipped_steps=2
has nan-always 'step 3: loss .* 3 steps in a row were not finite \(train.max_skipped_steps = 2\)'
echo "ok: NaN at every step with max_skipped_steps=2: exit 11 at step 3 in ${secs}s"

# --- kill at forward: the run fails promptly, naming the worker that died
TESSERA_FAULT=1:2:forward:kill run kill 137
has kill 'worker rank 1 \(node 0, local rank 1, pid [0-9]+\): signal 9 \(KILL\)'
$py -c 'import sys; sys.exit(float(sys.argv[1]) > 15)' "$secs" || fail "kill: took ${secs}s"
echo "ok: kill -9 of rank 1 at forward of step 2: exit 137 in ${secs}s, worker 1 named"

# --- exit at backward
TESSERA_FAULT=0:2:backward:exit run exit 1
has exit 'worker rank 0 \(node 0, local rank 0, pid [0-9]+\): exit code 1'
echo "ok: rank 0 exits at backward of step 2: exit 1 in ${secs}s, worker 0 named"

# --- hang at optimizer: the peer's next collective times out naming the operation
TESSERA_FAULT=1:2:optimizer:hang run hang 12 --set parallel.timeout_ms=2000
has hang '\[rank 0\] error: .*(all_gather|reduce_scatter|all_reduce) #[0-9]+ on rank 0 of 2 failed \([0-9]+ x f32\): .*timed out waiting for rank 1'
$py -c 'import sys; sys.exit(float(sys.argv[1]) > 20)' "$secs" || fail "hang: took ${secs}s"
echo "ok: rank 1 hangs at optimizer of step 2: rank 0 times out after 2 s naming the operation, exit 12 in ${secs}s"
# --- the same over TCP (Gloo names its own timeout)
TESSERA_FAULT=1:2:optimizer:hang run hang-tcp 12 --set parallel.timeout_ms=2000 --set parallel.host_transport=tcp
has hang-tcp '\[rank 0\] error: .*(all_gather|reduce_scatter|all_reduce) #[0-9]+ on rank 0 of 2 failed \([0-9]+ x f32\): .*Timed out'
has hang-tcp '\[rank 0\] info: host collectives: world: TCP \(Gloo\)'
echo "ok: the same hang over TCP: exit 12 in ${secs}s"
# --- shared memory refused (rank 1 cannot map the group's segment, as in a container with another
# IPC namespace or a full /dev/shm): auto warns, naming the rank and why, and trains over TCP;
# host_transport = shm stops at start-up naming it, exit 2 (a restart would not help)
TESSERA_FAULT='1:*:shm.attach:io' run shm-refused 0 --set train.max_steps=2
has shm-refused 'warn: a group of 2 ranks keeps its collectives on TCP: its ranks cannot share memory \(rank 1: cannot map the segment'
has shm-refused '\[rank 0\] info: host collectives: world: TCP \(Gloo\)'
TESSERA_FAULT='1:*:shm.attach:io' run shm-forced 2 --set parallel.host_transport=shm
has shm-forced 'parallel.host_transport = shm, but the group.s ranks cannot share memory: rank 1: cannot map the segment'
echo "ok: shared memory refused by rank 1: auto trains over TCP with a warning naming rank 1; shm stops with exit 2 naming it"
# --- row 17: one slow rank (2 s sleep before each step's forward) is flagged within K steps;
# a healthy run flags nobody
TESSERA_FAULT='1:*:forward:slow' run straggler 0 --set train.max_steps=4 --set metrics.straggler_steps=2
has straggler '\[rank 0\] warn: rank 1 is a straggler: busy 2\.[0-9]+ s per step'
$py - "$dir/straggler/metrics.jsonl" "$dir/ref/metrics.jsonl" <<'PY' || fail "straggler: metrics"
import json, sys
slow, healthy = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
flagged = [r["step"] for r in slow if r.get("stragglers") == [1]]
assert flagged and flagged[0] <= 2, flagged          # within K = 2 steps
assert all(len(r["rank_busy_s"]) == 2 for r in slow)
assert not any("stragglers" in r for r in healthy), "a healthy run flagged a straggler"
PY
echo "ok: row 17, a rank 2 s slower per step flagged as a straggler at step 2 (K = 2); the healthy run flags nobody"
# --- a slow load: rank 1 takes 2 s longer than rank 0 to load the checkpoint it resumes from,
# past parallel.timeout_ms (1.5 s); rank 0 waits for it as for slow storage (at least 30 min), not
# as for a collective
TESSERA_FAULT='1:0:checkpoint.load:slow' run slow-load 0 --resume "$dir/ref/checkpoints" --set train.max_steps=7 \
  --set parallel.timeout_ms=1500
has slow-load 'resumed from .*step_00000006'
echo "ok: a rank's load 2 s slower than its peer's, past parallel.timeout_ms = 1.5 s: resumed and trained on (${secs}s)"
TESSERA_FAULT='1:0:checkpoint.load:io' run load-io 10 --resume "$dir/ref/checkpoints" --set train.max_steps=7
has load-io "cannot read the checkpoint .*step_00000006 .* after 4 attempts; stopping without falling back"
echo "ok: rank 1's reads of the checkpoint fail (EIO): every rank exits 10 without falling back (${secs}s)"
echo "PASS"
