"""``ejk.grouped_matmul``: the row-grouped matmul of mixture-of-experts layers."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ejk._contract import Extension
from ejk.execution.kernel import Invocation
from ejk.ops._base import ImplChoice, OpKernel, get_default_executor, run_op
from ejk.ops._check_common import as_array, matmul_precision
from ejk.ops._check_common import preferred_element_type as output_dtype
from ejk.ops._definition import define_op
from ejk.ops._eager import eager_fast_path
from ejk.ops._grouped_matmul._check import check_activation, check_grouped_matmul_args, check_grouped_matmul_values
from ejk.ops._matmul._op import DEFAULT_PRECISION

__all__ = ["DEFINITION", "GROUPED", "GROUPED_MATMUL_EXTENSIONS", "GroupedMatmulKernel", "grouped_matmul"]

#: ``activation`` came after the first implementations: one whose signature does not name it runs only
#: calls without it.
GROUPED_MATMUL_EXTENSIONS = (Extension("activation", legacy=None, since="0.2.0"),)


class GroupedMatmulKernel(OpKernel):
    """Dispatches ``grouped_matmul``; tunes on realistic uneven group sizes."""

    op_id = "grouped_matmul"
    version = "2"  # 2: precision / preferred_element_type are arguments
    array_names = ("lhs", "rhs", "group_sizes")
    positional = 3
    extensions = GROUPED_MATMUL_EXTENSIONS

    def normalize(
        self,
        lhs: Any,
        rhs: Any,
        group_sizes: Any,
        *,
        precision: Any = DEFAULT_PRECISION,
        preferred_element_type: Any = None,
        activation: Any = None,
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
        if (gated := check_activation(activation, rhs)) is not None:  # absent when None: the keys of plain calls
            static["activation"] = gated  # (and their cached configs) stay as they were
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


GROUPED = GroupedMatmulKernel()


@eager_fast_path(GROUPED, get_default_executor, values=check_grouped_matmul_values)
def grouped_matmul(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    precision: Any = DEFAULT_PRECISION,
    preferred_element_type: Any = None,
    activation: str | None = None,
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
        activation: ``None`` (the product), or ``"swiglu"``: ``rhs`` is ``[g, k, 2n]``, each
            expert's gate columns ``[:n]`` then its up columns ``[n:]``, and the call returns
            ``silu(z[:, :n]) * z[:, n:]`` (``[m, n]``) of the float32 product ``z``, rounded once,
            without writing ``z`` where the implementation fuses it (a mixture-of-experts layer's
            first matmul and its SwiGLU). The backward recomputes ``z``.
        platform: ``"auto"`` or a platform name to force.
        cfg: Explicit config; always wins.

    Returns:
        ``[m, n]`` in ``preferred_element_type`` (``[m, n / 2]`` with an activation).
    """
    arrays, static = GROUPED.normalize(lhs, rhs, group_sizes, precision=precision,
                                       preferred_element_type=preferred_element_type, activation=activation)
    return run_op(GROUPED, arrays, static, platform, cfg)  # type: ignore[no-any-return]


_HERE = __package__

DEFINITION = define_op(
    GROUPED, grouped_matmul,
    reference=f"{_HERE}._reference:reference_grouped_matmul",
    check=f"{_HERE}._conformance:check_grouped_matmul",
    shard_rule=f"{_HERE}._shard:grouped_rule",
    bench=f"{_HERE}._bench:BENCH",
    samples=f"{_HERE}._samples:samples",
)
