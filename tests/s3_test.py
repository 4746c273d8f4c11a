#!/usr/bin/env python3
"""The object store end to end (checkpoint tier and datasets), against a real S3-compatible server (s3rver,
installed by scripts/setup.sh into build/tools):

1. mirror to the bucket at 2 ranks on one node (their 2 shard files gathered in one node object,
   multipart), PUTs per checkpoint equal to the plan; delete the local checkpoints; resume from the bucket alone
   at 1 rank: the final checkpoint bitwise equal to a resume from the same step on local disk;
   `tessera checkpoint verify` and `export` read the bucket; `checkpoint upload` sends a local
   checkpoint there by hand, checked first;
2. the server killed mid-upload and restarted: the run goes on, a later upload completes, every
   manifest in the bucket has its objects (verify), `latest` names the last step;
3. with checkpoint.on_failure = stop, a lost server stops the run with exit 10; the last checkpoint's
   upload failing after the last step ends it with exit 10 too, and the restarted run uploads it;
4. every request's AWS Signature V4 checked by a proxy with its own implementation of the spec
   (s3rver checks only the access key): mirror, prune and resume pass, a wrong secret is refused;
5. wrong credentials and a missing bucket: exit 10 naming the bucket, never the secret; another
   URL scheme: exit 2 naming the key;
6. two nodes (two launch agents): each node's first rank uploads its node's object, rank 0 commits;
7. `tessera prepare --out s3://...`, then training on the s3:// dataset at 2 ranks gives the losses
   of the same dataset on local disk; every shard fetched once per node in ranged GETs of the
   planned count (none per sample), a second run from the cache fetches nothing;
8. a slow link (every request 0.65 s late) and `tessera launch --hang-timeout 5`: the last upload
   after the last step and a restore from the bucket before the first step each outlast the
   timeout, and the job finishes: the bytes they move are progress to the agent's watchdog.

usage: s3_test.py TESSERA"""
import hashlib
import hmac
import http.client
import http.server
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
S3RVER = ROOT / "build/tools/node_modules/.bin/s3rver"
BUCKET = "tessera-test"
PART_MIB = 1 / 32  # 32 KiB parts: the tiny model's node objects take several
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, work):
        self.dir, self.port, self.proc = work / "s3rver", free_port(), None

    def start(self):
        env = dict(os.environ, NODE_OPTIONS="--openssl-legacy-provider")  # its list tokens use DES
        self.proc = subprocess.Popen(
            [str(S3RVER), "-d", str(self.dir), "-a", "127.0.0.1", "-p", str(self.port), "--silent",
             "--configure-bucket", BUCKET], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(300):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        sys.exit(f"s3rver not listening on {self.port} after 15 s")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def canonical_query(query):
    """SigV4's canonical query string: every name and value URI-encoded, sorted by name."""
    pairs = [p.split("=", 1) + [""] * ("=" not in p) for p in query.split("&") if p]
    enc = lambda x: urllib.parse.quote(urllib.parse.unquote(x), safe="-_.~")
    return "&".join(f"{enc(k)}={enc(v)}" for k, v in sorted(pairs))


class SigV4Proxy(http.server.ThreadingHTTPServer):
    """Checks every request's AWS Signature V4 (s3rver checks only the access key) with an
    implementation of AWS's spec of its own, then passes it on to s3rver; 403
    SignatureDoesNotMatch when the signature is wrong. `delay`: seconds each request waits first
    (a slow link); only those whose path holds `only`, when given."""

    def __init__(self, upstream_port, secret, delay=0.0, only=""):
        self.upstream_port, self.secret, self.checked, self.delay, self.only = upstream_port, secret, 0, delay, only
        super().__init__(("127.0.0.1", 0), SigV4Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def signature_ok(self, method, target, headers, body):
        path, _, query = target.partition("?")
        auth = headers.get("Authorization", "")
        m = re.match(r"AWS4-HMAC-SHA256 Credential=[^/]+/(\d{8})/([^/]+)/s3/aws4_request, "
                     r"SignedHeaders=([^,]+), Signature=(\w+)$", auth)
        payload = headers.get("x-amz-content-sha256", "")
        if not m or not payload or "host" not in m.group(3).split(";"):
            return False
        if payload != "UNSIGNED-PAYLOAD" and payload != hashlib.sha256(body).hexdigest():
            return False
        date, region, signed, signature = m.groups()
        names = signed.split(";")
        canonical = "\n".join([method, path, canonical_query(query),
                               "".join(f"{h}:{' '.join(headers.get(h, '').split())}\n" for h in names), signed, payload])
        amz_date = headers.get("x-amz-date", "")
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, f"{date}/{region}/s3/aws4_request",
                             hashlib.sha256(canonical.encode()).hexdigest()])
        key = ("AWS4" + self.secret).encode()
        for part in (date, region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        return hmac.compare_digest(hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest(), signature)


class SigV4Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def relay(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if not self.server.signature_ok(self.command, self.path, self.headers, body):
            reply = b"<Error><Code>SignatureDoesNotMatch</Code><Message>checked by the test's proxy</Message></Error>"
            self.send_response(403)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)
            return
        self.server.checked += 1
        if self.server.only in self.path:
            time.sleep(self.server.delay)  # a slow link: every request answered this late
        up = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=60)
        up.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
        r = up.getresponse()
        data = r.read()
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                self.send_header(k, v)
        # A HEAD reply has no body but the object's length.
        self.send_header("Content-Length", r.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        up.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = relay


def run(tessera, args, env, cwd, **kw):
    p = subprocess.run([tessera] + args, env=env, cwd=cwd, capture_output=True, text=True, **kw)
    return p.returncode, p.stdout + p.stderr


CHILDREN = []


def spawn(args, **kw):
    """A process the test reads as it runs; whatever is left of it is killed when the test ends,
    pass or fail (an open-ended run outliving a failed check would load the machine for hours)."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    CHILDREN.append(proc)
    return proc


def two_node_job(tessera, config, work, run_id, env, args):
    """A 10-step job of two nodes (two agents of `tessera launch`, one worker each), saving every
    5 steps, `args` after; the agents' exit codes and their output."""
    agents = [spawn([tessera, "launch", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv",
                     f"file://{work}/rdzv-{run_id}", "--run-id", run_id, "--run-dir", f"runs/{run_id}",
                     "--rdzv-timeout", "60", "--last-call", "0.5", config, "--set", "checkpoint.interval_steps=5",
                     "--set", "train.max_steps=10"] + args, env=env, cwd=work) for _ in range(2)]
    codes = [a.wait(timeout=240) for a in agents]
    return codes, "".join(a.stdout.read() for a in agents)


def shard_bytes(step_dir):
    return sum(f.stat().st_size for f in Path(step_dir).glob("*.bin"))


def uploads(log):
    """(step, objects, bytes, puts) of every "uploaded" line."""
    pat = r"checkpoint step (\d+) uploaded to \S+ in \S+: (\d+) node object\(s\), (\d+) bytes, (\d+) PUT"
    return [tuple(int(g) for g in m.groups()) for m in re.finditer(pat, log)]


def failed_uploads(log):
    """The step of every "could not be uploaded" line."""
    return [int(s) for s in re.findall(r"checkpoint step (\d+) could not be uploaded", log)]


def losses(run_dir, after):
    rows = [json.loads(l) for l in open(run_dir / "metrics.jsonl")]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r and r.get("step", 0) > after]


def main():
    tessera = os.path.abspath(sys.argv[1])
    if not S3RVER.exists():
        sys.exit(f"{S3RVER} is missing: run scripts/setup.sh (it installs s3rver)")
    work = Path(tempfile.mkdtemp(prefix="tessera_s3_test_"))
    server = Server(work)
    server.start()
    env = dict(os.environ, AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER",
               AWS_ENDPOINT_URL=f"http://127.0.0.1:{server.port}", AWS_REGION="us-east-1",
               TESSERA_S3_PART_MIB=str(PART_MIB))
    for v in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        env.pop(v, None)
    config = str(ROOT / "configs/tiny.toml")
    common = ["--set", "train.eval_interval=0", "--set", "checkpoint.save_final=false"]
    try:
        # 1. Two ranks on one node: one node object per checkpoint (src/checkpoint's ObjectTier
        # test uploads two nodes' objects under hashed prefixes).
        mirror = f"s3://{BUCKET}/ckpt"
        rc, log = run(tessera, ["train", config, "--run-dir", "runs/a", "--set", "parallel.nproc=2",
                                "--set", "checkpoint.interval_steps=5", "--set", "train.max_steps=10",
                                "--set", f"checkpoint.mirror_dir={mirror}", "--set", "checkpoint.s3_prefixes=4"]
                      + common, env, work)
        check(rc == 0, f"training mirrored to {mirror} (exit {rc})")
        ups = uploads(log)
        check([u[0] for u in ups] == [5, 10], f"uploads of steps 5 and 10 logged: {[u[0] for u in ups]}")
        part = int(PART_MIB * (1 << 20))
        for step, objects, nbytes, puts in ups:
            step_dir = work / f"runs/a/checkpoints/step_{step:08d}"
            total = shard_bytes(step_dir)
            planned = math.ceil(total / part) if total > part else 1
            check(objects == 1 and nbytes == total,
                  f"step {step}: 1 node object of the 2 shards' {total} bytes ({objects}, {nbytes})")
            check(puts == planned + 2, f"step {step}: {puts} PUTs = {planned} parts + manifest + latest")
        shutil.copytree(work / "runs/a", work / "runs/twin")
        shutil.rmtree(work / "runs/a/checkpoints")
        rc, log = run(tessera, ["train", config, "--run-dir", "runs/a", "--resume", "auto", "--set",
                                "checkpoint.interval_steps=5", "--set", "train.max_steps=20", "--set",
                                f"checkpoint.mirror_dir={mirror}"] + common, env, work)
        check(rc == 0 and "resuming from the mirror s3://" in log and "resumed from s3://" in log,
              f"resumed at 1 rank from the bucket alone (exit {rc})")
        rc2, _ = run(tessera, ["train", config, "--run-dir", "runs/twin", "--resume", "auto", "--set",
                               "checkpoint.interval_steps=5", "--set", "train.max_steps=20"] + common, env, work)
        a, b = work / "runs/a/checkpoints/step_00000020", work / "runs/twin/checkpoints/step_00000020"
        same = rc2 == 0 and all((a / f.name).read_bytes() == f.read_bytes() for f in b.glob("*.bin"))
        check(same and losses(work / "runs/a", 10) == losses(work / "runs/twin", 10),
              "resumed from the bucket == resumed from local disk: losses and step-20 shards bitwise")
        rc, out = run(tessera, ["checkpoint", "verify", f"{mirror}/a"], env, work)
        check(rc == 0 and out.count("ok ") == 3, f"checkpoint verify reads the bucket's 3 checkpoints (exit {rc})")
        rc, out = run(tessera, ["checkpoint", "export", "--format", "hf", f"{mirror}/a", "hf"], env, work)
        check(rc == 0 and (work / "hf/model.safetensors").exists(), f"checkpoint export from the bucket (exit {rc})")
        # `tessera checkpoint upload`: a local checkpoint into the tier by hand, its checksums
        # checked first; once there, not sent again; an older step than the tier's refused.
        manual = f"s3://{BUCKET}/manual/twin"
        rc, out = run(tessera, ["checkpoint", "upload", "runs/twin", manual], env, work)
        rc2, out2 = run(tessera, ["checkpoint", "upload", "runs/twin/checkpoints/step_00000020/", manual], env, work)
        rc3, out3 = run(tessera, ["checkpoint", "verify", manual], env, work)
        rc4, out4 = run(tessera, ["checkpoint", "upload", "runs/twin/checkpoints/step_00000015", manual], env, work)
        check(rc == 0 and "uploaded step 20 of runs/twin/checkpoints/step_00000020" in out
              and rc2 == 0 and "holds step 20 already: nothing sent" in out2
              and rc3 == 0 and out3.count("ok ") == 1 and rc4 == 2 and "newer than" in out4,
              f"checkpoint upload: step 20 sent, then not again, verified from the bucket; step 15 refused "
              f"(exit {rc}, {rc2}, {rc3}, {rc4}){'' if rc == 0 else out[-600:]}")
        shutil.copytree(work / "runs/twin/checkpoints/step_00000015", work / "damaged/step_00000015")
        shard = sorted((work / "damaged/step_00000015").glob("*.bin"))[0]
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
        rc, out = run(tessera, ["checkpoint", "upload", "damaged/step_00000015", f"s3://{BUCKET}/manual/damaged"], env, work)
        sent = list((server.dir / BUCKET / "manual/damaged").rglob("*")) if (server.dir / BUCKET / "manual/damaged").exists() else []
        check(rc == 3 and shard.name in out and "not uploaded" in out and not sent,
              f"checkpoint upload of a damaged copy: exit {rc} naming {shard.name}, nothing sent ({len(sent)} object(s))")

        # 2. The server killed mid-upload and restarted: the run goes on, a later upload lands.
        # The run (20000 steps at most) is stopped by SIGTERM (finish the step, save, exit 0) once an
        # upload after the outage has landed: a fixed step count raced the restart (tiny's steps
        # are a few ms: a fast moment ended the run while the server was still down).
        mirror2 = f"s3://{BUCKET}/ckpt2"
        proc = spawn([tessera, "train", config, "--run-dir", "runs/k", "--set",
                      "checkpoint.interval_steps=2", "--set", "train.max_steps=20000", "--set",
                      f"checkpoint.mirror_dir={mirror2}", "--set", "checkpoint.keep=2"] + common,
                     env=dict(env, TESSERA_S3_ATTEMPTS="2"), cwd=work)
        log = ""
        for line in proc.stdout:
            log += line
            if "uploaded to" in line:
                break
        server.kill()
        time.sleep(1.5)
        server.start()
        deadline, last_failed = time.time() + 120, 0  # 0: no upload has failed yet
        for line in proc.stdout:
            log += line
            last_failed = max([last_failed] + failed_uploads(line))
            landed = uploads(line)
            if (last_failed and landed and landed[0][0] > last_failed) or time.time() > deadline:
                break
        proc.send_signal(signal.SIGTERM)
        log += proc.stdout.read()
        rc = proc.wait()
        ups = uploads(log)
        failed = failed_uploads(log)
        check(rc == 0, f"the run went on through the outage and stopped at SIGTERM (exit {rc})")
        check(failed and ups and ups[-1][0] > max(failed),
              f"uploads failed during the outage ({len(failed)}) and a later one completed (last {ups[-1][0] if ups else None})")
        # Each step's record counts the failures known then; an upload may still fail after the
        # last record (the run outpaces the uploader), which the run's closing line counts.
        counted = [json.loads(l).get("checkpoint_upload_failures") for l in open(work / "runs/k/metrics.jsonl")]
        total = re.findall(r"(\d+) checkpoint upload\(s\) to \S+ failed during the run", log)
        check(total == [str(len(failed))] and 0 < counted[-1] <= len(failed) and counted == sorted(counted),
              f"the run's last line counts the {len(failed)} failed uploads ({total}); metrics.jsonl's records "
              f"count those known at each step ({counted[-1]} at the last)")
        rc, out = run(tessera, ["checkpoint", "verify", f"{mirror2}/k"], env, work)
        check(rc == 0 and "DAMAGED" not in out, f"every manifest in the bucket has its objects (verify exit {rc})")
        latest = (server.dir / BUCKET / "ckpt2/k/latest._S3rver_object").read_text().strip()
        check(ups and latest == str(ups[-1][0]), f"the bucket's latest names the last step uploaded ({latest})")

        # 3. on_failure = stop: a lost server stops the run with exit 10.
        proc = spawn([tessera, "train", config, "--run-dir", "runs/s", "--set",
                      "checkpoint.interval_steps=2", "--set", "train.max_steps=100000", "--set",
                      f"checkpoint.mirror_dir={mirror2}", "--set", "checkpoint.on_failure=stop"] + common,
                     env=dict(env, TESSERA_S3_ATTEMPTS="1"), cwd=work)
        for line in proc.stdout:
            if "uploaded to" in line:
                break
        server.kill()
        out = proc.stdout.read()
        rc = proc.wait(timeout=120)
        server.start()
        check(rc == 10 and "on_failure = stop" in out, f"on_failure = stop ends the run at a failed upload (exit {rc})")
        # The last checkpoint's upload fails after the last step (an injected fault, first attempt
        # only): every rank ends with exit 10 rather than 0, the agent restarts them, and the
        # resumed run (no steps left) uploads step 4 before it exits 0.
        last_env = dict(env, TESSERA_JOB_TOKEN="s3-test-token-last-upload", TESSERA_FAULT="0:4:checkpoint.upload:io")
        rc, out = run(tessera, ["launch", "--nnodes", "1", "--nproc-per-node", "2", "--rdzv", f"file://{work}/rdzv-last", "--run-id",
                                "last", "--run-dir", "runs/last", "--rdzv-timeout", "60", "--last-call", "0.5", config,
                                "--set", "checkpoint.interval_steps=2", "--set", "train.max_steps=4", "--set",
                                f"checkpoint.mirror_dir=s3://{BUCKET}/last", "--set", "checkpoint.on_failure=stop"]
                      + common, last_env, work, timeout=240)
        log0 = (work / "runs/last/logs/rank_0.log").read_text()
        latest = server.dir / BUCKET / "last/last/latest._S3rver_object"
        check(rc == 0 and "checkpoint step 4 could not be uploaded" in log0
              and "checkpoint step_00000004 is committed on local disk but not in" in out
              and "restart 1/" in out and "checkpoint step 4 uploaded to" in log0 and "the tier lacked it" in log0
              and latest.exists() and latest.read_text().strip() == "4",
              f"the last upload failed after the last step: exit 10, restarted, the resumed run uploaded it (exit {rc})"
              + ("" if rc == 0 else out[-2000:]))

        # 4. Signatures checked (s3rver checks only the access key): mirror and resume through a
        # proxy that verifies every request's SigV4 by AWS's spec; a wrong secret is refused.
        proxy = SigV4Proxy(server.port, "S3RVER")
        signed = dict(env, AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy.server_address[1]}")
        rc, log = run(tessera, ["train", config, "--run-dir", "runs/sig", "--set", "checkpoint.interval_steps=3",
                                "--set", "train.max_steps=6", "--set", "checkpoint.keep=1", "--set",
                                f"checkpoint.mirror_dir=s3://{BUCKET}/signed/a+b"] + common, signed, work)
        shutil.rmtree(work / "runs/sig/checkpoints", ignore_errors=True)
        rc2, log2 = run(tessera, ["train", config, "--run-dir", "runs/sig", "--resume", "auto", "--set",
                                  "train.max_steps=8", "--set", f"checkpoint.mirror_dir=s3://{BUCKET}/signed/a+b"]
                        + common, signed, work)
        check(rc == 0 and rc2 == 0 and "resumed from s3://" in log2 and "pruned" in log and proxy.checked > 50,
              f"every request signed by AWS SigV4: multipart, list, ranged GETs, deletes ({proxy.checked} checked)"
              + ("" if rc == 0 and rc2 == 0 else log[-1500:] + log2[-1500:]))
        rc, out = run(tessera, ["train", config, "--run-dir", "runs/sig2", "--set",
                                f"checkpoint.mirror_dir=s3://{BUCKET}/signed"] + common,
                      dict(signed, AWS_SECRET_ACCESS_KEY="wrong-secret-do-not-print"), work)
        check(rc == 10 and "SignatureDoesNotMatch" in out and "wrong-secret" not in out,
              f"a wrong secret: exit 10, SignatureDoesNotMatch, the secret not printed ({rc})")
        proxy.shutdown()

        # 5. Credentials, buckets, schemes.
        bad = dict(env, AWS_ACCESS_KEY_ID="NOT-A-KEY", AWS_SECRET_ACCESS_KEY="topsecret-do-not-print")
        rc, out = run(tessera, ["train", config, "--run-dir", "runs/w", "--set", f"checkpoint.mirror_dir={mirror}"]
                      + common, bad, work)
        check(rc == 10 and f"s3://{BUCKET}/ckpt/w" in out and "topsecret" not in out and "InvalidAccessKeyId" in out,
              f"wrong credentials: exit 10 naming the bucket, not the secret (exit {rc}): {out.strip()[-200:]}")
        rc, out = run(tessera, ["train", config, "--run-dir", "runs/w", "--set",
                                "checkpoint.mirror_dir=s3://no-such-bucket/x"] + common, env, work)
        check(rc == 10 and "no-such-bucket" in out and "NoSuchBucket" in out, f"a missing bucket: exit 10 naming it ({rc})")
        rc, out = run(tessera, ["train", config, "--run-dir", "runs/w", "--set",
                                "checkpoint.mirror_dir=gs://bucket/x"] + common, env, work)
        check(rc == 2 and "checkpoint.mirror_dir" in out, f"gs:// refused: exit 2 naming the key ({rc})")
        # 6. Two nodes (two agents of `tessera launch` here): each node's first rank uploads its
        # node's object, rank 0 commits after both.
        # Node 1's upload of step 5 fails (an injected fault): step 5 is dropped, step 10 commits.
        launch_env = dict(env, TESSERA_JOB_TOKEN="s3-test-token-0123456789", TESSERA_FAULT="1:5:checkpoint.upload:io")
        codes, _ = two_node_job(tessera, config, work, "n2", launch_env,
                                ["--set", f"checkpoint.mirror_dir=s3://{BUCKET}/multi", "--set",
                                 "checkpoint.s3_prefixes=4"] + common)
        logs = {r: (work / f"runs/n2/logs/rank_{r}.log").read_text() for r in (0, 1)}
        ups = uploads(logs[0])
        node1 = re.findall(r"step (\d+): node 1's object uploaded \((\d+) bytes, (\d+) PUT", logs[1])
        check(codes == [0, 0] and [u[0] for u in ups] == [10] and [int(n[0]) for n in node1] == [10],
              f"2 nodes: node 1's first rank uploaded its object of step 10, rank 0 committed ({codes})")
        check("checkpoint step 5 could not be uploaded" in logs[0] and "node 1: cannot upload" in logs[0],
              "node 1's failed upload of step 5: rank 0 says so and commits nothing for it")
        keys = [str(p.relative_to(server.dir / BUCKET)) for p in (server.dir / BUCKET).rglob("*._S3rver_object")]
        check(not [k for k in keys if "step_00000005" in k and ("multi" in k)],
              f"nothing of step 5 left in the bucket: {[k for k in keys if 'multi' in k]}")
        for (step, objects, nbytes, puts), (_, b1, p1) in zip(ups, node1):
            total = shard_bytes(work / f"runs/n2/checkpoints/step_{step:08d}")
            planned = sum(math.ceil(b / part) if b > part else 1 for b in (total - int(b1), int(b1))) + 2
            check(objects == 2 and nbytes == total and puts == planned,
                  f"step {step}: 2 node objects, {puts} PUTs = the plan {planned} (node 1: {p1})")
        rc, out = run(tessera, ["checkpoint", "verify", f"s3://{BUCKET}/multi/n2"], env, work)
        check(rc == 0 and out.count("ok ") == 1, f"the two-node checkpoint verifies from the bucket (exit {rc})")
        # With on_failure = stop, node 1's upload of the last step fails: rank 0 says so to both
        # ranks at the end (exit 10), the agents restart them, and rank 0 uploads step 10 alone.
        stop_env = dict(launch_env, TESSERA_JOB_TOKEN="s3-test-token-n2-stop", TESSERA_FAULT="1:10:checkpoint.upload:io")
        codes, out = two_node_job(tessera, config, work, "n2s", stop_env,
                                  ["--set", f"checkpoint.mirror_dir=s3://{BUCKET}/multi", "--set",
                                   "checkpoint.on_failure=stop"] + common)
        log0 = (work / "runs/n2s/logs/rank_0.log").read_text()
        latest = server.dir / BUCKET / "multi/n2s/latest._S3rver_object"
        check(codes == [0, 0] and out.count("exit code 10 after step 10 (its last: finishing the run)") >= 2
              and "checkpoint step 10 could not be uploaded" in log0 and "the tier lacked it" in log0
              and latest.exists() and latest.read_text().strip() == "10",
              f"2 nodes, on_failure = stop: node 1's last upload failed, both ranks exited 10, the restarted run "
              f"uploaded step 10 ({codes})")

        # 7. A dataset on the object store.
        prep = ["prepare", "--input", str(ROOT / "data/kjv.txt.zst"), "--tokenizer", "tok.model", "--val-fraction",
                "0.02", "--shard-tokens", "200000"]
        rc, log = run(tessera, ["tokenizer", "train", "--input", str(ROOT / "data/kjv.txt.zst"), "--vocab-size", "512",
                                "--out", "tok.model"], env, work)
        check(rc == 0, f"tokenizer trained (exit {rc})")
        dataset = f"s3://{BUCKET}/datasets/kjv"
        rc, log = run(tessera, prep + ["--out", "local_ds"], env, work)
        rc2, log2 = run(tessera, prep + ["--out", dataset], env, work)
        check(rc == 0 and rc2 == 0 and f"uploaded to {dataset}" in log2, f"prepared locally and to {dataset}")
        train = ["train", config, "--set", "train.max_steps=12", "--set", "train.eval_interval=6", "--set",
                 "checkpoint.save_final=false", "--set", "parallel.nproc=2"]
        rc, _ = run(tessera, train + ["--run-dir", "runs/dl", "--set", "data.dataset=local_ds"], env, work)
        rc2, log = run(tessera, train + ["--run-dir", "runs/ds", "--set", f"data.dataset={dataset}", "--set",
                                         "data.cache_dir=s3cache"], env, work)
        check(rc == 0 and rc2 == 0 and losses(work / "runs/dl", 0) == losses(work / "runs/ds", 0),
              "training on the s3:// dataset: the losses of the same dataset on local disk")
        rank_logs = "".join(f.read_text() for f in sorted((work / "runs/ds/logs").glob("rank_*.log")))
        fetched = re.findall(r"data: fetched s3://\S+/([\w.-]+) into \S+: \S+ MB in (\d+) ranged GET", rank_logs)
        shards = sorted(p.name for p in (work / "local_ds").glob("*.bin"))
        planned = sum(math.ceil((work / "local_ds" / n).stat().st_size / part) for n in shards)
        check(sorted(n for n, _ in fetched) == shards,
              f"each of the {len(shards)} shards fetched once by the node's 2 ranks: {sorted(fetched)}")
        gets = sum(int(g) for _, g in fetched)
        samples = 12 * 8 + 2 * 8 * 8  # steps x batch + evaluations x eval_batches x batch
        check(gets == planned, f"{gets} ranged GETs = the plan {planned} (for {samples}+ samples read)")
        rc, log = run(tessera, train + ["--run-dir", "runs/ds2", "--set", f"data.dataset={dataset}", "--set",
                                        "data.cache_dir=s3cache"], env, work)
        rank_logs = "".join(f.read_text() for f in sorted((work / "runs/ds2/logs").glob("rank_*.log")))
        check(rc == 0 and "data: fetched" not in rank_logs and losses(work / "runs/ds2", 0) == losses(work / "runs/ds", 0),
              "a second run reads the cache: nothing fetched, the same losses")

        # 8. A slow link to the bucket (every request answered 0.65 s late) and --hang-timeout 5 s:
        # the last checkpoint's upload after the last step, and a restore from the bucket alone
        # before the first step, each take longer than that. The bytes they move keep the workers
        # alive; rank 1, waiting for rank 0's verdict on the upload, moves none but its peer's count.
        slow = SigV4Proxy(server.port, "S3RVER", delay=0.65)
        slow_env = dict(env, AWS_ENDPOINT_URL=f"http://127.0.0.1:{slow.server_address[1]}",
                        TESSERA_JOB_TOKEN="s3-test-token-slow-link")
        launch = ["launch", "--nnodes", "1", "--nproc-per-node", "2", "--rdzv", f"file://{work}/rdzv-slow", "--run-id",
                  "slow", "--run-dir", "runs/slow", "--rdzv-timeout", "60", "--last-call", "0.5", "--max-restarts",
                  "0", "--hang-timeout", "5", "--monitor-interval", "0.2", config, "--set",
                  "checkpoint.interval_steps=4", "--set", f"checkpoint.mirror_dir=s3://{BUCKET}/slow", "--set",
                  "checkpoint.on_failure=stop"] + common  # stop: every rank waits for the last upload's verdict
        latest = server.dir / BUCKET / "slow/slow/latest._S3rver_object"
        t0 = time.time()
        rc, out = run(tessera, launch + ["--set", "train.max_steps=4"], slow_env, work, timeout=240)
        log0 = (work / "runs/slow/logs/rank_0.log").read_text()
        upload_s = re.findall(r"checkpoint step 4 uploaded to \S+ in ([\d.]+)s", log0)
        check(rc == 0 and latest.exists() and latest.read_text().strip() == "4" and upload_s and float(upload_s[0]) > 5,
              f"a slow link: the last upload ({upload_s} s) outlasted --hang-timeout 5 s, and the job finished "
              f"(exit {rc}, {time.time() - t0:.1f} s)" + ("" if rc == 0 else out[-2000:]))
        shutil.rmtree(work / "runs/slow/checkpoints")
        t0 = time.time()
        rc, out = run(tessera, launch + ["--set", "train.max_steps=6"], slow_env, work, timeout=240)
        log0 = (work / "runs/slow/logs/rank_0.log").read_text()
        restore_s = re.findall(r"resumed from s3://\S+ in ([\d.]+)s", log0)
        check(rc == 0 and "resuming from the mirror s3://" in log0 and restore_s and float(restore_s[0]) > 5
              and latest.read_text().strip() == "6",
              f"a slow link: the restore from the bucket alone ({restore_s} s) outlasted --hang-timeout 5 s before "
              f"the first step, and the job finished (exit {rc}, {time.time() - t0:.1f} s)" + ("" if rc == 0 else out[-2000:]))
        slow.shutdown()
        # Across nodes, no agent sees the other node's bytes: they go through the job's store. One
        # node's object of the last step comes slowly, the other's at once; the ranks that wait
        # (node 1's for rank 0's verdict; rank 0 for node 1's report) outlast --hang-timeout 5 s.
        for node in (0, 1):
            slow = SigV4Proxy(server.port, "S3RVER", delay=1.2, only=f"node_{node:05d}.bin")
            node_env = dict(env, AWS_ENDPOINT_URL=f"http://127.0.0.1:{slow.server_address[1]}",
                            TESSERA_JOB_TOKEN=f"s3-test-token-slow-node{node}")
            t0 = time.time()
            codes, out = two_node_job(tessera, config, work, f"slow{node}", node_env, [
                "--hang-timeout", "5", "--monitor-interval", "0.2", "--max-restarts", "0", "--set",
                f"checkpoint.mirror_dir=s3://{BUCKET}/slow", "--set", "checkpoint.on_failure=stop", "--set",
                "checkpoint.interval_steps=4", "--set", "train.max_steps=4"] + common)
            log0 = (work / f"runs/slow{node}/logs/rank_0.log").read_text()
            upload_s = re.findall(r"checkpoint step 4 uploaded to \S+ in ([\d.]+)s", log0)
            check(codes == [0, 0] and upload_s and float(upload_s[0]) > 5,
                  f"2 nodes, node {node}'s object slow: the last upload ({upload_s} s) outlasted --hang-timeout 5 s "
                  f"on the other node too, and the job finished ({codes}, {time.time() - t0:.1f} s)"
                  + ("" if codes == [0, 0] else out[-3000:]))
            slow.shutdown()
        # Before the first step the same holds for a restore from the bucket alone: rank 1's slice
        # comes from node 1's object, slowly; rank 0, whose own came at once, waits for it.
        slow = SigV4Proxy(server.port, "S3RVER", delay=0.5, only="node_00001.bin")
        node_env = dict(env, AWS_ENDPOINT_URL=f"http://127.0.0.1:{slow.server_address[1]}",
                        TESSERA_JOB_TOKEN="s3-test-token-slow-node1")
        shutil.rmtree(work / "runs/slow1/checkpoints")
        t0 = time.time()
        codes, out = two_node_job(tessera, config, work, "slow1", node_env, [
            "--hang-timeout", "5", "--monitor-interval", "0.2", "--max-restarts", "0", "--set",
            f"checkpoint.mirror_dir=s3://{BUCKET}/slow", "--set", "checkpoint.interval_steps=4", "--set",
            "train.max_steps=6"] + common)
        restore_s = re.findall(r"resumed from s3://\S+ in ([\d.]+)s", (work / "runs/slow1/logs/rank_1.log").read_text())
        check(codes == [0, 0] and restore_s and float(restore_s[-1]) > 5,
              f"2 nodes, node 1's object slow: rank 1's restore from the bucket ({restore_s} s) outlasted "
              f"--hang-timeout 5 s on node 0 too, and the job finished ({codes}, {time.time() - t0:.1f} s)"
              + ("" if codes == [0, 0] else out[-3000:]))
        slow.shutdown()
    finally:
        for child in CHILDREN:
            if child.poll() is None:
                child.kill()
                child.wait()
        if server.proc and server.proc.poll() is None:
            server.kill()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{0 if failures else 1} passed, {1 if failures else 0} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
