"""Writes a run directory whose metrics.jsonl holds every key of docs/metrics.md (tests/report_test.sh).

usage: report_fixture.py RUN_DIR --steps N --world W

Evaluation every N/3 steps, a checkpoint stall at step N/2, rank 1 slow (a straggler) over the
last quarter, one skipped step with a non-finite (null) loss, and a run.json with every key.
Deterministic (no randomness).
"""
import argparse
import json
import math
import os


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--world", type=int, default=2)
    args = ap.parse_args()
    n, w = args.steps, args.world
    os.makedirs(args.run_dir, exist_ok=True)
    tokens_per_step, flops_per_token, peak = 4096, 1.2e6, 2.0e11 * w
    info = {
        "config": "config.toml", "dataset": "/data/<fixture> & co", "tokenizer": "tokenizer.model",
        "weights": "model.safetensors", "version": "0.1.0", "started": "2025-01-01T00:00:00Z",
        "host": "fixture-host", "world_size": w, "strategy": "full_shard", "param_dtype": "fp32", "threads": 1,
        "preset": "tiny", "parameters": 164000, "flops_per_token": flops_per_token,
        "tokens_per_step": tokens_per_step, "max_steps": n, "peak_flops_per_s": peak,
        "peak_source": "calibration (1024^3 fp32 GEMM per rank)",
    }
    with open(os.path.join(args.run_dir, "run.json"), "w") as f:
        json.dump(info, f, indent=2)
    with open(os.path.join(args.run_dir, "config.toml"), "w") as f:
        f.write('[model]\npreset = "tiny"  # <b>not bold</b>\n\n[train]\nmax_steps = %d\n' % n)

    t0, elapsed, skipped = 1.7e9, 0.0, 0
    eval_every, save_at, slow_from = max(1, n // 3), max(1, n // 2), n - n // 4
    with open(os.path.join(args.run_dir, "metrics.jsonl"), "w") as f:
        for step in range(1, n + 1):
            s = step / n
            split = {
                "data_wait_s": 0.002 + 0.001 * math.sin(step), "forward_s": 0.030, "backward_s": 0.055,
                "comm_s": 0.010 + (0.02 if step >= slow_from else 0.0), "optimizer_s": 0.008, "other_s": 0.001,
            }
            step_s = sum(split.values())
            checkpoint_s = 0.15 if step == save_at else 0.0
            elapsed += step_s + checkpoint_s
            tps = tokens_per_step / step_s
            r = {"step": step, "time": round(t0 + elapsed, 3), "elapsed_s": round(elapsed, 4),
                 "loss": round(6.2 - 3.0 * (1 - math.exp(-4 * s)) + 0.05 * math.sin(7 * step), 5),
                 "lr": 3e-3 * min(1.0, step / 5), "grad_norm": round(0.7 + 0.3 * math.cos(step), 4),
                 "tokens": step * tokens_per_step, "step_s": round(step_s, 5)}
            r.update({k: round(v, 5) for k, v in split.items()})
            r.update({"checkpoint_s": checkpoint_s, "tokens_per_s": round(tps, 1),
                      "model_flops_per_s": round(tps * flops_per_token, 1),
                      "mfu": round(tps * flops_per_token / peak, 5),
                      "rss_bytes": (300 << 20) + step * 4096 + (40 << 20) * (step >= save_at),
                      "peak_rss_bytes": (300 << 20) + step * 4096 + (60 << 20) * (step >= save_at)})
            if step % eval_every == 0 or step == n:
                r["val_loss"], r["eval_s"] = round(r["loss"] + 0.1, 5), 0.25
            if w > 1:
                r["rank_busy_s"] = [round(0.085 + (0.03 if k == 1 and step >= slow_from else 0.001 * k), 4)
                                    for k in range(w)]
                r["rank_rss_bytes"] = [((300 + 10 * k) << 20) + (step * 4096 >> 20 << 20) for k in range(w)]
                if step >= slow_from + 3:
                    r["stragglers"] = [1]
            if step == save_at + 1:
                r["loss"], r["skipped"] = None, True  # a non-finite loss is written as null
                skipped += 1
            if skipped:
                r["skipped_steps"] = skipped
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
