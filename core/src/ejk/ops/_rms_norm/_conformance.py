"""The conformance check of ``rms_norm``: shapes, widths, dtypes, values and gradients."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._rms_norm._op import rms_norm
from ejk.ops._rms_norm._reference import reference_rms_norm
from ejk.testing._op_checks import check_aval, compare, normal

__all__ = ["RMS_NORM_SHAPES", "check_rms_norm"]

#: Shapes of ``x`` in :func:`check_rms_norm`: a matrix, batched activations, one row, a width
#: that is not a power of two, a width of 1 and no rows at all.
RMS_NORM_SHAPES: tuple[tuple[int, ...], ...] = ((8, 32), (2, 3, 64), (1, 16), (5, 96), (4, 1), (0, 8))


def check_rms_norm(
    platform: str,
    *,
    dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16),
    cfg: Any = None,
    shapes: Sequence[tuple[int, ...]] = RMS_NORM_SHAPES,
    eps: float = 1e-6,
) -> int:
    """``ejk.rms_norm`` on ``platform`` against the reference, with gradients; returns the cases run.

    ``x`` rows get different scales (some tiny, where ``eps`` matters); ``scale`` is ``1 + noise``.
    """
    for dtype in dtypes:
        for seed, shape in enumerate(shapes):
            rng = np.random.default_rng(seed)
            rows = np.geomspace(1e-3, 10.0, num=max(int(np.prod(shape[:-1])), 1))[: int(np.prod(shape[:-1]))]
            x = normal(rng, shape, jnp.float32) * jnp.asarray(rows, jnp.float32).reshape(*shape[:-1], 1)
            args = (x.astype(dtype), (1.0 + 0.1 * normal(rng, shape[-1:], jnp.float32)).astype(dtype))
            label = f"rms_norm[{platform}] {shape} {jnp.dtype(dtype).name} eps={eps}"

            def ours(x: jax.Array, scale: jax.Array) -> jax.Array:
                return rms_norm(x, scale, eps=eps, platform=platform, cfg=cfg)

            def ref(x: jax.Array, scale: jax.Array) -> jax.Array:
                return reference_rms_norm(x, scale, eps=eps)

            check_aval(jax.eval_shape(ours, *args), jax.eval_shape(ref, *args), label)
            compare(ours, ref, args, dtype, label, grads=True)
    return len(dtypes) * len(shapes)
