#!/usr/bin/python3
"""PyTorch peer of tessera_attention_bench: causal attention forward and backward on one GPU.

    python3 bench/peers/torch_attention_bench.py [--batch 8] [--seq 2048] [--heads 16]
                                                 [--kv-heads 8] [--head-dim 128] [--iters 20]

F.scaled_dot_product_attention(is_causal=True) on bf16 q, k, v, the call the GPU model peer
(torch_llama_bench.py --device cuda) makes, timed both ways PyTorch offers for GQA, the faster
taken: k and v expanded to the query heads (the expansion not timed; any backend may serve it,
cuDNN's included), and, from PyTorch 2.5, k and v of kv heads read in place (enable_gqa; the
flash backend only, which sums the gradients of k and v over each group as Tessera does).
PyTorch picks its fastest backend for each. Prints one JSON line with the same fields and FLOP
count as tessera_attention_bench: milliseconds a call (median, CUDA events) and TFLOP/s counting
forward as 2 and backward as 5 causal products; "layouts" holds both timings.
"""

import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "torch_ref"))
import llama  # noqa: E402  (path set just above; the model peer's facts about PyTorch)


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
    k0 = torch.randn(B, Hkv, T, D, device=dev, dtype=dt)
    v0 = torch.randn(B, Hkv, T, D, device=dev, dtype=dt)
    dout = torch.randn(B, H, T, D, device=dev, dtype=dt)

    def time_layout(copies, options):  # (forward ms, backward ms) with k, v repeated `copies` times
        k = k0.repeat_interleave(copies, dim=1).requires_grad_()
        v = v0.repeat_interleave(copies, dim=1).requires_grad_()
        with torch.no_grad():
            forward = median_ms(a.iters, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, **options))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, **options)
        return forward, median_ms(a.iters, lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))

    layouts = {"expanded": time_layout(H // Hkv, {})}
    if llama.SDPA_READS_GQA and H != Hkv:
        layouts["enable_gqa"] = time_layout(1, {"enable_gqa": True})
    best = min(layouts, key=lambda name: sum(layouts[name]))
    forward_ms, backward_ms = layouts[best]

    product_flops = 2.0 * B * H * D * T * (T + 1) / 2
    print(json.dumps({
        "impl": "torch_sdpa", "torch": torch.__version__, "device": torch.cuda.get_device_name(),
        "precision": "bf16", "kv_layout": best,
        "layouts": {name: {"forward_ms": round(f, 4), "backward_ms": round(b, 4)} for name, (f, b) in layouts.items()},
        "batch": B, "seq": T, "heads": H, "kv_heads": Hkv, "head_dim": D,
        "forward_ms": round(forward_ms, 4), "backward_ms": round(backward_ms, 4),
        "forward_tflops": round(2 * product_flops / forward_ms * 1e-9, 2),
        "backward_tflops": round(5 * product_flops / backward_ms * 1e-9, 2),
    }))


if __name__ == "__main__":
    main()
