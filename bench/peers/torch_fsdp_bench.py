#!/usr/bin/python3
"""PyTorch distributed peer for Tessera's multi-process benchmark: FSDP or DDP over Gloo on CPU.

    /usr/bin/python3 bench/peers/torch_fsdp_bench.py
        [--mode fsdp_full_shard|fsdp_shard_grad_op|ddp] [--nproc 2] [--threads 1]
        [--preset bench|tiny] [--steps 12]

The launcher (this script without --worker) starts --nproc copies of itself with RANK,
WORLD_SIZE, MASTER_ADDR=127.0.0.1 and MASTER_PORT (a free port) set; each worker joins a Gloo
process group, sets torch.set_num_threads(--threads) and trains tests/torch_ref/llama.py (the
model that checks Tessera's numerics) in fp32. Rank 0 prints ONE JSON line.

Method (BENCHMARKS.md): random tokens from a fixed seed (seed 1234 + rank, so rank 0 sees the
single-process peer's batch), micro-batch 4 per rank, AdamW lr 3e-4, betas 0.9/0.95, eps 1e-8,
weight decay 0.1 on 2-D tensors only, grad-norm clip 1.0 (FSDP: model.clip_grad_norm_; DDP:
torch.nn.utils.clip_grad_norm_, the grads being identical on all ranks after the all-reduce).
One step = zero_grad, forward, backward, clip, update; the figure is the median step time of
steps 3..N. Losses reported are the mean over ranks (all-reduced once after the timed loop).
FSDP wraps every TransformerBlock as its own unit (transformer_auto_wrap_policy); the root unit
holds the embedding, the final norm and the LM head. Defaults otherwise (no prefetch settings,
no CPU offload, no mixed precision).

What is patched, in memory only, in the worker processes (Debian's torch 1.13, CPU build):

 0. Importing torch.distributed.fsdp at all on Debian's Python 3.11: torch 1.13's
    torch/distributed/_shard/sharded_tensor/metadata.py declares
    `tensor_properties: TensorProperties = field(default=TensorProperties())`, an unhashable
    default that 3.11's dataclasses reject. During that import only, dataclasses.field turns an
    unhashable default=X into default_factory=lambda: X (the same shared object as before).
 1. Collectives Gloo lacks in 1.13:
    - dist._all_gather_base(out, inp) -> dist.all_gather(list(out.chunk(world)), inp): the same
      bytes on the wire; Gloo writes straight into the chunk views of `out`.
    - dist._reduce_scatter_base(out, inp) and dist.reduce_scatter(out, in_list) ->
      dist.all_to_all_single(recv, inp) (rank r sends chunk j of its input to rank j, i.e. the
      (world-1)/world share of the input a ring reduce-scatter sends too), then a local sum of
      the world received chunks in rank order into `out` (SUM only; anything else raises).
      FSDP's default reduce_scatter_hook (torch.distributed.algorithms._comm_hooks.default_hooks)
      calls dist._reduce_scatter_base, so patching the dist module attribute is enough.
    The time spent inside these two plus the clip's all_reduce is recorded (they block on CPU:
    there are no streams) and reported as exposed_comm_s (median per step, steps 3..N) for the
    FSDP modes; DDP's bucketed all-reduce runs on Gloo's own threads, so it reports null.
 2. FSDP 1.13's CUDA assumptions (fully_sharded_data_parallel.py, flat_param.py and
    default_hooks.py), scoped to those three modules: their global name `torch` is replaced by a
    proxy that forwards every attribute to the real torch except `torch.cuda`, which becomes a
    stub: is_available() -> True (FSDP._lazy_init raises "FSDP does not support CPU only
    execution" otherwise; _init_streams asserts it), Stream()/current_stream() -> a no-op stream
    (wait_stream, synchronize, record_event), Event() -> a no-op event (record, synchronize,
    query), stream(s) -> a null context, synchronize() -> no-op, current_device() -> 0,
    device_count() -> 1. On CPU every op is synchronous, so dropping the stream ordering loses
    nothing.
 3. FullyShardedDataParallel._get_compute_device -> torch.device("cpu") (it returns cuda:N).
 4. The fsdp module's _to_kwargs (moves forward inputs to compute_device.index, which is None
    on CPU) -> a version that leaves the inputs where they are (they are already on the CPU).
 5. torch.Tensor.record_stream -> no-op (FSDP calls it on flat params and grads with the stub
    streams); torch.Tensor.cuda -> returns the tensor itself (clip_grad_norm_ calls
    `_calc_grad_norm(...).cuda()` before its all_reduce). Nothing here ever uses a GPU.

Weight decay under FSDP: 1.13 has no use_orig_params, so the optimizer sees 1-D flat shards and
cannot group by the original tensors' rank. The FSDP modes therefore run AdamW with
weight_decay=0 and apply the decoupled decay themselves before opt.step(), as
p.mul_(where(mask, 1 - lr*wd, 1)) with `mask` marking the elements of this rank's shard that
come from 2-D tensors (from the FlatParameter's _shapes/_numels and the shard's position).
torch's AdamW does exactly p.mul_(1 - lr*wd) then the Adam update, so the math is the same as
DDP's (one extra elementwise pass over the local shard; the optimizer's own mul_ by 1 - 0
remains). The first losses of FSDP and DDP must agree to ~1e-5, and later ones closely.
"""

import argparse
import contextlib
import functools
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
import types

import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "torch_ref"))
import llama  # noqa: E402  (path set just above)
from torch_llama_bench import blas_info  # noqa: E402  (this script's folder is on sys.path)

MODES = ("fsdp_full_shard", "fsdp_shard_grad_op", "ddp")
MICRO_BATCH = {"bench": 4, "tiny": 4}
DATA_SEED = 1234
INIT_SEED = 42
LR, BETAS, EPS, WD, CLIP = 3e-4, (0.9, 0.95), 1e-8, 0.1, 1.0

COMM_S = [0.0]  # seconds spent in blocking collectives since the last reset (FSDP modes)


def timed_comm(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            COMM_S[0] += time.perf_counter() - t0
    return wrapper


# ---------------------------------------------------------------- patches (see the docstring)

def _check_sync(op, async_op):
    if op != dist.ReduceOp.SUM:
        raise NotImplementedError(f"emulated reduce-scatter supports SUM only, not {op}")
    if async_op:
        raise NotImplementedError("emulated collectives are synchronous (async_op=False only)")


@timed_comm
def _all_gather_base(output_tensor, input_tensor, group=None, async_op=False):
    if async_op:
        raise NotImplementedError("emulated collectives are synchronous (async_op=False only)")
    world = dist.get_world_size(group)
    assert output_tensor.numel() == input_tensor.numel() * world and output_tensor.is_contiguous()
    dist.all_gather(list(output_tensor.view(-1).chunk(world)), input_tensor.contiguous(),
                    group=group)


def _sum_chunks_into(output, recv, world):
    torch.sum(recv.view(world, -1), dim=0, out=output.view(-1))


@timed_comm
def _reduce_scatter_base(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
    _check_sync(op, async_op)
    world = dist.get_world_size(group)
    assert input.numel() == output.numel() * world
    recv = torch.empty(input.numel(), dtype=input.dtype)
    dist.all_to_all_single(recv, input.contiguous().view(-1), group=group)
    _sum_chunks_into(output, recv, world)


@timed_comm
def _reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):
    _check_sync(op, async_op)
    world = dist.get_world_size(group)
    flat = torch.cat([t.reshape(-1) for t in input_list])
    recv = torch.empty_like(flat)
    dist.all_to_all_single(recv, flat, group=group)
    _sum_chunks_into(output, recv, world)


class _NoopStream:
    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def synchronize(self):
        pass

    def record_event(self, event=None):
        return event or _NoopEvent()

    def query(self):
        return True


class _NoopEvent:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass

    def wait(self, stream=None):
        pass

    def query(self):
        return True


def _cuda_stub():
    return types.SimpleNamespace(
        is_available=lambda: True,
        current_device=lambda: 0,
        device_count=lambda: 1,
        synchronize=lambda *a, **k: None,
        Stream=lambda *a, **k: _NoopStream(),
        current_stream=lambda *a, **k: _NoopStream(),
        Event=_NoopEvent,
        stream=lambda s=None: contextlib.nullcontext(),
        set_device=lambda *a, **k: None,
    )


class _TorchProxy(types.ModuleType):
    """`torch` as FSDP's modules see it: everything forwarded, except `cuda`, a CPU stub."""

    def __init__(self, real):
        super().__init__("torch")
        object.__setattr__(self, "_real", real)
        object.__setattr__(self, "cuda", _cuda_stub())

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_real"), name)


def import_fsdp_on_python311():
    """torch 1.13's torch.distributed._shard (imported by FSDP) declares a dataclass field with
    an unhashable instance default, which Python 3.11's dataclasses rejects ("mutable default
    ... use default_factory"). During that one import, dataclasses.field turns such a
    default=X into default_factory=lambda: X (the same shared X, so the same behaviour)."""
    import dataclasses
    real_field = dataclasses.field

    def field(*args, **kwargs):
        default = kwargs.get("default", dataclasses.MISSING)
        if default is not dataclasses.MISSING and type(default).__hash__ is None:
            del kwargs["default"]
            kwargs["default_factory"] = lambda: default
        return real_field(*args, **kwargs)

    dataclasses.field = field
    try:
        import torch.distributed.fsdp  # noqa: F401
    finally:
        dataclasses.field = real_field


def patch_torch_for_cpu_fsdp():
    import_fsdp_on_python311()
    import torch.distributed.algorithms._comm_hooks.default_hooks as default_hooks
    import torch.distributed.fsdp.flat_param as flat_param
    import torch.distributed.fsdp.fully_sharded_data_parallel as fsdp_mod

    dist._all_gather_base = _all_gather_base
    dist._reduce_scatter_base = _reduce_scatter_base
    dist.reduce_scatter = _reduce_scatter
    dist.all_reduce = timed_comm(dist.all_reduce)  # the clip's norm all_reduce (FSDP modes)

    proxy = _TorchProxy(torch)
    for mod in (fsdp_mod, flat_param, default_hooks):
        mod.torch = proxy

    fsdp_mod.FullyShardedDataParallel._get_compute_device = (
        lambda self, *args, **kwargs: torch.device("cpu"))

    def _to_kwargs_cpu(inputs, kwargs, device_id, use_side_stream_for_tensor_copies):
        return (tuple(inputs),), (dict(kwargs),)
    fsdp_mod._to_kwargs = _to_kwargs_cpu

    torch.Tensor.record_stream = lambda self, stream: None
    torch.Tensor.cuda = lambda self, *args, **kwargs: self


# ---------------------------------------------------------------- worker

def decay_factors(fsdp_model, rank):
    """For every FlatParameter of the FSDP model: this rank's shard of per-element factors,
    1 - lr*wd where the element comes from a 2-D tensor, 1 elsewhere (norm weights, padding)."""
    from torch.distributed.fsdp.flat_param import FlatParameter
    out = {}
    for p in fsdp_model.parameters():
        assert isinstance(p, FlatParameter), type(p)
        full = torch.cat([torch.full((n,), 1.0 - LR * WD if len(s) >= 2 else 1.0)
                          for n, s in zip(p._numels, p._shapes)])
        shard = p.numel()
        start = rank * shard
        mask = torch.ones(shard)
        piece = full[start:start + shard]
        mask[:piece.numel()] = piece
        out[p] = mask.to(p.dtype)
    return out


def worker(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(args.threads)
    fsdp = args.mode.startswith("fsdp")
    if fsdp:
        patch_torch_for_cpu_fsdp()
        warnings.filterwarnings("ignore", message="Module is put on CPU")  # known, intended
    dist.init_process_group("gloo", rank=rank, world_size=world)

    cfg = llama.PRESETS[args.preset]
    B, T = MICRO_BATCH[args.preset], cfg["seq_len"]
    model = llama.Llama(cfg, torch.float32)
    llama.init_weights(model, INIT_SEED)
    params = llama.count_params(model)

    if fsdp:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        strategy = {"fsdp_full_shard": ShardingStrategy.FULL_SHARD,
                    "fsdp_shard_grad_op": ShardingStrategy.SHARD_GRAD_OP}[args.mode]
        policy = functools.partial(transformer_auto_wrap_policy,
                                   transformer_layer_cls={llama.TransformerBlock})
        model = FSDP(model, sharding_strategy=strategy, auto_wrap_policy=policy)
        factors = decay_factors(model, rank)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0)

        def clip():
            model.clip_grad_norm_(CLIP)

        def decay():
            with torch.no_grad():
                for p, f in factors.items():
                    p.mul_(f)
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model)
        opt = llama.make_optimizer(model.module, lr=LR, beta1=BETAS[0], beta2=BETAS[1], eps=EPS,
                                   weight_decay=WD)

        def clip():
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)

        def decay():
            pass

    gen = torch.Generator().manual_seed(DATA_SEED + rank)
    tokens = torch.randint(0, cfg["vocab_size"], (B, T + 1), generator=gen)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    times, losses, comm = [], [], []
    dist.barrier()
    for _ in range(args.steps):
        COMM_S[0] = 0.0
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = llama.loss_fn(model(inputs), targets)
        loss.backward()
        clip()
        decay()
        opt.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
        comm.append(COMM_S[0])

    # Cross-rank summaries, once, after the timed loop.
    step_t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(step_t, op=dist.ReduceOp.MAX)  # a step ends when its slowest rank does
    loss_t = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(loss_t)
    loss_t /= world
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024],
                       dtype=torch.float64)
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    comm_t = torch.tensor(comm, dtype=torch.float64)
    dist.all_reduce(comm_t, op=dist.ReduceOp.MAX)

    if rank == 0:
        times = step_t.tolist()
        first = 2 if len(times) > 2 else 0
        median = statistics.median(times[first:])
        tokens_per_step = B * T * world
        flops_per_token = llama.model_flops_per_token(cfg)
        tokens_per_s = tokens_per_step / median
        result = {
            "impl": "pytorch",
            "mode": args.mode,
            "nproc": world,
            "threads": args.threads,
            "preset": args.preset,
            "params": params,
            "matmul_params": llama.matmul_params(cfg),
            "tokens_per_step": tokens_per_step,
            "steps": args.steps,
            "timed_steps": f"{first + 1}..{len(times)}",
            "median_step_s": median,
            "min_step_s": min(times[first:]),  # a hint of contention when far below the median
            "tokens_per_s": tokens_per_s,
            "model_flops_per_token": flops_per_token,
            "model_flops_per_s": flops_per_token * tokens_per_s,
            "exposed_comm_s": statistics.median(comm_t.tolist()[first:]) if fsdp else None,
            "peak_rss_bytes_per_rank": int(rss.item()),
            "first_loss": loss_t[0].item(),
            "last_loss": loss_t[-1].item(),
            "losses": [round(x, 6) for x in loss_t.tolist()],
            "step_times_s": [round(t, 4) for t in times],
            "torch_version": torch.__version__,
            "backend": "gloo",
            "ld_preload": os.environ.get("LD_PRELOAD", ""),
            "openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE", ""),
            "openblas_num_threads_env": os.environ.get("OPENBLAS_NUM_THREADS", ""),
        }
        result.update(blas_info())
        print(json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------- launcher

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, argv):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(args.nproc))
    procs = []
    for rank in range(args.nproc):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker"] + argv
        procs.append(subprocess.Popen(cmd, env=dict(env, RANK=str(rank))))
    rc = 0
    try:
        while procs:
            for p in list(procs):
                code = p.poll()
                if code is None:
                    continue
                procs.remove(p)
                if code != 0 and rc == 0:
                    rc = code if code > 0 else 1  # killed by a signal: -signum
                    print(f"torch_fsdp_bench: a worker exited with {code}; stopping the others",
                          file=sys.stderr)
                    for q in procs:
                        q.terminate()
            time.sleep(0.05)
    finally:
        for p in procs:
            p.kill()
    return rc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=MODES, default="fsdp_full_shard")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--preset", choices=sorted(MICRO_BATCH), default="bench")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < 1 or args.nproc < 1 or args.threads < 1:
        ap.error("--steps, --nproc and --threads must be >= 1")
    if args.worker:
        return worker(args)
    return launch(args, [a for a in sys.argv[1:] if a != "--worker"])


if __name__ == "__main__":
    sys.exit(main())
