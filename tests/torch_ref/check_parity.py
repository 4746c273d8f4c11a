#!/usr/bin/python3
"""Checks Tessera's logits, loss, gradients and first AdamW losses against the PyTorch oracle.

Usage:
    /usr/bin/python3 tests/torch_ref/check_parity.py DIR [--tol 1e-5] [--final-tol 1e-4] [--ref-dtype float64]
    /usr/bin/python3 tests/torch_ref/check_parity.py --self-test

DIR, written by Tessera:
    config.json       llama.CONFIG_KEYS + batch, steps, lr, beta1, beta2, eps, weight_decay,
                      grad_clip (0 = no clipping)
    params/NAME.npy   initial float32 weights, Meta names (tok_embeddings.weight, ...)
    inputs.npy        int (B, T) token ids
    targets.npy       int (B, T) next-token ids; negative ids are ignored by the loss
    logits.npy        (B, T, V) at the initial weights
    loss.npy          shape () or (1,), the mean loss at the initial weights
    grads/NAME.npy    d(mean loss)/d(NAME) at the initial weights, for every parameter
    losses.npy        (steps,): the loss before each of `steps` AdamW steps on the same batch
    grad_norms.npy    (steps,): the global gradient norm of each step, before clipping
    final/NAME.npy    every parameter after the `steps` AdamW steps (weight decay and clipping
                      change these long before they move the loss)

The oracle's semantics, which Tessera has to match:
    - AdamW is torch.optim.AdamW: decoupled decay p -= lr * wd * p before the Adam update,
      bias-corrected moments, eps added to sqrt(v_hat). Decay applies to 2-D tensors only.
    - Clipping is torch.nn.utils.clip_grad_norm_: one L2 norm over all gradients, scale by
      grad_clip / (norm + 1e-6) when that is below 1.
    - losses[0] equals loss: both are measured at the initial weights.
    - The loss is the mean over the valid targets of the whole batch.

Metric: relative error ||tessera - torch||_2 / ||torch||_2 over the whole tensor (norm-wise, so
that a few near-zero entries cannot dominate), and the max elementwise |difference| for
context. Pass iff every relative error <= --tol, and <= --final-tol for the final parameters.
Exit codes: 0 pass, 1 some tensor over the
tolerance, 2 malformed input (the message names the file or key).

Why float64 (logits, loss, gradients and the AdamW steps alike): the oracle's own rounding
must be negligible next to Tessera's float32 rounding, or a 1e-5 tolerance measures two errors
at once. float32 was tried: --self-test compares the float32 PyTorch model (playing Tessera)
with the float64 oracle, and on the tiny config they differ by 2e-7 (logits), 4e-8 (loss),
7e-8 (10 AdamW losses) and 3e-7..7e-7 (gradients), so a float32 implementation has ~15x
headroom under 1e-5, while a float32 oracle would spend half the budget on its own rounding.
(--ref-dtype float32 remains for experiments.)

Why the final parameters get 1e-4: AdamW divides each gradient element by its own magnitude, so
an element whose gradient sits at float32's rounding noise (a few per tensor) moves by +-lr
whichever way its noise points, and ten such steps leave the float32 oracle itself up to 7e-6
(relative, norm-wise) from float64 on the tiny case (--self-test prints it). 1e-4 keeps ~14x
headroom and still sees what the final parameters are there for: weight decay on a norm gain
moves it by (1 - lr wd)^10 - 1 = 1e-3 relative, and a clip applied or skipped on the wrong
steps changes the AdamW moments by far more.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama  # noqa: E402  (path set just above: this directory is not a package)

RUN_KEYS = ("batch", "steps", "lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip")
DTYPES = {"float64": torch.float64, "float32": torch.float32}


class Malformed(Exception):
    """Input that cannot be compared at all: missing file or key, wrong shape or type."""


# ---------------------------------------------------------------------------------------------
# Reading a case


def load_npy(path, shape=None, kind="f"):
    """kind: 'f' floating, 'i' integer. shape: expected shape, or None for any."""
    if not os.path.isfile(path):
        raise Malformed(f"missing file {path}")
    try:
        a = np.load(path, allow_pickle=False)
    except Exception as e:  # numpy raises several types for a corrupt header
        raise Malformed(f"cannot read {path}: {e}") from e
    if kind == "f" and a.dtype.kind != "f":
        raise Malformed(f"{path}: expected floating point, got {a.dtype}")
    if kind == "i" and a.dtype.kind not in "iu":
        raise Malformed(f"{path}: expected integers, got {a.dtype}")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise Malformed(f"{path}: shape {tuple(a.shape)}, expected {tuple(shape)}")
    return a


def check_no_extra(folder, names):
    """An unexpected tensor file means the two sides disagree on the model (tied head, layer
    count), which a silent skip would hide."""
    if not os.path.isdir(folder):
        raise Malformed(f"missing directory {folder}")
    expected = {n + ".npy" for n in names}
    for f in sorted(os.listdir(folder)):
        if f not in expected:
            raise Malformed(f"unexpected file {os.path.join(folder, f)} (not a parameter of "
                            f"this config)")


def load_case(d):
    path = os.path.join(d, "config.json")
    if not os.path.isfile(path):
        raise Malformed(f"missing file {path}")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except ValueError as e:
        raise Malformed(f"{path}: {e}") from e
    for key in llama.CONFIG_KEYS + RUN_KEYS:
        if key not in cfg:
            raise Malformed(f"{path}: missing key '{key}'")
    try:
        llama.check_config(cfg)
    except ValueError as e:
        raise Malformed(f"{path}: {e}") from e

    # A float64 skeleton gives the parameter names and shapes without trusting the files.
    shapes = {n: tuple(p.shape) for n, p in llama.Llama(cfg, torch.float64).state_dict().items()}
    check_no_extra(os.path.join(d, "params"), shapes)
    check_no_extra(os.path.join(d, "grads"), shapes)
    check_no_extra(os.path.join(d, "final"), shapes)
    params = {n: load_npy(os.path.join(d, "params", n + ".npy"), s) for n, s in shapes.items()}

    inputs = load_npy(os.path.join(d, "inputs.npy"), kind="i")
    B = cfg["batch"]
    if inputs.ndim != 2 or inputs.shape[0] != B or not 0 < inputs.shape[1] <= cfg["seq_len"]:
        raise Malformed(f"{d}/inputs.npy: shape {inputs.shape}, expected ({B}, T) with "
                        f"0 < T <= seq_len {cfg['seq_len']}")
    T = inputs.shape[1]
    if inputs.min() < 0 or inputs.max() >= cfg["vocab_size"]:
        raise Malformed(f"{d}/inputs.npy: token ids outside [0, {cfg['vocab_size']})")
    targets = load_npy(os.path.join(d, "targets.npy"), (B, T), kind="i")
    if targets.max() >= cfg["vocab_size"]:
        raise Malformed(f"{d}/targets.npy: target ids >= vocab_size {cfg['vocab_size']}")

    loss = load_npy(os.path.join(d, "loss.npy"))
    if loss.shape not in ((), (1,)):
        raise Malformed(f"{d}/loss.npy: shape {loss.shape}, expected () or (1,)")
    tessera = {
        "logits": load_npy(os.path.join(d, "logits.npy"), (B, T, cfg["vocab_size"])),
        "loss": loss.reshape(()),
        "losses": load_npy(os.path.join(d, "losses.npy"), (cfg["steps"],)),
        "grad_norms": load_npy(os.path.join(d, "grad_norms.npy"), (cfg["steps"],)),
    }
    for n, s in shapes.items():
        tessera["grads/" + n] = load_npy(os.path.join(d, "grads", n + ".npy"), s)
        tessera["final/" + n] = load_npy(os.path.join(d, "final", n + ".npy"), s)
    return cfg, params, inputs, targets, tessera


# ---------------------------------------------------------------------------------------------
# The oracle


def reference(cfg, params, inputs, targets, dtype):
    """Returns {'logits', 'loss', 'grads/NAME'..., 'losses', 'grad_norms', 'final/NAME'...} as
    float64 numpy arrays."""
    model = llama.Llama(cfg, dtype)
    model.load_state_dict({n: torch.from_numpy(np.asarray(a)).to(dtype)
                           for n, a in params.items()}, strict=True)
    x = torch.from_numpy(np.asarray(inputs)).long()
    y = torch.from_numpy(np.asarray(targets)).long()

    out = {}
    logits = model(x)
    loss = llama.loss_fn(logits, y)
    loss.backward()
    out["logits"] = logits.detach().double().numpy()
    out["loss"] = loss.detach().double().numpy()
    for n, p in model.named_parameters():
        out["grads/" + n] = p.grad.double().numpy().copy()  # copy: clipping rescales in place

    # Optimizer steps. Step 0 reuses the gradients above: they are the same computation.
    opt = llama.make_optimizer(model, cfg["lr"], cfg["beta1"], cfg["beta2"], cfg["eps"],
                               cfg["weight_decay"])
    losses, norms = [], []
    for step in range(cfg["steps"]):
        if step > 0:
            opt.zero_grad(set_to_none=True)
            loss = llama.loss_fn(model(x), y)
            loss.backward()
        losses.append(loss.item())
        # clip_grad_norm_ with an infinite max_norm measures the norm without scaling anything.
        max_norm = cfg["grad_clip"] if cfg["grad_clip"] > 0 else float("inf")
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        opt.step()
    out["losses"] = np.array(losses, dtype=np.float64)
    out["grad_norms"] = np.array(norms, dtype=np.float64)
    for n, p in model.named_parameters():
        out["final/" + n] = p.detach().double().numpy().copy()
    return out


# ---------------------------------------------------------------------------------------------
# Comparison


def compare(tessera, ref, tol, final_tol):
    """Rows (name, shape, rel_err, max_abs, ok) in a stable order: logits, loss, losses,
    grad_norms, grads, final parameters."""
    order = (["logits", "loss", "losses", "grad_norms"] + sorted(k for k in ref if k.startswith("grads/")) +
             sorted(k for k in ref if k.startswith("final/")))
    rows = []
    for name in order:
        t = np.asarray(tessera[name], dtype=np.float64)
        r = np.asarray(ref[name], dtype=np.float64)
        diff = t - r
        dn, rn = np.linalg.norm(diff.ravel()), np.linalg.norm(r.ravel())
        if rn > 0:
            rel = dn / rn
        else:  # an all-zero reference (e.g. an empty loss list) must be matched exactly
            rel = 0.0 if dn == 0 else float("inf")
        max_abs = float(np.max(np.abs(diff))) if diff.size else 0.0
        limit = final_tol if name.startswith("final/") else tol
        ok = bool(np.isfinite(rel) and rel <= limit and np.all(np.isfinite(t)))
        rows.append((name, tuple(r.shape), float(rel), max_abs, ok))
    return rows


def print_table(rows, out):
    w = max(len(r[0]) for r in rows)
    out.write(f"{'tensor':<{w}}  {'shape':<16} {'rel err':>10}  {'max abs diff':>12}  result\n")
    out.write("-" * (w + 52) + "\n")
    for name, shape, rel, max_abs, ok in rows:
        shp = "x".join(map(str, shape)) or "scalar"
        out.write(f"{name:<{w}}  {shp:<16} {rel:>10.3e}  {max_abs:>12.3e}  "
                  f"{'PASS' if ok else 'FAIL'}\n")


def check(d, tol=1e-5, ref_dtype="float64", out=sys.stdout, final_tol=1e-4):
    """Returns the exit code: 0 pass, 1 fail, 2 malformed."""
    try:
        cfg, params, inputs, targets, tessera = load_case(d)
    except Malformed as e:
        out.write(f"check_parity: malformed input: {e}\n")
        return 2
    ref = reference(cfg, params, inputs, targets, DTYPES[ref_dtype])
    rows = compare(tessera, ref, tol, final_tol)
    out.write(f"parity: {d}\n  model: vocab {cfg['vocab_size']}, dim {cfg['dim']}, "
              f"layers {cfg['n_layers']}, heads {cfg['n_heads']}/{cfg['n_kv_heads']} kv, "
              f"ffn {cfg['ffn_hidden']}, tied {bool(cfg['tied_embeddings'])}; batch "
              f"{inputs.shape[0]}x{inputs.shape[1]}, {cfg['steps']} AdamW steps\n"
              f"  oracle: PyTorch {torch.__version__} {ref_dtype}; tolerance {tol:g}, final "
              f"parameters {final_tol:g} (norm-wise relative)\n")
    print_table(rows, out)
    bad = [r[0] for r in rows if not r[4]]
    worst = max(rows, key=lambda r: r[2])
    if bad:
        out.write(f"parity: FAIL ({len(bad)} of {len(rows)} tensors over the tolerance: "
                  f"{', '.join(bad)})\n")
        return 1
    out.write(f"parity: PASS ({len(rows)} tensors, worst {worst[0]} at {worst[2]:.2e})\n")
    return 0


# ---------------------------------------------------------------------------------------------
# Self-test: PyTorch float32 plays Tessera


def write_case(d, cfg, seed):
    """Writes a complete DIR for cfg whose 'Tessera' results come from the float32 oracle."""
    for sub in ("params", "grads", "final"):
        os.makedirs(os.path.join(d, sub))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    model = llama.Llama(cfg, torch.float32)
    llama.init_weights(model, seed, norm_jitter=0.1)
    params = {n: p.detach().numpy().copy() for n, p in model.state_dict().items()}
    for n, a in params.items():
        np.save(os.path.join(d, "params", n + ".npy"), a)

    g = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, cfg["vocab_size"], (cfg["batch"], cfg["seq_len"] + 1), generator=g)
    inputs = tokens[:, :-1].numpy().astype(np.int32)
    targets = tokens[:, 1:].numpy().astype(np.int32)
    targets[0, -1] = -1  # exercise the ignored-target path
    np.save(os.path.join(d, "inputs.npy"), inputs)
    np.save(os.path.join(d, "targets.npy"), targets)

    res = reference(cfg, params, inputs, targets, torch.float32)
    np.save(os.path.join(d, "logits.npy"), res["logits"].astype(np.float32))
    np.save(os.path.join(d, "loss.npy"), res["loss"].astype(np.float32))
    np.save(os.path.join(d, "losses.npy"), res["losses"].astype(np.float32))
    np.save(os.path.join(d, "grad_norms.npy"), res["grad_norms"].astype(np.float32))
    for n in params:
        np.save(os.path.join(d, "grads", n + ".npy"), res["grads/" + n].astype(np.float32))
        np.save(os.path.join(d, "final", n + ".npy"), res["final/" + n].astype(np.float32))


def self_test():
    cfg = dict(llama.PRESETS["tiny"], batch=4, steps=10, lr=1e-3, beta1=0.9, beta2=0.95,
               eps=1e-8, weight_decay=0.1, grad_clip=1.0)
    failures = []

    def expect(what, got, want):
        status = "ok" if got == want else "WRONG"
        print(f"self-test: {what}: exit {got} (want {want}) {status}\n")
        if got != want:
            failures.append(what)

    root = tempfile.mkdtemp(prefix="tessera_parity_")
    quiet = open(os.devnull, "w")  # the tables that add nothing to the ones printed
    try:
        base = os.path.join(root, "untied")
        write_case(base, cfg, seed=1)
        expect("float32 PyTorch vs float64 oracle, untied", check(base), 0)

        def mutated(name, edit):
            """A copy of the untied case with one file edited: edit(path of the copy)."""
            d = os.path.join(root, name)
            shutil.copytree(base, d)
            edit(d)
            return d

        def scale(rel, factor, flat_index=None):
            def edit(d):
                a = np.load(os.path.join(d, rel))
                if flat_index is None:
                    a = a * np.float32(factor)
                else:
                    a.flat[flat_index] += np.float32(factor * np.linalg.norm(a))
                np.save(os.path.join(d, rel), a)
            return edit

        # A 1e-4 relative error in one gradient (e.g. a wrong scale factor) must be caught.
        expect("one gradient scaled by 1+1e-4",
               check(mutated("g_scaled", scale("grads/layers.1.feed_forward.w3.weight.npy", 1 + 1e-4)),
                     out=quiet), 1)
        # One wrong element, however large the tensor, must be caught too.
        expect("one gradient element off",
               check(mutated("g_elem", scale("grads/layers.0.attention.wk.weight.npy", 0.05, 7)),
                     out=quiet), 1)
        # Weight decay on a norm gain over 10 steps: (1 - lr wd)^10, a 1e-3 relative change.
        expect("a norm gain decayed",
               check(mutated("decayed", scale("final/layers.0.ffn_norm.weight.npy", (1 - 1e-4) ** 10)),
                     out=quiet), 1)
        # A norm that counts every replica: sqrt(2) too large, which clipping would divide out.
        expect("gradient norms scaled by sqrt(2)",
               check(mutated("norms", scale("grad_norms.npy", 2 ** 0.5)), out=quiet), 1)
        expect("losses.npy missing",
               check(mutated("missing", lambda d: os.remove(os.path.join(d, "losses.npy")))), 2)

        d = os.path.join(root, "tied")
        write_case(d, dict(cfg, tied_embeddings=True), seed=2)
        expect("tied embeddings", check(d, out=quiet), 0)
        with open(os.path.join(d, "params", "output.weight.npy"), "wb") as f:
            np.save(f, np.zeros((cfg["vocab_size"], cfg["dim"]), np.float32))
        expect("tied config with an output.weight file", check(d), 2)
    finally:
        quiet.close()
        shutil.rmtree(root)

    if failures:
        print(f"self-test: FAILED: {'; '.join(failures)}")
        return 1
    print("self-test: OK")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", nargs="?", help="directory written by Tessera")
    ap.add_argument("--tol", type=float, default=1e-5, help="max norm-wise relative error")
    ap.add_argument("--final-tol", type=float, default=1e-4,
                    help="max norm-wise relative error of the parameters after the AdamW steps")
    ap.add_argument("--ref-dtype", choices=sorted(DTYPES), default="float64",
                    help="precision of the PyTorch oracle (float64 unless experimenting)")
    ap.add_argument("--self-test", action="store_true",
                    help="check the checker on generated cases and exit")
    args = ap.parse_args()
    torch.set_num_threads(1)  # deterministic reductions; the tiny case needs no threads
    if args.self_test:
        return self_test()
    if not args.dir:
        ap.error("DIR is required unless --self-test")
    return check(args.dir, args.tol, args.ref_dtype, final_tol=args.final_tol)


if __name__ == "__main__":
    sys.exit(main())
