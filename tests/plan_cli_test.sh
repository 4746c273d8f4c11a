#!/usr/bin/env bash
# `tessera plan` and `tessera train --dry-run` from the command line (issue 18): the search on
# Llama 2 70B over 16 x 8 H100 80 GB returns a layout that fits and rejects others with the
# numbers; a model that fits nowhere, unknown hardware, zero nodes and a bad hardware table are
# exit 2 naming the key; --json is one JSON object; a dry run plans on this machine and trains
# nothing; the published comparison (bench/plan_published.sh) stays within 15%.
# usage: plan_cli_test.sh TESSERA_BINARY
set -euo pipefail
tessera=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# expect_exit CODE PATTERN COMMAND...: exit code CODE and PATTERN in its output.
expect_exit() {
  local code=$1 pattern=$2 rc=0
  shift 2
  "$@" >"$dir/out" 2>&1 || rc=$?
  [[ $rc == "$code" ]] || { cat "$dir/out"; fail "$* exited $rc, expected $code"; }
  grep -q -- "$pattern" "$dir/out" || { cat "$dir/out"; fail "$* did not say '$pattern'"; }
}

seventy=(--set model.preset=llama2-70b --set train.batch_size=256 --set parallel.param_dtype=bf16
         --set parallel.reduce_dtype=bf16)
"$tessera" plan "${seventy[@]}" --hardware h100-80gb --nodes 16 --search >"$dir/search" ||
  { cat "$dir/search"; fail "search over 16 x 8 H100 failed"; }
grep -q "fit in .* per device; fastest first" "$dir/search" || fail "no count of the layouts that fit"
grep -Eq "^ +1  " "$dir/search" || { cat "$dir/search"; fail "no layout fits 70B on 128 H100"; }
grep -q "no_shard .*needs .* per device" "$dir/search" || fail "no_shard of 70B was not rejected with its numbers"
"$tessera" plan "${seventy[@]}" --hardware h100-80gb --nodes 16 --search --json |
  python3 -c "
import json, sys
c = json.load(sys.stdin)
fit = [x for x in c if x['fits']]
assert fit and all(x['memory']['total_bytes'] <= x['memory']['capacity_bytes'] for x in fit), 'fits but too big'
assert all(a['step']['step_s'] <= b['step']['step_s'] for a, b in zip(fit, fit[1:])), 'not fastest first'
assert all(x['why_not'] for x in c if not x['fits'])
" || fail "the search's JSON is wrong"

# One layout, with a token budget.
"$tessera" plan "${seventy[@]}" --hardware h100-80gb --nodes 16 --set parallel.activation_checkpointing=1 \
  --set train.micro_batch_size=2 --tokens 2T >"$dir/one" || { cat "$dir/one"; fail "plan of one layout failed"; }
for what in "memory per device" "optimizer (AdamW moments)" "activations" "fits" "MFU" "time to 2e+12 tokens" \
  "scaling efficiency against one node"; do
  grep -q "$what" "$dir/one" || { cat "$dir/one"; fail "the plan does not print '$what'"; }
done

# Bad input: exit 2 naming what is wrong.
expect_exit 2 "fits no layout" "$tessera" plan "${seventy[@]}" --hardware a100-40gb --nodes 1 --search
expect_exit 2 "does not fit" "$tessera" plan --set model.preset=llama2-70b --hardware a100-40gb
expect_exit 2 "unknown hardware (known: a100-40gb" "$tessera" plan --hardware h300
expect_exit 2 "\-\-nodes 0" "$tessera" plan --hardware h100-80gb --nodes 0
expect_exit 2 "\-\-gpus-per-node 0" "$tessera" plan --hardware h100-80gb --gpus-per-node 0
expect_exit 2 "\-\-hardware is required" "$tessera" plan
expect_exit 2 "\-\-tokens" "$tessera" plan --hardware h100-80gb --tokens lots
printf 'memory_gib = 80\npeak_bf16_tflops = 1000\nnvlink_gbs = 900\n' >"$dir/mine.toml"
expect_exit 2 "unknown key nvlink_gbs" "$tessera" plan --hardware "$dir/mine.toml"
expect_exit 2 "parallel.tensor" "$tessera" plan --hardware h100-80gb --set parallel.tensor=3

# A dry run plans the config on this machine and trains nothing.
(cd "$dir" && "$tessera" train --set model.preset=tiny --set data.synthetic=true --set train.batch_size=8 \
  --dry-run >"$dir/dry" 2>&1) || { cat "$dir/dry"; fail "train --dry-run failed"; }
grep -q "memory per device" "$dir/dry" || { cat "$dir/dry"; fail "the dry run printed no plan"; }
grep -q "measured on this machine" "$dir/dry" || fail "the dry run did not measure this machine"
[[ ! -e "$dir/runs" ]] || fail "the dry run created a run directory"

"$here/../bench/plan_published.sh" "$tessera" >"$dir/published" || { cat "$dir/published"; fail "a published figure is >15% off"; }
echo "plan_cli_test: ok"
