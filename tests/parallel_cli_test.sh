#!/usr/bin/env bash
# Tensor and pipeline parallelism through `tessera train` (issue 15): 2 tensor-parallel x 2
# data-parallel ranks, 2 pipeline stages x 2 tensor-parallel ranks and 2 GPipe stages train the
# same losses and gradient norms as 2 data-parallel ranks alone, and end with the same weights, as
# do 2 stages with tied embeddings (resumed into one stage and out of it); a
# checkpoint saved at tp 2 resumes at tp 1, one saved at tp 1 resumes at tp 2, one saved by 2
# stages x tp 2 resumes in one stage, each ending where the uninterrupted run ended; `checkpoint
# verify` and the Hugging Face export read them; a tp size that does not divide the model is exit
# 2 naming the key.
# usage: parallel_cli_test.sh TESSERA_BINARY
set -euo pipefail
tessera=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

common=(--set model.preset=tiny --set data.synthetic=true --set train.batch_size=8 --set train.max_steps=6
        --set checkpoint.interval_steps=3 --set train.eval_interval=0 --set metrics.log_interval=1)
train() {  # RUN_NAME NPROC TENSOR [more arguments]
  local run=$1 nproc=$2 tensor=$3
  shift 3
  "$tessera" train "${common[@]}" --set parallel.nproc="$nproc" --set parallel.tensor="$tensor" \
    --run-dir "$dir/$run" "$@" 2>"$dir/$run.log" || { cat "$dir/$run.log"; fail "$run failed"; }
}

train tp2 4 2
train dp2 2 1
grep -q "full_shard x tensor 2" "$dir/tp2.log" || fail "the start-up line does not state the tensor-parallel size"
ls "$dir/tp2/checkpoints/step_00000003" | grep -q '^tp01_shard_00001.bin$' || fail "no file for tp rank 1, shard 1"
"$tessera" checkpoint verify "$dir/tp2/checkpoints/step_00000006" || fail "verify refused a tp checkpoint"

# Pipeline stages, 4 micro-batches of 2 per step.
train pp2_tp2 4 2 --set parallel.pipeline=2 --set train.micro_batch_size=2
train pp2_gpipe 2 1 --set parallel.pipeline=2 --set parallel.pipeline_schedule=gpipe --set train.micro_batch_size=2
grep -q "full_shard x tensor 2 x pipeline 2 (1f1b, blocks 1 + 1)" "$dir/pp2_tp2.log" ||
  fail "the start-up line does not state the pipeline"
# Blocks per stage by hand: 3 + 1 of 4 (the balanced cut is 2 + 2), as each stage's log says.
train pp2_layers 2 1 --set parallel.pipeline=2 --set model.n_layers=4 --set parallel.pipeline_layers=[3,1] \
  --set train.max_steps=1
grep -q "pipeline 2 (1f1b, blocks 3 + 1)" "$dir/pp2_layers.log" || fail "the start-up line does not state the blocks"
grep -q "pipeline stage 0 of 2: blocks 0..2, the embedding$" "$dir/pp2_layers/logs/rank_0.log" ||
  fail "stage 0 does not hold blocks 0..2"
grep -q "pipeline stage 1 of 2: blocks 3..3, the LM head$" "$dir/pp2_layers/logs/rank_1.log" ||
  fail "stage 1 does not hold block 3"
ls "$dir/pp2_tp2/checkpoints/step_00000003" | grep -q '^pp01_tp01_shard_00000.bin$' || fail "no file for stage 1, tp 1"
"$tessera" checkpoint verify "$dir/pp2_tp2/checkpoints/step_00000006" || fail "verify refused a pipeline checkpoint"

# Resume across tensor-parallel sizes, from step 3 of the other run.
train tp2_to_tp1 2 1 --resume "$dir/tp2/checkpoints/step_00000003"
train tp1_to_tp2 4 2 --resume "$dir/dp2/checkpoints/step_00000003"
train pp2_to_pp1 2 1 --resume "$dir/pp2_tp2/checkpoints/step_00000003"

# Tied embeddings across 2 stages (the last holds a copy of the table), against dp 2 tied;
# resumed from 2 stages into one and from one into 2 stages (the copy takes the saved table).
tied=(--set model.tied_embeddings=true --set train.micro_batch_size=2)
train tied_dp2 2 1 "${tied[@]}"
train tied_pp2 2 1 --set parallel.pipeline=2 "${tied[@]}"
train tied_pp2_to_pp1 2 1 "${tied[@]}" --resume "$dir/tied_pp2/checkpoints/step_00000003"
train tied_pp1_to_pp2 2 1 --set parallel.pipeline=2 "${tied[@]}" --resume "$dir/tied_dp2/checkpoints/step_00000003"

# Same losses and gradient norms, step by step (fp32: only the order of sums differs).
/usr/bin/python3 - "$dir" <<'PY' || fail "the runs differ"
import json, sys
d = sys.argv[1]
def steps(run):
    return {r["step"]: r for r in map(json.loads, open(f"{d}/{run}/metrics.jsonl")) if "loss" in r}
bad = 0
runs = [("tp2", 1, "dp2"), ("tp2_to_tp1", 4, "dp2"), ("tp1_to_tp2", 4, "dp2"), ("pp2_tp2", 1, "dp2"),
        ("pp2_gpipe", 1, "dp2"), ("pp2_to_pp1", 4, "dp2"), ("tied_pp2", 1, "tied_dp2"),
        ("tied_pp2_to_pp1", 4, "tied_dp2"), ("tied_pp1_to_pp2", 4, "tied_dp2")]
for run, first, ref in runs:
    got, want = steps(run), steps(ref)
    for s in range(first, 7):
        for key in ["loss", "grad_norm"]:
            a, b = got[s][key], want[s][key]
            if abs(a - b) > 1e-5 * abs(b):
                print(f"{run} step {s} {key}: {a} vs {b} ({ref})")
                bad += 1
print(f"compared {sum(7 - first for _, first, _ in runs)} steps against dp2 and tied_dp2: {bad} differ")

# The final weights, whole, as dp2's (fp32: the order of sums differs only).
import numpy as np
def weights(run):
    raw = open(f"{d}/{run}/model.safetensors", "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.float32).reshape(t["shape"])
    return out
for run, reference in [("tp2", "dp2"), ("pp2_tp2", "dp2"), ("pp2_gpipe", "dp2"), ("tied_pp2", "tied_dp2")]:
    got, ref = weights(run), weights(reference)
    if sorted(got) != sorted(ref):
        print(f"{run}: tensors {sorted(set(got) ^ set(ref))} differ in name")
        bad += 1
        continue
    for name, w in ref.items():
        err = np.linalg.norm(got[name] - w) / np.linalg.norm(w)
        if got[name].shape != w.shape or err > 1e-5:
            print(f"{run}: {name} differs from {reference}'s by {err:.2e}")
            bad += 1
sys.exit(1 if bad else 0)
PY

# Exposed communication by dimension: the tp collectives' and the pipeline's waits are parts of
# comm_s, recorded only where the dimension exists, with the bubble's formula beside them.
/usr/bin/python3 - "$dir" <<'PY' || fail "the communication split by dimension is wrong"
import json, sys
d = sys.argv[1]
def records(run):
    return [r for r in map(json.loads, open(f"{d}/{run}/metrics.jsonl")) if "loss" in r]
for run, tp, pp in [("dp2", False, False), ("tp2", True, False), ("pp2_gpipe", False, True), ("pp2_tp2", True, True)]:
    rs = records(run)
    for r in rs:
        assert ("comm_tp_s" in r) == tp and ("comm_pp_s" in r) == pp and ("pipeline_bubble" in r) == pp, (run, r)
        assert r.get("comm_tp_s", 0) + r.get("comm_pp_s", 0) <= r["comm_s"] + 1e-6, (run, r)
        if pp:
            assert abs(r["pipeline_bubble"] - 1 / 5) < 1e-12, (run, r)  # P = 2 stages, m = 4 micro-batches
    for key, present in [("comm_tp_s", tp), ("comm_pp_s", pp)]:
        assert not present or sum(r[key] for r in rs) > 0, (run, key)
PY

# Tensor-parallel and pipeline checkpoints export as the whole model.
"$tessera" checkpoint export --format hf "$dir/tp2/checkpoints/step_00000006" "$dir/hf" >/dev/null 2>&1 ||
  fail "export of a tp checkpoint failed"
"$tessera" checkpoint export --format hf "$dir/pp2_tp2/checkpoints/step_00000006" "$dir/hf_pp" >/dev/null 2>&1 ||
  fail "export of a pipeline checkpoint failed"
for out in hf hf_pp; do
  /usr/bin/python3 - "$dir/$out/config.json" <<'PY' || fail "the export $out is not the whole model"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["num_attention_heads"] == 4 and c["num_key_value_heads"] == 2 and c["vocab_size"] == 512, c
assert c["num_hidden_layers"] == 2, c
PY
done

# A pipeline run on the bundled corpus: `tessera eval` (one process) reads its weights and prints the
# validation loss its last evaluation logged (the whole split, both times).
train pp2_text 2 1 --set parallel.pipeline=2 --set data.synthetic=false --set data.cache_dir="$dir/cache" \
  --set train.eval_interval=6
"$tessera" eval --checkpoint "$dir/pp2_text" >"$dir/eval.json" 2>"$dir/eval.log" || { cat "$dir/eval.log"; fail "eval of a pipeline run failed"; }
/usr/bin/python3 - "$dir" <<'PY' || fail "eval differs from the run's last validation loss"
import json, sys
d = sys.argv[1]
last = [r["val_loss"] for r in map(json.loads, open(f"{d}/pp2_text/metrics.jsonl")) if "val_loss" in r][-1]
got = json.load(open(f"{d}/eval.json"))["val_loss"]
print(f"eval {got} vs the run's {last}")
sys.exit(0 if abs(got - last) <= 1e-5 * abs(last) else 1)
PY

# A tensor-parallel size that does not divide the model: exit 2 naming the key.
set +e
"$tessera" train "${common[@]}" --set parallel.nproc=4 --set parallel.tensor=4 --run-dir "$dir/bad" 2>"$dir/bad.log"
rc=$?
set -e
[[ $rc -eq 2 ]] || fail "tensor 4 with 2 key/value heads exited $rc, not 2"
grep -q "model.n_kv_heads = 2: must be divisible by parallel.tensor = 4" "$dir/bad.log" || fail "$(cat "$dir/bad.log")"
echo "parallel CLI: ok"
