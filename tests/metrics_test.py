#!/usr/bin/python3
"""End-to-end checks of what a training run reports (docs/metrics.md).

    metrics_test.py --tessera BIN [--skip-prometheus]

- RUN/metrics.jsonl against the documented schema (keys, types, when present), for one process
  and for two ranks; the time split adds up to step_s; MFU arithmetic with a configured peak;
  no MFU with peak_flops < 0; run.json metadata.
- Per-rank log files with the rank prefix, at metrics.log_level.
- The progress line on a terminal (under `script`), plain lines otherwise.
- The Prometheus endpoint: its page passes `promtool check metrics`, names exactly the metrics of
  docs/metrics.md; a real Prometheus server scrapes a two-rank run and its HTTP API returns the
  step, token and loss series, whose samples agree with metrics.jsonl.
"""

import argparse
import json
import math
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "configs" / "tiny.toml")
DOC = ROOT / "docs" / "metrics.md"

ALWAYS = {"step": int, "time": float, "elapsed_s": float, "loss": float, "lr": float, "grad_norm": float,
          "tokens": int, "step_s": float, "data_wait_s": float, "forward_s": float, "backward_s": float,
          "comm_s": float, "optimizer_s": float, "other_s": float, "checkpoint_s": float,
          "tokens_per_s": float, "model_flops_per_s": float, "rss_bytes": int, "peak_rss_bytes": int}
OPTIONAL = {"mfu": float, "val_loss": float, "val_tokens": int, "eval_s": float, "rank_busy_s": list, "rank_rss_bytes": list,
            "stragglers": list, "skipped": bool, "skipped_steps": int, "comm_tp_s": float, "comm_pp_s": float,
            "pipeline_bubble": float, "checkpoint_upload_failures": int, "gpu": dict}
SPLIT = ["data_wait_s", "forward_s", "backward_s", "comm_s", "optimizer_s", "other_s"]

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", file=sys.stderr)
    return cond


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(tessera, run_dir, *sets, nproc=1, wait=True, **kw):
    cmd = [tessera, "train", TINY, "--run-dir", str(run_dir), "--nproc", str(nproc),
           "--set", f"data.cache_dir={Path(run_dir).parent / 'cache'}"]
    for s in sets:
        cmd += ["--set", s]
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r


def records(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def documented_keys():
    """The metrics.jsonl keys of docs/metrics.md's table (first column, `a`, `b` lists)."""
    text = DOC.read_text()
    section = text[text.index("## `RUN/metrics.jsonl`"):text.index("## `RUN/run.json`")]
    keys = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            keys |= set(re.findall(r"`(\w+)`", line.split("|")[1]))
    return keys


def documented_prometheus():
    text = DOC.read_text()
    section = text[text.index("## Prometheus"):]
    return {m for line in section.splitlines() if line.startswith("| `tessera_")
            for m in re.findall(r"`(tessera_\w+)`", line.split("|")[1])}


def check_schema(recs, world, where, eval_interval, max_steps):
    check(documented_keys() == set(ALWAYS) | set(OPTIONAL),
          f"docs/metrics.md keys {sorted(documented_keys())} != the test's {sorted(set(ALWAYS) | set(OPTIONAL))}")
    check([r["step"] for r in recs] == list(range(1, max_steps + 1)), f"{where}: steps 1..{max_steps}")
    for r in recs:
        at = f"{where} step {r.get('step')}"
        for k, t in ALWAYS.items():
            ok = k in r and (isinstance(r[k], (int, float)) if t is float else isinstance(r[k], t))
            check(ok and not isinstance(r[k], bool), f"{at}: {k} missing or not {t.__name__}: {r.get(k)!r}")
        for k in r:
            check(k in ALWAYS or k in OPTIONAL, f"{at}: undocumented key {k}")
        if not all(k in r for k in ALWAYS):
            continue
        parts = sum(r[k] for k in SPLIT)
        check(abs(parts - r["step_s"]) < 1e-6 * max(1.0, r["step_s"]), f"{at}: split sums to {parts}, step_s {r['step_s']}")
        check(all(r[k] >= 0 for k in SPLIT if k != "other_s"), f"{at}: negative phase")
        check(r["other_s"] > -1e-3, f"{at}: other_s {r['other_s']}")
        check(r["forward_s"] > 0 and r["backward_s"] > 0 and r["optimizer_s"] > 0, f"{at}: empty phase")
        check(r["tokens"] == r["step"] * 512, f"{at}: tokens {r['tokens']}")
        check(math.isclose(r["tokens_per_s"], 512 / r["step_s"], rel_tol=1e-9), f"{at}: tokens_per_s")
        check(0 < r["rss_bytes"] <= r["peak_rss_bytes"], f"{at}: rss {r['rss_bytes']} peak {r['peak_rss_bytes']}")
        evaluated = r["step"] % eval_interval == 0 or r["step"] == max_steps
        check(all((k in r) == evaluated for k in ("val_loss", "val_tokens", "eval_s")),
              f"{at}: val_loss/val_tokens/eval_s presence")
        check(("rank_busy_s" in r) == (world > 1) and ("rank_rss_bytes" in r) == (world > 1),
              f"{at}: per-rank arrays with world {world}")
        if world > 1:
            check(len(r["rank_busy_s"]) == world and len(r["rank_rss_bytes"]) == world, f"{at}: per-rank lengths")
            check(all(b > 0 for b in r["rank_busy_s"]) and all(m > 0 for m in r["rank_rss_bytes"]),
                  f"{at}: per-rank values")
        if "mfu" in r:
            check(0 < r["mfu"] < 2, f"{at}: mfu {r['mfu']}")


def test_single_and_mfu(tessera, tmp):
    # One process, measured peak; the schema and run.json.
    run = tmp / "single"
    train(tessera, run, "train.max_steps=25", "train.eval_interval=10", "checkpoint.interval_steps=10")
    recs = records(run)
    check_schema(recs, 1, "single", 10, 25)
    check(all("mfu" in r for r in recs), "single: mfu with a measured peak")
    check(sum(r["checkpoint_s"] > 0 for r in recs) >= 3, "single: checkpoint stalls at steps 10, 20, 25")
    info = json.loads((run / "run.json").read_text())
    for k in ["config", "version", "started", "host", "world_size", "strategy", "param_dtype", "threads", "preset",
              "parameters", "flops_per_token", "tokens_per_step", "max_steps", "peak_flops_per_s", "peak_source"]:
        check(k in info, f"run.json: no {k}")
    check(info.get("peak_source", "").startswith("measured"), f"run.json peak_source {info.get('peak_source')}")
    # Enum-like keys are written by name, as the config spells them (the dashboard filters on them).
    check(info.get("param_dtype") == "fp32" and info.get("strategy") == "single",
          f"run.json param_dtype {info.get('param_dtype')!r}, strategy {info.get('strategy')!r}")
    # MFU arithmetic: a configured peak of 1 GFLOP/s per rank, two ranks.
    run = tmp / "configured"
    train(tessera, run, "train.max_steps=6", "metrics.peak_flops=1e9", nproc=2)
    info = json.loads((run / "run.json").read_text())
    check(info["peak_flops_per_s"] == 2e9 and info["peak_source"].startswith("configured"), f"configured: {info}")
    for r in records(run):
        check(math.isclose(r["mfu"], r["model_flops_per_s"] / 2e9, rel_tol=1e-12), f"configured: mfu {r}")
        check(math.isclose(r["model_flops_per_s"], r["tokens_per_s"] * info["flops_per_token"], rel_tol=1e-12),
              "configured: model_flops_per_s = tokens_per_s x flops_per_token")
    # No MFU: peak_flops < 0.
    run = tmp / "nomfu"
    train(tessera, run, "train.max_steps=3", "metrics.peak_flops=-1")
    check(all("mfu" not in r for r in records(run)), "peak_flops < 0: no mfu")
    check("peak_flops_per_s" not in json.loads((run / "run.json").read_text()), "peak_flops < 0: no peak in run.json")


def test_logs_and_progress(tessera, tmp):
    run = tmp / "logs"
    r = train(tessera, run, "train.max_steps=12", "metrics.log_interval=5", nproc=2)
    for rank in (0, 1):
        lines = (run / "logs" / f"rank_{rank}.log").read_text().splitlines()
        check(lines and all(re.match(rf"\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ \[rank {rank}\] (debug|info|warn|error): ", l)
                            for l in lines), f"rank_{rank}.log: every line stamped and prefixed [rank {rank}]")
        check(any("health check passed" in l for l in lines), f"rank_{rank}.log: info lines of its own")
    log0 = (run / "logs" / "rank_0.log").read_text()
    check("step     5/12" in log0 and "step    10/12" in log0, "rank 0 log: periodic step lines")
    check(not re.search(r"step +\d+/12 loss", (run / "logs" / "rank_1.log").read_text()),
          "rank 1 log: no job-wide step lines")
    check("[rank 1] info" not in r.stderr, "rank 1: no info lines on the console")
    check("step    10/12" in r.stderr and "\r" not in r.stdout + r.stderr, "not a terminal: plain lines")
    # metrics.log_level = warn: no info lines in the file either.
    run = tmp / "quiet"
    train(tessera, run, "train.max_steps=3", "metrics.log_level=warn")
    check(" info: " not in (run / "logs" / "rank_0.log").read_text(), "log_level warn: no info lines in the log file")
    # A terminal: one progress line redrawn in place; evaluations above it.
    run = tmp / "tty"
    cmd = (f"{tessera} train {TINY} --run-dir {run} --set data.cache_dir={tmp / 'cache'} --set train.max_steps=40 "
           "--set train.eval_interval=20 2>/dev/null")
    out = subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True, timeout=120).stdout.decode()
    redraws = [p for p in out.split("\r\x1b[K") if p.startswith("step ")]
    check(len(redraws) >= 2, f"terminal: progress line redrawn ({len(redraws)} draws)")
    check(any(re.match(r"step 40/40 loss \d+\.\d{4} val \d+\.\d{4} \| [\d.]+k? tok/s MFU [\d.]+% \| eta 0s", p)
              for p in redraws), f"terminal: final progress line, got {redraws[-1:]}")


def test_prometheus(tessera, tmp):
    if not check(Path("/usr/bin/prometheus").exists() and Path("/usr/bin/promtool").exists(),
                 "prometheus and promtool (Debian package prometheus; scripts/setup.sh)"):
        return
    port, prom_port = free_port(), free_port()
    (tmp / "prometheus.yml").write_text(f"""global:
  scrape_interval: 250ms
  scrape_timeout: 200ms
scrape_configs:
  - job_name: tessera
    static_configs:
      - targets: ['127.0.0.1:{port}']
""")
    prom = subprocess.Popen(["/usr/bin/prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "w"))
    api = f"http://127.0.0.1:{prom_port}"
    try:
        for _ in range(200):
            try:
                if urllib.request.urlopen(f"{api}/-/ready", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.1)
        else:
            check(False, f"prometheus not ready: {(tmp / 'prometheus.log').read_text()[-2000:]}")
            return

        def query(q, **params):
            url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": q, **params})
            body = json.loads(urllib.request.urlopen(url, timeout=5).read())
            check(body["status"] == "success", f"query {q}: {body}")
            return body["data"]["result"]

        # A run longer than any machine needs, stopped (SIGTERM: a checkpoint, exit 0) once
        # Prometheus holds a few scrapes of it: Prometheus starts scraping a static target only
        # seconds after it is ready, which a fast machine's fixed-length run can outlast.
        run = tmp / "prom"
        steps = 100000
        proc = train(tessera, run, f"train.max_steps={steps}", "train.eval_interval=50",
                     f"metrics.prometheus_port={port}", nproc=2, wait=False)
        page = None
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            try:
                if page is None:
                    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                    if "tessera_validation_loss" not in page:
                        page = None
                elif len((query("tessera_step[10m]") or [{"values": []}])[0]["values"]) >= 4:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
        check(proc.returncode == 0 and "stopped at step" in out, f"prometheus run failed or did not stop:\n{out[-3000:]}")
        if not check(page is not None, "the endpoint served a page with a validation loss during the run"):
            return
        r = subprocess.run(["/usr/bin/promtool", "check", "metrics"], input=page, capture_output=True, text=True)
        check(r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(),
              f"promtool check metrics: {r.stdout}{r.stderr}")
        served = set(re.findall(r"^# TYPE (\w+)", page, re.M))
        check(served == documented_prometheus(),
              f"served vs documented metrics: extra {served - documented_prometheus()}, "
              f"missing {documented_prometheus() - served}")
        for rank in (0, 1):
            check(f'tessera_rank_busy_seconds{{rank="{rank}"}}' in page, f"per-rank gauge for rank {rank}")

        # Steps, tokens and loss series, as the scrapes saw them over the run.
        for name in ("tessera_steps_total", "tessera_tokens_total", "tessera_loss", "tessera_step"):
            samples = query(f"{name}[10m]")
            check(len(samples) == 1 and len(samples[0]["values"]) >= 3,
                  f"{name}: {len(samples[0]['values']) if samples else 0} scraped samples (want >= 3)")
        steps_seen = query("max_over_time(tessera_steps_total[10m])")
        check(steps_seen and 0 < float(steps_seen[0]["value"][1]) <= steps, f"steps seen {steps_seen}")
        # Each scrape's loss is the loss metrics.jsonl holds for the step scraped with it.
        by_step = {r["step"]: r for r in records(run)}
        step_values = query("tessera_step[10m]")[0]["values"]
        loss_values = dict((t, float(v)) for t, v in query("tessera_loss[10m]")[0]["values"])
        tokens_values = dict((t, float(v)) for t, v in query("tessera_tokens_total[10m]")[0]["values"])
        matched = 0
        for t, step in step_values:
            rec = by_step.get(int(float(step)))
            if rec is None or t not in loss_values:
                continue
            matched += 1
            check(math.isclose(loss_values[t], rec["loss"], rel_tol=1e-12), f"scraped loss at step {step}")
            check(tokens_values.get(t) == rec["tokens"], f"scraped tokens at step {step}")
        check(matched >= 3, f"{matched} scrapes matched to metrics.jsonl records")
        print(f"prometheus: {len(step_values)} scrapes of a run stopped at step {max(by_step, default=0)}; {matched} matched to metrics.jsonl")
        per_rank = query("max_over_time(tessera_rank_resident_memory_bytes[10m])")
        check(sorted(s["metric"]["rank"] for s in per_rank) == ["0", "1"], f"per-rank series: {per_rank}")
        phases = query("max_over_time(tessera_step_phase_seconds[10m])")
        check({s["metric"]["phase"] for s in phases} ==
              {"data_wait", "forward", "backward", "comm", "optimizer", "other", "checkpoint"}, f"phases: {phases}")
    finally:
        prom.terminate()
        prom.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--skip-prometheus", action="store_true")
    args = ap.parse_args()
    tessera = str(Path(args.tessera).resolve())
    with tempfile.TemporaryDirectory(prefix="tessera-metrics-") as d:
        tmp = Path(d)
        test_single_and_mfu(tessera, tmp)
        test_logs_and_progress(tessera, tmp)
        if not args.skip_prometheus:
            test_prometheus(tessera, tmp)
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("metrics_test: all checks passed")


if __name__ == "__main__":
    main()
