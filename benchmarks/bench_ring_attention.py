"""Ring attention on a multi-GPU host: tokens/s on 1 vs N GPUs and how much communication is hidden.

Lines per sequence length (batch 1, 16 query / 8 kv heads, head dim 128, bfloat16, causal):

- ``1 GPU flash_attention``: the public op on the whole sequence (best implementation: cuDNN,
  Triton, …), the single-GPU reference,
- ``1 GPU ring``: ``ejk.ring_attention`` on a one-device mesh — the same local kernel
  (``flash_attention_lse``) as the ring, without communication,
- ``N GPU ring <layout>``: ``ejk.ring_attention`` on an N-device mesh (``--devices``, default all),
  sequence sharded, ``contiguous`` and ``zigzag``; the note gives the speed-up over one GPU's
  ``flash_attention`` and the scaling efficiency ``tokens/s(N GPUs) / (N · tokens/s(1 GPU ring))``,
- ``N GPU compute only`` / ``N GPU comm only``: the same ring with its ``ppermute`` removed
  (each device computes on the block it holds; same schedule, same work) and with its block
  compute replaced by a trivial function of the received blocks (only the transfers remain).
  Hidden fraction = ``1 - (t_ring - t_compute) / t_comm`` (clamped to [0, 1]): 1 means the
  transfers cost nothing on top of the compute.

Each in ``fwd`` and ``fwd+bwd`` (output plus dq, dk, dv in one jitted call). Timing as in
``_harness.time_ms`` (compile excluded, median of ``--reps``).

Usage (needs two or more GPUs; ``--smoke`` runs tiny shapes on two CPU devices):
    python benchmarks/bench_ring_attention.py
    python benchmarks/bench_ring_attention.py --seqs 32768,65536,131072 --modes fwd,fwd+bwd
    python benchmarks/bench_ring_attention.py --devices 4 --seqs 131072 --layouts zigzag
    python benchmarks/bench_ring_attention.py --smoke

The markdown table goes to ``$OUT/ring_attention_gpu.md`` when ``OUT`` is set, else to
``benchmarks/results/ring_attention_gpu.md`` (``--out`` overrides both).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from functools import partial
from typing import Any

if "--smoke" in sys.argv:  # two CPU devices; must be set before JAX starts
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import _harness
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import ejk
from ejk.parallel import ring_ablation

HEADS, KV_HEADS, DIM = 16, 8, 128


def _ring_fn(mesh: Mesh, layout: str, mode: str) -> Callable[..., Any]:
    spec = P(None, "sp")
    local = partial(ejk.ring_attention, axis_name="sp", causal=True, layout=layout)
    sharded = jax.shard_map(lambda q, k, v: local(q, k, v), mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    if mode == "fwd":
        return sharded
    return jax.grad(lambda q, k, v: sharded(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2))


def _single_fn(mode: str) -> Callable[..., Any]:
    fwd = partial(ejk.flash_attention, causal=True)
    if mode == "fwd":
        return fwd
    return jax.grad(lambda q, k, v: fwd(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2))


def main() -> None:
    p = _harness.parser(__doc__)
    p.add_argument("--seqs", default=None, help="comma-separated sequence lengths (default 32768,65536,131072)")
    p.add_argument("--modes", default="fwd,fwd+bwd")
    p.add_argument("--layouts", default="contiguous,zigzag")
    p.add_argument("--devices", type=int, default=None, help="ring size (default: every device)")
    args = _harness.parse(p)
    seqs = [int(s) for s in (args.seqs or ("256,512" if args.smoke else "32768,65536,131072")).split(",")]
    heads, kv_heads, dim = (4, 2, 32) if args.smoke else (HEADS, KV_HEADS, DIM)
    devices = jax.devices()
    n = args.devices or len(devices)
    if not 2 <= n <= len(devices):
        raise SystemExit(f"needs {max(n, 2)} devices, found {len(devices)} ({devices})")
    one, many = Mesh(np.array(devices[:1]), ("sp",)), Mesh(np.array(devices[:n]), ("sp",))
    dtype = jnp.float32 if args.smoke else jnp.bfloat16
    lines = _harness.header(
        f"Ring attention: 1 vs {n} GPUs", args,
        f"batch 1, {heads} q heads / {kv_heads} kv heads, head dim {dim}, {jnp.dtype(dtype).name}, causal",
        "rate = tokens/s (sequence length / time); ring lines use flash_attention_lse as the local kernel",
        "hidden = share of the transfers overlapped by compute: 1 - (t_ring - t_compute only) / t_comm only",
        case="sequence", rate="tokens/s",
    )
    for seq in seqs:
        keys = jax.random.split(jax.random.key(seq), 3)
        q = jax.random.normal(keys[0], (1, seq, heads, dim), dtype)
        k = jax.random.normal(keys[1], (1, seq, kv_heads, dim), dtype)
        v = jax.random.normal(keys[2], (1, seq, kv_heads, dim), dtype)
        for mode in args.modes.split(","):
            times: dict[str, float] = {}

            def line(name: str, fn: Callable[..., Any], note: Any = "", *, seq: int = seq, mode: str = mode,
                     times: dict[str, float] = times, inputs: tuple[Any, ...] = (q, k, v)) -> None:
                try:
                    ms = _harness.time_ms(fn, inputs, args.reps)
                except Exception as exc:  # reported on its line
                    traceback.print_exc()
                    lines.append(f"| {seq} | {mode} | {name} | - | - | {_harness.error_text(exc)} |")
                    return
                times[name] = ms
                extra = note(ms) if callable(note) else note
                lines.append(f"| {seq} | {mode} | {name} | {ms:.2f} | {seq / ms * 1e3:,.0f} | {extra} |")
                print(lines[-1], flush=True)

            line("1 GPU flash_attention", _single_fn(mode))
            line("1 GPU ring", _ring_fn(one, "contiguous", mode))
            base, single = times.get("1 GPU ring"), times.get("1 GPU flash_attention")

            def efficiency(ms: float, base: float | None = base, single: float | None = single) -> str:
                parts = [] if single is None else [f"{single / ms:.2f}x one GPU's flash_attention"]
                parts += [] if base is None else [f"scaling efficiency {base / ms / n:.0%}"]
                return "; ".join(parts)

            for layout in args.layouts.split(","):
                line(f"{n} GPU ring {layout}", _ring_fn(many, layout, mode), efficiency)
                with ring_ablation(communication=False):
                    line(f"{n} GPU compute only {layout}", _ring_fn(many, layout, mode))
                with ring_ablation(computation=False):
                    line(f"{n} GPU comm only {layout}", _ring_fn(many, layout, mode))
                ring, compute = times.get(f"{n} GPU ring {layout}"), times.get(f"{n} GPU compute only {layout}")
                comm = times.get(f"{n} GPU comm only {layout}")
                if None not in (ring, compute, comm) and comm:
                    hidden = min(1.0, max(0.0, 1 - (ring - compute) / comm))  # type: ignore[operator]
                    lines.append(f"| {seq} | {mode} | {n} GPU {layout}: communication hidden | - | - | "
                                 f"{hidden:.0%} (ring {ring:.2f} ms, compute {compute:.2f} ms, comm {comm:.2f} ms) |")
                    print(lines[-1], flush=True)
    _harness.write(lines, args, "ring_attention_gpu.md")


if __name__ == "__main__":
    main()
