"""``ejk.bench.eager_split`` reaches into the eager fast path (its remembered calls): it must still find the
remembered call of a public op and time the four measures (``benchmarks/bench_eager_split.py`` runs it)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import ejk
from ejk.bench import EAGER_MEASURES, eager_split


def test_the_split_times_the_remembered_call_of_a_public_op() -> None:
    a = jnp.ones((16, 16), jnp.float32)
    jitted = jax.jit(lambda x, y: ejk.matmul(x, y))
    times = eager_split(lambda: ejk.matmul(a, a), lambda: jitted(a, a), number=5, samples=2)
    assert set(times) == set(EAGER_MEASURES)
    assert all(len(v) == 2 and all(t > 0 for t in v) for v in times.values())


def test_a_call_off_the_fast_path_is_an_error() -> None:
    jitted = jax.jit(lambda: jnp.ones(3))
    with pytest.raises(RuntimeError, match="remembered eager call"):
        eager_split(jitted, jitted, number=2, samples=1)


def test_a_caller_that_indexes_the_result_still_times_ejk_alone() -> None:
    """The ``ejk`` measure swaps the remembered function for a stand-in returning its real result: a caller that
    indexes the op's output (the linear-attention workloads return ``(out, state)[0]``) keeps working."""
    a = jnp.ones((8, 8), jnp.float32)
    jitted = jax.jit(lambda x: ejk.matmul(x, x)[0])
    times = eager_split(lambda: ejk.matmul(a, a)[0], lambda: jitted(a), number=3, samples=1)
    assert all(len(v) == 1 for v in times.values())
