#!/usr/bin/python3
"""PyTorch peer for Tessera's generation benchmark: a Llama with a key/value cache, greedy.

    /usr/bin/python3 bench/peers/torch_generate_bench.py make-hf OUT --shape bench|gqa [--seed S]
    /usr/bin/python3 bench/peers/torch_generate_bench.py run HF_DIR --prompts FILE --max-tokens N
                                                         [--threads 2]

make-hf writes a Hugging Face Llama directory (config.json, model.safetensors in F32) with
random weights that `tessera checkpoint import --format hf` reads: `bench` is Tessera's bench
preset (BENCHMARKS.md), `gqa` a grouped-query shape (16 query heads on 4 key/value heads).
Matrices are drawn N(0, 1/fan_in), so activations stay O(1) and the LM head's logits spread by
~1 per token: greedy picks rarely sit on a near-tie that fp32 summation order could flip (the
0.02 of a fresh training run gives nearly flat logits, where they would).

run loads the directory (tests/torch_ref/hf_llama.py's safetensors reader) and continues every
prompt of FILE (JSON: a list of lists of token ids) by N greedy tokens, as one batch: prompts
are left-padded to the longest, each row's RoPE positions start at its first real token, and
padded keys are masked. The cache is preallocated, (B, Hkv, T, D) per layer, and query heads
attend their key/value head through a view (no repeat of K and V). It prints one JSON line:
the new tokens per prompt, the seconds of prefill + decode (weights loaded before the clock
starts), and tokens/s. torch.no_grad, fp32, torch.set_num_threads(--threads).

The model follows transformers' LlamaForCausalLM semantics (rotate_half RoPE, HF tensor names)
as tests/torch_ref/hf_llama.py does, written here again with a cache and in fp32.
"""

import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "torch_ref"))
import hf_llama  # noqa: E402  (path set just above)

SHAPES = {
    # Tessera's bench preset (src/model/model_config.cc).
    "bench": dict(vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=8, intermediate_size=1408, max_position_embeddings=512),
    # Grouped-query attention, 4 query heads per key/value head; ~170M parameters.
    "gqa": dict(vocab_size=32000, hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                num_key_value_heads=4, intermediate_size=2816, max_position_embeddings=1024),
}


def make_hf(out, shape, seed):
    s = SHAPES[shape]
    C, H, Hkv, F = s["hidden_size"], s["num_attention_heads"], s["num_key_value_heads"], s["intermediate_size"]
    D, V = C // H, s["vocab_size"]
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", head_dim=D, hidden_act="silu",
               rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None, attention_bias=False, mlp_bias=False,
               tie_word_embeddings=False, initializer_range=0.02, torch_dtype="float32", **s)
    rng = np.random.default_rng(seed)

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) / math.sqrt(cols)).astype(np.float32)

    def gain(n):
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    tensors = {"model.embed_tokens.weight": rng.standard_normal((V, C), dtype=np.float32)}
    for i in range(s["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": matrix(H * D, C), p + "self_attn.k_proj.weight": matrix(Hkv * D, C),
            p + "self_attn.v_proj.weight": matrix(Hkv * D, C), p + "self_attn.o_proj.weight": matrix(C, H * D),
            p + "mlp.gate_proj.weight": matrix(F, C), p + "mlp.up_proj.weight": matrix(F, C),
            p + "mlp.down_proj.weight": matrix(C, F), p + "input_layernorm.weight": gain(C),
            p + "post_attention_layernorm.weight": gain(C)})
    tensors["model.norm.weight"] = gain(C)
    tensors["lm_head.weight"] = matrix(V, C)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    js = json.dumps(header).encode()
    js += b" " * (-len(js) % 8)  # the data starts 8-byte aligned
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js)
        for a in tensors.values():
            f.write(a.astype("<f4").tobytes())


class CachedLlama:
    def __init__(self, cfg, weights, batch, max_len):
        self.C, self.H = cfg["hidden_size"], cfg["num_attention_heads"]
        self.Hkv = cfg.get("num_key_value_heads", self.H)
        self.D = cfg.get("head_dim", self.C // self.H)
        self.L, self.eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
        self.w = {k: torch.from_numpy(v.astype(np.float32)) for k, v in weights.items()}
        # Fused q|k|v and gate|up, as Tessera runs them: the same GEMM count on both sides.
        self.qkv, self.gate_up = [], []
        for i in range(self.L):
            p = f"model.layers.{i}."
            self.qkv.append(torch.cat([self.w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]).T.contiguous())
            self.gate_up.append(torch.cat([self.w[p + "mlp.gate_proj.weight"],
                                           self.w[p + "mlp.up_proj.weight"]]).T.contiguous())
        self.wo = [self.w[f"model.layers.{i}.self_attn.o_proj.weight"].T.contiguous() for i in range(self.L)]
        self.down = [self.w[f"model.layers.{i}.mlp.down_proj.weight"].T.contiguous() for i in range(self.L)]
        self.head = self.w["lm_head.weight"].T.contiguous()
        cos, sin = hf_llama.rotary_cos_sin(max_len, self.D, cfg.get("rope_theta", 10000.0), torch.float32)
        self.cos, self.sin = cos, sin
        self.k = [torch.zeros(batch, self.Hkv, max_len, self.D) for _ in range(self.L)]
        self.v = [torch.zeros(batch, self.Hkv, max_len, self.D) for _ in range(self.L)]
        self.key_ok = torch.zeros(batch, max_len, dtype=torch.bool)  # real (not padding) keys

    def norm(self, x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w[name]

    def forward(self, ids, pos, slot):
        """ids, pos: (B, n) tokens and their RoPE positions, written to cache slots slot..slot+n-1.
        Returns the last slot's logits (B, V)."""
        B, n = ids.shape
        H, Hkv, D, rep = self.H, self.Hkv, self.D, self.H // self.Hkv
        cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)  # (B, 1, n, D)
        end = slot + n
        # Query i (slot slot+i) sees real keys at slots <= slot+i.
        causal = torch.ones(n, end, dtype=torch.bool).tril(slot)
        # A padding query sees itself, so that no row is all -inf (NaN would reach the cache).
        itself = torch.zeros(n, end, dtype=torch.bool)
        itself[torch.arange(n), slot + torch.arange(n)] = True
        allowed = (causal.unsqueeze(0) & self.key_ok[:, None, :end]) | itself  # (B, n, end)
        bias = torch.zeros(B, 1, 1, n, end).masked_fill(~allowed[:, None, None], float("-inf"))
        h = self.w["model.embed_tokens.weight"][ids]
        for i in range(self.L):
            p = f"model.layers.{i}."
            qkv = self.norm(h, p + "input_layernorm.weight") @ self.qkv[i]
            q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
            q = q.view(B, n, H, D).transpose(1, 2)
            k = k.view(B, n, Hkv, D).transpose(1, 2)
            q = q * cos + hf_llama.rotate_half(q) * sin
            self.k[i][:, :, slot:end] = k * cos + hf_llama.rotate_half(k) * sin
            self.v[i][:, :, slot:end] = v.view(B, n, Hkv, D).transpose(1, 2)
            qg = q.reshape(B, Hkv, rep, n, D)
            kc, vc = self.k[i][:, :, None, :end], self.v[i][:, :, None, :end]  # (B, Hkv, 1, end, D)
            scores = qg @ kc.transpose(-1, -2) / math.sqrt(D) + bias
            a = (torch.softmax(scores, dim=-1) @ vc).reshape(B, H, n, D).transpose(1, 2).reshape(B, n, H * D)
            h = h + a @ self.wo[i]
            gu = self.norm(h, p + "post_attention_layernorm.weight") @ self.gate_up[i]
            gate, up = gu.chunk(2, dim=-1)
            h = h + (torch.nn.functional.silu(gate) * up) @ self.down[i]
        return self.norm(h[:, -1], "model.norm.weight") @ self.head


def generate(model, prompts, max_tokens):
    B, longest = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros(B, longest, dtype=torch.long)
    pos = torch.zeros(B, longest, dtype=torch.long)
    for b, p in enumerate(prompts):
        pad = longest - len(p)
        ids[b, pad:] = torch.tensor(p)
        pos[b, pad:] = torch.arange(len(p))
        model.key_ok[b, pad:] = True
    model.key_ok[:, longest:] = True
    logits = model.forward(ids, pos, 0)
    lengths = torch.tensor([len(p) for p in prompts])
    out = []
    for i in range(max_tokens):
        nxt = logits.argmax(-1)
        out.append(nxt)
        if i + 1 == max_tokens:
            break
        logits = model.forward(nxt[:, None], (lengths + i)[:, None], longest + i)
    return torch.stack(out, 1).tolist()


def run(args):
    torch.set_num_threads(args.threads)
    with open(os.path.join(args.hf_dir, "config.json")) as f:
        cfg = json.load(f)
    weights = hf_llama.read_hf_weights(args.hf_dir)
    with open(args.prompts) as f:
        prompts = json.load(f)
    longest = max(len(p) for p in prompts)
    if longest + args.max_tokens > cfg["max_position_embeddings"]:
        raise SystemExit("prompt + max-tokens exceeds max_position_embeddings (no sliding window here)")
    model = CachedLlama(cfg, weights, len(prompts), longest + args.max_tokens)
    with torch.no_grad():
        t0 = time.perf_counter()
        tokens = generate(model, prompts, args.max_tokens)
        seconds = time.perf_counter() - t0
    new = len(prompts) * args.max_tokens
    print(json.dumps({"tokens": tokens, "prompts": len(prompts), "prompt_tokens": sum(map(len, prompts)),
                      "new_tokens": new, "seconds": seconds, "tokens_per_s": new / seconds,
                      "threads": torch.get_num_threads(), "torch": torch.__version__}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    mk = sub.add_parser("make-hf")
    mk.add_argument("out")
    mk.add_argument("--shape", choices=sorted(SHAPES), default="bench")
    mk.add_argument("--seed", type=int, default=1)
    rn = sub.add_parser("run")
    rn.add_argument("hf_dir")
    rn.add_argument("--prompts", required=True)
    rn.add_argument("--max-tokens", type=int, default=64)
    rn.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.command == "make-hf":
        make_hf(args.out, args.shape, args.seed)
    else:
        run(args)


if __name__ == "__main__":
    main()
