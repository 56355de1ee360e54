"""Conformance of a platform's operations: the one tolerance table, the comparisons, and :func:`check_op`.

Each op's own check lives with the op (its definition's ``check``); a plugin's test-suite calls,
for example, ``check_op("flash_attention", "pallas")`` to compare its implementation with the op's
reference over the edge cases every platform must get right, forward values and gradients, with
tolerances that fit the dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.testing._cases import values_and_grads
from ejk.tolerances import TOLERANCES, tolerance

__all__ = ["TOLERANCES", "assert_close", "check_aval", "check_op", "compare", "normal", "tolerance"]



def assert_close(got: Any, want: Any, dtype: Any, *, what: str = "output", kind: str | None = None,
                 strict: bool = False) -> None:
    """Compare in float32, scaled by the reference's magnitude, with the tolerance of ``dtype``
    (and ``kind``, see :data:`TOLERANCES`).

    Args:
        got: The result under test.
        want: The reference result.
        dtype: Picks the tolerance (the dtype the computation ran in).
        what: Names the compared value in the failure message.
        kind: A kind of result with its own rows in :data:`TOLERANCES` (e.g. ``"matmul"``).
        strict: Also require ``got`` to have ``want``'s shape and dtype.

    Raises:
        AssertionError: naming ``what``, when the values (or, with ``strict``, shape or dtype) differ.
    """
    if strict and (np.shape(got), jnp.dtype(got.dtype)) != (np.shape(want), jnp.dtype(want.dtype)):
        raise AssertionError(f"{what}: got shape {np.shape(got)} dtype {jnp.dtype(got.dtype).name}, "
                             f"want shape {np.shape(want)} dtype {jnp.dtype(want.dtype).name}")
    got32 = np.asarray(jnp.asarray(got, jnp.float32))
    want32 = np.asarray(jnp.asarray(want, jnp.float32))
    scale = max(float(np.max(np.abs(want32), initial=0.0)), 1.0)
    atol, rtol = tolerance(dtype, kind)
    np.testing.assert_allclose(got32 / scale, want32 / scale, atol=atol, rtol=rtol, err_msg=what)


def normal(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """Standard normal values drawn on the host: no compilation per shape (``jax.random`` compiles one)."""
    return jnp.asarray(rng.standard_normal(shape, np.float32), dtype)


def compare(ours: Callable[..., Any], ref: Callable[..., Any], args: tuple[Any, ...], dtype: Any,
            label: str = "output", grads: bool = True, *, cotangent: Any = None) -> None:
    """Assert ``ours(*args)`` matches ``ref(*args)`` within the tolerance of ``dtype`` and, with ``grads``,
    so do their gradients for one output cotangent (``cotangent``, else a random one; an argument either
    gives ``None`` for is skipped)."""
    if not grads:
        assert_close(ours(*args), ref(*args), dtype, what=label)
        return
    out, got_grads = values_and_grads(ours, args, cotangent=cotangent)  # one cheaply compiled program per case
    want, want_grads = values_and_grads(ref, args, cotangent=cotangent)  # the same cotangent (seed 7)
    assert_close(out, want, dtype, what=label)
    names = ("d" + str(i) for i in range(len(args)))
    for name, got_g, want_g in zip(names, got_grads, want_grads, strict=True):
        if want_g is not None and got_g is not None:
            assert_close(got_g, want_g, dtype, what=f"{label} gradient {name}")


def check_aval(got: Any, want: Any, label: str) -> None:
    """Assert two abstract values (``jax.eval_shape`` results) have the same shape and dtype."""
    if (got.shape, jnp.dtype(got.dtype)) != (want.shape, jnp.dtype(want.dtype)):
        raise AssertionError(f"{label}: got shape {got.shape} dtype {jnp.dtype(got.dtype).name}, "
                             f"want shape {want.shape} dtype {jnp.dtype(want.dtype).name}")


def check_op(name: str, platform: str, **options: Any) -> int:
    """Run the conformance check of operation ``name`` (built in or defined by a plugin with
    :func:`ejk.ops.define_op`) on ``platform``; returns the cases run.

    Raises:
        ValueError: for an unknown operation, or one defined without a conformance check.
    """
    from ejk.ops import get_op

    check = get_op(name).check_fn()
    if check is None:
        raise ValueError(f"operation {name!r} was defined without a conformance check (define_op(..., check=))")
    return check(platform, **options)
