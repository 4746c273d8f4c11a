#!/usr/bin/env python3
"""A Tessera run exported to Hugging Face gives Tessera's log-probabilities under a Llama reader.

    python3 tests/hf_transformers_check.py TESSERA RUN_DIR WORK_DIR
        [--reference transformers|torch_ref] [--device cpu|cuda] [--tokens 16] [--tol 1e-4]
        [--dtype fp32|bf16]

Exports RUN_DIR (a `tessera train` run directory, its model.safetensors) with
`TESSERA checkpoint export --format hf --dtype DTYPE` into WORK_DIR/hf, has `TESSERA generate --token-ids`
continue a fixed prompt greedily by --tokens tokens (it prints each new token's log-probability
under the model), then runs the exported directory on the prompt and the continuation:

  transformers  LlamaForCausalLM.from_pretrained (fp32, eager attention, TF32 off), the reader
                users load Tessera's exports with (the GPU image has it; Debian's python3 does not)
  torch_ref     tests/torch_ref/hf_llama.py, an independent reimplementation of its semantics in
                float64 (what the CPU tests use; it checks this script where transformers is absent)

and checks, for every new token, that the reader's log-softmax at that token is within --tol of
Tessera's (log-probabilities are the logits less their log-sum-exp, so this compares the logits
up to that shift, position by position) and that the token is the reader's greedy choice up to
--tol (a near-tie may pick either). One JSON line on stdout; exit 0 pass, 1 a mismatch, 2 a
failed command or a missing reader.
"""

import argparse
import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "torch_ref"))
import llama  # noqa: E402  (the path is set just above)


def run(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stderr[-2000:]}", file=sys.stderr)
        sys.exit(2)
    return done.stdout


def reference_logprobs(reference, hf_dir, ids, device):
    """(T, V) float64 log-softmax of the reader's logits for ids (a list of T token ids)."""
    if reference == "transformers":
        try:
            import transformers
        except ImportError:
            print("transformers is not installed: use --reference torch_ref", file=sys.stderr)
            sys.exit(2)
        from packaging.version import Version  # a dependency of transformers
        llama.tf32_off()
        # transformers 4.56 renamed torch_dtype to dtype (5 still takes the old name, with a warning).
        dtype_key = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
        model = transformers.LlamaForCausalLM.from_pretrained(hf_dir, attn_implementation="eager",
                                                              **{dtype_key: torch.float32}).to(device)
        with torch.no_grad():
            logits = model(torch.tensor([ids], device=device)).logits[0]
        return torch.log_softmax(logits.double(), dim=-1).cpu()
    import hf_llama  # noqa: E402  (beside llama)
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    weights = hf_llama.read_hf_weights(hf_dir)
    logits = hf_llama.hf_forward(cfg, weights, torch.tensor([ids]))[0]
    return torch.log_softmax(logits.double(), dim=-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tessera")
    ap.add_argument("run_dir")
    ap.add_argument("work_dir")
    ap.add_argument("--reference", choices=["transformers", "torch_ref"], default="transformers")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="the export's weights (bf16: rounded, so compare with a bf16-sized --tol)")
    args = ap.parse_args()

    hf_dir = os.path.join(args.work_dir, "hf")
    run([args.tessera, "checkpoint", "export", "--format", "hf", "--dtype", args.dtype, args.run_dir, hf_dir])
    with open(os.path.join(hf_dir, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    prompt = [(7 + 131 * i) % vocab for i in range(12)]  # fixed, spread over the vocabulary
    out = json.loads(run([args.tessera, "generate", "--checkpoint", args.run_dir, "--token-ids", "--prompt",
                          " ".join(map(str, prompt)), "--max-tokens", str(args.tokens), "--temperature", "0"]))
    new, theirs = out["tokens"][0], out["logprobs"][0]
    if len(new) != args.tokens or len(theirs) != len(new):
        print(f"generate gave {len(new)} tokens and {len(theirs)} log-probabilities, not {args.tokens}",
              file=sys.stderr)
        return 1
    lp = reference_logprobs(args.reference, hf_dir, prompt + new[:-1], args.device)
    worst, not_greedy = 0.0, []
    for i, (token, tessera_lp) in enumerate(zip(new, theirs)):
        row = lp[len(prompt) - 1 + i]
        worst = max(worst, abs(row[token].item() - tessera_lp))
        if row.max().item() - row[token].item() > args.tol:
            not_greedy.append(i)
    ok = worst <= args.tol and not not_greedy
    print(json.dumps({"reference": args.reference, "device": args.device, "dtype": args.dtype, "tokens": len(new),
                      "max_abs_logprob_difference": worst, "tol": args.tol,
                      "not_the_readers_greedy_choice": not_greedy, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
