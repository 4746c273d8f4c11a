"""Independent plain-PyTorch Llama 2 (Meta layout and names): the oracle Tessera is checked against.

Written from the Llama 2 paper and Meta's reference semantics, not from Tessera's C++, so that a
shared misreading cannot make both sides agree. Deliberately unoptimised: clarity over speed.
Runs on Debian's torch 1.13 (no scaled_dot_product_attention, no HF transformers).

Shape letters: B batch, T time, C model dim, H query heads, Hkv key/value heads, D head dim
(C / H), F MLP hidden, V vocabulary.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG_KEYS = (
    "vocab_size",
    "dim",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "ffn_hidden",
    "seq_len",
    "rope_theta",
    "norm_eps",
    "tied_embeddings",
)

# The two configs BENCHMARKS.md names; both sides of a comparison must use these exact numbers.
PRESETS = {
    "tiny": dict(vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=192,
                 seq_len=64, rope_theta=10000.0, norm_eps=1e-5, tied_embeddings=False),
    "bench": dict(vocab_size=32000, dim=512, n_layers=8, n_heads=8, n_kv_heads=8,
                  ffn_hidden=1408, seq_len=512, rope_theta=10000.0, norm_eps=1e-5,
                  tied_embeddings=False),
    # GPU benchmarks (BENCHMARKS.md): ~0.89B parameters.
    "gpu-1b": dict(vocab_size=32000, dim=2048, n_layers=16, n_heads=16, n_kv_heads=8,
                   ffn_hidden=5632, seq_len=2048, rope_theta=10000.0, norm_eps=1e-5,
                   tied_embeddings=False),
}

TORCH_VERSION = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])  # (major, minor)

# Attention through torch's fused scaled_dot_product_attention (PyTorch 2.x; the GPU peer) instead
# of the explicit softmax(QK^T)V that the numerics tests read. The same function either way.
USE_SDPA = False
# PyTorch 2.5 added enable_gqa: SDPA reads each kv head for its group of query heads in place,
# without the repeated copies below. Only its flash backend does so, on bf16 or fp16; on fp32 it
# falls back to the unfused math one, slower than the copies. So, as transformers does, the GPU
# peer reads in place under bf16 autocast and repeats otherwise.
SDPA_READS_GQA = TORCH_VERSION >= (2, 5)


def tf32_off():
    """fp32 products in fp32 on a GPU (Tessera's default, model.allow_tf32 = false). PyTorch 2.9
    replaced allow_tf32 with fp32_precision and raises when code mixes the two, as a library
    reading the new flag would after this set the old one."""
    if TORCH_VERSION >= (2, 9):
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def check_config(cfg):
    """Raises ValueError naming the first missing key or inconsistent value."""
    for key in CONFIG_KEYS:
        if key not in cfg:
            raise ValueError(f"config: missing key '{key}'")
    if cfg["dim"] % cfg["n_heads"] != 0:
        raise ValueError(f"config: dim {cfg['dim']} is not a multiple of n_heads {cfg['n_heads']}")
    if cfg["n_heads"] % cfg["n_kv_heads"] != 0:
        raise ValueError(f"config: n_heads {cfg['n_heads']} is not a multiple of "
                         f"n_kv_heads {cfg['n_kv_heads']}")
    if (cfg["dim"] // cfg["n_heads"]) % 2 != 0:
        raise ValueError("config: head dim must be even for RoPE pairs")


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):  # x: (..., C)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim, seq_len, theta, dtype):
    """cos, sin: (T, D/2). Pair i of every head turns by t * theta^(-2i/D).

    Angles are formed in float64 whatever the model dtype: t * freq reaches ~T radians, and a
    float32 product there is off by ~T * 6e-8, which the float64 oracle must not inherit.
    """
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    freq = theta ** (-2.0 * i / head_dim)
    t = torch.arange(seq_len, dtype=torch.float64)
    angle = torch.outer(t, freq)
    return angle.cos().to(dtype), angle.sin().to(dtype)


def apply_rope(x, cos, sin):
    """x: (B, T, H, D); Meta's interleaved layout: (x[2i], x[2i+1]) is one complex number.

    Not the HF "rotate_half" layout, which pairs i with i + D/2; weights converted between the
    two need a permutation of wq/wk rows, so getting this wrong does not show up as NaNs.
    """
    T = x.shape[1]
    c = cos[:T].view(1, T, 1, -1)
    s = sin[:T].view(1, T, 1, -1)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
    return out.flatten(-2)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_heads = cfg["n_heads"]
        self.n_kv_heads = cfg["n_kv_heads"]
        self.head_dim = cfg["dim"] // cfg["n_heads"]
        C, D = cfg["dim"], self.head_dim
        self.wq = nn.Linear(C, self.n_heads * D, bias=False)
        self.wk = nn.Linear(C, self.n_kv_heads * D, bias=False)
        self.wv = nn.Linear(C, self.n_kv_heads * D, bias=False)
        self.wo = nn.Linear(self.n_heads * D, C, bias=False)

    def forward(self, x, cos, sin):  # x: (B, T, C) -> (B, T, C)
        B, T, _ = x.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        q = apply_rope(self.wq(x).view(B, T, H, D), cos, sin)
        k = apply_rope(self.wk(x).view(B, T, Hkv, D), cos, sin)
        v = self.wv(x).view(B, T, Hkv, D)
        # GQA: query head h reads kv head h // (H / Hkv); repeat_interleave gives exactly that
        # order (each kv head repeated for its consecutive group of query heads), as does SDPA's
        # enable_gqa.
        rep = H // Hkv
        if USE_SDPA and SDPA_READS_GQA and torch.is_autocast_enabled(x.device.type):
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H or Hkv, T, D)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=rep > 1)
            return self.wo(y.transpose(1, 2).reshape(B, T, H * D))
        if rep > 1:
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        if USE_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.wo(y.transpose(1, 2).reshape(B, T, H * D))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)  # (B, H, T, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v  # (B, H, T, D)
        return self.wo(y.transpose(1, 2).reshape(B, T, H * D))


class FeedForward(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, Fh = cfg["dim"], cfg["ffn_hidden"]
        self.w1 = nn.Linear(C, Fh, bias=False)  # gate
        self.w2 = nn.Linear(Fh, C, bias=False)  # down
        self.w3 = nn.Linear(C, Fh, bias=False)  # up

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attention_norm = RMSNorm(cfg["dim"], cfg["norm_eps"])
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg["dim"], cfg["norm_eps"])
        self.feed_forward = FeedForward(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """state_dict() names are exactly Meta's (tok_embeddings.weight, layers.0.attention.wq.weight,
    ..., norm.weight, output.weight); with tied embeddings there is no output.weight."""

    def __init__(self, cfg, dtype=torch.float32):
        super().__init__()
        check_config(cfg)
        self.cfg = dict(cfg)
        self.tok_embeddings = nn.Embedding(cfg["vocab_size"], cfg["dim"])
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg["n_layers"]))
        self.norm = RMSNorm(cfg["dim"], cfg["norm_eps"])
        if not cfg["tied_embeddings"]:
            self.output = nn.Linear(cfg["dim"], cfg["vocab_size"], bias=False)
        self.to(dtype)
        cos, sin = rope_tables(cfg["dim"] // cfg["n_heads"], cfg["seq_len"], cfg["rope_theta"],
                               dtype)
        # Buffers, not parameters: they follow .to() but stay out of state_dict().
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens):  # tokens: (B, T) int64 -> logits (B, T, V)
        T = tokens.shape[1]
        if T > self.cfg["seq_len"]:
            raise ValueError(f"sequence length {T} exceeds seq_len {self.cfg['seq_len']}")
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, self.rope_cos, self.rope_sin)
        x = self.norm(x)
        head = self.tok_embeddings.weight if self.cfg["tied_embeddings"] else self.output.weight
        return x @ head.t()


def loss_fn(logits, targets):
    """Mean next-token cross-entropy over the positions whose target is >= 0.

    targets are given explicitly (not derived by shifting the inputs), so the caller decides
    what "next" means; every negative id counts as ignored, not only -100.
    """
    V = logits.shape[-1]
    targets = targets.long().masked_fill(targets < 0, -100)
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-100)


def init_weights(model, seed, std=0.02, norm_jitter=0.0):
    """Normal(0, std) matrices, norm weights 1 (+ uniform jitter, so that tests see gradients
    that depend on the norm weights rather than on a special value of 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                noise = torch.rand(p.shape, generator=gen, dtype=torch.float64) * 2 - 1
                p.copy_(1.0 + norm_jitter * noise)
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * std)


def make_optimizer(model, lr, beta1, beta2, eps, weight_decay, **options):
    """torch AdamW with decay on 2-D tensors only (matrices and embeddings, not norm weights);
    options go to torch.optim.AdamW (fused=True on a GPU)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [dict(params=decay, weight_decay=weight_decay),
              dict(params=no_decay, weight_decay=0.0)]
    return torch.optim.AdamW(groups, lr=lr, betas=(beta1, beta2), eps=eps, **options)


def count_params(model):
    return sum(p.numel() for p in model.parameters())


def matmul_params(cfg):
    """Parameters that BENCHMARKS.md's model FLOPs count: every block weight (norms included),
    the final norm and the LM head; the embedding table is a lookup, not a matmul, unless it
    doubles as the LM head."""
    C, Fh, V = cfg["dim"], cfg["ffn_hidden"], cfg["vocab_size"]
    D = C // cfg["n_heads"]
    attn = C * cfg["n_heads"] * D * 2 + C * cfg["n_kv_heads"] * D * 2
    block = attn + 3 * C * Fh + 2 * C
    return cfg["n_layers"] * block + C + V * C


def model_flops_per_token(cfg):
    """6 x matmul params + 12 x layers x seq x dim (attention scores and values, fwd + bwd)."""
    return 6 * matmul_params(cfg) + 12 * cfg["n_layers"] * cfg["seq_len"] * cfg["dim"]
