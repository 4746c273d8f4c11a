#!/usr/bin/env bash
# `tessera plan` beside published training throughput for the same model, hardware and layout
# (docs/plan.md). Prints a Markdown table: source, configuration, published and predicted
# tokens/s per GPU (or scaling efficiency), and the relative error. Exits 1 if any prediction is
# more than 15% off. Needs no GPU: the plan is arithmetic.
#   bench/plan_published.sh [path/to/tessera]
set -euo pipefail
cd "$(dirname "$0")/.."
tessera=${1:-build/release/bin/tessera}
hw=bench/hardware
bf16="--set parallel.param_dtype=bf16 --set parallel.reduce_dtype=bf16"
# Llama 3 8B's and 70B's shapes over the Llama 2 presets (vocabulary 128256, sequence 8192).
llama3_8b="--set model.preset=llama2-7b --set model.vocab_size=128256 --set model.n_kv_heads=8 --set model.ffn_hidden=14336 --set model.seq_len=8192"
llama3_70b="--set model.preset=llama2-70b --set model.vocab_size=128256 --set model.seq_len=8192"

worst=0
echo "| source | model, cluster, layout | published | predicted | error |"
echo "|---|---|---|---|---|"
# row SOURCE DESCRIPTION PUBLISHED FIELD ARGS...: FIELD is tokens_per_s_per_device or
# scaling_efficiency (published as a percentage).
row() {
  local source=$1 what=$2 published=$3 field=$4
  shift 4
  local json predicted
  json=$("$tessera" plan --json "$@" 2>/dev/null || true)  # exit 2 when it does not fit: the speed stands
  predicted=$(python3 -c "
import json, sys
d = json.loads(sys.argv[1])
v = d['step']['tokens_per_s_per_device'] if sys.argv[2] == 'tokens_per_s_per_device' else 100 * d['scaling_efficiency']
print(f'{v:.1f}')" "$json" "$field")
  python3 - "$source" "$what" "$published" "$predicted" "$field" <<'EOF'
import sys
source, what, published, predicted, field = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
unit = " tok/s/GPU" if field == "tokens_per_s_per_device" else "% scaling"
error = (predicted - published) / published
print(f"| {source} | {what} | {published:g}{unit} | {predicted:.0f}{unit} | {100 * error:+.1f}% |")
EOF
  worst=$(python3 -c "print(max($worst, abs($predicted - $published) / $published))")
}

tt="torchtitan docs/performance.md"
row "$tt" "Llama 3 8B, 64 A100 80GB, FSDP, batch 1 x 8192, selective op AC" 2973 tokens_per_s_per_device \
  --hardware $hw/a100-80gb-ib.toml --nodes 8 $llama3_8b --set train.batch_size=64 --set train.micro_batch_size=1 $bf16
row "$tt" "Llama 3 70B, 64 A100 80GB, FSDP, batch 1 x 8192, full AC" 331 tokens_per_s_per_device \
  --hardware $hw/a100-80gb-ib.toml --nodes 8 $llama3_70b --set train.batch_size=64 --set train.micro_batch_size=1 \
  $bf16 --set parallel.activation_checkpointing=1
row "$tt" "Llama 2 13B, 64 A100 80GB, FSDP, batch 2 x 4096, no AC" 2162 tokens_per_s_per_device \
  --hardware $hw/a100-80gb-ib.toml --nodes 8 --set model.preset=llama2-13b --set train.batch_size=128 \
  --set train.micro_batch_size=2 $bf16
row "$tt" "Llama 2 13B, 64 A100 80GB, FSDP, batch 2 x 4096, selective layer AC" 1914 tokens_per_s_per_device \
  --hardware $hw/a100-80gb-ib.toml --nodes 8 --set model.preset=llama2-13b --set train.batch_size=128 \
  --set train.micro_batch_size=2 $bf16 --set parallel.activation_checkpointing=2
row "$tt" "Llama 2 70B, 64 A100 80GB, FSDP, batch 2 x 4096, full AC" 353 tokens_per_s_per_device \
  --hardware $hw/a100-80gb-ib.toml --nodes 8 --set model.preset=llama2-70b --set train.batch_size=128 \
  --set train.micro_batch_size=2 $bf16 --set parallel.activation_checkpointing=1
row "$tt" "Llama 3.1 8B, 8 H100 96GB (500 W), FSDP, batch 2 x 8192, selective AC" 5762 tokens_per_s_per_device \
  --hardware $hw/h100-96gb-gt.toml --nodes 1 $llama3_8b --set train.batch_size=16 --set train.micro_batch_size=2 \
  $bf16 --set parallel.activation_checkpointing=2
fms="IBM fms-fsdp README"
row "$fms" "Llama 2 7B, 128 A100 80GB, HSDP (8), batch 2 x 4096, no AC" 3760 tokens_per_s_per_device \
  --hardware $hw/a100-80gb-ib.toml --nodes 16 --set model.preset=llama2-7b --set train.batch_size=256 \
  --set train.micro_batch_size=2 $bf16 --set parallel.strategy=hybrid_shard --set parallel.shard_group_size=8
row "$fms" "Llama 2 13B, 128 A100 80GB, HSDP (8), batch 1 x 4096, no AC" 1700 tokens_per_s_per_device \
  --hardware $hw/a100-80gb-ib.toml --nodes 16 --set model.preset=llama2-13b --set train.batch_size=128 \
  --set train.micro_batch_size=1 $bf16 --set parallel.strategy=hybrid_shard --set parallel.shard_group_size=8
row "$fms" "Llama 2 70B, 128 A100 80GB, FSDP, batch 6 x 4096, AC" 380 tokens_per_s_per_device \
  --hardware $hw/a100-80gb-ib.toml --nodes 16 --set model.preset=llama2-70b --set train.batch_size=768 \
  --set train.micro_batch_size=6 $bf16 --set parallel.activation_checkpointing=1
row "founding document 2 (AWS, FSDP on EKS)" "Llama 2 70B, 16 p5 nodes (8 H100 80GB) against one node, FSDP, batch 2 x 4096, AC" \
  87 scaling_efficiency --hardware h100-80gb --nodes 16 --set model.preset=llama2-70b --set train.batch_size=256 \
  --set train.micro_batch_size=2 $bf16 --set parallel.activation_checkpointing=1

echo
python3 -c "print(f'largest error: {100 * $worst:.1f}%')"
python3 -c "import sys; sys.exit(0 if $worst <= 0.15 else 1)"
