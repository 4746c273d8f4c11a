#!/usr/bin/env bash
# End to end on the bundled corpus with the tiny model: first-use preparation, a short run that
# lowers the loss, eval, and generate (deterministic for a seed; with and without the key/value
# cache; several prompts).
# usage: e2e_train_test.sh TESSERA_BINARY
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
tessera=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

"$tessera" train "$(dirname "$0")/../configs/tiny.toml" --set data.cache_dir="$dir/cache" \
  --set train.max_steps=60 --set train.eval_interval=30 --set train.lr=3e-3 --run-dir "$dir/run" 2>"$dir/train.log" ||
  { cat "$dir/train.log"; fail "training failed"; }
grep -q "unigram entropy" "$dir/train.log" || fail "the log does not state the unigram entropy"
for f in config.toml run.json metrics.jsonl model.safetensors tokenizer.model; do
  [[ -s $dir/run/$f ]] || fail "run directory lacks $f"
done

# Loss falls: the last validation loss is well below the first training loss (ln 512 = 6.24)
# and below the corpus's unigram entropy.
read -r first val entropy < <(/usr/bin/python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
rows = [json.loads(l) for l in open(f"{d}/run/metrics.jsonl")]
vals = [r["val_loss"] for r in rows if "val_loss" in r]
info = json.load(open(f"{d}/run/run.json"))
man = json.load(open(f"{info['dataset']}/manifest.json"))
print(rows[0]["loss"], vals[-1], man["unigram_entropy_nats"])
PY
)
echo "first loss $first, last val loss $val, unigram entropy $entropy"
awk -v a="$first" -v b="$val" -v h="$entropy" 'BEGIN { exit !(b < a - 1.0 && b < h) }' ||
  fail "validation loss $val did not fall well below the first loss $first and the unigram entropy $entropy"

# A second run reuses the prepared corpus instead of tokenizing again.
"$tessera" train "$(dirname "$0")/../configs/tiny.toml" --set data.cache_dir="$dir/cache" --set train.max_steps=1 \
  --set train.eval_interval=0 --set checkpoint.save_final=false --run-dir "$dir/run2" 2>"$dir/train2.log" ||
  fail "second run failed"
if grep -q "first use" "$dir/train2.log"; then fail "the bundled corpus was prepared twice"; fi

"$tessera" eval --checkpoint "$dir/run" >"$dir/eval.json" || fail "eval failed"
/usr/bin/python3 -c 'import json, math, sys; r = json.load(open(sys.argv[1])); assert abs(r["perplexity"] - math.exp(r["val_loss"])) < 1e-6 * r["perplexity"], r; print("eval:", r)' "$dir/eval.json"
# One validation loss per model: the run's last evaluation covers the whole validation split, as
# eval does, and the two agree on the same weights (to the summation order of other micro-batches).
grep -q "over the whole validation split" "$dir/train.log" || fail "the run's last evaluation does not say what it covered"
/usr/bin/python3 - "$dir/run/metrics.jsonl" "$dir/eval.json" <<'PY' || fail "train's last validation loss differs from eval's"
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]
e = json.load(open(sys.argv[2]))
assert last["val_tokens"] == e["val_targets"], (last["val_tokens"], e["val_targets"])
assert abs(last["val_loss"] - e["val_loss"]) <= 1e-6 * e["val_loss"], (last["val_loss"], e["val_loss"])
print(f"train's last val_loss {last['val_loss']:.6f} over {last['val_tokens']} targets; eval {e['val_loss']:.6f}")
PY

gen() { "$tessera" generate --checkpoint "$dir/run" --prompt "And God said" --max-tokens 30 "$@"; }
a=$(gen --seed 7) && b=$(gen --seed 7) && c=$(gen --seed 8) && g=$(gen --temperature 0) || fail "generate failed"
echo "seed 7: $a"
echo "seed 8: $c"
echo "greedy: $g"
[[ $a == "$b" ]] || fail "generate is not deterministic for a seed"
[[ $a == "And God said"* ]] || fail "generate does not echo the prompt"
[[ $a != "$c" ]] || fail "different seeds gave the same text"
# A tiny nucleus keeps only the likeliest token: greedy's text whatever the seed.
[[ $(gen --seed 7 --top-p 1e-6) == "$g" && $(gen --seed 8 --top-p 1e-6) == "$g" ]] ||
  fail "generate --top-p 1e-6 is not greedy"

# The key/value cache against the reference path (a full forward per token): the same greedy text,
# also past seq_len (64 for tiny), where the cached path re-runs the last seq_len tokens per token.
long=$(gen --temperature 0 --max-tokens 100) && long_ref=$(gen --temperature 0 --max-tokens 100 --no-kv-cache) ||
  fail "generate --no-kv-cache failed"
echo "greedy, 100 tokens: $long"
[[ $long == "$long_ref" ]] || fail "greedy text with the cache differs from --no-kv-cache: $long_ref"
[[ $(gen --seed 7 --no-kv-cache) == "$a" ]] || fail "sampled text with the cache differs from --no-kv-cache"
# Several prompts as one batch, a block each: the first samples as a single prompt does for the
# seed; the second's text does not depend on the first; greedy blocks equal single runs.
multi() { "$tessera" generate --checkpoint "$dir/run" --max-tokens 30 "$@"; }
m=$(multi --prompt "And God said" --prompt "In the beginning" --seed 7) &&
  m2=$(multi --prompt "Let there be" --prompt "In the beginning" --seed 7) &&
  mg=$(multi --prompt "And God said" --prompt "In the beginning" --temperature 0) &&
  g2=$("$tessera" generate --checkpoint "$dir/run" --prompt "In the beginning" --max-tokens 30 --temperature 0) ||
  fail "generate with two prompts failed"
echo "$m"
[[ $m == "=== 1/2 ==="$'\n'"$a"$'\n'"=== 2/2 ==="$'\n'* ]] || fail "the first of two prompts differs from it alone"
[[ ${m#*=== 2/2 ===} == "${m2#*=== 2/2 ===}" ]] || fail "the second prompt's text depends on the first prompt"
[[ $mg == "=== 1/2 ==="$'\n'"$g"$'\n'"=== 2/2 ==="$'\n'"$g2" ]] || fail "greedy batch differs from single prompts: $mg"
printf 'And God said\nIn the beginning\n' >"$dir/prompts.txt"
[[ $(multi --prompts-file "$dir/prompts.txt" --temperature 0) == "$mg" ]] || fail "--prompts-file differs from --prompt"
bf=$(gen --temperature 0 --bf16) || fail "generate --bf16 failed"
echo "greedy, bf16 weights: $bf"
[[ $bf == "And God said"* ]] || fail "generate --bf16 does not echo the prompt"

# The run's final sharded checkpoint holds the same weights as its model.safetensors: generate and
# eval read it too (a step directory or the checkpoint root with `latest`).
"$tessera" eval --checkpoint "$dir/run/checkpoints" >"$dir/eval_ckpt.json" || fail "eval of the checkpoint failed"
/usr/bin/python3 -c 'import json, sys; a, b = (json.load(open(p)) for p in sys.argv[1:]); assert a["val_loss"] == b["val_loss"], (a, b)' \
  "$dir/eval.json" "$dir/eval_ckpt.json" || fail "eval of the checkpoint differs"
k=$("$tessera" generate --checkpoint "$dir/run/checkpoints/$(cat "$dir/run/checkpoints/latest")" --prompt "And God said" \
  --max-tokens 30 --seed 7) || fail "generate from the checkpoint failed"
[[ $k == "$a" ]] || fail "generate from the checkpoint differs: $k"
echo "ok"
