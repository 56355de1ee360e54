"""``ejk.matmul``: ``a @ b`` shaped as ``jnp.matmul``, accumulated in float32."""

from __future__ import annotations

from typing import Any

import jax

from ejk.ops._base import ImplChoice, OpKernel, get_default_executor, run_op
from ejk.ops._check_common import as_array, matmul_precision, result_dtype
from ejk.ops._check_common import preferred_element_type as output_dtype
from ejk.ops._definition import define_op
from ejk.ops._eager import eager_fast_path
from ejk.ops._matmul._check import check_matmul_args

__all__ = ["DEFAULT_PRECISION", "DEFINITION", "MATMUL", "MatmulKernel", "matmul"]

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


MATMUL = MatmulKernel()


@eager_fast_path(MATMUL, get_default_executor)  # validation reads shapes, dtypes, statics only
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


_HERE = __package__

DEFINITION = define_op(
    MATMUL, matmul,
    reference=f"{_HERE}._reference:reference_matmul",
    check=f"{_HERE}._conformance:check_matmul",
    shard_rule=f"{_HERE}._shard:matmul_rule",
    bench=f"{_HERE}._bench:BENCH",
    samples=f"{_HERE}._samples:samples",
)
