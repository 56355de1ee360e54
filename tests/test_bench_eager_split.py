"""benchmarks/bench_eager_split.py reaches into the eager fast path (its remembered calls): it must still find
the remembered call of a public op and time the four measures."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp

import ejk

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import bench_eager_split


def test_the_split_times_the_remembered_call_of_a_public_op() -> None:
    a = jnp.ones((16, 16), jnp.float32)
    jitted = jax.jit(lambda x, y: ejk.matmul(x, y))
    times = bench_eager_split.split(lambda: ejk.matmul(a, a), lambda: jitted(a, a), number=5, samples=2)
    assert set(times) == set(bench_eager_split.MEASURES)
    assert all(len(v) == 2 and all(t > 0 for t in v) for v in times.values())
    found, args = bench_eager_split._remembered(lambda: ejk.matmul(a, a))
    assert found.fn is not None and any(arg is a for arg in args)
