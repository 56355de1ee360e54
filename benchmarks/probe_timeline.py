"""The GPU timeline of back-to-back calls of one op, from a ``jax.profiler`` trace: each kernel's
start, duration and the gap before it, then the per-call span beside the wall-clock loop time.

Usage (GPU host): ``python benchmarks/probe_timeline.py grouped-equal [grouped-skewed matmul ...]``.
Cases: ``grouped-equal`` / ``grouped-skewed`` (``ejk.grouped_matmul(platform="triton")``, 64 experts,
k 2048, n 1536, 32k tokens), ``grouped-pallas-equal`` / ``grouped-pallas-skewed`` (the same through
ejk-pallas), ``matmul`` (``ejk.matmul(platform="triton")``, 8192³), ``einsum`` (the dense batched
einsum over equal groups). Where ``time_ms`` (wall) exceeds ``span_ms`` (device) the loop waits on
the host: on 2026-11-25 this showed ejk-triton's grouped matmul at 0.49 ms wall against 0.34 ms of
back-to-back kernels (``triton_moe_h100_20261125.md``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import _harness
import jax
import jax.numpy as jnp
from bench_triton_moe import FULL_MOE

import ejk
from ejk.bench import workload_for
from ejk.config import _device_clock


def case(name: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """``(fn, args)`` of a named case."""
    if name == "matmul":
        a = jax.random.normal(jax.random.key(0), (8192, 8192), jnp.bfloat16)
        return (lambda x, y: ejk.matmul(x, y, platform="triton", precision="default")), (a, a)
    groups = "skewed" if name.endswith("skewed") else "equal"
    lhs, rhs, sizes = workload_for(FULL_MOE[groups], jnp.bfloat16).inputs()
    if name == "einsum":
        return (lambda x, w: jnp.einsum("gmk,gkn->gmn", x.reshape(64, 512, 2048), w)), (lhs, rhs)
    platform = "pallas" if "pallas" in name else "triton"
    return (lambda x, w, g: ejk.grouped_matmul(x, w, g, platform=platform)), (lhs, rhs, sizes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cases", nargs="+", choices=("grouped-equal", "grouped-skewed", "grouped-pallas-equal",
                                                "grouped-pallas-skewed", "matmul", "einsum"))
    p.add_argument("--calls", type=int, default=6)
    args = p.parse_args()
    for name in args.cases:
        fn, inputs = case(name)
        compiled = jax.jit(fn).lower(*inputs).compile()
        for _ in range(_harness.WARMUP):
            jax.block_until_ready(compiled(*inputs))
        events = _harness.gpu_timeline(compiled, inputs, args.calls)
        print(f"== {name}: {args.calls} back-to-back calls", flush=True)
        prev_end = events[0][1]
        for kernel, start, end in events:
            print(f"  {kernel[:56]:56s} start {(start - events[0][1]) / 1e3:9.1f} us  dur {(end - start) / 1e3:8.1f}"
                  f"  gap {(start - prev_end) / 1e3:6.1f}")
            prev_end = max(prev_end, end)
        span = (_device_clock.events_span_ns(events) or 0) / args.calls / 1e6
        wall = _harness.time_ms(fn, inputs, 5)
        print(f"  per call: span {span:.3f} ms on the device, {wall:.3f} ms wall (time_ms)", flush=True)


if __name__ == "__main__":
    main()
