#!/usr/bin/env python3
"""`tessera plan --hardware cpu` beside `tessera bench` on this machine (issue 18).

For each preset, at 1 process and at 2 processes under every strategy: the plan's memory per rank
against the bench's peak resident memory per rank, and the plan's tokens/s against the bench's,
each measured right after the other (ratios from one moment, never absolute times across runs).

Bounds: memory within 5%, except `tiny` at 2 processes, whose ~140 MiB per rank are nearly all
runtime: there a rank's peak moves by up to 10 MiB from run to run, in steps of ~4 MiB (glibc keeps
start-up's freed 4 MiB buffers in the heap or not; forcing them out with mallopt costs oneDNN's
per-call scratchpads page faults, a third of the step). The plan's runtime share is its probe
run's peak, a second such draw: 6 runs here drew plans of 136.1-146.5 MiB and peaks of
136.3-142.9 MiB (same-run pairs up to 8.6 MiB apart, the extremes 10.1 MiB; a full ctest run
here failed the old 10 MiB bound and passed alone); so 12 MiB there. Tokens/s within 15%, except
`tiny` at 2 processes, whose 10 ms steps are mostly scheduling between two ranks and their Gloo
threads on two cores (+-30% from one bench to the next, and the plan's probe run as much): printed,
not asserted. `tiny` at 1 process is no steadier on a shared machine: five alternating pairs in
one CI run all erred by +28% to +70% (median +29%), in another by -25%, where a quiet machine
gives +2% to +9%; so its tokens/s are printed (the median of five pairs) and asserted only with
TESSERA_PLAN_ASSERT_TINY=1. Tokens/s are asserted on `bench` (1.5-3 s steps), which
scripts/nightly.sh adds (TESSERA_PLAN_PRESETS); CI runs `tiny` for the memory figures.

usage: plan_vs_bench_test.py TESSERA_BINARY
"""
import json
import os
import subprocess
import sys

tessera = sys.argv[1]
presets = os.environ.get("TESSERA_PLAN_PRESETS", "tiny").split()
steps = {"tiny": 100, "bench": 6}  # tiny: 5-10 ms steps, a median of many
assert_tiny = os.environ.get("TESSERA_PLAN_ASSERT_TINY") == "1"
MiB = 1 << 20


def run_json(args):
    out = subprocess.run([tessera] + args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"FAIL: tessera {' '.join(args)} exited {out.returncode}:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


failures = []
print(f"{'preset':<7} {'ranks':<16} {'plan MiB':>9} {'RSS MiB':>9} {'err':>7} {'plan tok/s':>11} {'bench tok/s':>12} {'err':>7}")
for preset in presets:
    cases = [(1, "full_shard")] + [(2, s) for s in ("full_shard", "shard_grad_op", "hybrid_shard", "no_shard")]
    for nproc, strategy in cases:
        common = ["--set", f"parallel.strategy={strategy}"]
        # bench's config: micro-batch 4 per rank, one thread per rank when there are several.
        plan_args = ["plan", "--hardware", "cpu", "--gpus-per-node", str(nproc), "--json",
                     "--set", f"model.preset={preset}", "--set", f"train.batch_size={4 * nproc}",
                     "--set", "train.micro_batch_size=4", "--set", f"train.threads={1 if nproc > 1 else 0}"] + common
        bench_args = ["bench", "--preset", preset, "--steps", str(steps.get(preset, 6)), "--nproc", str(nproc)] + common
        pairs = []  # (tokens/s error, plan, bench), plan and bench alternating
        for _ in range(5 if (preset == "tiny" and nproc == 1) else 1):
            plan, bench = run_json(plan_args), run_json(bench_args)
            tps_plan, tps_real = plan["step"]["tokens_per_s"], bench["tokens_per_s"]
            pairs.append(((tps_plan - tps_real) / tps_real, plan, bench))
        tps_err, plan, bench = sorted(pairs, key=lambda p: p[0])[len(pairs) // 2]
        mem_plan, mem_real = plan["memory"]["total_bytes"], bench["peak_rss_bytes_per_rank"]
        tps_plan, tps_real = plan["step"]["tokens_per_s"], bench["tokens_per_s"]
        mem_err = (mem_plan - mem_real) / mem_real
        label = "1 process" if nproc == 1 else f"2 x {strategy}"
        print(f"{preset:<7} {label:<16} {mem_plan / MiB:9.1f} {mem_real / MiB:9.1f} {100 * mem_err:+6.1f}% "
              f"{tps_plan:11.0f} {tps_real:12.0f} {100 * tps_err:+6.1f}%"
              + (f"  (median of {', '.join(f'{100 * p[0]:+.1f}%' for p in pairs)})" if len(pairs) > 1 else ""),
              flush=True)
        mem_ok = abs(mem_err) <= 0.05 or (preset == "tiny" and nproc > 1 and abs(mem_plan - mem_real) <= 12 * MiB)
        if not mem_ok:
            failures.append(f"{preset} {label}: memory {100 * mem_err:+.1f}%")
        if abs(tps_err) > 0.15 and (preset != "tiny" or (nproc == 1 and assert_tiny)):
            failures.append(f"{preset} {label}: tokens/s {100 * tps_err:+.1f}% (bound 15%)")

if failures:
    sys.exit("FAIL: " + "; ".join(failures))
print("plan_vs_bench_test: ok")
