"""The conformance check of ``grouped_matmul``: uneven, empty and trailing-row groups, with gradients."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._grouped_matmul._op import grouped_matmul
from ejk.ops._grouped_matmul._reference import reference_grouped_matmul
from ejk.testing._op_checks import check_aval, compare, normal

__all__ = ["check_grouped_matmul"]


def check_grouped_matmul(
    platform: str,
    *,
    dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16),
    cfg: Any = None,
    precision: Any = "highest",
    preferred_element_type: Any = None,
    activation: str | None = None,
) -> int:
    """``ejk.grouped_matmul`` on ``platform``: uneven, empty and trailing-row groups, with gradients.

    ``precision``, ``preferred_element_type`` and ``activation`` go to both ``ejk.grouped_matmul`` and
    :func:`reference_grouped_matmul`; the output must be ``[m, n]`` in ``preferred_element_type``
    (``lhs.dtype`` when ``None``). With an activation ``rhs`` has ``2n`` columns.
    """
    options = {"precision": precision, "preferred_element_type": preferred_element_type}
    if activation is not None:
        options["activation"] = activation
    widen = 1 if activation is None else 2
    cases = ((40, 16, 8, [10, 0, 25, 3]), (7, 4, 3, [7]), (33, 8, 5, [0, 0, 33, 0]), (1, 4, 2, [0, 1]),
             (12, 8, 8, [0, 0, 0]))
    for dtype in dtypes:
        for seed, (m, k, n, sizes) in enumerate(cases):
            rng = np.random.default_rng(seed)
            lhs = normal(rng, (m, k), dtype)
            rhs = normal(rng, (len(sizes), k, widen * n), dtype)
            group_sizes = jnp.asarray(sizes, jnp.int32)

            def ours(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array = group_sizes) -> jax.Array:
                return grouped_matmul(lhs, rhs, group_sizes, platform=platform, cfg=cfg, **options)

            def ref(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array = group_sizes) -> jax.Array:
                return reference_grouped_matmul(lhs, rhs, group_sizes, **options)

            label = f"grouped_matmul[{platform}] m={m} sizes={sizes} {jnp.dtype(dtype).name} {options}"
            want = jax.ShapeDtypeStruct((m, n), dtype if preferred_element_type is None else preferred_element_type)
            check_aval(jax.eval_shape(ours, lhs, rhs), want, label)
            compare(ours, ref, (lhs, rhs), dtype, label, grads=True)
    return len(dtypes) * len(cases)
