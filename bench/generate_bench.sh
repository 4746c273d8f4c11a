#!/usr/bin/env bash
# Generation throughput: Tessera's key/value-cache decoder beside a PyTorch Llama with a KV cache
# (bench/peers/torch_generate_bench.py) on the same weights, the same prompt batch and the same
# number of new tokens, greedy, runs alternating; plus Tessera's uncached reference path
# (--no-kv-cache) on fewer tokens. Prints a table with the ratio and how many greedy tokens the
# two agree on (per prompt, the tokens before the first difference: fp32 summation orders differ,
# and a near-tie flipped there changes everything after it).
#
# The weights: random, written by the peer as a Hugging Face directory (make-hf) and imported
# with `tessera checkpoint import --format hf`, so both sides read the same file.
#
# usage: bench/generate_bench.sh [--shape bench|gqa] [--batch B] [--prompt-len N] [--max-tokens N]
#                                [--uncached-tokens N] [--rounds R] [--threads T]
# (prompts: B prompts of N, N + 8, N + 16, ... random token ids; the figure is the median of R
# rounds of tokens/s = B x max-tokens / seconds of prefill + decode, weights loaded before.)
set -euo pipefail
cd "$(dirname "$0")/.."
tessera=${TESSERA:-build/release/bin/tessera}
peer=bench/peers/torch_generate_bench.py
shape=bench batch=1 prompt_len=64 max_tokens=128 uncached=8 rounds=3 threads=2
while (($#)); do
  case $1 in
    --shape) shape=$2 ;;
    --batch) batch=$2 ;;
    --prompt-len) prompt_len=$2 ;;
    --max-tokens) max_tokens=$2 ;;
    --uncached-tokens) uncached=$2 ;;
    --rounds) rounds=$2 ;;
    --threads) threads=$2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
work=${GENERATE_BENCH_DIR:-build/generate_bench}/$shape
mkdir -p "$work"
if [[ ! -s $work/hf/model.safetensors ]]; then
  /usr/bin/python3 "$peer" make-hf "$work/hf" --shape "$shape"
fi
if [[ ! -s $work/imp/model.safetensors ]]; then
  rm -rf "$work/imp"
  "$tessera" checkpoint import --format hf "$work/hf" "$work/imp" >/dev/null
fi
run_dir=$work/b${batch}_p${prompt_len}_n${max_tokens}
rm -rf "$run_dir" && mkdir -p "$run_dir"
/usr/bin/python3 - "$run_dir" "$batch" "$prompt_len" <<'PY'
import json, random, sys
d, B, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(1)
prompts = [[rng.randrange(32000) for _ in range(n + 8 * b)] for b in range(B)]
json.dump(prompts, open(f"{d}/prompts.json", "w"))
open(f"{d}/prompts.txt", "w").write("".join(" ".join(map(str, p)) + "\n" for p in prompts))
PY
tess() {
  "$tessera" generate --checkpoint "$work/imp" --prompts-file "$run_dir/prompts.txt" --token-ids --temperature 0 \
    --threads "$threads" "$@"
}
# The peer tuned as bench/run_bench.sh tunes it (BENCHMARKS.md): OpenBLAS picks its own core type
# and tcmalloc keeps PyTorch's buffers.
tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
peer_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "OPENBLAS_NUM_THREADS=$threads")
[[ -r $tcmalloc ]] && peer_env+=("LD_PRELOAD=$tcmalloc")
echo "peer environment: ${peer_env[*]}"
for ((r = 1; r <= rounds; r++)); do
  tess --max-tokens "$max_tokens" >"$run_dir/tessera_$r.json"
  "${peer_env[@]}" /usr/bin/python3 "$peer" run "$work/hf" --prompts "$run_dir/prompts.json" --max-tokens "$max_tokens" \
    --threads "$threads" >"$run_dir/torch_$r.json"
done
tess --max-tokens "$uncached" --no-kv-cache >"$run_dir/tessera_nocache.json"
/usr/bin/python3 - "$run_dir" "$rounds" "$shape" <<'PY'
import glob, json, statistics, sys
d, rounds, shape = sys.argv[1], int(sys.argv[2]), sys.argv[3]
load = lambda p: json.load(open(p))
tess = [load(f"{d}/tessera_{r}.json") for r in range(1, rounds + 1)]
peer = [load(f"{d}/torch_{r}.json") for r in range(1, rounds + 1)]
nc = load(f"{d}/tessera_nocache.json")
t = statistics.median(x["tokens_per_s"] for x in tess)
p = statistics.median(x["tokens_per_s"] for x in peer)
def prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
agree = sum(prefix(a, b) for a, b in zip(tess[0]["tokens"], peer[0]["tokens"]))
total = sum(len(a) for a in tess[0]["tokens"])
nc_agree = sum(prefix(a, b) for a, b in zip(tess[0]["tokens"], nc["tokens"]))
nc_total = sum(len(a) for a in nc["tokens"])
B, new = tess[0]["prompts"], tess[0]["new_tokens"] // tess[0]["prompts"]
print(f"generate, {shape}: batch {B}, {tess[0]['prompt_tokens']} prompt tokens, {new} new tokens each, greedy, "
      f"{tess[0]['threads']} threads, median of {rounds} alternating rounds")
print(f"{'':28}{'tokens/s':>10}{'seconds':>10}")
print(f"{'tessera (kv cache)':28}{t:10.1f}{statistics.median(x['seconds'] for x in tess):10.3f}")
print(f"{'torch ' + peer[0]['torch'] + ' (kv cache)':28}{p:10.1f}{statistics.median(x['seconds'] for x in peer):10.3f}")
print(f"{'tessera --no-kv-cache':28}{nc['tokens_per_s']:10.1f}{nc['seconds']:10.3f}   ({nc_total // B} new tokens each)")
print(f"ratio tessera / torch: {t / p:.2f}x; kv cache / no cache: {t / nc['tokens_per_s']:.1f}x")
print(f"greedy tokens agreeing with torch (per prompt, before the first difference): {agree} of {total}")
print(f"greedy tokens agreeing with --no-kv-cache: {nc_agree} of {nc_total}")
PY
