#!/usr/bin/env python3
"""Tessera's tokenizer.json against Hugging Face's Rust library (`tokenizers`, which the GPU
image has beside transformers): the ids of every text and the decoding of every list of ids
equal, for each tokenizer in DIR. tests/hf_tokenizer_check.mjs does the same against tokenizers.js
where Node runs; the Rust library settles what that one cannot (GPT-2's pattern with U+0085).

    python3 tests/hf_tokenizers_check.py TESSERA DIR

DIR (made by scripts/gpu_check.sh pack): NAME.tokenizer.json.gz for each tokenizer, and
texts.jsonl.gz (one JSON string a line, from hf_tokenizer_check.mjs --write-texts). Prints one
JSON line a tokenizer. Exit 0: all equal; 1: a difference (the first few printed); 2: no
`tokenizers` here, or bad usage.
"""
import glob
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time


def tessera_lines(tessera, command, tokenizer, lines):
    """`tessera tokenizer COMMAND --jsonl` over `lines` (JSON values), its output parsed."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        f.write("".join(json.dumps(x) + "\n" for x in lines))
    try:
        out = subprocess.run([tessera, "tokenizer", command, "--tokenizer", tokenizer, "--jsonl", f.name],
                             check=True, capture_output=True, text=True, encoding="utf-8").stdout
    finally:
        os.unlink(f.name)
    # split("\n"), not splitlines(): a decoded text holds U+2028 or U+0085 unescaped, and JSON
    # escapes only the newline.
    return [json.loads(line) for line in out.split("\n") if line]


def check(tessera, name, packed, texts, Tokenizer):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tokenizer.json")
        with gzip.open(packed, "rb") as src, open(path, "wb") as dst:
            dst.write(src.read())
        reference = Tokenizer.from_file(path)
        t0 = time.time()
        got = tessera_lines(tessera, "encode", path, texts)
        tessera_s = time.time() - t0
        t0 = time.time()
        want = [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]
        reference_s = time.time() - t0
        decoded = tessera_lines(tessera, "decode", path, want)
        failures, tokens = [], 0
        for text, g, w, d in zip(texts, got, want, decoded):
            tokens += len(w)
            if g != w:
                failures.append({"text": text[:200], "tessera": g[:40], "reference": w[:40]})
            ref_text = reference.decode(w, skip_special_tokens=False)
            if d != ref_text:
                failures.append({"text": text[:200], "decoded": d[:200], "reference": ref_text[:200]})
    print(json.dumps({"tokenizer": name, "texts": len(texts), "tokens": tokens, "failures": len(failures),
                      "tessera_encode_s": round(tessera_s, 3), "reference_encode_s": round(reference_s, 3),
                      "reference": "tokenizers (Rust)"}), flush=True)
    for f in failures[:5]:
        print(name, "MISMATCH", json.dumps(f), file=sys.stderr)
    return len(failures)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    tessera, directory = sys.argv[1:]
    try:
        from tokenizers import Tokenizer
    except ImportError:
        print("hf_tokenizers_check: the Python package `tokenizers` is not installed here", file=sys.stderr)
        return 2
    with gzip.open(os.path.join(directory, "texts.jsonl.gz"), "rt", encoding="utf-8") as f:
        texts = [json.loads(line) for line in f]
    packed = sorted(glob.glob(os.path.join(directory, "*.tokenizer.json.gz")))
    if not packed:
        print(f"hf_tokenizers_check: no *.tokenizer.json.gz in {directory}", file=sys.stderr)
        return 2
    failures = 0
    for p in packed:
        failures += check(tessera, os.path.basename(p).split(".")[0], p, texts, Tokenizer)
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
