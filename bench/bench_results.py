"""Reading benchmark runs' results, shared by run_bench.sh and run_bench_dist.sh.

Each run leaves WORK/NAME.ROUND.out (its stdout: log lines, then one JSON result line) and,
for programs that do not report their own peak RSS, WORK/NAME.ROUND.rss (bytes, from the
script's measurement).
"""
import json
import os
import sys

REQUIRED = ("tokens_per_s", "model_flops_per_s", "median_step_s", "params", "tokens_per_step")


def last_json(path, script):
    """The last stdout line that is a JSON object: programs may log before their result."""
    with open(path) as f:
        lines = f.read().splitlines()
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    # The work folder is deleted on exit, so show what the program printed instead of a path.
    tail = "".join(f"\n  | {line}" for line in lines[-10:]) or " (nothing)"
    sys.exit(f"{script}: no JSON result line from {os.path.basename(path)[:-4]}; its stdout ended:{tail}")


def median_round(work, name, rounds, script, rss_key):
    """The round of NAME with the median tokens/s (the lower one of an even count), with
    `all_tokens_per_s` (every round's, ascending) and `rss_key` filled from WORK/NAME.R.rss when
    the program did not report it (or from its peak_rss_bytes)."""
    runs = []
    for r in range(1, rounds + 1):
        j = last_json(f"{work}/{name}.{r}.out", script)
        for key in REQUIRED:
            if key not in j:
                sys.exit(f"{script}: {name} result lacks '{key}': {j}")
        if rss_key not in j:
            if "peak_rss_bytes" in j:
                j[rss_key] = j["peak_rss_bytes"]
            else:
                with open(f"{work}/{name}.{r}.rss") as f:
                    j[rss_key] = int(f.read())
        runs.append(j)
    runs.sort(key=lambda j: j["tokens_per_s"])
    chosen = runs[(len(runs) - 1) // 2]
    chosen["all_tokens_per_s"] = [j["tokens_per_s"] for j in runs]
    return chosen


def write_summary(path, mode, tessera, peer):
    """Appends one mode's figures to PATH as a JSON line (nothing when PATH is empty): the line
    bench/table.sh turns into a row."""
    if not path:
        return
    line = {"mode": mode, "tessera_tokens_per_s": tessera["tokens_per_s"],
            "peer_tokens_per_s": peer["tokens_per_s"], "ratio": tessera["tokens_per_s"] / peer["tokens_per_s"],
            "tessera_exposed_comm_s": tessera.get("exposed_comm_s"), "tessera_mfu": tessera.get("mfu")}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
