"""The conformance check of ``rms_norm``: what ``ejk.testing.check_op("example_rms_norm", platform)`` runs.

Every implementation of ``rms_norm`` (this plugin's or another's) is compared with
:func:`ejk_example.reference.reference_rms_norm` over the edge cases below, values and gradients
of ``x`` and ``weight``, with ``ejk.testing``'s tolerances for the dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.testing import assert_close
from ejk_example.reference import reference_rms_norm

__all__ = ["RMS_NORM_CASES", "check_rms_norm"]

#: (x shape, eps): a vector, a batch, a 3-D activation, one row, one feature, a zero row, a large eps.
RMS_NORM_CASES: tuple[tuple[tuple[int, ...], float], ...] = (
    ((16,), 1e-6),
    ((8, 32), 1e-6),
    ((2, 5, 24), 1e-5),
    ((1, 7), 1e-6),
    ((6, 1), 1e-6),
    ((300, 8), 1e-6),  # more rows than the smallest block of the config space
    ((4, 16), 1.0),
)


def _value_and_vjp(fn: Callable[..., jax.Array], x: jax.Array, weight: jax.Array,
                   cotangent: jax.Array) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """The output and the cotangents of ``x`` and ``weight``, in one compiled function (fast on CPU)."""
    def both(x: jax.Array, weight: jax.Array, cotangent: jax.Array) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        out, pull = jax.vjp(fn, x, weight)
        return out, pull(cotangent)

    return jax.jit(both)(x, weight, cotangent)  # type: ignore[no-any-return]


def check_rms_norm(platform: str, *, dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16), cfg: Any = None,
                   cases: Sequence[tuple[tuple[int, ...], float]] = RMS_NORM_CASES) -> int:
    """``ejk.example_rms_norm(..., platform=platform, cfg=cfg)`` against the reference; returns the cases run."""
    from ejk_example.ops import rms_norm

    for dtype in dtypes:
        for seed, (shape, eps) in enumerate(cases):
            rng = np.random.default_rng(seed)
            x = jnp.asarray(rng.standard_normal(shape, np.float32), dtype)
            if seed == 1:  # a row of zeros: the output and its gradient stay finite
                x = x.at[0].set(0)
            weight = jnp.asarray(1 + rng.standard_normal(shape[-1:], np.float32) / 4, dtype)
            label = f"example_rms_norm[{platform}] {shape} eps={eps} {jnp.dtype(dtype).name}"

            def ours(x: jax.Array, weight: jax.Array, eps: float = eps) -> jax.Array:
                return rms_norm(x, weight, eps=eps, platform=platform, cfg=cfg)

            def ref(x: jax.Array, weight: jax.Array, eps: float = eps) -> jax.Array:
                return reference_rms_norm(x, weight, eps=eps)

            cotangent = jnp.asarray(rng.standard_normal(x.shape, np.float32), x.dtype)
            out, grads = _value_and_vjp(ours, x, weight, cotangent)
            want, want_grads = _value_and_vjp(ref, x, weight, cotangent)
            if (out.shape, out.dtype) != (want.shape, want.dtype):
                raise AssertionError(f"{label}: got {out.shape} {out.dtype}, want {want.shape} {want.dtype}")
            assert_close(out, want, dtype, what=label)
            for name, got, expected in zip(("dx", "dweight"), grads, want_grads, strict=True):
                assert_close(got, expected, dtype, what=f"{label} gradient {name}")
    return len(dtypes) * len(cases)
