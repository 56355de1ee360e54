"""``ejk.matmul`` and ``ejk.grouped_matmul`` (mixture-of-experts)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ejk.execution.kernel import Invocation
from ejk.ops._base import ImplChoice, OpKernel, run_op
from ejk.ops._check_common import as_array, matmul_precision, result_dtype
from ejk.ops._check_common import preferred_element_type as output_dtype
from ejk.ops._check_grouped import check_grouped_matmul_args, check_matmul_args
from ejk.ops._definition import define_op

__all__ = ["DEFAULT_PRECISION", "GroupedMatmulKernel", "MatmulKernel", "grouped_matmul", "matmul"]

#: ejk's default ``precision`` for every matmul-like op: full float32 products (``jnp.matmul``'s
#: default, ``None``, is the backend's fast path, e.g. TF32 on NVIDIA GPUs).
DEFAULT_PRECISION = "highest"


class MatmulKernel(OpKernel):
    """Dispatches ``matmul`` to the registered implementations."""

    op_id = "matmul"
    version = "2"  # 2: jnp.matmul shapes; precision / preferred_element_type are arguments
    array_names = ("a", "b")
    positional = 2

    def normalize(
        self, a: Any, b: Any, *, precision: Any = DEFAULT_PRECISION, preferred_element_type: Any = None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        a, b = as_array("matmul", "a", a), as_array("matmul", "b", b)
        check_matmul_args(a, b)
        static = {
            "precision": matmul_precision("matmul", precision),
            "preferred_element_type": output_dtype(
                "matmul", preferred_element_type, result_dtype(a.dtype, b.dtype),
                default_means="result_type(a, b)",
            ),
        }
        return (a, b), static


class GroupedMatmulKernel(OpKernel):
    """Dispatches ``grouped_matmul``; tunes on realistic uneven group sizes."""

    op_id = "grouped_matmul"
    version = "2"  # 2: precision / preferred_element_type are arguments
    array_names = ("lhs", "rhs", "group_sizes")
    positional = 3

    def normalize(
        self,
        lhs: Any,
        rhs: Any,
        group_sizes: Any,
        *,
        precision: Any = DEFAULT_PRECISION,
        preferred_element_type: Any = None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        lhs, rhs, group_sizes = (as_array("grouped_matmul", n, x)
                                 for n, x in (("lhs", lhs), ("rhs", rhs), ("group_sizes", group_sizes)))
        check_grouped_matmul_args(lhs, rhs, group_sizes)
        static = {
            "precision": matmul_precision("grouped_matmul", precision),
            "preferred_element_type": output_dtype(
                "grouped_matmul", preferred_element_type, lhs.dtype, default_means="lhs.dtype"
            ),
        }
        return (lhs, rhs, group_sizes), static

    def tuning_args(self, inv: Invocation[ImplChoice], seed: int = 0) -> tuple[Any, ...]:
        lhs, rhs, group_sizes = super().tuning_args(inv, seed)
        m, groups = lhs.shape[0], rhs.shape[0]
        rng = np.random.default_rng(seed)
        weights = rng.dirichlet(np.ones(groups)) if groups else np.zeros(0)
        sizes = np.floor(weights * m).astype(np.int64)
        if groups:
            sizes[rng.integers(groups)] += m - int(sizes.sum())  # every row in some group
        return lhs, rhs, jax.numpy.asarray(sizes, dtype=group_sizes.dtype)


MATMUL = MatmulKernel()
GROUPED = GroupedMatmulKernel()


def matmul(
    a: jax.Array,
    b: jax.Array,
    *,
    precision: Any = DEFAULT_PRECISION,
    preferred_element_type: Any = None,
    platform: str = "auto",
    cfg: ImplChoice | Any | None = None,
) -> jax.Array:
    """``a @ b`` shaped as ``jnp.matmul``, accumulated in float32.

    ``a [..., m, k] @ b [..., k, n] -> [..., m, n]`` where the batch dimensions broadcast
    (NumPy rules). A 1-D ``a`` ``[k]`` is a row and a 1-D ``b`` ``[k]`` a column; their
    dimension is dropped from the result, as in ``jnp.matmul``.

    Args:
        a: ``[..., m, k]`` or ``[k]``; bfloat16, float16 or float32.
        b: ``[..., k, n]`` or ``[k]``; bfloat16, float16 or float32.
        precision: Precision of the products, as in ``jax.lax.dot_general``: ``"highest"``
            (the default: full float32 products for float32 inputs; ``jnp.matmul``'s default
            is ``None``), ``"high"``, ``"default"`` (the backend's fast path, e.g. TF32 on
            NVIDIA GPUs), a ``jax.lax.Precision``, a pair of these (lhs, rhs), or ``None``
            (JAX's default: ``jax_default_matmul_precision``, else ``"default"``).
        preferred_element_type: Output dtype (bfloat16, float16 or float32); ``None`` (the
            default) means ``result_type(a, b)``. Accumulation is float32 either way.
        platform: ``"auto"`` or a platform name to force.
        cfg: Explicit config; always wins. It only tunes speed: numerics are set by
            ``precision`` and ``preferred_element_type``.

    Returns:
        The broadcast batch dimensions, then ``m`` (unless ``a`` is 1-D), then ``n`` (unless
        ``b`` is 1-D), in ``preferred_element_type``.
    """
    arrays, static = MATMUL.normalize(a, b, precision=precision, preferred_element_type=preferred_element_type)
    return run_op(MATMUL, arrays, static, platform, cfg)  # type: ignore[no-any-return]


def grouped_matmul(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    precision: Any = DEFAULT_PRECISION,
    preferred_element_type: Any = None,
    platform: str = "auto",
    cfg: ImplChoice | Any | None = None,
) -> jax.Array:
    """Row-grouped matmul: rows of ``lhs`` in consecutive groups, group i times ``rhs[i]``.

    Never materialises a dense ``[g, m, n]``. Accumulated in float32.

    Args:
        lhs: ``[m, k]``.
        rhs: ``[g, k, n]``.
        group_sizes: ``[g]`` int32, non-negative, ``sum <= m``; rows past the sum give zeros;
            empty groups are fine.
        precision: Precision of the products (forward and backward), as for :func:`matmul`;
            default ``"highest"``.
        preferred_element_type: Output dtype (bfloat16, float16 or float32); ``None`` (the
            default) means ``lhs.dtype``. Gradients are in the dtypes of ``lhs`` and ``rhs``.
        platform: ``"auto"`` or a platform name to force.
        cfg: Explicit config; always wins.

    Returns:
        ``[m, n]`` in ``preferred_element_type``.
    """
    arrays, static = GROUPED.normalize(lhs, rhs, group_sizes, precision=precision,
                                       preferred_element_type=preferred_element_type)
    return run_op(GROUPED, arrays, static, platform, cfg)  # type: ignore[no-any-return]


define_op(MATMUL, matmul, reference="ejk.testing:reference_matmul", check="ejk.testing:check_matmul")
define_op(GROUPED, grouped_matmul, reference="ejk.testing:reference_grouped_matmul",
          check="ejk.testing:check_grouped_matmul")
