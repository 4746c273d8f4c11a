#!/usr/bin/env bash
# RELIABILITY.md row 4 at random (issue 12): a two-worker run (`tessera train --nproc 2`, sharded
# checkpoints) saving every step is killed with SIGKILL KILLS times at random moments and resumed
# each time. Each kill takes, by a draw from bash's RANDOM seeded with SEED: the whole job (the
# process group: the local agent and both workers), one worker (rank 0 or 1; the agent then stops
# the other), the agent alone (its workers must die with it), or the whole job during start-up
# (health check, resume, clean-up). Kills otherwise come 0-40 ms after the run logs a step, so
# they land in a background save as well as between saves. After each kill: no process of the
# run survives, the run directory's lock is free, `tessera checkpoint verify` passes on the
# latest committed checkpoint (and on every committed one), `latest` never goes back, at most one
# completed step is lost (the checkpoint interval), and the next start resumes from `latest`.
# After the last kill the run completes; its per-step losses and gradient norms (every step, those
# after the last resume included), its final parameters and its final checkpoint's shard files
# must be bitwise equal to an uninterrupted run's, and its run directory must hold the same files.
# Tiny model, synthetic tokens, one thread per worker (deterministic). Prints one line per kill
# and an `ok:` summary; on failure `FAIL: kill K of N (seed S): ...`, keeps the directory, exit 1.
# usage: kill_loop_test.sh TESSERA_BINARY KILLS [SEED]   (SEED default 1)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
tessera=$1
kills=$2
seed=${3:-1}
[[ $kills =~ ^[1-9][0-9]*$ && $seed =~ ^[0-9]+$ ]] || { echo "usage: $0 TESSERA_BINARY KILLS [SEED]" >&2; exit 2; }
RANDOM=$seed  # every draw below is made in this shell, never in a $(...) subshell (that would not advance it)
dir=$(mktemp -d)
mkdir "$dir/tmp"
export TMPDIR=$dir/tmp  # where the agent's heartbeat directory goes: counted at the end
run=$dir/run
ref=$dir/ref
k=0  # the kill being made (0: before the first, $kills + 1: the final run)
keep=0
live_group=  # the process group of the life being killed (each life has its own: setsid), until reaped
cleanup() {
  [[ -z $live_group ]] || kill -KILL -- "-$live_group" 2>/dev/null || true
  local p  # and any process of this run that left its group (their arguments name this test's directory)
  for p in $(pgrep -f -- "--run-dir $run( |$)" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
  ((keep)) || rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  keep=1
  local at="kill $k of $kills"
  ((k > 0)) || at="before the first kill"
  ((k <= kills)) || at="the run resumed after the last of $kills kills"
  echo "FAIL: $at (seed $seed): $*; the directory is kept: $dir"
  exit 1
}
now() { echo "$EPOCHREALTIME"; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
since_ms() { local t=${EPOCHREALTIME/[.,]/}; echo $(((10#$t - 10#${1/[.,]/}) / 1000)); }  # since_ms EPOCHREALTIME

# Enough steps that no life reaches the end before its kill (a life trains at most ~8 steps).
steps=$((10 * kills + 20))
common=(--set model.preset=tiny --set data.synthetic=true --set train.max_steps=$steps --set train.eval_interval=0
        --set train.threads=1 --set train.batch_size=12 --set checkpoint.interval_steps=1
        --set checkpoint.interval_minutes=0 --set parallel.timeout_ms=20000 --nproc 2)

last_step() {  # the highest step of a complete record (a kill can leave a torn last line)
  [[ -s $1/metrics.jsonl ]] || { echo 0; return; }
  awk '/^\{"step":[0-9]+,.*\}$/ { s = substr($0, 9) + 0; if (s > m) m = s } END { print m + 0 }' "$1/metrics.jsonl"
}
latest_step() {  # the step `latest` names, 0 when there is none
  local name
  name=$(cat "$run/checkpoints/latest" 2>/dev/null) || { echo 0; return 0; }
  [[ $name =~ ^step_([0-9]{8})$ ]] && echo $((10#${BASH_REMATCH[1]})) || echo "'$name'"
}
step_name() { printf 'step_%08d' "$1"; }
alive() {  # alive PGID: the processes of the run still running (zombies waiting for init are dead)
  local p
  for p in $(pgrep -g "$1" 2>/dev/null; pgrep -f -- "--run-dir $run( |$)" 2>/dev/null); do
    [[ -r /proc/$p/stat && $(awk '{ print $3 }' "/proc/$p/stat" 2>/dev/null) != Z ]] && echo "$p"
  done | sort -u
}
worker() {  # worker AGENT RANK: that worker's pid
  local p
  for p in $(pgrep -P "$1"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "TESSERA_RANK=$2" && { echo "$p"; return 0; }
  done
  return 0
}
in_flight() {  # in_flight LATEST MARKER: what a save of this life left: step directories past `latest`, temporaries
  local latest=$1 marker=$2 d s out=()  # (only what changed after MARKER: not a previous life's leftovers)
  for d in "$run"/checkpoints/step_*; do
    [[ -d $d && $(basename "$d") =~ ^step_([0-9]{8})$ ]] || continue
    s=$((10#${BASH_REMATCH[1]}))
    ((s > latest)) && [[ -n $(find "$d" -newer "$marker" | head -1) ]] || continue
    if [[ -e $d/manifest.json ]]; then out+=("$(basename "$d") renamed in, latest not yet")
    else out+=("$(basename "$d") uncommitted: $(find "$d" -maxdepth 1 -type f | wc -l) file(s)"); fi
  done
  for d in "$run"/checkpoints/*.tmp "$run"/checkpoints/step_*/*.tmp; do
    [[ -e $d && -n $(find "$d" -newer "$marker") ]] && out+=("${d#"$run"/checkpoints/}")
  done
  local joined=""
  for d in "${out[@]}"; do joined+="${joined:+, }$d"; done
  echo "$joined"
}

t_start=$(now)
"$tessera" train "${common[@]}" --run-dir "$ref" 2>"$dir/ref.log" || { cat "$dir/ref.log"; fail "the uninterrupted reference run"; }
[[ -z $(ls -A "$TMPDIR") ]] || fail "the reference run left $(ls -A "$TMPDIR") in TMPDIR"

mid_save=0 lost_max=0 lost_sum=0 gone_max=0 agent_kills=0
declare -A how_many=([job]=0 [rank]=0 [agent]=0 [start-up]=0)
prev_latest=0
# Bash reports each life it reaps as "line N: PID Killed setsid ..." at any later command: not ours to print.
exec 4>&2 2> >(grep --line-buffered -v -E '^.*: line [0-9]+: +[0-9]+ Killed +setsid ' >&4)
for ((k = 1; k <= kills; k++)); do
  log=$dir/life-$k.log
  resume=()
  [[ -d $run ]] && resume=(--resume auto)
  from=$(latest_step)
  touch "$dir/life-$k.start"
  setsid "$tessera" train "${common[@]}" --run-dir "$run" "${resume[@]}" 2>"$log" &
  agent=$!  # setsid execs (a background job is no group leader): the agent, leader of its own group
  live_group=$agent
  # Until setsid has run, the child is still in this script's group (a kill of -PID would miss).
  until [[ $(ps -o pgid= -p "$agent" 2>/dev/null | tr -d ' ') == "$agent" ]]; do
    kill -0 "$agent" 2>/dev/null || { cat "$log"; fail "the run did not start"; }
    sleep 0.001
  done
  t0=$EPOCHREALTIME
  # A record of step from + 2 is the life's own: a stale one of the previous life reaches from + 1.
  draw=$((RANDOM % 10))
  if ((draw == 0)); then  # at a random moment of start-up, or at its first step when that comes first
    how=start-up target=$((from + 2)) deadline_ms=$((RANDOM % 700)) delay_ms=0
  else  # 0-40 ms after the run logs step target (it has just handed that step's save to its writer)
    if ((draw <= 2)); then how=rank; elif ((draw == 3)); then how=agent; else how=job; fi
    target=$((from + 2 + RANDOM % 3)) deadline_ms=-1 delay_ms=$((RANDOM % 41))
  fi
  rank=$((RANDOM % 2))
  while (($(steps_logged "$run") < target)); do
    kill -0 "$agent" 2>/dev/null || { grep -v "info: step" "$log" | tail; fail "the run ended before reaching step $target"; }
    ((deadline_ms < 0 || $(since_ms "$t0") < deadline_ms)) || break
    sleep 0.005
  done
  ((delay_ms == 0)) || sleep "$(printf '0.%03d' "$delay_ms")"
  kill -0 "$agent" 2>/dev/null || { grep -v "info: step" "$log" | tail; fail "the run ended before its kill"; }
  case $how in
    job | start-up) kill -KILL -- "-$agent"; what="the whole job" ;;
    agent) kill -KILL "$agent"; what="the agent alone" ;;
    rank)
      victim=$(worker "$agent" "$rank")
      [[ -n $victim ]] || fail "no worker of rank $rank under agent $agent"
      kill -KILL "$victim"; what="rank $rank alone" ;;
  esac
  t_kill=$(now)
  how_many[$how]=$((${how_many[$how]} + 1))
  [[ $how == rank ]] || agent_kills=$((agent_kills + 1))
  # No process of the run survives (workers of a killed agent die with it; a worker whose peer
  # was killed is stopped by its agent).
  for _ in $(seq 600); do [[ -z $(alive "$agent") ]] && break; sleep 0.05; done
  [[ -z $(alive "$agent") ]] || { ps -o pid,stat,args -p "$(alive "$agent" | tr '\n' ,)0"; fail "after killing $what: processes survive 30 s later"; }
  gone=$(elapsed "$t_kill" "$(now)")
  rc=0
  wait "$agent" || rc=$?
  live_group=
  ((rc != 0)) || fail "after killing $what the agent exited 0"
  # A crash never leaves the run locked.
  [[ ! -e $run/.lock ]] || flock -n "$run/.lock" true || fail "after killing $what: $run/.lock is still held"
  latest=$(latest_step)
  [[ $latest =~ ^[0-9]+$ ]] || fail "after killing $what: checkpoints/latest holds $latest"
  ((latest >= prev_latest)) || fail "latest went back from step $prev_latest to step $latest"
  ((latest >= from)) || fail "latest went back from step $from (resumed) to step $latest"
  done_steps=$(last_step "$run")
  lost=$((done_steps > latest ? done_steps - latest : 0))
  # A life killed before it logged anything lost nothing (a record past latest is the previous life's).
  [[ -n $(find "$run/metrics.jsonl" -newer "$dir/life-$k.start" 2>/dev/null) ]] || lost=0
  ((lost <= 1)) || fail "killed $what at step $done_steps: latest is step $latest, $lost steps lost (interval 1)"
  ((lost > lost_max)) && lost_max=$lost
  lost_sum=$((lost_sum + lost))
  left=$(in_flight "$latest" "$dir/life-$k.start")
  [[ -n $left ]] && mid_save=$((mid_save + 1))
  if ((latest > 0)); then
    if ! "$tessera" checkpoint verify "$run/checkpoints/$(step_name "$latest")" >"$dir/verify-$k.out" 2>&1; then
      cat "$dir/verify-$k.out"; fail "after killing $what: the latest checkpoint $(step_name "$latest") does not verify"
    fi
    if ! "$tessera" checkpoint verify "$run/checkpoints" >"$dir/verify-all-$k.out" 2>&1; then
      cat "$dir/verify-all-$k.out"; fail "after killing $what: a committed checkpoint does not verify"
    fi
  fi
  # The life resumed from the `latest` it found (when the kill let it get that far).
  if grep -q "resumed from" "$log" && ! grep -q "resumed from .*$(step_name "$from") " "$log"; then
    grep "resumed from" "$log"; fail "life $k did not resume from $(step_name "$from")"
  fi
  awk -v g="$gone" -v m="$gone_max" 'BEGIN { exit !(g > m) }' && gone_max=$gone
  if [[ $how == start-up ]]; then when="in start-up, at most $deadline_ms ms in"; else when="step $target +$delay_ms ms"; fi
  printf 'kill %d/%d: %s (%s) after %s s, at step %d: latest %s, %d step(s) lost%s; all gone in %s s; %s\n' \
    "$k" "$kills" "$what" "$when" "$(elapsed "$t0" "$t_kill")" "$done_steps" \
    "$( ((latest > 0)) && step_name "$latest" || echo none)" "$lost" "${left:+; mid-save: $left}" "$gone" \
    "$( ((latest > 0)) && echo verified || echo "nothing committed yet")"
  prev_latest=$latest
done

# The final life runs to the end.
k=$((kills + 1))
from=$(latest_step)
"$tessera" train "${common[@]}" --run-dir "$run" --resume auto 2>"$dir/final.log" ||
  { grep -v "info: step" "$dir/final.log" | tail -20; fail "the final resume"; }
if ((from > 0)); then
  grep -q "resumed from .*$(step_name "$from") " "$dir/final.log" || fail "the final run did not resume from $(step_name "$from")"
fi
# Bitwise: every step's loss and gradient norm (the steps of every life, those after the last
# resume included), the final parameters, the final checkpoint's shards.
[[ $(losses "$run" | awk '{ print $1 }' | tr '\n' ' ') == "$(seq -s ' ' 1 "$steps") " ]] ||
  fail "metrics.jsonl does not hold steps 1..$steps once each"
if ! diff <(losses "$ref") <(losses "$run") >"$dir/losses.diff"; then
  head "$dir/losses.diff"
  fail "losses differ from the uninterrupted run (step, loss, grad norm; the last resume was at step $from):" \
    "$(grep -m1 '^<' "$dir/losses.diff") (uninterrupted) vs $(grep -m1 '^>' "$dir/losses.diff")"
fi
cmp -s "$ref/model.safetensors" "$run/model.safetensors" || fail "final parameters differ from the uninterrupted run"
final=checkpoints/$(step_name "$steps")
for f in "$ref/$final"/shard_*.bin; do
  cmp -s "$f" "$run/$final/$(basename "$f")" || fail "$final/$(basename "$f") differs from the uninterrupted run's"
done
[[ $(ls "$ref/$final") == "$(ls "$run/$final")" ]] || fail "$final holds other files than the uninterrupted run's"
# Nothing left behind: the same files as the uninterrupted run (lock included), no process.
if ! diff <(cd "$ref" && find . -mindepth 1 | sort) <(cd "$run" && find . -mindepth 1 | sort) >"$dir/tree.diff"; then
  cat "$dir/tree.diff"; fail "the run directory holds other files than the uninterrupted run's"
fi
flock -n "$run/.lock" true || fail "$run/.lock is still held after the final run"
if pgrep -f -- "--run-dir $run( |$)" >/dev/null; then pgrep -af -- "--run-dir $run( |$)"; fail "processes left after the final run"; fi
# An agent killed with SIGKILL cannot remove its private heartbeat directory (mkdtemp in TMPDIR);
# the next agent removes such stale ones, so after the final run TMPDIR is empty.
[[ -z $(ls -A "$TMPDIR") ]] || fail "TMPDIR holds $(ls -A "$TMPDIR" | head -3 | tr '\n' ' ')after the final run ($agent_kills kill(s) took an agent)"

kinds="${how_many[job]} whole job, ${how_many[rank]} one rank, ${how_many[agent]} agent alone, ${how_many[start-up]} at start-up"
echo "ok: $kills kill -9s (seed $seed: $kinds), $mid_save landed mid-save;" \
  "steps lost per kill max $lost_max (total $lost_sum, interval 1); every latest verified;" \
  "resumed to step $steps (last resume at step $from) bitwise equal to the uninterrupted run" \
  "(losses, grad norms, parameters, checkpoint shards); no process, lock or temporary file left in the run" \
  "directory, none in TMPDIR (the heartbeat directories of $agent_kills killed agents removed by the next);" \
  "processes gone within $gone_max s of a kill; $(elapsed "$t_start" "$(now)") s"
