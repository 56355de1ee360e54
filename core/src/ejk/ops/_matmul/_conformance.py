"""The conformance check of ``matmul``: shapes as ``jnp.matmul`` treats them, values and gradients."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._matmul._op import matmul
from ejk.ops._matmul._reference import reference_matmul
from ejk.testing._op_checks import check_aval, compare, normal

__all__ = ["MATMUL_SHAPES", "check_matmul"]


#: Shapes of ``check_matmul``: plain, batched, broadcasting batch dimensions and 1-D operands,
#: as ``jnp.matmul`` treats them.
MATMUL_SHAPES: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = (
    ((8, 16), (16, 4)),
    ((2, 3, 5, 7), (7, 9)),
    ((1, 1), (1, 1)),
    ((3, 1, 5, 7), (4, 7, 2)),  # batch dims broadcast: [3, 1] with [4] -> [3, 4]
    ((6, 5), (2, 5, 3)),  # only b batched
    ((7,), (2, 7, 3)),  # 1-D a: a row
    ((2, 4, 7), (7,)),  # 1-D b: a column
    ((6,), (6,)),  # both 1-D: a scalar
)


def check_matmul(
    platform: str,
    *,
    dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16),
    cfg: Any = None,
    precision: Any = "highest",
    preferred_element_type: Any = None,
    shapes: Sequence[tuple[tuple[int, ...], tuple[int, ...]]] = MATMUL_SHAPES,
) -> int:
    """``ejk.matmul`` on ``platform`` against the reference, with gradients; returns the cases run.

    ``precision`` and ``preferred_element_type`` go to both ``ejk.matmul`` and
    :func:`reference_matmul`; the output's shape and dtype must be ``jnp.matmul``'s (in
    ``preferred_element_type`` when given). Tolerances are those of the input dtype.
    """
    options = {"precision": precision, "preferred_element_type": preferred_element_type}
    for dtype in dtypes:
        for seed, (sa, sb) in enumerate(shapes):
            rng = np.random.default_rng(seed)
            args = (normal(rng, sa, dtype), normal(rng, sb, dtype))
            label = f"matmul[{platform}] {sa}x{sb} {jnp.dtype(dtype).name} {options}"

            def ours(a: jax.Array, b: jax.Array) -> jax.Array:
                return matmul(a, b, platform=platform, cfg=cfg, **options)

            def ref(a: jax.Array, b: jax.Array) -> jax.Array:
                return reference_matmul(a, b, **options)

            want = jax.eval_shape(lambda a, b: jnp.matmul(a, b, preferred_element_type=preferred_element_type), *args)
            check_aval(jax.eval_shape(ours, *args), want, label)
            compare(ours, ref, args, dtype, label, grads=True)
    return len(dtypes) * len(shapes)
