"""Where an eager call of a public op spends its host time: cProfile over many cached calls.

Complements ``bench_core.py`` (which measures the overhead) by saying where it goes. Prints the
functions with the most own time and the most cumulative time for ``ejk.matmul`` and
``ejk.flash_attention`` on tiny inputs (so the device work is negligible).

Usage: python benchmarks/profile_eager_ops.py [--calls N] [--top K]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
from collections.abc import Callable

import jax
import jax.numpy as jnp

import ejk


def _profile(label: str, call: Callable[[], object], calls: int, top: int) -> None:
    for _ in range(50):  # compile, fill the config caches
        jax.block_until_ready(call())
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    jax.block_until_ready(call())
    profiler.disable()
    for key in ("tottime", "cumulative"):
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text).sort_stats(key)
        stats.print_stats(top)
        body = text.getvalue()
        total = stats.total_tt  # type: ignore[attr-defined]
        print(f"## {label}: {calls} eager calls, {total / calls * 1e6:.1f} µs per call (profiled), by {key}")
        print(body[body.find("ncalls"):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}")
    a = jnp.ones((8, 8))
    q = jnp.ones((1, 16, 2, 8))
    print("matmul runs:", ejk.get_implementations("matmul") if hasattr(ejk, "get_implementations") else "?")
    _profile("ejk.matmul (8x8)", lambda: ejk.matmul(a, a), args.calls, args.top)
    _profile("ejk.flash_attention (1x16x2x8)", lambda: ejk.flash_attention(q, q, q), args.calls, args.top)


if __name__ == "__main__":
    main()
