#!/usr/bin/env bash
# A 3D job through `tessera launch` survives a killed worker (issue 15): 2 nodes (agents on this
# machine, file rendezvous) x 4 workers = pipeline 2 x tensor 2 (sequence parallel) x data 2,
# tiny model, synthetic tokens, one thread per worker, checkpoints every 4 steps. A worker of the
# second node is killed with SIGKILL mid-step; the job must restart from its last checkpoint and
# end bitwise equal to an uninterrupted run (per-step losses and gradient norms, final
# parameters). Every log line of a worker names its coordinates.
# usage: launch_3d_test.sh TESSERA_BINARY
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
tessera=$1
dir=$(mktemp -d)
export TESSERA_JOB_TOKEN=launch-3d-test-token
cleanup() {
  pkill -KILL -f "$dir" 2>/dev/null || true  # any agent or worker of this test (their args name $dir)
  rm -rf "$dir"
}
trap cleanup EXIT

steps=16
train_args=(--set model.preset=tiny --set data.synthetic=true --set train.max_steps=$steps --set train.eval_interval=0
            --set train.threads=1 --set train.batch_size=8 --set train.micro_batch_size=1
            --set parallel.pipeline=2 --set parallel.tensor=2 --set parallel.sequence_parallel=true
            --set checkpoint.interval_steps=4 --set checkpoint.interval_minutes=0 --set parallel.timeout_ms=5000)
# launch NAME: one agent of the 2-node job NAME (it execs: `launch NAME &` gives the agent's pid).
launch() {
  exec "$tessera" launch --nnodes 2 --nproc-per-node 4 --rdzv "file://$dir/rdzv-$1" --run-id "$1" \
    --run-dir "$dir/$1" --monitor-interval 0.2 --rdzv-timeout 60 --last-call 0.5 "${train_args[@]}"
}

# The reference: no fault.
launch ref 2>"$dir/ref.a.log" & a=$!
launch ref 2>"$dir/ref.b.log" & b=$!
wait $a || { tail -20 "$dir/ref.a.log"; fail "reference run (agent a)"; }
wait $b || { tail -20 "$dir/ref.b.log"; fail "reference run (agent b)"; }
grep -q "tensor 2 (sequence parallel) x pipeline 2" "$dir/ref/logs/rank_0.log" || fail "the layout is not in rank 0's log"
for r in 0 6; do
  want=$(case $r in 0) echo "pp0 tp0 dp0" ;; 6) echo "pp1 tp0 dp1" ;; esac)
  grep -q "\[rank $r $want\] info: " "$dir/ref/logs/rank_$r.log" ||
    { head -3 "$dir/ref/logs/rank_$r.log"; fail "rank $r's log lines do not name its coordinates ($want)"; }
done

# Kill one worker of the second node mid-step, after the first checkpoint.
launch kill 2>"$dir/kill.a.log" & a=$!
launch kill 2>"$dir/kill.b.log" & b=$!
wait_step "$dir/kill" 6
victim=$(pgrep -P $b | tail -1)
kill -9 "$victim"
wait $a || { tail -20 "$dir/kill.a.log"; fail "killed run (agent a) did not recover"; }
wait $b || { tail -20 "$dir/kill.b.log"; fail "killed run (agent b) did not recover"; }
grep -q "signal 9 (KILL)" "$dir/kill.b.log" || fail "agent b does not name the signal"
resumed=$(sed -n 's/.*resumed from .*step_0*\([0-9]*\) in.*/\1/p' "$dir/kill/logs/rank_0.log" | head -1)
[[ -n $resumed ]] || fail "the restarted job did not resume from a checkpoint"
diff <(losses "$dir/ref") <(losses "$dir/kill") >/dev/null ||
  { diff <(losses "$dir/ref") <(losses "$dir/kill") | head -5; fail "losses or gradient norms differ"; }
cmp -s "$dir/ref/model.safetensors" "$dir/kill/model.safetensors" || fail "final parameters differ"
echo "ok: pipeline 2 x tensor 2 (sequence parallel) x data 2 on 2 agents: a worker killed mid-step, restarted from step $resumed; bitwise equal"
