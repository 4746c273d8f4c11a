#!/usr/bin/python3
"""Checks deploy/ (Kubernetes manifests, the Slurm script) against what `tessera launch` relies on.

    deploy_test.py [--tessera BIN]

The checks run on the files as they are (every one must pass), then on mutated copies that each
break one requirement (every copy must fail), so a check that can no longer fail is caught too.
The Slurm script also runs, under stub srun/scancel/scontrol: a run to the end, a requeued
attempt, a preemption (SIGTERM to the script) and a failure. With --tessera, the ConfigMap's
TOML and the Job's --set overrides go through `tessera config`, the real schema.

The launcher's contract (docs: ARCHITECTURE.md, "Launcher and resilience"):
  tessera launch --nnodes MIN[:MAX] --nproc-per-node N --rdzv file://DIR|etcd://HOST:PORT/PREFIX
                 --run-id ID [--max-restarts R] [--monitor-interval S] [--run-dir DIR]
                 CONFIG [--set key=value]...
"""

import argparse
import copy
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path, PurePosixPath

import yaml

ROOT = Path(__file__).resolve().parent.parent
K8S_DIR = ROOT / "deploy" / "kubernetes"
K8S_GPU_DIR = K8S_DIR / "gpu"
SBATCH = ROOT / "deploy" / "slurm" / "train.sbatch"

LAUNCH_VALUE_OPTIONS = {"--nnodes", "--nproc-per-node", "--rdzv", "--run-id", "--max-restarts",
                        "--monitor-interval", "--run-dir", "--set"}
LAUNCH_REQUIRED = ["--nnodes", "--nproc-per-node", "--rdzv", "--run-id", "--max-restarts"]
MIN_GRACE_S = 60  # a step plus a checkpoint save after SIGTERM
TOKEN_ENV = "TESSERA_JOB_TOKEN"


class Failed(Exception):
    pass


def expect(cond, msg, errors):
    if not cond:
        errors.append(msg)
    return cond


# ---------------------------------------------------------------------------------------------
# The launch command line

def parse_launch(argv, where):
    """argv after `tessera launch`: {option: [values]} and the positional CONFIG."""
    opts, positional, i = {}, [], 0
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("--"):
            name, eq, value = tok.partition("=")
            if name not in LAUNCH_VALUE_OPTIONS:
                raise Failed(f"{where}: `tessera launch` has no option {name}")
            if not eq:
                if i + 1 >= len(argv):
                    raise Failed(f"{where}: {name} without a value")
                i += 1
                value = argv[i]
            opts.setdefault(name, []).append(value)
        else:
            positional.append(tok)
        i += 1
    if len(positional) != 1:
        raise Failed(f"{where}: `tessera launch` takes one CONFIG, got {positional}")
    for name in LAUNCH_REQUIRED:
        if name not in opts:
            raise Failed(f"{where}: `tessera launch` without {name}")
    for name, values in opts.items():
        if name != "--set" and len(values) > 1:
            raise Failed(f"{where}: {name} given {len(values)} times")
    return {k: (v if k == "--set" else v[0]) for k, v in opts.items()}, positional[0]


def parse_nnodes(value, where):
    m = re.fullmatch(r"(\d+)(?::(\d+))?", value)
    if not m:
        raise Failed(f"{where}: --nnodes {value!r} is not MIN[:MAX]")
    lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
    if not 1 <= lo <= hi:
        raise Failed(f"{where}: --nnodes {value!r} needs 1 <= MIN <= MAX")
    return lo, hi


def check_int_option(opts, name, minimum, where, errors):
    v = opts.get(name)
    if v is not None:
        expect(re.fullmatch(r"\d+", v) and int(v) >= minimum,
               f"{where}: {name} {v!r} is not an integer >= {minimum}", errors)


# ---------------------------------------------------------------------------------------------
# Kubernetes

def load_k8s(directory):
    """{'files': {name: [docs]}, 'kustomization': doc or None}"""
    files, kustomization = {}, None
    for path in sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        if path.name in ("kustomization.yaml", "kustomization.yml"):
            kustomization = docs[0]
        else:
            files[path.name] = docs
    return {"files": files, "kustomization": kustomization}


def apply_json_patch(doc, ops, where):
    """RFC 6902 add, replace and remove (what kustomize's patches apply) on doc, in place."""
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        if op["op"] == "add":
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), op["value"])
            else:
                parent[last] = op["value"]
        elif op["op"] == "replace":
            index = int(last) if isinstance(parent, list) else last
            if not isinstance(parent, list) and last not in parent:
                raise Failed(f"{where}: replace of {op['path']}, which does not exist")
            parent[index] = op["value"]
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            raise Failed(f"{where}: op {op['op']!r} is not add, replace or remove")


def load_overlay(base, directory):
    """The base's objects with the overlay's patches applied, as `kubectl apply -k` would."""
    kz = yaml.safe_load((directory / "kustomization.yaml").read_text())
    where = f"{directory.relative_to(ROOT)}/kustomization.yaml"
    if kz.get("resources") != [".."]:
        raise Failed(f"{where}: resources {kz.get('resources')} is not the base [..]")
    k8s = copy.deepcopy(base)
    for patch in kz.get("patches") or []:
        target = patch.get("target") or {}
        docs = [d for d in find(k8s, target.get("kind"), target.get("name"))]
        if len(docs) != 1:
            raise Failed(f"{where}: patch {patch.get('path')} targets {target}, which is {len(docs)} objects")
        apply_json_patch(docs[0], yaml.safe_load((directory / patch["path"]).read_text()), patch["path"])
    return k8s


def check_gpu(k8s):
    """The GPU variant: a worker per GPU, train.device = cuda, /dev/shm for NCCL."""
    errors = []
    e = lambda cond, msg: expect(cond, msg, errors)  # noqa: E731
    container = launch_container(k8s)
    opts, _ = parse_launch([str(a) for a in (container.get("command") or []) + (container.get("args") or [])][2:],
                           "GPU Job")
    gpus = ((container.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
    e(str(gpus) == opts["--nproc-per-node"],
      f"GPU Job: limits nvidia.com/gpu {gpus} != --nproc-per-node {opts['--nproc-per-node']} (one worker per GPU)")
    e("train.device=cuda" in opts.get("--set", []),
      "GPU Job: no --set train.device=cuda (a node without its GPUs would train on its CPUs)")
    volumes = {v.get("name"): v for v in pod(k8s).get("volumes") or []}
    shm = [m for m in container.get("volumeMounts") or [] if m.get("mountPath") == "/dev/shm"]
    e(shm and ((volumes.get(shm[0].get("name")) or {}).get("emptyDir") or {}).get("medium") == "Memory",
      "GPU Job: /dev/shm is not an emptyDir in memory (NCCL's shared memory; 64 MiB by default)")
    return errors


def objects(k8s):
    for name, docs in k8s["files"].items():
        for doc in docs:
            yield name, doc


def find(k8s, kind, name=None):
    return [d for _, d in objects(k8s) if d.get("kind") == kind and
            (name is None or d.get("metadata", {}).get("name") == name)]


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def is_under(path, root):
    p, r = PurePosixPath(path), PurePosixPath(root)
    return p == r or r in p.parents


def quantity_cores(q):
    q = str(q)
    return int(q[:-1]) / 1000 if q.endswith("m") else float(q)


def image_has_registry_host(image):
    first = image.split("/")[0]
    return "/" in image and ("." in first or ":" in first or first == "localhost")


def check_metrics_port(toml, overrides, container, template, where, e):
    """With metrics.prometheus_port set, the container declares it, rank 0 listens beyond the pod
    (prometheus_host 0.0.0.0) and the pod's prometheus.io annotations point at it."""
    metrics = dict(toml.get("metrics") or {})
    for k, _, v in overrides:
        if k.startswith("metrics."):
            metrics[k.split(".", 1)[1]] = v
    port = int(metrics.get("prometheus_port", 0))
    if port == 0:
        return
    declared = [p for p in container.get("ports") or [] if p.get("containerPort") == port]
    e(declared and declared[0].get("name") == "metrics",
      f"{where}: metrics.prometheus_port {port} is not a container port named metrics")
    e(metrics.get("prometheus_host", "127.0.0.1") == "0.0.0.0",
      f"{where}: metrics.prometheus_host {metrics.get('prometheus_host', '127.0.0.1')!r} is not "
      f"reachable from outside the pod (use 0.0.0.0)")
    notes = (template.get("metadata") or {}).get("annotations") or {}
    e(notes.get("prometheus.io/scrape") == "true" and notes.get("prometheus.io/port") == str(port),
      f"{where}: pod annotations prometheus.io/scrape and prometheus.io/port {port} missing or "
      f"different: {notes}")


def check_k8s(k8s, tessera=None):
    errors = []
    e = lambda cond, msg: expect(cond, msg, errors)  # noqa: E731

    # Every object is well formed and unique; `apply -k` deploys every file.
    seen = set()
    for fname, doc in objects(k8s):
        meta = doc.get("metadata") or {}
        if not e(doc.get("apiVersion") and doc.get("kind") and meta.get("name"),
                 f"{fname}: a document without apiVersion, kind or metadata.name"):
            continue
        key = (doc["kind"], meta["name"])
        e(key not in seen, f"{fname}: {key[0]} {key[1]} defined twice")
        seen.add(key)
    kz = k8s["kustomization"]
    if e(kz is not None, "deploy/kubernetes: no kustomization.yaml"):
        listed = set(kz.get("resources") or [])
        e(listed == set(k8s["files"]),
          f"kustomization.yaml resources {sorted(listed)} != the manifests {sorted(k8s['files'])}")

    jobs = find(k8s, "Job")
    if not e(len(jobs) == 1, f"expected one Job, found {len(jobs)}"):
        return errors
    job = jobs[0]
    job_name = job["metadata"]["name"]
    where = f"Job {job_name}"
    spec = job.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or {}
    pod_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}

    # The launch container and its command line.
    launch = []
    for c in pod.get("containers") or []:
        argv = [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]
        if len(argv) >= 2 and PurePosixPath(argv[0]).name == "tessera" and argv[1] == "launch":
            launch.append((c, argv))
    if not e(len(launch) == 1, f"{where}: expected one container running `tessera launch`, "
                               f"found {len(launch)}"):
        return errors
    container, argv = launch[0]
    where_c = f"{where} container {container.get('name')}"
    try:
        opts, config_path = parse_launch(argv[2:], where_c)
        lo, hi = parse_nnodes(opts["--nnodes"], where_c)
    except Failed as err:
        errors.append(str(err))
        return errors
    check_int_option(opts, "--nproc-per-node", 1, where_c, errors)
    check_int_option(opts, "--max-restarts", 0, where_c, errors)

    # Environment: $(VAR) in the command must be defined (Kubernetes leaves unknown ones as they
    # are), the job name comes from the Job controller, the token from a Secret.
    env = {v.get("name"): v for v in container.get("env") or []}
    for ref in sorted(set(re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", " ".join(argv)))):
        e(ref in env, f"{where_c}: the command uses $({ref}) but the container defines no {ref}")
    values = {}  # what the $(VAR)s become in the pod
    for name, v in env.items():
        field = ((v.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
        if field in ("metadata.labels['batch.kubernetes.io/job-name']", "metadata.labels['job-name']"):
            values[name] = job_name
        elif "value" in v:
            values[name] = str(v["value"])
    expand = lambda s: re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",  # noqa: E731
                              lambda m: values.get(m.group(1), m.group(0)), s)
    run_id = expand(opts["--run-id"])
    e(run_id and "$(" not in run_id, f"{where_c}: --run-id {opts['--run-id']!r} is empty or "
                                     f"does not resolve to the job name")

    # Indexed Job, one pod per node: parallelism == completions == --nnodes.
    e(spec.get("completionMode") == "Indexed",
      f"{where}: completionMode is {spec.get('completionMode')!r}, not Indexed")
    e(spec.get("parallelism") == hi,
      f"{where}: parallelism {spec.get('parallelism')} != --nnodes {opts['--nnodes']}")
    e(spec.get("completions") == hi,
      f"{where}: completions {spec.get('completions')} != --nnodes {opts['--nnodes']}")
    # The launcher restarts workers; Kubernetes replaces only pods pushed off their node.
    e(pod.get("restartPolicy") == "Never",
      f"{where}: restartPolicy {pod.get('restartPolicy')!r}: the launcher restarts workers, the "
      f"kubelet must not restart the agent (and podFailurePolicy needs Never)")
    e(isinstance(spec.get("backoffLimit"), int), f"{where}: backoffLimit is not set")
    rules = (spec.get("podFailurePolicy") or {}).get("rules") or []
    e(any(r.get("action") == "Ignore" and any(c.get("type") == "DisruptionTarget"
                                              for c in r.get("onPodConditions") or [])
          for r in rules),
      f"{where}: no podFailurePolicy rule ignores DisruptionTarget (preempted or evicted pods "
      f"would count as failures)")
    grace = pod.get("terminationGracePeriodSeconds")
    e(isinstance(grace, int) and grace >= MIN_GRACE_S,
      f"{where}: terminationGracePeriodSeconds {grace} < {MIN_GRACE_S}: no time to checkpoint "
      f"on preemption")

    # Rendezvous: etcd://SERVICE:PORT/PREFIX names a Service of the manifests that leads to etcd.
    rdzv = opts["--rdzv"]
    m = re.fullmatch(r"etcd://([a-z0-9.-]+):(\d+)/(\S+)", rdzv)
    if e(m, f"{where_c}: --rdzv {rdzv!r} is not etcd://SERVICE:PORT/PREFIX"):
        svc_name, port = m.group(1).split(".")[0], int(m.group(2))
        svcs = find(k8s, "Service", svc_name)
        if e(svcs, f"{where_c}: --rdzv names host {m.group(1)!r} but there is no Service "
                   f"{svc_name}"):
            svc = svcs[0]["spec"]
            ports = [p for p in svc.get("ports") or [] if p.get("port") == port]
            if e(ports, f"Service {svc_name}: no port {port} (--rdzv {rdzv})"):
                target = ports[0].get("targetPort", port)
                backends = [w for kind in ("StatefulSet", "Deployment") for w in find(k8s, kind)
                            if selects(svc.get("selector"),
                                       w["spec"]["template"]["metadata"].get("labels") or {})]
                ok = False
                for w in backends:
                    for c in w["spec"]["template"]["spec"].get("containers") or []:
                        for p in c.get("ports") or []:
                            if target in (p.get("name"), p.get("containerPort")):
                                ok = ok or any(f":{p['containerPort']}" in str(a) and
                                               "listen-client-urls" in str(a)
                                               for a in c.get("args") or [])
                e(ok, f"Service {svc_name} port {port} (target {target}) reaches no etcd "
                      f"container listening for clients on that port")
            e(not selects(svc.get("selector"), pod_labels),
              f"Service {svc_name} (etcd) also selects the training pods")

    # The job token comes from a Secret defined here (a Secret or kustomize's secretGenerator).
    tok = env.get(TOKEN_ENV)
    if e(tok, f"{where_c}: no {TOKEN_ENV} in the environment: the agents would be refused"):
        ref = (tok.get("valueFrom") or {}).get("secretKeyRef")
        if e(ref and "value" not in tok, f"{where_c}: {TOKEN_ENV} is not read from a Secret"):
            e(not ref.get("optional"), f"{where_c}: {TOKEN_ENV}'s secretKeyRef is optional")
            keys = set()
            for s in find(k8s, "Secret", ref.get("name")):
                keys |= set(s.get("data") or {}) | set(s.get("stringData") or {})
            for g in (kz or {}).get("secretGenerator") or []:
                if g.get("name") == ref.get("name"):
                    if not (g.get("options") or {}).get("disableNameSuffixHash"):
                        keys.add(ref.get("key"))  # kustomize rewrites the reference itself
                    for src in (g.get("files") or []) + (g.get("literals") or []):
                        keys.add(src.partition("=")[0] if "=" in src else Path(src).name)
            e(ref.get("key") in keys, f"{where_c}: {TOKEN_ENV} reads key {ref.get('key')!r} of "
                                      f"Secret {ref.get('name')!r}, which no manifest defines")

    # Volumes: --run-dir (and a checkpoint mirror) on a writable ReadWriteMany claim, CONFIG in
    # a ConfigMap.
    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    mounts = container.get("volumeMounts") or []

    def mount_of(path):
        best = None
        for mt in mounts:
            if is_under(path, mt.get("mountPath", "")) and (
                    best is None or len(mt["mountPath"]) > len(best["mountPath"])):
                best = mt
        return best

    def check_shared_dir(path, what):
        mt = mount_of(path)
        if not e(mt, f"{where_c}: {what} {path} is on no mounted volume"):
            return
        e(not mt.get("readOnly"), f"{where_c}: {what} {path} is mounted read-only")
        claim = (volumes.get(mt.get("name"), {}).get("persistentVolumeClaim") or {}).get("claimName")
        if not e(claim, f"{where_c}: {what} {path} is on volume {mt.get('name')!r}, not a "
                        f"PersistentVolumeClaim"):
            return
        pvcs = find(k8s, "PersistentVolumeClaim", claim)
        if e(pvcs, f"{where_c}: {what} {path}: no PersistentVolumeClaim {claim}"):
            modes = pvcs[0]["spec"].get("accessModes") or []
            e("ReadWriteMany" in modes, f"PersistentVolumeClaim {claim} ({what}) is {modes}, "
                                        f"not ReadWriteMany: every pod writes checkpoints there")

    if e("--run-dir" in opts, f"{where_c}: no --run-dir (checkpoints must be on the shared volume)"):
        check_shared_dir(opts["--run-dir"], "--run-dir")
    overrides = [s.partition("=") for s in opts.get("--set", [])]
    for key, _, value in overrides:
        if key == "checkpoint.mirror_dir" and value:
            check_shared_dir(value, "checkpoint.mirror_dir")

    toml_text = None
    mt = mount_of(config_path)
    if e(mt, f"{where_c}: CONFIG {config_path} is on no mounted volume"):
        cm_name = (volumes.get(mt.get("name"), {}).get("configMap") or {}).get("name")
        if e(cm_name, f"{where_c}: CONFIG {config_path} is not in a ConfigMap volume"):
            rel = str(PurePosixPath(config_path).relative_to(mt["mountPath"]))
            items = volumes[mt["name"]]["configMap"].get("items")
            key = next((i["key"] for i in items if i.get("path") == rel), None) if items else rel
            cms = find(k8s, "ConfigMap", cm_name)
            data = (cms[0].get("data") or {}) if cms else {}
            if e(key in data, f"{where_c}: CONFIG {config_path}: ConfigMap {cm_name} has no key "
                              f"{key!r}"):
                toml_text = data[key]
    if toml_text is not None:
        try:
            toml = tomllib.loads(toml_text)
        except tomllib.TOMLDecodeError as err:
            errors.append(f"ConfigMap {cm_name} {key}: not TOML: {err}")
            toml = None
        if toml is not None:
            # train.threads = 0 means a thread per core of the node, not of the pod.
            threads = (toml.get("train") or {}).get("threads", 0)
            for k, _, v in overrides:
                if k == "train.threads":
                    threads = int(v)
            nproc = int(opts["--nproc-per-node"])
            cpu = ((container.get("resources") or {}).get("requests") or {}).get("cpu")
            if e(threads > 0, f"ConfigMap {cm_name}: train.threads is 0 (one thread per core "
                              f"of the node, not of the pod)") and cpu is not None:
                e(threads * nproc <= quantity_cores(cpu),
                  f"train.threads {threads} x --nproc-per-node {nproc} > the pod's {cpu} CPUs")
        if toml is not None:
            check_metrics_port(toml, overrides, container, spec.get("template") or {}, where_c, e)
        if tessera and toml is not None:
            with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
                f.write(toml_text)
                f.flush()
                cmd = [tessera, "config", f.name]
                for k, _, v in overrides:
                    cmd += ["--set", f"{k}={expand(v)}"]
                r = subprocess.run(cmd, capture_output=True, text=True)
                e(r.returncode == 0, f"`tessera config` rejects ConfigMap {cm_name} {key} with "
                                     f"the Job's --set: {r.stderr.strip()}")

    # Resources: what the scheduler needs to place one agent and its workers.
    res = container.get("resources") or {}
    e(all(k in (res.get("requests") or {}) for k in ("cpu", "memory")),
      f"{where_c}: resources.requests needs cpu and memory")
    e("memory" in (res.get("limits") or {}), f"{where_c}: no memory limit")

    # The headless Service gives the Job's pods DNS names: it selects them and is their subdomain.
    headless = [s for s in find(k8s, "Service")
                if s["spec"].get("clusterIP") == "None" and selects(s["spec"].get("selector"),
                                                                    pod_labels)]
    if e(headless, f"{where}: no headless Service (clusterIP None) selects the Job's pods "
                   f"{pod_labels}"):
        names = [s["metadata"]["name"] for s in headless]
        e(pod.get("subdomain") in names,
          f"{where}: subdomain {pod.get('subdomain')!r} is not the headless Service {names}")

    # Images: set in one place (kustomization images), never pulled by a registry host in git.
    images = []
    for _, doc in objects(k8s):
        tmpl = ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
        images += [c.get("image", "") for c in (tmpl.get("containers") or []) +
                   (tmpl.get("initContainers") or [])]
    kz_images = {i.get("name") for i in (kz or {}).get("images") or []}
    for image in images:
        e(not image_has_registry_host(image),
          f"image {image!r} names a registry host; users set their registry in kustomization.yaml")
        e(re.split(r"[:@]", image)[0] in kz_images,
          f"image {image!r} is not listed under images: in kustomization.yaml")
    return errors


# ---------------------------------------------------------------------------------------------
# Slurm

STUB_SRUN = r"""#!/bin/bash
# stub srun: records its argv and environment; STUB_MODE says what the "agents" do.
printf '%s\n' "$@" > "$STUB_LOG/srun.args"
printf '%s' "${TESSERA_JOB_TOKEN-<unset>}" > "$STUB_LOG/srun.token"
echo $$ > "$STUB_LOG/srun.pid"
case $STUB_MODE in
  done) exit 0 ;;
  fail) exit 1 ;;
  wait)  # run until SIGTERM, then "checkpoint" and exit 0 as the agents do
    trap 'sleep 0.2; echo saved > "$STUB_LOG/srun.saved"; exit 0' TERM
    for _ in $(seq 160); do sleep 0.05; done
    exit 9 ;;
esac
"""

STUB_SCANCEL = r"""#!/bin/bash
# stub scancel: records its argv; signals the stub srun only for a signal to the job steps.
printf '%s\n' "$@" >> "$STUB_LOG/scancel.args"
sig= batch=0
for a in "$@"; do
  case $a in
    --signal=*) sig=${a#--signal=} ;;
    -b|--batch|-f|--full) batch=1 ;;
  esac
done
prev=
for a in "$@"; do [[ $prev == -s ]] && sig=$a; prev=$a; done
if [[ $sig =~ ^(SIG)?TERM$|^15$ ]] && ((batch == 0)); then kill -TERM "$(cat "$STUB_LOG/srun.pid")"; fi
"""

STUB_SCONTROL = r"""#!/bin/bash
printf '%s\n' "$*" >> "$STUB_LOG/scontrol.args"
"""


def sbatch_directives(text):
    """#SBATCH options before the first command (sbatch reads no further), and the late ones."""
    early, late, in_header = [], [], True
    for line in text.splitlines()[1:]:
        s = line.strip()
        if s and not s.startswith("#"):
            in_header = False
        m = re.match(r"#SBATCH\s+(\S+)", s)
        if m:
            (early if in_header else late).append(m.group(1))
    return early, late


def check_sbatch_static(text):
    errors = []
    e = lambda cond, msg: expect(cond, msg, errors)  # noqa: E731
    with tempfile.NamedTemporaryFile("w", suffix=".sbatch") as f:
        f.write(text)
        f.flush()
        r = subprocess.run(["bash", "-n", f.name], capture_output=True, text=True)
        e(r.returncode == 0, f"train.sbatch: bash -n: {r.stderr.strip()}")
    e(text.startswith("#!"), "train.sbatch: no #! line (sbatch needs one)")
    early, late = sbatch_directives(text)
    e(not late, f"train.sbatch: #SBATCH {late} after the first command: sbatch ignores them")
    e("--ntasks-per-node=1" in early, "train.sbatch: no #SBATCH --ntasks-per-node=1 (one agent per node)")
    e("--requeue" in early, "train.sbatch: no #SBATCH --requeue (preempted jobs would not come back)")
    sig = [d for d in early if d.startswith("--signal=")]
    if e(sig, "train.sbatch: no #SBATCH --signal: the time limit kills the run without a checkpoint"):
        m = re.fullmatch(r"--signal=(B:|R:|RB:|BR:)?(?:SIG)?(TERM|15)@(\d+)", sig[0])
        if e(m, f"train.sbatch: {sig[0]}: the launcher treats SIGTERM as preemption, expected "
                f"--signal=[B:]TERM@SECONDS"):
            e(int(m.group(3)) >= MIN_GRACE_S,
              f"train.sbatch: {sig[0]}: less than {MIN_GRACE_S} s to checkpoint")
            if m.group(1) and "B" in m.group(1):
                e(re.search(r"^\s*trap\s+\S+\s+.*\bTERM\b", text, re.M),
                  "train.sbatch: --signal=B:... signals only the script, which traps no TERM")
    srun = [line for line in text.splitlines() if re.match(r"\s*srun\b", line)]
    e(srun, "train.sbatch: no srun line")
    e(re.search(r"^\s*srun\b[^\n]*(?:\\\n[^\n]*)*\btessera launch\b", text, re.M),
      "train.sbatch: srun does not start `tessera launch`")
    return errors


def run_sbatch(script, tmp, mode, job_id, restart_count=0, nnodes=3, preempt=False):
    """Runs the script with stubs; returns (rc, log dir, shared dir)."""
    stubs, log = tmp / "stubs", tmp / f"log-{job_id}-{restart_count}-{mode}"
    submit, shared = tmp / "submit", tmp / "shared"
    for d in (stubs, log, submit, shared):
        d.mkdir(exist_ok=True)
    for name, body in (("srun", STUB_SRUN), ("scancel", STUB_SCANCEL), ("scontrol", STUB_SCONTROL)):
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp), "STUB_LOG": str(log),
           "STUB_MODE": mode, "SLURM_JOB_ID": str(job_id), "SLURM_JOB_NUM_NODES": str(nnodes),
           "SLURM_NNODES": str(nnodes), "SLURM_SUBMIT_DIR": str(submit),
           "SLURM_CPUS_ON_NODE": "16", "SLURM_RESTART_COUNT": str(restart_count),
           "SHARED_DIR": str(shared)}
    # Output to a file, not a pipe: a stub still running after the script must not hold us.
    out_file = log / "out"
    with out_file.open("w") as out:
        proc = subprocess.Popen(["bash", str(script), "cfg.toml", "--set", "train.max_steps=7"],
                                cwd=submit, env=env, start_new_session=True,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        if preempt:
            deadline = time.monotonic() + 10
            while not (log / "srun.pid").exists() and proc.poll() is None:
                if time.monotonic() > deadline:
                    raise Failed("train.sbatch: srun never started")
                time.sleep(0.02)
            time.sleep(0.2)  # let the script reach `wait`
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=12)
        # What the agents had done when the script ended (the stubs may still be running).
        for f in log.iterdir():
            if f.name.startswith("srun."):
                f.rename(f.with_name("at_exit." + f.name))
    except subprocess.TimeoutExpired:
        raise Failed(f"train.sbatch ({mode}{', SIGTERM' if preempt else ''}) did not finish in 12 s")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, log, shared, out_file.read_text()


def read(path):
    return path.read_text() if path.exists() else None


def check_sbatch_run(text):
    errors = []
    e = lambda cond, msg: expect(cond, msg, errors)  # noqa: E731
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        script = tmp / "train.sbatch"
        script.write_text(text)
        try:
            # A run to the end.
            rc, log, shared, out = run_sbatch(script, tmp, "done", 4242)
            args = (read(log / "at_exit.srun.args") or "").splitlines()
            if not e(rc == 0 and args, f"train.sbatch (run to the end): exit {rc}, srun "
                                       f"{'ran' if args else 'never ran'}: {out.strip()}"):
                return errors
            if not e("tessera" in [PurePosixPath(a).name for a in args],
                     f"train.sbatch: srun does not run tessera: {args}"):
                return errors
            i = [PurePosixPath(a).name for a in args].index("tessera")
            srun_opts, argv = args[:i], args[i + 1:]
            e(argv[:1] == ["launch"], f"train.sbatch: srun runs `tessera {' '.join(argv[:1])}`, "
                                      f"not `tessera launch`")
            e("--ntasks-per-node=1" in srun_opts or "--ntasks-per-node=1" in sbatch_directives(text)[0],
              "train.sbatch: srun may start more than one agent per node")
            opts, config = parse_launch(argv[1:], "train.sbatch")
            e(config == "cfg.toml", f"train.sbatch: CONFIG is {config!r}, not the script's argument")
            e(opts.get("--set", [])[-1:] == ["train.max_steps=7"],
              "train.sbatch: the script's --set arguments are not passed on last")
            e(parse_nnodes(opts["--nnodes"], "train.sbatch") == (3, 3),
              f"train.sbatch: --nnodes {opts['--nnodes']} != the allocation's 3 nodes")
            check_int_option(opts, "--nproc-per-node", 1, "train.sbatch", errors)
            check_int_option(opts, "--max-restarts", 0, "train.sbatch", errors)
            rdzv = opts["--rdzv"]
            if e(rdzv.startswith("file://"), f"train.sbatch: the default --rdzv {rdzv} is not a "
                                             f"file store"):
                store = rdzv[len("file://"):]
                e(is_under(store, shared) and Path(store).is_dir(),
                  f"train.sbatch: the file store {store} is not a directory on the shared path "
                  f"{shared}")
            run_dir = opts.get("--run-dir", "")
            e(run_dir and is_under(run_dir, shared),
              f"train.sbatch: --run-dir {run_dir!r} is not on the shared path {shared}")
            token = read(log / "at_exit.srun.token") or ""
            e(re.fullmatch(r"[0-9a-f]{32,}", token),
              f"train.sbatch: agents get {TOKEN_ENV}={token!r}, not a generated token")
            for p in Path(run_dir or shared).rglob("*"):
                if p.is_file() and token and token in p.read_text(errors="replace"):
                    e(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0,
                      f"train.sbatch: {p.name} holds the job token and others can read it")
            e(read(log / "scontrol.args") is None, "train.sbatch: requeued a job that ended")

            # The same job requeued: same run and token. Another job: another token.
            rc2, log2, _, out2 = run_sbatch(script, tmp, "done", 4242, restart_count=1)
            args2 = (read(log2 / "at_exit.srun.args") or "").splitlines()
            e(rc2 == 0 and "--run-dir" in args2 and
              args2[args2.index("--run-dir") + 1] == run_dir and
              read(log2 / "at_exit.srun.token") == token,
              f"train.sbatch: a requeued attempt does not continue the run with the same token "
              f"({out2.strip()})")
            _, log3, _, _ = run_sbatch(script, tmp, "done", 4343)
            e(read(log3 / "at_exit.srun.token") not in (None, token),
              "train.sbatch: two jobs share a job token")

            # Preemption / time limit: SIGTERM to the script reaches the agents, the script
            # waits for their checkpoint, requeues and exits 0.
            rc, log, _, out = run_sbatch(script, tmp, "wait", 4444, preempt=True)
            e(read(log / "at_exit.srun.saved"),
              f"train.sbatch: the script ended before the agents had checkpointed (SIGTERM not "
              f"passed on to them, or not waited for): {out.strip()}")
            e(rc == 0, f"train.sbatch: exit {rc} after preemption, expected 0 ({out.strip()})")
            requeue = read(log / "scontrol.args") or ""
            e(re.search(r"\brequeue\b.*\b4444\b", requeue),
              f"train.sbatch: not requeued after SIGTERM (scontrol: {requeue!r})")

            # A failure the launcher gave up on: the script fails and does not requeue.
            rc, log, _, _ = run_sbatch(script, tmp, "fail", 4545)
            e(rc != 0, "train.sbatch: exit 0 although the agents failed")
            e(read(log / "scontrol.args") is None, "train.sbatch: requeued a failed run")
        except Failed as err:
            errors.append(str(err))
    return errors


def check_sbatch(text):
    return check_sbatch_static(text) + check_sbatch_run(text)


# ---------------------------------------------------------------------------------------------
# Mutations: each breaks one requirement and must be caught.

def job(k):
    return find(k, "Job")[0]


def pod(k):
    return job(k)["spec"]["template"]["spec"]


def launch_container(k):
    return next(c for c in pod(k)["containers"] if "launch" in (c.get("command") or []) +
                (c.get("args") or []))


def argv_set(k, option, value):
    c = launch_container(k)
    args = c["args"]
    args[args.index(option) + 1] = value


def argv_drop(k, option):
    args = launch_container(k)["args"]
    i = args.index(option)
    del args[i:i + 2]


def env_of(k, name):
    return next(v for v in launch_container(k)["env"] if v["name"] == name)


def service(k, name):
    return find(k, "Service", name)[0]


def headless(k):
    return next(s for s in find(k, "Service") if s["spec"].get("clusterIP") == "None" and
                s["metadata"]["name"] == pod(k).get("subdomain"))


def runs_volume(k):
    return next(v for v in pod(k)["volumes"] if "persistentVolumeClaim" in v)


def config_map(k):
    return find(k, "ConfigMap")[0]


def set_config_arg(k, path):
    args = launch_container(k)["args"]
    args[next(i for i, a in enumerate(args) if a.endswith(".toml"))] = path


def set_toml(k, old, new):
    data = config_map(k)["data"]
    key = next(iter(data))
    assert old in data[key], old
    data[key] = data[key].replace(old, new)


K8S_MUTATIONS = {
    "Job not Indexed": lambda k: job(k)["spec"].update(completionMode="NonIndexed"),
    "parallelism != --nnodes": lambda k: job(k)["spec"].update(parallelism=job(k)["spec"]["parallelism"] + 1),
    "completions != --nnodes": lambda k: job(k)["spec"].update(completions=job(k)["spec"]["completions"] + 1),
    "--nnodes != completions": lambda k: argv_set(k, "--nnodes", "7"),
    "tessera train, not launch": lambda k: launch_container(k).update(
        command=["tessera", "train"] + launch_container(k)["command"][2:]),
    "no --nproc-per-node": lambda k: argv_drop(k, "--nproc-per-node"),
    "no --max-restarts": lambda k: argv_drop(k, "--max-restarts"),
    "no --run-id": lambda k: argv_drop(k, "--run-id"),
    "--run-id of an undefined variable": lambda k: argv_set(k, "--run-id", "$(NO_SUCH_VAR)"),
    "--rdzv not etcd": lambda k: argv_set(k, "--rdzv", "file:///tmp/rdzv"),
    "--rdzv host is no Service": lambda k: argv_set(k, "--rdzv", "etcd://no-such-etcd:2379/tessera"),
    "--rdzv port is not the Service's": lambda k: argv_set(k, "--rdzv", "etcd://tessera-etcd:2380/tessera"),
    "etcd Service on another port": lambda k: service(k, "tessera-etcd")["spec"]["ports"][0].update(port=4001),
    "etcd Service selects nothing": lambda k: service(k, "tessera-etcd")["spec"].update(selector={"app": "none"}),
    "token as a literal": lambda k: env_of(k, TOKEN_ENV).update(value="x") or env_of(k, TOKEN_ENV).pop("valueFrom"),
    "token from an undefined Secret": lambda k: env_of(k, TOKEN_ENV)["valueFrom"]["secretKeyRef"].update(name="nope"),
    "token from an undefined key": lambda k: env_of(k, TOKEN_ENV)["valueFrom"]["secretKeyRef"].update(key="nope"),
    "no token": lambda k: launch_container(k).update(
        env=[v for v in launch_container(k)["env"] if v["name"] != TOKEN_ENV]),
    "no Secret generator": lambda k: k["kustomization"].pop("secretGenerator"),
    "--run-dir off the volume": lambda k: argv_set(k, "--run-dir", "/tmp/run"),
    "runs volume mounted elsewhere": lambda k: next(
        m for m in launch_container(k)["volumeMounts"] if m["name"] == runs_volume(k)["name"]).update(mountPath="/data"),
    "runs volume read-only": lambda k: next(
        m for m in launch_container(k)["volumeMounts"] if m["name"] == runs_volume(k)["name"]).update(readOnly=True),
    "runs volume an emptyDir": lambda k: runs_volume(k).update(emptyDir={}) or runs_volume(k).pop("persistentVolumeClaim"),
    "PVC ReadWriteOnce": lambda k: find(k, "PersistentVolumeClaim")[0]["spec"].update(accessModes=["ReadWriteOnce"]),
    "PVC claim name wrong": lambda k: runs_volume(k)["persistentVolumeClaim"].update(claimName="nope"),
    "metrics port not declared": lambda k: launch_container(k).pop("ports"),
    "metrics port annotation differs": lambda k: job(k)["spec"]["template"]["metadata"]["annotations"].update(
        {"prometheus.io/port": "9999"}),
    "metrics on loopback only": lambda k: set_toml(k, 'prometheus_host = "0.0.0.0"', 'prometheus_host = "127.0.0.1"'),
    "grace 30 s": lambda k: pod(k).update(terminationGracePeriodSeconds=30),
    "no grace set": lambda k: pod(k).pop("terminationGracePeriodSeconds"),
    "restartPolicy OnFailure": lambda k: pod(k).update(restartPolicy="OnFailure"),
    "no podFailurePolicy": lambda k: job(k)["spec"].pop("podFailurePolicy"),
    "no backoffLimit": lambda k: job(k)["spec"].pop("backoffLimit"),
    "headless Service selects other pods": lambda k: headless(k)["spec"].update(
        selector={"app.kubernetes.io/component": "other"}),
    "headless Service not headless": lambda k: headless(k)["spec"].pop("clusterIP"),
    "subdomain not the Service": lambda k: pod(k).update(subdomain="nope"),
    "CONFIG not in the ConfigMap": lambda k: set_config_arg(k, "/config/other.toml"),
    "ConfigMap not TOML": lambda k: set_toml(k, "[model]", "[model"),
    "train.threads 0": lambda k: set_toml(k, "threads = 4", "threads = 0"),
    "threads x nproc > CPUs": lambda k: set_toml(k, "threads = 4", "threads = 8"),
    "no CPU request": lambda k: launch_container(k)["resources"]["requests"].pop("cpu"),
    "a file missing from kustomization": lambda k: k["kustomization"]["resources"].remove("job.yaml"),
    "image with a registry host": lambda k: launch_container(k).update(image="registry.invalid/tessera:latest"),
    "mirror_dir on no volume": lambda k: launch_container(k)["args"].extend(
        ["--set", "checkpoint.mirror_dir=/mirror/x"]),
    "unknown launch option": lambda k: launch_container(k)["args"].extend(["--nodes", "2"]),
}

def gpu_limits(k):
    return launch_container(k)["resources"]["limits"]


def dshm_volume(k):
    return next(v for v in pod(k)["volumes"] if v["name"] == "dshm")


GPU_MUTATIONS = {
    "GPUs != --nproc-per-node": lambda k: gpu_limits(k).update({"nvidia.com/gpu": 4}),
    "no GPUs requested": lambda k: gpu_limits(k).pop("nvidia.com/gpu"),
    "train.device auto": lambda k: launch_container(k).update(
        args=[a if a != "train.device=cuda" else "train.device=auto" for a in launch_container(k)["args"]]),
    "/dev/shm on disk": lambda k: dshm_volume(k)["emptyDir"].pop("medium"),
    "no /dev/shm": lambda k: launch_container(k).update(
        volumeMounts=[m for m in launch_container(k)["volumeMounts"] if m["mountPath"] != "/dev/shm"]),
    "threads x nproc > CPUs": lambda k: launch_container(k)["resources"]["requests"].update(cpu="32"),
    "--nnodes changed by the patch": lambda k: argv_set(k, "--nnodes", "8"),
}

TESSERA_MUTATIONS = {
    "an unknown config key": lambda k: set_toml(k, "[train]", "[train]\nno_such_key = 1"),
}


def sbatch_sub(old, new, count=1):
    def f(text):
        assert old in text, old
        return text.replace(old, new, count)
    return f


SBATCH_MUTATIONS = {
    "bash syntax error": lambda t: t + "\nif then\n",
    "--ntasks-per-node=2": sbatch_sub("#SBATCH --ntasks-per-node=1", "#SBATCH --ntasks-per-node=2"),
    "no --requeue": sbatch_sub("#SBATCH --requeue\n", ""),
    "no --signal": sbatch_sub("#SBATCH --signal=B:TERM@120\n", ""),
    "--signal too late": sbatch_sub("#SBATCH --signal=B:TERM@120", "#SBATCH --signal=B:TERM@10"),
    "a command before #SBATCH": sbatch_sub("#SBATCH --job-name", "true\n#SBATCH --job-name"),
    "tessera train under srun": sbatch_sub("  tessera launch --nnodes", "  tessera train --nnodes"),
    "--rdzv off the shared path": sbatch_sub("RDZV=${RDZV:-file://$RUN_DIR/rdzv/$attempt}",
                                             "RDZV=${RDZV:-file://$HOME/rdzv}"),
    "--nnodes fixed": sbatch_sub('--nnodes "$NNODES"', "--nnodes 2"),
    "no trap": sbatch_sub("trap on_term TERM\n", ""),
    "scancel signals the script": sbatch_sub('scancel --signal=TERM "$SLURM_JOB_ID"',
                                             'scancel --full --signal=TERM "$SLURM_JOB_ID"'),
    "no requeue": sbatch_sub('scontrol requeue "$SLURM_JOB_ID" || true', "true"),
    "no wait for the checkpoint": sbatch_sub('while kill -0 "$srun_pid"', 'while false && kill -0 "$srun_pid"'),
    "token not exported": sbatch_sub("export TESSERA_JOB_TOKEN\n", ""),
    "token world-readable": sbatch_sub("umask 077", "umask 022"),
    "a token per attempt": sbatch_sub('if [[ ! -s $token_file ]]; then', "if true; then"),
    "run dir per attempt": sbatch_sub("RUN_DIR=$SHARED_DIR/$RUN_ID",
                                      "RUN_DIR=$SHARED_DIR/$RUN_ID.${SLURM_RESTART_COUNT:-0}"),
    "failure hidden": sbatch_sub('exit "$rc"', "exit 0"),
    "user --set dropped": sbatch_sub('"$@" &', "&"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessera", help="the tessera binary: validate the ConfigMap's TOML with it")
    ap.add_argument("--no-mutations", action="store_true", help="check the files only")
    args = ap.parse_args()

    k8s = load_k8s(K8S_DIR)
    sbatch = SBATCH.read_text()
    failures = 0

    errors = check_k8s(k8s, args.tessera)
    print(f"deploy/kubernetes: {len(list(objects(k8s)))} objects in {len(k8s['files'])} files: "
          f"{'ok' if not errors else 'FAILED'}")
    for err in errors:
        print("  " + " | ".join(err.splitlines()))
    failures += bool(errors)
    try:
        gpu = load_overlay(k8s, K8S_GPU_DIR)
        errors = check_k8s(gpu, args.tessera) + check_gpu(gpu)
    except (Failed, KeyError, IndexError, ValueError) as err:
        gpu, errors = None, [f"deploy/kubernetes/gpu: {err!r}"]
    print(f"deploy/kubernetes/gpu: {'ok' if not errors else 'FAILED'}")
    for err in errors:
        print("  " + " | ".join(err.splitlines()))
    failures += bool(errors)
    errors = check_sbatch(sbatch)
    print(f"deploy/slurm/train.sbatch: {'ok' if not errors else 'FAILED'}")
    for err in errors:
        print("  " + " | ".join(err.splitlines()))
    failures += bool(errors)

    if not args.no_mutations and not failures:
        mutations = [("k8s", n, f) for n, f in K8S_MUTATIONS.items()]
        if args.tessera:
            mutations += [("k8s", n, f) for n, f in TESSERA_MUTATIONS.items()]
        mutations += [("sbatch", n, f) for n, f in SBATCH_MUTATIONS.items()]
        missed = []
        mutations += [("k8s gpu", n, f) for n, f in GPU_MUTATIONS.items()]
        for target, name, mutate in mutations:
            if target == "k8s":
                broken = copy.deepcopy(k8s)
                mutate(broken)
                errs = check_k8s(broken, args.tessera)
            elif target == "k8s gpu":
                broken = copy.deepcopy(gpu)
                mutate(broken)
                errs = check_k8s(broken) + check_gpu(broken)
            else:
                errs = check_sbatch(mutate(sbatch))
            if not errs:
                missed.append(f"{target}: {name}")
            else:
                first = " | ".join(errs[0].splitlines())
                print(f"  mutation {target}: {name}: caught ({first})")
        print(f"mutations: {len(mutations) - len(missed)}/{len(mutations)} caught")
        for m in missed:
            print(f"  NOT CAUGHT: {m}")
        failures += bool(missed)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
