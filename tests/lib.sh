# What the shell suites share: failing, the steps a run has logged, waiting for them, and
# comparing two runs bitwise. Sourced by a suite after its `set -euo pipefail`; a suite that must
# say more when it fails (kill_loop_test.sh) defines its own fail() after sourcing this.
# shellcheck shell=bash

py=/usr/bin/python3  # Debian's interpreter (the one scripts/setup.sh equips)

fail() { echo "FAIL: $*"; exit 1; }

# steps_logged RUN: the complete lines of RUN/metrics.jsonl, one per step logged (0 before the first)
steps_logged() { [[ -s $1/metrics.jsonl ]] && wc -l <"$1/metrics.jsonl" || echo 0; }

# wait_step RUN STEP [SECONDS]: returns once RUN has logged STEP steps; fails after SECONDS (120)
wait_step() {
  local tries=$((${3:-120} * 20)) i
  for ((i = 0; i < tries; i++)); do
    (($(steps_logged "$1") >= $2)) && return 0
    sleep 0.05
  done
  fail "$1 never reached step $2"
}

# wait_file PATH [SECONDS]: returns once PATH exists; fails after SECONDS (120)
wait_file() {
  local tries=$((${2:-120} * 20)) i
  for ((i = 0; i < tries; i++)); do
    [[ -e $1 ]] && return 0
    sleep 0.05
  done
  fail "$1 never appeared"
}

# losses RUN: step, loss and gradient norm of every record, exact (JSON keeps every bit of a double)
losses() {
  $py -c 'import json, sys
for l in open(sys.argv[1]): r = json.loads(l); print(r["step"], r["loss"].hex(), r["grad_norm"].hex())' "$1/metrics.jsonl"
}

# same_run REF RUN WHAT: per-step losses, gradient norms and final parameters bitwise equal
same_run() {
  diff <(losses "$1") <(losses "$2") >/dev/null || { diff <(losses "$1") <(losses "$2") | head; fail "$3: losses differ"; }
  cmp -s "$1/model.safetensors" "$2/model.safetensors" || fail "$3: final parameters differ"
}
