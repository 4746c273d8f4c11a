#!/usr/bin/python3
"""PyTorch peer for Tessera's training benchmark: same model, same step, one JSON line out.

    /usr/bin/python3 bench/peers/torch_llama_bench.py [--preset bench|tiny|gpu-1b] [--steps 12]
                                                      [--threads 2] [--dtype fp32|bf16]
                                                      [--device cpu|cuda]

Method (BENCHMARKS.md): fp32, random tokens from a fixed seed, AdamW lr 3e-4, betas 0.9/0.95,
weight decay 0.1 (2-D tensors), grad-norm clip 1.0; one step = forward, backward, clip, update;
the figure is the median step time of steps 3..N (1-based), so that the first steps' allocator
warm-up and lazy initialisation are left out. The model is tests/torch_ref/llama.py, the same
code that checks Tessera's numerics, so the peer cannot quietly compute something cheaper.
--dtype bf16 runs forward and loss under torch.autocast("cpu", dtype=torch.bfloat16), PyTorch's
mixed precision on CPU (fp32 parameters, optimizer and gradients; bf16 GEMMs), the peer of
Tessera's parallel.param_dtype = bf16.
--device cuda is the GPU peer (PyTorch 2.x, as the GPU image has): the model on one GPU, eager,
attention through F.scaled_dot_product_attention (causal; with bf16 and PyTorch 2.5+, GQA's kv
heads read in place with enable_gqa), autocast to bf16 with --dtype bf16,
torch.optim.AdamW(fused=True), TF32 off as in Tessera's default; it also reports the GPU's name
and torch.cuda.max_memory_allocated.

The environment is deliberately left alone: bench/run_bench.sh runs this script twice, once as
given and once tuned (tcmalloc, OpenBLAS core type auto-detected), and the difference is the
point. The JSON reports which BLAS and core type actually ran, so a figure can be read right.
"""

import argparse
import ctypes
import json
import os
import resource
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "torch_ref"))
import llama  # noqa: E402  (path set just above)

MICRO_BATCH = {"bench": 4, "tiny": 4, "gpu-1b": 8}  # BENCHMARKS.md
DATA_SEED = 1234
INIT_SEED = 42


def blas_info():
    """The BLAS library torch loaded and, for OpenBLAS, the kernel core type it chose.

    Debian's torch calls whatever libblas.so.3 the alternatives system points at (OpenBLAS,
    BLIS or the netlib reference), and OpenBLAS's speed here depends on the core type, so the
    library's name alone does not explain a figure.
    """
    path = None
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and "blas" in os.path.basename(fields[-1]).lower():
                path = fields[-1]
                break
    if path is None:
        return {"blas": "none found"}
    info = {"blas": os.path.realpath(path)}
    try:
        lib = ctypes.CDLL(path)
        lib.openblas_get_corename.restype = ctypes.c_char_p
        lib.openblas_get_config.restype = ctypes.c_char_p
        info["blas_corename"] = lib.openblas_get_corename().decode()
        info["blas_config"] = lib.openblas_get_config().decode().strip()
    except (OSError, AttributeError):
        pass  # not OpenBLAS: the path says what it is (e.g. the netlib reference BLAS)
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(MICRO_BATCH), default="bench")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save-dir", default="",
                    help="then time three checkpoints (torch.save of model and optimizer state, fsynced)")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: PyTorch 2.x eager on one GPU, scaled_dot_product_attention, bf16 "
                         "autocast with --dtype bf16, fused AdamW, TF32 off")
    args = ap.parse_args()
    if args.steps < 1:
        ap.error("--steps must be >= 1")

    torch.set_num_threads(args.threads)
    cfg = llama.PRESETS[args.preset]
    B, T = MICRO_BATCH[args.preset], cfg["seq_len"]

    cuda = args.device == "cuda"
    if cuda:
        llama.USE_SDPA = True
        llama.tf32_off()  # Tessera's fp32 default (model.allow_tf32)
    model = llama.Llama(cfg, torch.float32)
    llama.init_weights(model, INIT_SEED)
    model.to(args.device)
    opt = llama.make_optimizer(model, lr=3e-4, beta1=0.9, beta2=0.95, eps=1e-8,
                               weight_decay=0.1, **({"fused": True} if cuda else {}))
    gen = torch.Generator().manual_seed(DATA_SEED)
    tokens = torch.randint(0, cfg["vocab_size"], (B, T + 1), generator=gen).to(args.device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    times, losses = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            loss = llama.loss_fn(model(inputs), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())  # .item() waits for the step (on a GPU too)
        times.append(time.perf_counter() - t0)

    saves = []
    if args.save_dir:
        # The common practice with this PyTorch (1.13 has no asynchronous distributed checkpoint):
        # a synchronous torch.save of both state dicts, written to a temporary name, fsynced and
        # renamed. The step loop waits for all of it.
        os.makedirs(args.save_dir, exist_ok=True)
        path = os.path.join(args.save_dir, "checkpoint.pt")
        for _ in range(3):
            t0 = time.perf_counter()
            with open(path + ".tmp", "wb") as f:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(path + ".tmp", path)
            saves.append(time.perf_counter() - t0)
    timed = times[2:] if len(times) > 2 else times
    median = statistics.median(timed)
    tokens_per_step = B * T
    flops_per_token = llama.model_flops_per_token(cfg)
    tokens_per_s = tokens_per_step / median
    result = {
        "impl": "pytorch",
        "preset": args.preset,
        "params": llama.count_params(model),
        "matmul_params": llama.matmul_params(cfg),
        "tokens_per_step": tokens_per_step,
        "steps": args.steps,
        "timed_steps": f"{len(times) - len(timed) + 1}..{len(times)}",
        "median_step_s": median,
        "tokens_per_s": tokens_per_s,
        "model_flops_per_token": flops_per_token,
        "model_flops_per_s": flops_per_token * tokens_per_s,
        "threads": args.threads,
        "dtype": args.dtype,
        "attention": ("sdpa, enable_gqa" if llama.SDPA_READS_GQA and args.dtype == "bf16" else
                      "sdpa, kv heads repeated") if cuda else "explicit softmax(QK^T)V",
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_device_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "torch_version": torch.__version__,
        "step_times_s": [round(t, 4) for t in times],
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
        "openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE", ""),
    }
    if saves:
        save_s = statistics.median(saves)
        result.update({"checkpoint_bytes": os.path.getsize(path), "save_stall_s": save_s,
                       "save_commit_s": save_s, "step_s_during_save": median})
    result.update(blas_info())
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
