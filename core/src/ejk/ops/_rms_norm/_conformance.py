"""The conformance check of ``rms_norm``: shapes, widths, dtypes, values and gradients, with and without a residual."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._rms_norm._op import rms_norm
from ejk.ops._rms_norm._reference import reference_rms_norm
from ejk.testing._op_checks import assert_close, check_aval, compare, normal

__all__ = ["RMS_NORM_RESIDUAL_SHAPES", "RMS_NORM_SHAPES", "check_rms_norm"]

#: Shapes of ``x`` in :func:`check_rms_norm`: a matrix, batched activations, one row, a width
#: that is not a power of two, a width of 1 and no rows at all.
RMS_NORM_SHAPES: tuple[tuple[int, ...], ...] = ((8, 32), (2, 3, 64), (1, 16), (5, 96), (4, 1), (0, 8))
#: Shapes of ``x`` and ``residual`` in the residual cases of :func:`check_rms_norm`: batched, a width that is
#: not a power of two, and no rows.
RMS_NORM_RESIDUAL_SHAPES: tuple[tuple[int, ...], ...] = ((2, 3, 64), (5, 96), (0, 8))


def _inputs(shape: tuple[int, ...], dtype: Any, seed: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``x`` with rows of different scales (some tiny, where ``eps`` matters), ``scale = 1 + noise``, a residual."""
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape[:-1]))
    rows = np.geomspace(1e-3, 10.0, num=max(count, 1))[:count]
    x = normal(rng, shape, jnp.float32) * jnp.asarray(rows, jnp.float32).reshape(*shape[:-1], 1)
    scale = 1.0 + 0.1 * normal(rng, shape[-1:], jnp.float32)
    return x.astype(dtype), scale.astype(dtype), normal(rng, shape, jnp.float32).astype(dtype)


def check_rms_norm(
    platform: str,
    *,
    dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16),
    cfg: Any = None,
    shapes: Sequence[tuple[int, ...]] = RMS_NORM_SHAPES,
    residual_shapes: Sequence[tuple[int, ...]] = RMS_NORM_RESIDUAL_SHAPES,
    eps: float = 1e-6,
) -> int:
    """``ejk.rms_norm`` on ``platform`` against the reference, with gradients; returns the cases run.

    ``x`` rows get different scales (some tiny, where ``eps`` matters); ``scale`` is ``1 + noise``.
    The ``residual_shapes`` cases pass ``residual=`` and check both outputs and the gradients of all
    three inputs (``residual_shapes=()`` for an implementation that does not take it).
    """
    for dtype in dtypes:
        for seed, shape in enumerate(shapes):
            x, scale, _ = _inputs(shape, dtype, seed)
            label = f"rms_norm[{platform}] {shape} {jnp.dtype(dtype).name} eps={eps}"

            def ours(x: jax.Array, scale: jax.Array) -> jax.Array:
                return rms_norm(x, scale, eps=eps, platform=platform, cfg=cfg)

            def ref(x: jax.Array, scale: jax.Array) -> jax.Array:
                return reference_rms_norm(x, scale, eps=eps)  # type: ignore[return-value]

            check_aval(jax.eval_shape(ours, x, scale), jax.eval_shape(ref, x, scale), label)
            compare(ours, ref, (x, scale), dtype, label, grads=True)
        for seed, shape in enumerate(residual_shapes):
            _check_residual(platform, _inputs(shape, dtype, 100 + seed), dtype, cfg, eps,
                            f"rms_norm[{platform}] {shape} {jnp.dtype(dtype).name} eps={eps} residual")
    return len(dtypes) * (len(shapes) + len(residual_shapes))


def _check_residual(platform: str, args: tuple[jax.Array, ...], dtype: Any, cfg: Any, eps: float, label: str) -> None:
    """Both outputs of a call with ``residual=``, and the gradients of ``x``, ``scale`` and ``residual`` for
    one random cotangent of each output."""

    def ours(x: jax.Array, scale: jax.Array, residual: jax.Array) -> jax.Array:
        return jnp.concatenate(rms_norm(x, scale, eps=eps, residual=residual, platform=platform, cfg=cfg), axis=-1)

    def ref(x: jax.Array, scale: jax.Array, residual: jax.Array) -> jax.Array:
        return jnp.concatenate(reference_rms_norm(x, scale, residual, eps=eps), axis=-1)

    got = rms_norm(args[0], args[1], eps=eps, residual=args[2], platform=platform, cfg=cfg)
    for name, g, w in zip(("output", "sum"), got, reference_rms_norm(*args, eps=eps), strict=True):
        assert_close(g, w, dtype, what=f"{label} {name}", strict=True)
    compare(ours, ref, args, dtype, label, grads=True)  # one array of both outputs: a cotangent reaches each
