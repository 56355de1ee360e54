"""``ejk.matmul`` and ``ejk.grouped_matmul`` (mixture-of-experts)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ejk.execution.kernel import Invocation
from ejk.ops._base import ImplChoice, OpKernel, run_op
from ejk.ops._check_common import as_array
from ejk.ops._check_grouped import check_grouped_matmul_args, check_matmul_args
from ejk.ops._definition import define_op

__all__ = ["GroupedMatmulKernel", "MatmulKernel", "grouped_matmul", "matmul"]


class MatmulKernel(OpKernel):
    """Dispatches ``matmul`` to the registered implementations."""

    op_id = "matmul"
    version = "1"
    array_names = ("a", "b")
    positional = 2

    def normalize(self, a: Any, b: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        a, b = as_array("matmul", "a", a), as_array("matmul", "b", b)
        check_matmul_args(a, b)
        return (a, b), {}


class GroupedMatmulKernel(OpKernel):
    """Dispatches ``grouped_matmul``; tunes on realistic uneven group sizes."""

    op_id = "grouped_matmul"
    version = "1"
    array_names = ("lhs", "rhs", "group_sizes")
    positional = 3

    def normalize(self, lhs: Any, rhs: Any, group_sizes: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        lhs, rhs, group_sizes = (as_array("grouped_matmul", n, x)
                                 for n, x in (("lhs", lhs), ("rhs", rhs), ("group_sizes", group_sizes)))
        check_grouped_matmul_args(lhs, rhs, group_sizes)
        return (lhs, rhs, group_sizes), {}

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


def matmul(a: jax.Array, b: jax.Array, *, platform: str = "auto", cfg: ImplChoice | Any | None = None) -> jax.Array:
    """``a @ b`` with float32 accumulation.

    Args:
        a: ``[..., m, k]``.
        b: ``[k, n]``.
        platform: ``"auto"`` or a platform name to force.
        cfg: Explicit config; always wins.

    Returns:
        ``[..., m, n]`` in ``result_type(a, b)``.
    """
    return run_op(MATMUL, *MATMUL.normalize(a, b), platform, cfg)  # type: ignore[no-any-return]


def grouped_matmul(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    platform: str = "auto",
    cfg: ImplChoice | Any | None = None,
) -> jax.Array:
    """Row-grouped matmul: rows of ``lhs`` in consecutive groups, group i times ``rhs[i]``.

    Never materialises a dense ``[g, m, n]``.

    Args:
        lhs: ``[m, k]``.
        rhs: ``[g, k, n]``.
        group_sizes: ``[g]`` int32, non-negative, ``sum <= m``; rows past the sum give zeros;
            empty groups are fine.
        platform: ``"auto"`` or a platform name to force.
        cfg: Explicit config; always wins.

    Returns:
        ``[m, n]`` in ``lhs.dtype``.
    """
    return run_op(GROUPED, *GROUPED.normalize(lhs, rhs, group_sizes), platform, cfg)  # type: ignore[no-any-return]


define_op(MATMUL, matmul, reference="ejk.testing:reference_matmul", check="ejk.testing:check_matmul")
define_op(GROUPED, grouped_matmul, reference="ejk.testing:reference_grouped_matmul",
          check="ejk.testing:check_grouped_matmul")
