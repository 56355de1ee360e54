"""``ejk.rms_norm``: root-mean-square layer normalisation, statistics in float32, optionally fused with
the residual addition before it."""

from __future__ import annotations

from typing import Any, overload

import jax

from ejk._contract import Extension
from ejk.ops._base import ImplChoice, OpKernel, get_default_executor, run_op
from ejk.ops._check_common import as_array
from ejk.ops._definition import define_op
from ejk.ops._eager import eager_fast_path
from ejk.ops._rms_norm._check import check_rms_norm_args

__all__ = ["DEFINITION", "KERNEL", "RMS_NORM_EXTENSIONS", "RMS_NORM_RESIDUALS", "RmsNormKernel", "rms_norm"]

#: Residual format of the implementations' custom VJPs: ``(x, scale, inv_rms)``, ``inv_rms`` the
#: float32 ``1 / sqrt(mean(x²) + eps)`` of each row, shaped ``x.shape[:-1]`` (see docs/KERNEL_CONTRACT.md).
#: With ``residual``: ``(h, scale, inv_rms, x[..., :0], residual[..., :0])``, ``h = x + residual`` the
#: normalised sum and the empty slices the inputs' ``shard_map`` types (for ``cotangent_like``).
RMS_NORM_RESIDUALS = "rms_norm:x+scale+inv_rms"

#: ``residual`` came after the first implementations: one whose signature does not name it runs only
#: calls without it.
RMS_NORM_EXTENSIONS = (Extension("residual", legacy=None, since="0.2.0"),)


class RmsNormKernel(OpKernel):
    """Dispatches ``rms_norm`` to the registered implementations."""

    op_id = "rms_norm"
    version = "1"
    array_names = ("x", "scale", "residual")
    positional = 2
    extensions = RMS_NORM_EXTENSIONS

    def normalize(self, x: Any, scale: Any, *, eps: Any = 1e-6,
                  residual: Any = None) -> tuple[tuple[Any, ...], dict[str, Any]]:
        x, scale = as_array("rms_norm", "x", x), as_array("rms_norm", "scale", scale)
        residual = None if residual is None else as_array("rms_norm", "residual", residual)
        return (x, scale, residual), {"eps": check_rms_norm_args(x, scale, eps=eps, residual=residual)}


KERNEL = RmsNormKernel()


@overload
def rms_norm(x: jax.Array, scale: jax.Array, *, eps: float = 1e-6, residual: None = None, platform: str = "auto",
             cfg: ImplChoice | Any | None = None) -> jax.Array: ...


@overload
def rms_norm(x: jax.Array, scale: jax.Array, *, eps: float = 1e-6, residual: jax.Array, platform: str = "auto",
             cfg: ImplChoice | Any | None = None) -> tuple[jax.Array, jax.Array]: ...


@eager_fast_path(KERNEL, get_default_executor)  # validation reads shapes, dtypes, statics only
def rms_norm(
    x: jax.Array,
    scale: jax.Array,
    *,
    eps: float = 1e-6,
    residual: jax.Array | None = None,
    platform: str = "auto",
    cfg: ImplChoice | Any | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """``x / sqrt(mean(x², axis=-1) + eps) * scale``, the statistics in float32.

    Args:
        x: ``[..., D]``; bfloat16, float16 or float32. Normalised over its last dimension.
        scale: ``[D]``, multiplied in (not ``1 + scale``); bfloat16, float16 or float32.
        eps: Added to the mean square; a finite number > 0.
        residual: ``None``, or an array of ``x``'s shape and dtype added to ``x`` first (a
            transformer's residual stream): the call returns ``(rms_norm(h), h)`` with
            ``h = x + residual`` (rounded to ``x.dtype``), both from one pass over the data.
        platform: ``"auto"`` or a platform name to force.
        cfg: Explicit config; always wins.

    Returns:
        ``x.shape`` in ``x.dtype`` (rounded once from float32); with ``residual``, the pair
        ``(normalised, h)``. Differentiable in ``x``, ``scale`` and ``residual`` (gradients in
        their dtypes); the backward pass reuses the forward's per-row ``1 / rms``.
    """
    arrays, static = KERNEL.normalize(x, scale, eps=eps, residual=residual)
    return run_op(KERNEL, arrays, static, platform, cfg)  # type: ignore[no-any-return]


_HERE = __package__

DEFINITION = define_op(
    KERNEL, rms_norm,
    reference=f"{_HERE}._reference:reference_rms_norm",
    check=f"{_HERE}._conformance:check_rms_norm",
    shard_rule=f"{_HERE}._shard:rms_norm_rule",
    bench=f"{_HERE}._bench:BENCH",
    samples=f"{_HERE}._samples:samples",
    residuals=(RMS_NORM_RESIDUALS,),
)
