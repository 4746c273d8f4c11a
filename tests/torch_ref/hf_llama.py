#!/usr/bin/python3
"""An independent Hugging Face-convention Llama: checks that a Tessera export gives Tessera's logits.

Usage:
    /usr/bin/python3 tests/torch_ref/hf_llama.py DIR [--tol 1e-5]
    /usr/bin/python3 tests/torch_ref/hf_llama.py --self-test

DIR, written by Tessera (tests/hf_parity_test.cc):
    hf/             the export: config.json and model.safetensors, or model-*-of-*.safetensors
                    with model.safetensors.index.json
    inputs.npy      int (B, T) token ids
    logits.npy      (B, T, V) Tessera's logits for them

This computes what transformers' LlamaForCausalLM (eager attention) computes, written from its
modeling_llama.py semantics with its tensor names: q_proj/k_proj/v_proj/o_proj,
gate_proj/up_proj/down_proj, input_layernorm/post_attention_layernorm, and rotary embeddings in
the rotate_half convention (channel i turns with channel i + D/2, cos/sin = cat(freqs, freqs)).
It shares no code with llama.py (Meta's interleaved pairs), so an export that forgot to permute
the q and k rows, or permuted them the wrong way, gives other logits here. transformers and the
safetensors package are not installed on Debian's python3; safetensors files are parsed with
struct and numpy, strictly (every tensor the config implies, no others).

Metric as check_parity.py: ||tessera - torch||_2 / ||torch||_2 <= --tol, computed in float64.
Exit codes: 0 pass, 1 over the tolerance, 2 malformed input (the message names the file).
"""

import argparse
import json
import math
import os
import struct
import sys
import tempfile

import numpy as np
import torch


class Malformed(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# safetensors, by hand

DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2)}


def read_safetensors(path):
    """{name: float64 numpy array}; F32, F16 and BF16 (widened exactly)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise Malformed(f"{path}: too short")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise Malformed(f"{path}: header length {n} exceeds the file")
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in DTYPES:
            raise Malformed(f"{path}: tensor {name}: dtype {info['dtype']}")
        descr, size = DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if not 0 <= begin <= end <= len(data) or end - begin != size * math.prod(shape):
            raise Malformed(f"{path}: tensor {name}: bad data_offsets {begin}, {end}")
        a = np.frombuffer(data[begin:end], dtype=descr)
        if info["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a.astype(np.float64).reshape(shape)
    return out


def read_hf_weights(d):
    """Every tensor of an HF directory: one model.safetensors, or the files an index names."""
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        out = {}
        for file in sorted(set(weight_map.values())):
            for name, a in read_safetensors(os.path.join(d, file)).items():
                if weight_map.get(name) != file:
                    raise Malformed(f"{file}: tensor {name} not listed for it in {index}")
                out[name] = a
        missing = set(weight_map) - set(out)
        if missing:
            raise Malformed(f"{index}: tensors {sorted(missing)} not found in their files")
        return out
    return read_safetensors(os.path.join(d, "model.safetensors"))


# ---------------------------------------------------------------------------------------------
# The model, as transformers' LlamaForCausalLM computes it


def rms_norm(x, weight, eps):  # LlamaRMSNorm
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_parameters(cfg):
    """The rotary parameters as transformers 5 reads config.json (PreTrainedConfig's conversion):
    rope_scaling (4's spelling) or else rope_parameters (5's), with the base as their rope_theta or
    else the top-level rope_theta or else 10000. The default rotation and Llama 3.1's "llama3"
    scaling are computed here, whole rotations only."""
    params = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    if params["rope_type"] not in ("default", "llama3") or params.get("partial_rotary_factor", 1.0) != 1.0:
        raise Malformed(f"config.json: rotary parameters {params!r}, this reference computes default and llama3")
    params["rope_theta"] = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    return params


def rope_theta(cfg):
    return rope_parameters(cfg)["rope_theta"]


def inv_frequencies(params, D):
    """LlamaRotaryEmbedding's inv_freq (D/2,), float64: the default rotation, or transformers'
    _compute_llama3_parameters: wavelengths past original / low_freq_factor divided by factor,
    those under original / high_freq_factor kept, the ones between blended."""
    inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    if params["rope_type"] == "default":
        return inv_freq
    factor, low, high = params["factor"], params.get("low_freq_factor", 1.0), params.get("high_freq_factor", 4.0)
    old = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def rotary_cos_sin(T, inv_freq, dtype):  # LlamaRotaryEmbedding
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, D)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def repeat_kv(x, n_rep):  # (B, Hkv, T, D) -> (B, Hkv * n_rep, T, D): query head h reads kv h // n_rep
    B, Hkv, T, D = x.shape
    return x[:, :, None, :, :].expand(B, Hkv, n_rep, T, D).reshape(B, Hkv * n_rep, T, D)


def expected_names(cfg):
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names += [p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight",
                  p + "self_attn.o_proj.weight", p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                  p + "mlp.down_proj.weight", p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    if not cfg.get("tie_word_embeddings", False):
        names.append("lm_head.weight")
    return names


def hf_forward(cfg, w, ids, dtype=torch.float64):
    """ids: (B, T) long. Returns (B, T, V) logits."""
    for key, want in (("model_type", "llama"), ("hidden_act", "silu"), ("attention_bias", False),
                      ("mlp_bias", False)):
        if cfg.get(key, want) != want:
            raise Malformed(f"config.json: {key} = {cfg[key]!r}, this reference computes {want!r}")
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads", H)
    D = cfg.get("head_dim", C // H)
    eps, inv_freq = cfg["rms_norm_eps"], inv_frequencies(rope_parameters(cfg), cfg.get("head_dim", C // H))
    missing = sorted(set(expected_names(cfg)) - set(w))
    extra = sorted(set(w) - set(expected_names(cfg)))
    if missing or extra:
        raise Malformed(f"weights: missing {missing}, unexpected {extra}")
    t = {k: torch.from_numpy(v).to(dtype) for k, v in w.items()}
    B, T = ids.shape
    cos, sin = rotary_cos_sin(T, inv_freq, dtype)
    mask = torch.full((T, T), float("-inf"), dtype=dtype).triu(1)
    h = t["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, t[p + "input_layernorm.weight"], eps)
        q = (x @ t[p + "self_attn.q_proj.weight"].T).view(B, T, H, D).transpose(1, 2)
        k = (x @ t[p + "self_attn.k_proj.weight"].T).view(B, T, Hkv, D).transpose(1, 2)
        v = (x @ t[p + "self_attn.v_proj.weight"].T).view(B, T, Hkv, D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin  # apply_rotary_pos_emb
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv)
        scores = q @ k.transpose(2, 3) / math.sqrt(D) + mask
        a = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, H * D)
        h = h + a @ t[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, t[p + "post_attention_layernorm.weight"], eps)
        gate = torch.nn.functional.silu(x @ t[p + "mlp.gate_proj.weight"].T)
        h = h + (gate * (x @ t[p + "mlp.up_proj.weight"].T)) @ t[p + "mlp.down_proj.weight"].T
    h = rms_norm(h, t["model.norm.weight"], eps)
    head = t["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else t["lm_head.weight"]
    return h @ head.T


# ---------------------------------------------------------------------------------------------


def check(d, tol):
    try:
        with open(os.path.join(d, "hf", "config.json")) as f:
            cfg = json.load(f)
        weights = read_hf_weights(os.path.join(d, "hf"))
        ids = np.load(os.path.join(d, "inputs.npy"))
        tessera = np.load(os.path.join(d, "logits.npy")).astype(np.float64)
        ref = hf_forward(cfg, weights, torch.from_numpy(ids.astype(np.int64))).numpy()
        if ref.shape != tessera.shape:
            raise Malformed(f"logits.npy: shape {tessera.shape}, reference {ref.shape}")
    except (Malformed, OSError, KeyError, ValueError) as e:
        print(f"malformed: {e}", file=sys.stderr)
        return 2
    rel = np.linalg.norm(tessera - ref) / np.linalg.norm(ref)
    print(f"hf logits: relative error {rel:.3e}, max |diff| {np.abs(tessera - ref).max():.3e} (tol {tol})")
    return 0 if rel <= tol else 1


def self_test():
    """The parser widens F16 and BF16 exactly and honours an index; the rotary base is read as
    transformers 4 and 5 write it."""
    with tempfile.TemporaryDirectory() as d:
        vals = np.array([1.0, -2.0, 0.5, 65504.0], dtype=np.float16)
        bf = np.array([0x3F80, 0xC040], dtype="<u2")
        header = {"__metadata__": {"format": "pt"},
                  "h": {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 8]},
                  "b": {"dtype": "BF16", "shape": [2], "data_offsets": [8, 12]}}
        js = json.dumps(header).encode()
        with open(os.path.join(d, "model-00001-of-00001.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(js)) + js + vals.astype("<f2").tobytes() + bf.tobytes())
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 12},
                       "weight_map": {"h": "model-00001-of-00001.safetensors",
                                      "b": "model-00001-of-00001.safetensors"}}, f)
        w = read_hf_weights(d)
        assert w["h"].tolist() == [[1.0, -2.0], [0.5, 65504.0]], w["h"]
        assert w["b"].tolist() == [1.0, -3.0], w["b"]
    x = torch.arange(8, dtype=torch.float64).view(1, 1, 1, 8)
    assert rotate_half(x).flatten().tolist() == [-4, -5, -6, -7, 0, 1, 2, 3]
    for cfg, theta in (({}, 10000.0), ({"rope_theta": 5e5, "rope_scaling": None}, 5e5),
                       ({"rope_parameters": {"rope_type": "default", "rope_theta": 2.5e5}}, 2.5e5),
                       ({"rope_theta": 5e5, "rope_parameters": {"rope_type": "default"}}, 5e5)):
        assert rope_theta(cfg) == theta, (cfg, rope_theta(cfg))
    # Llama 3.1's scaling at D = 16, base 5e5, original length 64: pair 0 (wavelength 6.3 < 64 / 4)
    # kept, pair 1 (32.4) blended, pairs 2.. (over 64) divided by the factor.
    llama3 = {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}
    got = inv_frequencies(rope_parameters(llama3), 16)
    plain = 1.0 / 5e5 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    s1 = (64 / (2 * math.pi / plain[1]) - 1.0) / 3.0
    assert got[0] == plain[0] and torch.allclose(got[2:], plain[2:] / 8), got
    assert abs(got[1] - ((1 - s1) * plain[1] / 8 + s1 * plain[1])) < 1e-15, got
    for cfg in ({"rope_scaling": {"type": "linear"}}, {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
                {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}):
        try:
            rope_parameters(cfg)
            raise AssertionError(f"{cfg} accepted")
        except Malformed:
            pass
    print("hf_llama self-test: ok")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?")
    parser.add_argument("--tol", type=float, default=1e-5)
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    if not args.dir:
        parser.error("DIR is required")
    return check(args.dir, args.tol)


if __name__ == "__main__":
    sys.exit(main())
