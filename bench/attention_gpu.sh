#!/usr/bin/env bash
# Tessera's CUDA attention beside PyTorch's scaled_dot_product_attention, forward and backward, at
# gpu-1b's attention shape by default, on one GPU: both JSON lines, then one line with the ratios
# (Tessera's speed over PyTorch's; above 1 is faster).
#
#   bench/attention_gpu.sh [TESSERA_ATTENTION_BENCH] [-- OPTIONS...]
#
# TESSERA_ATTENTION_BENCH defaults to build/release/bin/tessera_attention_bench; OPTIONS (e.g.
# --seq 4096 --head-dim 64) go to both sides.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/release/bin/tessera_attention_bench
if [[ $# -gt 0 && $1 != -- ]]; then bin=$1; shift; fi
[[ ${1:-} == -- ]] && shift
tessera=$("$bin" "$@")
peer=$(python3 bench/peers/torch_attention_bench.py "$@")
echo "$tessera"
echo "$peer"
python3 - "$tessera" "$peer" <<'PY'
import json, sys
t, p = (json.loads(s) for s in sys.argv[1:3])
ratio = {f"{phase}_speedup": round(p[f"{phase}_ms"] / t[f"{phase}_ms"], 3) for phase in ("forward", "backward")}
print(json.dumps({"impl": "ratio", "over": p["impl"], **ratio,
                  "tessera_tflops": [t["forward_tflops"], t["backward_tflops"]],
                  "peer_tflops": [p["forward_tflops"], p["backward_tflops"]]}))
PY
