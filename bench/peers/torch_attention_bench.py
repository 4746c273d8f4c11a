#!/usr/bin/python3
"""PyTorch peer of tessera_attention_bench: causal attention forward and backward on one GPU.

    python3 bench/peers/torch_attention_bench.py [--batch 8] [--seq 2048] [--heads 16]
                                                 [--kv-heads 8] [--head-dim 128] [--iters 20]

F.scaled_dot_product_attention(is_causal=True) on bf16 q, k, v, the call the GPU model peer
(torch_llama_bench.py --device cuda) makes, with k and v expanded to the query heads as that
model does (the expansion is not timed). PyTorch picks its fastest backend for the shape (flash
attention on Hopper). Prints one JSON line with the same fields and FLOP count as
tessera_attention_bench: milliseconds a call (median, CUDA events) and TFLOP/s counting forward
as 2 and backward as 5 causal products.
"""

import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def median_ms(iters, f):
    f()
    f()
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        f()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in (("batch", 8), ("seq", 2048), ("heads", 16), ("kv-heads", 8), ("head-dim", 128),
                          ("iters", 20)):
        ap.add_argument("--" + name, type=int, default=default)
    a = ap.parse_args()
    B, T, H, Hkv, D = a.batch, a.seq, a.heads, a.kv_heads, a.head_dim
    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16
    q = torch.randn(B, H, T, D, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(B, Hkv, T, D, device=dev, dtype=dt).repeat_interleave(H // Hkv, dim=1).requires_grad_()
    v = torch.randn(B, Hkv, T, D, device=dev, dtype=dt).repeat_interleave(H // Hkv, dim=1).requires_grad_()
    dout = torch.randn(B, H, T, D, device=dev, dtype=dt)

    with torch.no_grad():
        forward_ms = median_ms(a.iters, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    backward_ms = median_ms(a.iters, lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))

    product_flops = 2.0 * B * H * D * T * (T + 1) / 2
    print(json.dumps({
        "impl": "torch_sdpa", "torch": torch.__version__, "device": torch.cuda.get_device_name(),
        "precision": "bf16", "batch": B, "seq": T, "heads": H, "kv_heads": Hkv, "head_dim": D,
        "forward_ms": round(forward_ms, 4), "backward_ms": round(backward_ms, 4),
        "forward_tflops": round(2 * product_flops / forward_ms * 1e-9, 2),
        "backward_tflops": round(5 * product_flops / backward_ms * 1e-9, 2),
    }))


if __name__ == "__main__":
    main()
