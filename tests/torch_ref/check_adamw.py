#!/usr/bin/python3
"""Checks one Tessera AdamW update against torch.optim.AdamW started from the same state.

Usage:
    /usr/bin/python3 tests/torch_ref/check_adamw.py DIR [--tol 1e-5]

DIR, written by Tessera (tests/optimizer_parity_test.cc):
    config.json     lr, beta1, beta2, eps, weight_decay; step: AdamW's update count before this
                    update (torch's state['step']); decay: the names of the tensors that take
                    weight decay
    KIND/NAME.npy   for KIND in param, exp_avg, exp_avg_sq (before the update), grad (the
                    gradient the update used), and param_after, exp_avg_after,
                    exp_avg_sq_after: every tensor of the model

The oracle runs in float64 with state['step'] = step, so its bias correction is that of update
step + 1. Metric as in check_parity.py: ||tessera - torch|| / ||torch|| per tensor. Exit codes:
0 pass, 1 some tensor over the tolerance, 2 malformed input.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

KINDS = ("param", "exp_avg", "exp_avg_sq", "grad", "param_after", "exp_avg_after", "exp_avg_sq_after")


def load(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    for key in ("lr", "beta1", "beta2", "eps", "weight_decay", "step", "decay"):
        if key not in cfg:
            raise ValueError(f"{d}/config.json: missing key '{key}'")
    names = sorted(f[:-4] for f in os.listdir(os.path.join(d, "param")) if f.endswith(".npy"))
    if not names:
        raise ValueError(f"{d}/param: no tensors")
    tensors = {k: {n: np.load(os.path.join(d, k, n + ".npy")) for n in names} for k in KINDS}
    return cfg, names, tensors


def oracle(cfg, name, t):
    """(param, exp_avg, exp_avg_sq) after one torch AdamW step from the saved state."""
    p = torch.nn.Parameter(torch.from_numpy(t["param"][name].astype(np.float64)))
    p.grad = torch.from_numpy(t["grad"][name].astype(np.float64))
    wd = cfg["weight_decay"] if name in cfg["decay"] else 0.0
    opt = torch.optim.AdamW([p], lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"],
                            weight_decay=wd)
    if cfg["step"] > 0:
        opt.state[p] = {"step": torch.tensor(float(cfg["step"])),
                        "exp_avg": torch.from_numpy(t["exp_avg"][name].astype(np.float64)),
                        "exp_avg_sq": torch.from_numpy(t["exp_avg_sq"][name].astype(np.float64))}
    opt.step()
    s = opt.state[p]
    return p.detach().numpy(), s["exp_avg"].numpy(), s["exp_avg_sq"].numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--tol", type=float, default=1e-5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    try:
        cfg, names, t = load(args.dir)
    except (OSError, ValueError) as e:
        print(f"check_adamw: malformed input: {e}")
        return 2
    print(f"adamw: {args.dir}: one update after {cfg['step']} (torch state['step']), lr {cfg['lr']:g}, "
          f"tolerance {args.tol:g}")
    bad = []
    for name in names:
        want = oracle(cfg, name, t)
        for kind, w in zip(("param_after", "exp_avg_after", "exp_avg_sq_after"), want):
            got = t[kind][name].astype(np.float64)
            rn = np.linalg.norm(w.ravel())
            rel = np.linalg.norm((got - w).ravel()) / rn if rn > 0 else float(np.abs(got).max())
            ok = np.isfinite(rel) and rel <= args.tol
            if not ok:
                bad.append(f"{kind}/{name}")
            print(f"  {kind + '/' + name:<52} {rel:10.3e}  {'PASS' if ok else 'FAIL'}")
    if bad:
        print(f"adamw: FAIL ({len(bad)} tensors over {args.tol:g}: {', '.join(bad)})")
        return 1
    print("adamw: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
