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
# tessera launch's numbers: each named with its value; NaN and infinity refused (NaN passed every
# comparison: --monitor-interval nan ran a job).
launch_flags=(launch --nnodes 1 --nproc-per-node 1 --rdzv "file://$dir/rdzv-flags" --run-id flags --run-dir "$dir/flags")
export TESSERA_JOB_TOKEN=cli-test-token
expect_exit 2 '--monitor-interval expects a finite number, got "nan"' -- "${launch_flags[@]}" --monitor-interval nan
expect_exit 2 '--hang-timeout expects a finite number, got "inf"' -- "${launch_flags[@]}" --hang-timeout inf
expect_exit 2 "--hang-timeout -1: expected seconds > 0" -- "${launch_flags[@]}" --hang-timeout -1
expect_exit 2 "--kill-grace -2: expected seconds >= 0 \(0: SIGKILL at once\)" -- "${launch_flags[@]}" --kill-grace -2
expect_exit 2 "--max-restarts -1: expected >= 0" -- "${launch_flags[@]}" --max-restarts -1
unset TESSERA_JOB_TOKEN
expect_exit 2 "--nproc 0: need at least 1" -- bench --preset tiny --steps 3 --nproc 0
expect_exit 2 "--top-k -1: must be >= 0" -- generate --checkpoint "$dir/none" --prompt x --top-k -1
expect_exit 2 "--top-p 0: must be in \(0, 1\]" -- generate --checkpoint "$dir/none" --prompt x --top-p 0
expect_exit 2 "--top-p 1.5: must be in \(0, 1\]" -- generate --checkpoint "$dir/none" --prompt x --top-p 1.5
expect_exit 2 '--temperature expects a finite number, got "nan"' -- generate --checkpoint "$dir/none" --prompt x --temperature nan
[[ ! -e $dir/flags ]] || { echo "FAIL: a refused launch wrote $dir/flags"; failures=$((failures + 1)); }
expect_exit 2 "cannot parse config" -- train /dev/null/missing.toml
expect_exit 2 "train.batch_size = 6" -- config --set train.batch_size=6 --set train.micro_batch_size=4
# train.device = cuda where no GPU can be used (CI): a config error naming the key and the reason.
if ! "$tessera" info | grep -q "^cuda device 0:"; then
  expect_exit 2 'config key train.device = "cuda": (no usable CUDA device|this tessera was built without CUDA)' -- \
    bench --preset tiny --steps 3 --set train.device=cuda
fi
# cuBLASLt is opened when the CUDA backend starts, never linked: loading it costs every process that
# links it 0.3 s of CPU, CPU runs and `--help` included (kernels/cuda/cublaslt.h).
if readelf -d "$tessera" | grep -q 'NEEDED.*libcublasLt'; then
  echo "FAIL: tessera links libcublasLt (kernels/cuda/cublaslt.h opens it when the CUDA backend starts instead)"
  failures=$((failures + 1))
else
  echo "ok: tessera does not link libcublasLt"
fi
expect_exit 2 "--device gpu: choose one of auto, cpu, cuda" -- generate --checkpoint "$dir/none" --prompt x --device gpu
# bench's breakdown of a step by op (attention's backward among them, wherever its time puts it).
expect_exit 0 '"ops":\{("[a-z_0-9]+":\{[^}]*\},)*"attention_backward":\{"calls":[0-9.]+,"seconds":[0-9.e-]+,"share":[0-9.e-]+\}' -- \
  bench --preset tiny --steps 3 --profile-ops --set train.threads=2
# The parallel layout: hybrid sharding in groups of 2 at 8 ranks (the output stays TOML).
expect_exit 0 "# dp_replicate \(2 groups of 4\): \[0 2 4 6\] \[1 3 5 7\]" -- config --nproc 8 \
  --set parallel.strategy=hybrid_shard --set parallel.shard_group_size=2 --set train.batch_size=48
expect_exit 2 "parallel.shard_group_size = 3" -- config --nproc 8 --set parallel.strategy=hybrid_shard \
  --set parallel.shard_group_size=3 --set train.batch_size=48

# A short run writes its outputs; loss values round-trip exactly (17 significant digits).
run() { "$tessera" train --set model.preset=tiny --set data.synthetic=true --set train.batch_size=8 --set train.micro_batch_size=4 \
  --set train.max_steps=3 --set train.threads=2 --run-dir "$1" "${@:2}" >"$1.log" 2>&1; }
if run "$dir/a" && run "$dir/b"; then
  lines=$(wc -l <"$dir/a/metrics.jsonl")
  [[ $lines -eq 3 ]] || { echo "FAIL: metrics.jsonl has $lines lines, want 3"; failures=$((failures + 1)); }
  grep -q '"step":3,' "$dir/a/metrics.jsonl" || { echo "FAIL: metrics.jsonl lacks step 3"; failures=$((failures + 1)); }
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

# Hugging Face interop: a run exported (one file and several), imported back, evaluated, and
# used as train.init_from gives the same numbers everywhere, since the weights are bitwise equal.
src=$(cd "$(dirname "$0")/.." && pwd)
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; failures=$((failures + 1)); fi; }
# Warmup-stable-decay: the peak held until the last train.lr_decay_steps, then linear to min_lr
# (metrics.jsonl's lr: step 1 warms up to 1e-3, 2-4 hold it, 5 and 6 decay).
if run "$dir/wsd" --set train.max_steps=6 --set train.warmup_steps=1 --set train.lr=1e-3 --set train.min_lr=1e-4 \
     --set train.lr_decay=linear --set train.lr_decay_steps=2; then
  check "train.lr_decay_steps holds the peak, then decays over the last steps" \
    '/usr/bin/python3 -c "import json, sys
lr = [json.loads(line)[\"lr\"] for line in open(sys.argv[1])]
print(\"lr by step:\", lr)
sys.exit(len(lr) != 6 or any(abs(a - b) > 1e-15 for a, b in zip(lr, [1e-3] * 4 + [5.5e-4, 1e-4])))" "$dir/wsd/metrics.jsonl"'
  # Resumed with more steps: the checkpoint's schedule named beside this run's.
  "$tessera" train --set model.preset=tiny --set data.synthetic=true --set train.batch_size=8 --set train.micro_batch_size=4 \
    --set train.max_steps=9 --set train.threads=2 --set train.warmup_steps=1 --set train.lr=1e-3 --set train.min_lr=1e-4 \
    --set train.lr_decay=linear --set train.lr_decay_steps=2 --resume auto --run-dir "$dir/wsd" >"$dir/wsd2.log" 2>&1
  check "a resume with a longer train.max_steps names the schedule's change" \
    'grep -q "was trained with another learning-rate schedule (train.max_steps 6 -> 9): from step 7 on" "$dir/wsd2.log"'
else
  echo "FAIL: the warmup-stable-decay run failed:"; tail -5 "$dir/wsd.log"; failures=$((failures + 1))
fi
val_loss() { "$tessera" eval --checkpoint "$1" --data "$dir/ds" 2>/dev/null | grep -o '"val_loss":[^,]*'; }
first_loss() {  # the step-1 loss of a one-step run with the short run's settings and extra --set flags
  run "$dir/init$1" --set train.max_steps=1 --set checkpoint.save_final=false --set train.eval_interval=0 "${@:2}" &&
    grep -o '"loss":[^,]*' "$dir/init$1/metrics.jsonl"
}
if [[ -s $dir/a/model.safetensors ]] &&
   "$tessera" tokenizer train --input "$src/data/kjv.txt.zst" --vocab-size 512 --out "$dir/tok.model" --threads 2 >"$dir/hf.log" 2>&1 &&
   "$tessera" prepare --input "$src/data/kjv.txt.zst" --tokenizer "$dir/tok.model" --out "$dir/ds" --workers 2 \
     --val-fraction 0.02 >>"$dir/hf.log" 2>&1 &&
   "$tessera" checkpoint export --format hf "$dir/a" "$dir/hf" >>"$dir/hf.log" 2>&1 &&
   "$tessera" checkpoint export --format hf --max-shard-size 50KB "$dir/a/model.safetensors" "$dir/hf_sharded" >>"$dir/hf.log" 2>&1 &&
   cp "$dir/tok.model" "$dir/hf/tokenizer.model" &&
   "$tessera" checkpoint import --format hf "$dir/hf" "$dir/imp" >>"$dir/hf.log" 2>&1 &&
   "$tessera" checkpoint import --format hf "$dir/hf_sharded" "$dir/imp_sharded" >>"$dir/hf.log" 2>&1; then
  check "export wrote config.json and one model.safetensors" '[[ -s $dir/hf/config.json && -s $dir/hf/model.safetensors ]]'
  check "a 50KB limit gives several files and an index" \
    '[[ -s $dir/hf_sharded/model.safetensors.index.json && $(ls "$dir"/hf_sharded/model-*-of-*.safetensors | wc -l) -gt 1 ]]'
  check "import copied tokenizer.model" '[[ -s $dir/imp/tokenizer.model && ! -e $dir/imp_sharded/tokenizer.model ]]'
  loss_run=$(val_loss "$dir/a") loss_imp=$(val_loss "$dir/imp") loss_sharded=$(val_loss "$dir/imp_sharded")
  echo "eval: run $loss_run, imported $loss_imp, imported from shards $loss_sharded"
  # The imports carry a default [train] section, so eval runs them in micro-batches of 16 rather
  # than the run's 8, and sgemm's blocking over the rows can differ with that (AVX2 oneDNN): equal
  # weights agree to ~1e-11 relative; a conversion error (a row permutation, a bf16 rounding) moves
  # the loss by far more than the 1e-9 allowed.
  same_loss() { /usr/bin/python3 -c 'import sys; a, b = (float(x.split(":")[1]) for x in sys.argv[1:]); sys.exit(abs(a - b) > 1e-9 * abs(a))' "$1" "$2"; }
  check "eval of the run and of its imports agree" \
    '[[ -n $loss_run && -n $loss_imp && -n $loss_sharded ]] && same_loss "$loss_run" "$loss_imp" && same_loss "$loss_run" "$loss_sharded"'
  gen() { "$tessera" generate --checkpoint "$@" --prompt "And God said" --max-tokens 8 --temperature 0 2>/dev/null; }
  check "generate from the import (its copied tokenizer) equals the run's" \
    '[[ -n $(gen "$dir/imp") && $(gen "$dir/imp") == "$(gen "$dir/a" --tokenizer "$dir/tok.model")" ]]'
  from_hf=$(first_loss hf --set train.init_from="$dir/hf") from_run=$(first_loss run --set train.init_from="$dir/a")
  from_imp=$(first_loss imp --set train.init_from="$dir/imp/model.safetensors") fresh=$(first_loss fresh)
  echo "step-1 loss: init_from hf $from_hf, run $from_run, import $from_imp; random init $fresh"
  check "train.init_from starts at the same loss from every form of the weights" \
    '[[ -n $from_hf && $from_hf == "$from_run" && $from_hf == "$from_imp" && $from_hf != "$fresh" ]]'
  # The export read by an independent HF-convention Llama (transformers' semantics; the GPU check
  # runs transformers itself) gives the log-probabilities `generate --token-ids` prints.
  check "an HF reader's log-probabilities of the export equal generate's" \
    '/usr/bin/python3 "$(dirname "$0")/hf_transformers_check.py" "$tessera" "$dir/a" "$dir/hf_check" --reference torch_ref'
  expect_exit 2 "config key model.dim = 128 does not match train.init_from" -- train --set model.preset=tiny --set model.dim=128 \
    --set data.synthetic=true --set train.max_steps=1 --set train.init_from="$dir/hf" --run-dir "$dir/bad_init"
  cp -r "$dir/hf" "$dir/hf_bad"
  sed -i 's/"rope_scaling": null/"rope_scaling": {"type": "linear", "factor": 2.0}/' "$dir/hf_bad/config.json"
  expect_exit 3 "hf_bad/config.json: key rope_scaling" -- checkpoint import --format hf "$dir/hf_bad" "$dir/imp_bad"
  # transformers 5's spelling of a scaled rotary embedding Tessera does not compute (YaRN), in
  # rope_parameters.
  sed -i -e 's/"rope_scaling": {.*}/"rope_scaling": null/' -e 's/"rope_type": "default"/"rope_type": "yarn"/' \
    "$dir/hf_bad/config.json"
  expect_exit 3 'hf_bad/config.json: key rope_parameters.rope_type = "yarn"' -- \
    checkpoint import --format hf "$dir/hf_bad" "$dir/imp_bad"
  expect_exit 2 "already exists" -- checkpoint export --format hf "$dir/a" "$dir/hf"
  # bf16: half the bytes, said in config.json; an HF reader's log-probabilities stay within bf16's
  # rounding of generate's (the fp32 model's).
  expect_exit 0 "exported" -- checkpoint export --format hf "$dir/a" "$dir/hf_bf16" --dtype bf16
  check "a bf16 export is half the bytes and says torch_dtype bfloat16" \
    '(( $(stat -c %s "$dir/hf_bf16/model.safetensors") < $(stat -c %s "$dir/hf/model.safetensors") / 2 + 4096 )) &&
     grep -q "\"torch_dtype\": \"bfloat16\"" "$dir/hf_bf16/config.json"'
  expect_exit 2 "--dtype fp16: expected fp32 or bf16" -- checkpoint export --format hf "$dir/a" "$dir/hf_x" --dtype fp16
  check "an HF reader's log-probabilities of the bf16 export are within 2e-2 of generate's" \
    '/usr/bin/python3 "$(dirname "$0")/hf_transformers_check.py" "$tessera" "$dir/a" "$dir/hf_check_bf16" \
       --reference torch_ref --dtype bf16 --tol 2e-2'
else
  echo "FAIL: Hugging Face export or import failed:"; tail -5 "$dir/hf.log"; failures=$((failures + 1))
fi
expect_exit 2 "unknown checkpoint subcommand 'frobnicate'" -- checkpoint frobnicate
expect_exit 2 "missing --format" -- checkpoint export "$dir/a" "$dir/x"
expect_exit 2 "usage: tessera checkpoint" -- checkpoint

# A diverging run stops with the non-finite exit code and names the step.
expect_exit 11 "step [0-9]+: loss" -- train --set model.preset=tiny --set data.synthetic=true --set train.batch_size=4 --set train.lr=1e30 \
  --set train.warmup_steps=0 --set train.grad_clip=0 --set train.max_steps=20 --run-dir "$dir/nan"

echo "$failures failure(s)"
[[ $failures -eq 0 ]]
