#!/usr/bin/env bash
# Command-line contract: exit codes, messages that name the key, run outputs, determinism.
# usage: cli_test.sh TESSERA_BINARY
set -uo pipefail
tessera=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0

# expect_exit CODE PATTERN -- ARGS...: runs tessera ARGS, checks the exit code and that stderr
# (or stdout) matches PATTERN.
expect_exit() {
  local code=$1 pattern=$2
  shift 3
  local out rc
  out=$("$tessera" "$@" 2>&1)
  rc=$?
  if [[ $rc -ne $code ]] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL: tessera $* -> exit $rc (want $code), output:"
    echo "$out" | head -5
    failures=$((failures + 1))
  else
    echo "ok: tessera $* -> $rc"
  fi
}

expect_exit 0 "gemm: +oneDNN" -- info
expect_exit 2 "unknown command 'frobnicate'" -- frobnicate
expect_exit 2 "usage" --
expect_exit 2 "did you mean train.lr" -- train --set train.lrr=1
expect_exit 2 "model.dim = 100: must be divisible by model.n_heads = 8" -- train --set model.dim=100
expect_exit 2 "unknown option --bogus" -- train --bogus
expect_exit 2 "cannot parse config" -- train /dev/null/missing.toml
expect_exit 2 "train.batch_size = 6" -- config --set train.batch_size=6 --set train.micro_batch_size=4

# A short run writes its outputs; loss values round-trip exactly (17 significant digits).
run() { "$tessera" train --set model.preset=tiny --set data.synthetic=true --set train.batch_size=8 --set train.micro_batch_size=4 \
  --set train.max_steps=3 --set train.threads=2 --run-dir "$1" "${@:2}" >"$1.log" 2>&1; }
if run "$dir/a" && run "$dir/b"; then
  lines=$(wc -l <"$dir/a/metrics.jsonl")
  [[ $lines -eq 3 ]] || { echo "FAIL: metrics.jsonl has $lines lines, want 3"; failures=$((failures + 1)); }
  grep -q '"step":3,"loss":' "$dir/a/metrics.jsonl" || { echo "FAIL: metrics.jsonl lacks step 3"; failures=$((failures + 1)); }
  [[ -s $dir/a/model.safetensors && -s $dir/a/config.toml ]] || { echo "FAIL: missing run outputs"; failures=$((failures + 1)); }
  # Same thread count: identical losses and weights, run after run.
  if cmp -s <(grep -o '"loss":[^,]*' "$dir/a/metrics.jsonl") <(grep -o '"loss":[^,]*' "$dir/b/metrics.jsonl") &&
     cmp -s "$dir/a/model.safetensors" "$dir/b/model.safetensors"; then
    echo "ok: two runs are bitwise identical"
  else
    echo "FAIL: two runs with the same seed and threads differ"; failures=$((failures + 1))
  fi
else
  echo "FAIL: tiny training run failed:"; cat "$dir/a.log" "$dir/b.log" 2>/dev/null | tail -5; failures=$((failures + 1))
fi

# A diverging run stops with the non-finite exit code and names the step.
expect_exit 11 "step [0-9]+: loss" -- train --set model.preset=tiny --set data.synthetic=true --set train.batch_size=4 --set train.lr=1e30 \
  --set train.warmup_steps=0 --set train.grad_clip=0 --set train.max_steps=20 --run-dir "$dir/nan"

echo "$failures failure(s)"
[[ $failures -eq 0 ]]
