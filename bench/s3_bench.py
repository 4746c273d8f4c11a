#!/usr/bin/env python3
"""The object store on this machine, beside local disk, in one run (docs/storage.md):

- the `bench` preset's checkpoint (58.5M parameters: 702 MB of fp32 parameters and AdamW moments)
  mirrored to a local S3-compatible server (s3rver): the step loop's stall per save, the upload's
  time, bytes and PUTs, and the steps' time with and without the upload running beside them;
- a dataset of the bundled corpus repeated 12 times (about 44 M tokens in 3 shards) read from the
  server (ranged GETs into data.cache_dir) beside the same shards read from local disk (O_DIRECT,
  so not from the page cache).

usage: bench/s3_bench.py [TESSERA]   (default build/release/bin/tessera)"""
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
S3RVER = ROOT / "build/tools/node_modules/.bin/s3rver"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, env, cwd):
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
    return p.stdout + p.stderr


def step_times(run_dir):
    return [json.loads(l)["step_s"] for l in open(run_dir / "metrics.jsonl")]


def main():
    tessera = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ROOT / "build/release/bin/tessera")
    work = Path(tempfile.mkdtemp(prefix="tessera_s3_bench_", dir=os.environ.get("TMPDIR", "/var/tmp")))
    port = free_port()
    server = subprocess.Popen([str(S3RVER), "-d", str(work / "s3rver"), "-a", "127.0.0.1", "-p", str(port), "--silent",
                               "--configure-bucket", "bench"], env=dict(os.environ, NODE_OPTIONS="--openssl-legacy-provider"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(3)
    env = dict(os.environ, AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER",
               AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    try:
        config = str(ROOT / "configs/bench.toml")
        base = ["train", config, "--set", "train.max_steps=16", "--set", "checkpoint.save_final=false"]
        run([tessera] + base + ["--run-dir", "plain"], env, work)
        log = run([tessera] + base + ["--run-dir", "mirrored", "--set", "checkpoint.interval_steps=4", "--set",
                                      "checkpoint.mirror_dir=s3://bench/ckpt"], env, work)
        stalls = [float(x) for x in re.findall(r"step loop stalled ([\d.]+) ms", log)]
        ups = re.findall(r"uploaded to \S+ in ([\d.]+)s: (\d+) node object\(s\), (\d+) bytes, (\d+) PUT", log)
        plain, mirrored = step_times(work / "plain")[2:], step_times(work / "mirrored")[2:]
        print("checkpoint of the bench preset to s3rver on this machine")
        print(f"  saves {len(stalls)}, step-loop stall per save: median {statistics.median(stalls):.1f} ms")
        for secs, objects, nbytes, puts in ups:
            print(f"  upload: {int(nbytes) / 1e6:.0f} MB in {float(secs):.2f} s = {int(nbytes) / 1e6 / float(secs):.0f} MB/s, "
                  f"{objects} node object, {puts} PUTs")
        print(f"  step time, median of steps 3-16: {statistics.median(plain):.3f} s without a mirror, "
              f"{statistics.median(mirrored):.3f} s with uploads beside the steps "
              f"({statistics.median(mirrored) / statistics.median(plain):.2f}x)")

        corpus = str(ROOT / "data/kjv.txt.zst")
        run([tessera, "tokenizer", "train", "--input", corpus, "--vocab-size", "4096", "--out", "tok.model"], env, work)
        prep = [tessera, "prepare", "--tokenizer", "tok.model", "--input"] + [corpus] * 12
        run(prep + ["--out", "local_ds"], env, work)
        run(prep + ["--out", "s3://bench/data"], env, work)
        log = run([tessera, "train", config, "--run-dir", "data_s3", "--set", "train.max_steps=1", "--set",
                   "data.synthetic=false", "--set", "data.dataset=s3://bench/data", "--set", "data.cache_dir=cache",
                   "--set", "model.vocab_size=4096", "--set", "checkpoint.save_final=false"], env, work)
        fetched = re.findall(r"fetched \S+ into \S+: ([\d.]+) MB in (\d+) ranged GET\(s\), (\d+) MB/s", log)
        mb = sum(float(f[0]) for f in fetched)
        gets = sum(int(f[1]) for f in fetched)
        shards = sorted((work / "local_ds").glob("*.bin"))
        t0 = time.perf_counter()
        for f in shards:
            subprocess.run(["dd", f"if={f}", "of=/dev/null", "bs=8M", "iflag=direct"], check=True,
                           capture_output=True)
        local_s = time.perf_counter() - t0
        local_mb = sum(f.stat().st_size for f in shards) / 1e6
        rates = [int(f[2]) for f in fetched]
        print(f"dataset of {len(shards)} shards, {local_mb:.0f} MB")
        print(f"  from s3rver: {mb:.0f} MB in {gets} ranged GETs, {min(rates)}-{max(rates)} MB/s per shard "
              f"(4 connections each)")
        print(f"  from local disk (O_DIRECT): {local_mb / local_s:.0f} MB/s")
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
