#!/usr/bin/env bash
# `tessera launch` under faults (RELIABILITY.md rows 1, 2, 9, 10, 11, 12, 16), end to end: agents
# on this machine rendezvous through a file store, tiny model, synthetic tokens, one thread per
# worker (deterministic), checkpoints every 4 steps. Each recovered run must end bitwise equal to
# an uninterrupted one (per-step losses and final parameters). Prints detection and recovery times.
# usage: launch_test.sh TESSERA_BINARY
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
tessera=$1
dir=$(mktemp -d)
export TESSERA_JOB_TOKEN=launch-test-token
cleanup() {
  pkill -KILL -f "$dir" 2>/dev/null || true  # any agent or worker of this test (their args name $dir)
  rm -rf "$dir"
}
trap cleanup EXIT
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

steps=40
train_args=(--set model.preset=tiny --set data.synthetic=true --set train.max_steps=$steps --set train.eval_interval=0
            --set train.threads=1 --set train.batch_size=12 --set checkpoint.interval_steps=4
            --set checkpoint.interval_minutes=0 --set parallel.timeout_ms=4000)
# launch NAME NNODES NPROC [more launch flags]: one agent. It execs, so `launch ... &` gives the
# agent's own pid in $!; in the foreground call it in a subshell: (launch ...).
launch() {
  local name=$1 nnodes=$2 nproc=$3
  shift 3
  # The caller's arguments last: its --set overrides win over train_args' (the last --set of a key does).
  exec "$tessera" launch --nnodes "$nnodes" --nproc-per-node "$nproc" --rdzv "file://$dir/rdzv-$name" --run-id "$name" \
    --run-dir "$dir/$name" --monitor-interval 0.2 --rdzv-timeout 60 --last-call 0.5 "${train_args[@]}" "$@"
}
workers_of() { pgrep -P "$1" || true; }
until_logged() {  # until_logged FILE PATTERN: waits (at most 120 s) for PATTERN in FILE
  for _ in $(seq 2400); do grep -q "$2" "$1" && return 0; sleep 0.05; done
  grep -v "info: step" "$1" | tail -20
  fail "$1 never logged '$2'"
}
no_leftovers() {
  sleep 0.3
  if pgrep -f "$dir/$1" >/dev/null; then pgrep -af "$dir/$1"; fail "$1: processes left behind"; fi
}

# The reference: 2 workers, no fault.
(launch ref 1 2) 2>"$dir/ref.log" || { cat "$dir/ref.log"; fail "reference run"; }
same_ref() { same_run "$dir/ref" "$dir/$1" "$1"; }
# parallel.cpu_bind = auto: the agent's workers each on their own block of its CPUs (rank 1's
# info lines are in its log file only)
if (($(nproc) >= 2)); then
  for r in 0 1; do
    grep -q "\[rank $r\] info: CPU binding: local rank $r of 2 on CPUs " "$dir/ref/logs/rank_$r.log" ||
      { grep -i "binding" "$dir/ref/logs/rank_$r.log"; fail "ref: local rank $r was not bound to its CPUs"; }
  done
fi

# --- row 1: kill -9 one worker mid-step
launch kill 1 2 2>"$dir/kill.log" &
agent=$!
wait_step "$dir/kill" 10 30
victim=$(workers_of $agent | tail -1)
t0=$(now)
kill -9 "$victim"
until_logged "$dir/kill.log" "round 0: worker rank"
t1=$(now)
until_logged "$dir/kill.log" "round 1: node 0"
t2=$(now)
wait "$agent" || { cat "$dir/kill.log"; fail "kill: the agent did not recover"; }
grep -q "signal 9 (KILL)" "$dir/kill.log" || fail "kill: the summary does not name the signal"
resumed=$(sed -n 's/.*resumed from .*step_0*\([0-9]*\) in.*/\1/p' "$dir/kill.log" | head -1)
same_ref kill
no_leftovers kill
echo "ok: row 1, kill -9 of a worker mid-step: detected in $(elapsed "$t0" "$t1") s, new round after $(elapsed "$t0" "$t2") s, resumed from step $resumed; bitwise equal"

# --- row 2: SIGSTOP one worker (a hang): peers time out (parallel.timeout_ms 4 s), the stopped worker
# is killed, everything restarts; nothing is left behind
launch hang 1 2 --hang-timeout 30 2>"$dir/hang.log" &
agent=$!
wait_step "$dir/hang" 10 30
victim=$(workers_of $agent | tail -1)
t0=$(now)
kill -STOP "$victim"
until_logged "$dir/hang.log" "round 1: node 0"
t1=$(now)
wait "$agent" || { cat "$dir/hang.log"; fail "hang: the agent did not recover"; }
grep -qi "timed out" "$dir/hang.log" || { grep -v "info: step" "$dir/hang.log" | tail; fail "hang: no collective timeout reported"; }
same_ref hang
no_leftovers hang
echo "ok: row 2, SIGSTOP of a worker: peers' collectives timed out (4 s configured), restarted after $(elapsed "$t0" "$t1") s; bitwise equal, no process left"

# The watchdog alone: a single worker stopped has no peer to time out; --hang-timeout 2 kills it.
launch watchdog 1 1 --hang-timeout 2 --kill-grace 1 2>"$dir/watchdog.log" &
agent=$!
wait_step "$dir/watchdog" 10 30
victim=$(workers_of $agent | tail -1)
t0=$(now)
kill -STOP "$victim"
until_logged "$dir/watchdog.log" "round 1: node 0"
t1=$(now)
wait "$agent" || fail "watchdog: the agent did not recover"
grep -q "made no progress for" "$dir/watchdog.log" || fail "watchdog: no hang reported"
echo "ok: watchdog: a stopped worker got TERM after the 2 s hang timeout, KILL 1 s later; restarted after $(elapsed "$t0" "$t1") s"

# --- row 10: two nodes (agents) on one machine; one agent killed and replaced
launch ref2 2 1 2>"$dir/ref2.log" & a=$!
(launch ref2 2 1) 2>"$dir/ref2.b.log" || fail "two-node reference (agent b)"
wait $a || fail "two-node reference (agent a)"
launch two 2 1 2>"$dir/two.a.log" & agent_a=$!
launch two 2 1 2>"$dir/two.b.log" & agent_b=$!
wait_step "$dir/two" 10 30
t0=$(now)
kill -9 $agent_b  # its worker dies with it (PR_SET_PDEATHSIG)
until_logged "$dir/two.a.log" "round 0: worker rank\|another node failed"
t1=$(now)
launch two 2 1 2>"$dir/two.c.log" & agent_c=$!  # the replacement
wait $agent_a || { cat "$dir/two.a.log"; fail "two nodes: agent a failed"; }
wait $agent_c || { cat "$dir/two.c.log"; fail "two nodes: the replacement agent failed"; }
t2=$(now)
grep -q "round 1: node .* of 2, .* restart 1/3" "$dir/two.a.log" || fail "two nodes: restart budget not used once"
same_run "$dir/ref2" "$dir/two" "agent replaced"
echo "ok: row 10, an agent killed and replaced: survivor detected it in $(elapsed "$t0" "$t1") s, re-rendezvoused with the replacement (restart 1/3); bitwise equal"

# --- row 11: restart budget used up: a worker killed in every attempt
set +e
(TESSERA_FAULT=1:6:forward:kill TESSERA_FAULT_ALWAYS=1 launch budget 1 2 --max-restarts 2) 2>"$dir/budget.log"
rc=$?
set -e
((rc != 0)) || fail "budget: exit 0"
grep -q "giving up: 2 restart(s) used (--max-restarts 2); first failure: rank 1 .*signal 9 (KILL) after step" "$dir/budget.log" ||
  { grep -v "info: step" "$dir/budget.log" | tail -5; fail "budget: no summary naming rank, signal and step"; }
echo "ok: row 11, restart budget used up: exit $rc with the first failure's rank, signal and step"

# --- row 9: too few nodes: a clear timeout error naming the count
set +e
t0=$(now)
"$tessera" launch --nnodes 2 --nproc-per-node 1 --rdzv "file://$dir/rdzv-alone" --run-id alone --run-dir "$dir/alone" \
  --rdzv-timeout 2 "${train_args[@]}" 2>"$dir/alone.log"
rc=$?
t1=$(now)
set -e
((rc != 0)) || fail "too few nodes: exit 0"
grep -q "only 1 of at least 2 nodes joined within 2 s" "$dir/alone.log" || { cat "$dir/alone.log"; fail "too few nodes: unclear error"; }
echo "ok: row 9, too few nodes: exit $rc after $(elapsed "$t0" "$t1") s naming 1 of at least 2 nodes"

# --- row 12: a bad config is rejected before any rendezvous or worker
for bad in "train.batch_size=-3" "train.lr=fast" "parallel.nproc=0" "train.batch_size=7" "model.no_such_key=1"; do
  set +e
  t0=$(now)
  "$tessera" launch --nnodes 1 --nproc-per-node 2 --rdzv "file://$dir/rdzv-bad" --run-id bad --run-dir "$dir/bad" \
    "${train_args[@]}" --set "$bad" 2>"$dir/bad.log"
  rc=$?
  t1=$(now)
  set -e
  [[ $rc == 2 ]] || { cat "$dir/bad.log"; fail "bad config $bad: exit $rc, expected 2"; }
  grep -q "${bad%%=*}" "$dir/bad.log" || { cat "$dir/bad.log"; fail "bad config $bad: the key is not named"; }
  [[ -e $dir/bad/metrics.jsonl ]] && fail "bad config $bad: a worker started"
  echo "ok: row 12, --set $bad rejected with exit 2 naming the key in $(elapsed "$t0" "$t1") s, no worker started"
done

# --- row 16: an agent with another job token is refused; nothing listens beyond loopback
# A run far longer than the checks below take: the SIGTERM at the end must find it training (the
# 400 steps it had take 5 s with shared-memory collectives, which a loaded machine could outlast).
launch guarded 1 2 --set train.max_steps=100000 2>"$dir/guarded.log" &
agent=$!
wait_step "$dir/guarded" 5 30
set +e
TESSERA_JOB_TOKEN=stranger-secret-7f3a "$tessera" launch --nnodes 1 --nproc-per-node 1 --rdzv "file://$dir/rdzv-guarded" \
  --run-id guarded --run-dir "$dir/intruder" "${train_args[@]}" 2>"$dir/intruder.log"
rc=$?
set -e
((rc != 0)) || fail "a stray agent without the job token was accepted"
grep -q -e stranger-secret-7f3a -e "$TESSERA_JOB_TOKEN" "$dir/intruder.log" && fail "stray agent: the refusal printed a token"
grep -q "wrong job token" "$dir/intruder.log" || { cat "$dir/intruder.log"; fail "stray agent: unclear refusal"; }
worker=$(workers_of $agent | head -1)
# Gloo listens only while its pairs connect; afterwards every socket of a worker (any state) must
# be bound to loopback.
sockets=$(ss -tanpH 2>/dev/null | grep -F "pid=$worker," | awk '{print $4}' | sort -u | tr '\n' ' ' || true)
[[ -n $sockets ]] || fail "no socket found for worker $worker (ss -tanp)"
for l in $sockets; do [[ $l == 127.0.0.1:* ]] || fail "a worker has a socket on $l"; done
kill -TERM $agent
stop_rc=0
wait $agent || stop_rc=$?
[[ $stop_rc == 143 ]] || fail "guarded: SIGTERM to the agent ended in exit $stop_rc, expected 143 (stopped, not finished)"
grep -q "stopped at step" "$dir/guarded.log" || fail "guarded: the workers did not checkpoint on the stop"
grep -q "stop requested" "$dir/guarded.log" || fail "guarded: the agent did not pass the stop on"
echo "ok: row 16, a stray agent with another token refused (exit $rc); worker sockets only on loopback ($sockets); SIGTERM to the agent: workers checkpointed and exited 0, the agent 143"
# --- workers started by Slurm (srun sets SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID) join a job
# through TESSERA_RDZV without an agent; the result equals the 2-worker reference
pids=()
for r in 0 1; do
  SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_LOCALID=$r SLURM_JOB_ID=77 TESSERA_RDZV="file://$dir/rdzv-slurm" \
    "$tessera" train "${train_args[@]}" --set parallel.nproc=2 --run-dir "$dir/slurm" 2>"$dir/slurm.$r.log" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { cat "$dir/slurm.0.log" "$dir/slurm.1.log" | grep -v "info: step"; fail "slurm-style workers"; }; done
[[ -s $dir/slurm/model.safetensors ]] || { cat "$dir/slurm.0.log"; fail "slurm-style workers: no result"; }
same_run "$dir/ref" "$dir/slurm" "slurm-style workers"
! grep -i "CPU binding" "$dir/slurm.0.log" "$dir/slurm.1.log" || fail "slurm-style workers: bound by Tessera, not by srun"
echo "ok: two workers started with Slurm's variables (no agent) train together; bitwise equal to the launched run"
# --- a worker's heartbeat file (what an agent's watchdog reads): its steps done, it says so, and
# the GPU idle rule stops applying while it writes its last checkpoint and final weights
RANK=0 WORLD_SIZE=1 TESSERA_RDZV="file://$dir/rdzv-beat" TESSERA_HEARTBEAT="$dir/beat" \
  "$tessera" train "${train_args[@]}" --run-dir "$dir/beat-run" 2>"$dir/beat.log" || { tail "$dir/beat.log"; fail "heartbeat: the worker failed"; }
[[ $(head -1 "$dir/beat") == "$steps finishing"* ]] || fail "heartbeat: ends with '$(head -1 "$dir/beat")', not '$steps finishing'"
io=$(sed -n 2p "$dir/beat")  # "io BYTES": its checkpoints' bytes, a sign of life outside the steps
[[ $io =~ ^io\ ([0-9]+)\ *$ ]] && (( BASH_REMATCH[1] > 0 )) || fail "heartbeat: its second line is '$io', not 'io BYTES' with BYTES > 0"
echo "ok: a worker's heartbeat ends '$steps finishing' once its steps are done, 'io ${BASH_REMATCH[1]}' moved through its checkpoints"

# --- workers started torchrun-style (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT): rank
# 0 serves a TCP store there; the result equals the 2-worker reference
port=$($py -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for r in 1 0; do  # rank 1 first: its client waits for rank 0's server
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$tessera" train "${train_args[@]}" --set parallel.nproc=2 --run-dir "$dir/torchrun" 2>"$dir/torchrun.$r.log" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { cat "$dir/torchrun.0.log" "$dir/torchrun.1.log" | grep -v "info: step"; fail "torchrun-style workers"; }; done
same_run "$dir/ref" "$dir/torchrun" "torchrun-style workers"
echo "ok: two workers started with torchrun's variables (MASTER_ADDR/MASTER_PORT: rank 0 serves a TCP store) train together; bitwise equal"

# --- two nodes on one machine through etcd (Debian etcd-server), 2 workers each: a worker killed
# mid-step on one node; both agents restart their workers from the latest checkpoint
if [[ -x /usr/bin/etcd ]]; then
  read -r client peer < <($py -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')
  start_etcd() {
    /usr/bin/etcd --name t --data-dir "$dir/etcd-data" --listen-client-urls "http://127.0.0.1:$client" \
      --advertise-client-urls "http://127.0.0.1:$client" --listen-peer-urls "http://127.0.0.1:$peer" \
      --initial-advertise-peer-urls "http://127.0.0.1:$peer" --initial-cluster "t=http://127.0.0.1:$peer" \
      >>"$dir/etcd.log" 2>&1 &
    etcd_pid=$!
    for _ in $(seq 200); do (echo >/dev/tcp/127.0.0.1/$client) 2>/dev/null && break; sleep 0.05; done
  }
  start_etcd
  etcd_launch() {  # etcd_launch NAME: one agent of a 2-node, 2-worker-per-node job through etcd
    exec "$tessera" launch --nnodes 2 --nproc-per-node 2 --rdzv "etcd://127.0.0.1:$client/tessera-test" \
      --run-id "$1" --run-dir "$dir/$1" --monitor-interval 0.2 --rdzv-timeout 60 --last-call 0.5 "${train_args[@]}"
  }
  etcd_launch eref 2>"$dir/eref.a.log" & a=$!
  (etcd_launch eref) 2>"$dir/eref.b.log" || { cat "$dir/eref.b.log"; fail "etcd: reference"; }
  wait $a || fail "etcd: reference (agent a)"
  etcd_launch etcd 2>"$dir/etcd.a.log" & agent_a=$!
  etcd_launch etcd 2>"$dir/etcd.b.log" & agent_b=$!
  wait_step "$dir/etcd" 10 30
  t0=$(now)
  kill -9 "$(workers_of $agent_b | tail -1)"
  wait $agent_a || { cat "$dir/etcd.a.log"; fail "etcd: agent a"; }
  wait $agent_b || { cat "$dir/etcd.b.log"; fail "etcd: agent b"; }
  t1=$(now)
  grep -q "round 1: node" "$dir/etcd.a.log" || fail "etcd: no second round"
  same_run "$dir/eref" "$dir/etcd" "two nodes through etcd"
  echo "ok: two agents x 2 workers through etcd: a worker killed mid-step, both nodes restarted (done $(elapsed "$t0" "$t1") s after the kill); bitwise equal"

  # Row 8: etcd killed mid-run and restarted 1.5 s later: the running steps go on (the workers
  # need the store only to rendezvous and commit checkpoints), the job finishes bitwise equal.
  long=(--set train.max_steps=300 --set checkpoint.interval_steps=0)
  etcd_long() { exec "$tessera" launch --nnodes 2 --nproc-per-node 1 --rdzv "etcd://127.0.0.1:$client/tessera-test" \
    --run-id "$1" --run-dir "$dir/$1" --monitor-interval 0.2 --rdzv-timeout 60 --last-call 0.5 "${train_args[@]}" "${long[@]}"; }
  etcd_long lref 2>"$dir/lref.a.log" & a=$!
  (etcd_long lref) 2>"$dir/lref.b.log" || { grep -v "info: step" "$dir/lref.b.log" | tail; fail "etcd restart: reference"; }
  wait $a || { grep -v "info: step" "$dir/lref.a.log" | tail; fail "etcd restart: reference (agent a)"; }
  etcd_long outage 2>"$dir/outage.a.log" & agent_a=$!
  etcd_long outage 2>"$dir/outage.b.log" & agent_b=$!
  wait_step "$dir/outage" 30 30
  kill -9 $etcd_pid
  t0=$(now)
  sleep 1.5
  steps_during=$(wc -l <"$dir/outage/metrics.jsonl")
  start_etcd
  t1=$(now)
  wait $agent_a || { grep -v "info: step" "$dir/outage.a.log" | tail; fail "etcd restart: agent a"; }
  wait $agent_b || { grep -v "info: step" "$dir/outage.b.log" | tail; fail "etcd restart: agent b"; }
  ((steps_during > 30)) || fail "etcd restart: no step while etcd was down"
  same_run "$dir/lref" "$dir/outage" "etcd restarted mid-run"
  echo "ok: row 8, etcd killed at step 30 and back after $(elapsed "$t0" "$t1") s: steps went on (step $steps_during when it returned), the job finished bitwise equal"
  kill $etcd_pid
else
  echo "skipped: two nodes through etcd (/usr/bin/etcd missing: scripts/setup.sh installs etcd-server)"
fi
echo "launch tests passed"
