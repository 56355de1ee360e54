"""``rms_norm`` as Triton kernels: one read of ``x`` forward, one of ``x`` and ``dy`` backward.

``x [..., D]`` is flattened to ``[rows, D]``. The forward kernel (``_norm_kernels.forward_kernel``)
normalises ``block_rows`` rows per program with float32 statistics and saves each row's
``inv_rms`` (residuals ``RMS_NORM_RESIDUALS``, shared with ejk-xla's ``fused``, so either
backward runs on either forward). The backward kernel runs a persistent grid (``programs_per_sm``
programs per SM, each walking row blocks) that writes ``dx`` and one float32 partial sum of
``dscale`` per program; the ``[programs, D]`` partials are summed by XLA. Rows wider than
``block_d`` columns take two passes per row block instead of one.

With ``residual`` the forward kernel (``forward_residual_kernel``) reads ``x`` and the residual,
writes their sum ``h`` and normalises it; ``h`` is saved in ``x``'s place, and the backward
(``backward_residual_kernel``) adds ``h``'s cotangent to ``dx``, which is also the residual's gradient.

Under ``jax.vmap`` the forward folds the mapped axis into the rows (one launch) when ``scale`` is
not mapped and ``x`` (and the residual) are; otherwise, and for the backward, it runs one launch
per mapped element.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import jax
import jax.custom_batching
import jax.numpy as jnp

from ejk.plugin import RMS_NORM_RESIDUALS, VJP, cdiv, cotangent_like, int_in, next_pow2, one_of, power_of_two
from ejk_triton import _device, _dots
from ejk_triton._launch import kernels, launch, sequential_vmap

__all__ = ["RmsNormConfig", "backward", "backward_args", "capability", "config_space", "forward", "forward_args",
           "forward_with_residuals", "heuristic_config", "vjp"]

#: Bytes of each operand a thread holds per step in the heuristic (16 bfloat16 or 8 float32 elements: two or
#: four 16-byte vector loads), which sets the warps per program.
BYTES_PER_THREAD = 32
#: Widest rows the heuristic keeps whole in registers: forward, in elements; backward, in bytes (it holds
#: ``x``, ``dy``, the next block's and a float32 ``dscale`` sum: rows of 16384 bfloat16 or 8192 float32 spill
#: on sm_90). Wider rows take two passes of half that.
WHOLE_ROW_ELEMENTS = 16384
WHOLE_ROW_BYTES_BWD = 16384
#: Bytes of each operand per program step the heuristic aims at for rows of 8 KiB or more: 16 KiB, e.g. two
#: rows of 4096 bfloat16 at 16 warps. On an H100 at [16384, D] bfloat16, one 16 KiB row per step (D = 8192)
#: moved 2.93 TB/s forward and backward, one 8 KiB row (D = 4096, 8 warps) 2.83-2.86.
STEP_BYTES = 16384
#: The same for narrower rows (several per step): 8 KiB, as more rows per thread need more registers than
#: the 128 a 16-warp program allows.
NARROW_STEP_BYTES = 8192
#: Warps per SM the persistent backward aims at (its heuristic configs hold about 100 to 128 registers per
#: thread, so 16 warps are what an SM keeps resident).
RESIDENT_WARPS = 16
#: Most rows (``x.shape[:-1]`` flattened) a call takes: the per-row statistics are indexed with int32.
MAX_ROWS = 2**31 - 1

#: ``(x, scale, inv_rms)``, or ``(h, scale, inv_rms, x[..., :0], residual[..., :0])`` for a call with a residual.
Residuals = tuple[jax.Array, ...]
Output = jax.Array | tuple[jax.Array, jax.Array]

_columns = one_of(0, *(2**k for k in range(4, 17)))
_warps = one_of(1, 2, 4, 8, 16, 32)


@attrs.frozen(kw_only=True)
class RmsNormConfig:
    """Launch parameters of the Triton RMSNorm (``block_rows`` and the column blocks are clamped to the problem).

    Attributes:
        block_rows: Rows per program step (forward: per program; backward: per step of a
            persistent program).
        block_d: Forward columns per step; ``0`` takes the whole row (``D`` rounded up to a power
            of two). Rows wider than it take two passes (the statistics, then the output).
        num_warps: Warps per forward program.
        bwd_block_d: Backward columns per step, as ``block_d``.
        bwd_num_warps: Warps per backward program.
        programs_per_sm: Programs of the persistent backward kernel per streaming multiprocessor
            (each writes one ``[D]`` float32 partial sum of ``dscale``).
    """

    block_rows: int = attrs.field(default=1, validator=power_of_two(1))
    block_d: int = attrs.field(default=0, validator=_columns)
    num_warps: int = attrs.field(default=8, validator=_warps)
    bwd_block_d: int = attrs.field(default=0, validator=_columns)
    bwd_num_warps: int = attrs.field(default=8, validator=_warps)
    programs_per_sm: int = attrs.field(default=2, validator=int_in(1, 32))


def _shape(x: Any) -> tuple[int, int]:
    """``(rows, D)`` of ``x [..., D]``."""
    return math.prod(x.shape[:-1]), x.shape[-1]


def _tiles(rows: int, d: int, block_rows: int, block_d: int) -> tuple[int, int]:
    """``(BLOCK_R, BLOCK_D)``: a config's blocks clamped to the problem (at least 16 columns)."""
    whole = max(16, next_pow2(d))
    return min(block_rows, next_pow2(max(rows, 1))), whole if block_d == 0 else min(block_d, whole)


def forward_args(rows: int, d: int, eps: float, cfg: RmsNormConfig) -> dict[str, Any]:
    """The forward kernel's constexprs and launch parameters for ``rows`` rows of width ``d`` (grid:
    ``cdiv(rows, BLOCK_R)``)."""
    block_r, block_d = _tiles(rows, d, cfg.block_rows, cfg.block_d)
    return dict(ROWS=rows, D=d, EPS=float(eps), BLOCK_R=block_r, BLOCK_D=block_d, num_warps=cfg.num_warps,
                num_stages=1)


def backward_args(rows: int, d: int, cfg: RmsNormConfig) -> dict[str, Any]:
    """The backward kernel's constexprs and launch parameters (grid: ``PROGRAMS``, persistent)."""
    block_r, block_d = _tiles(rows, d, cfg.block_rows, cfg.bwd_block_d)
    programs = _device.persistent_programs(cdiv(rows, block_r), cfg.programs_per_sm)
    return dict(ROWS=rows, D=d, BLOCK_R=block_r, BLOCK_D=block_d, PROGRAMS=programs, num_warps=cfg.bwd_num_warps,
                num_stages=1)


def _fold_vmap(run: Any) -> Any:
    """``run(x [rows, D], scale, *more [rows, D])`` (per-row outputs ``[rows, ...]``) with a vmap rule that
    folds the mapped axis into the rows (one launch) when ``scale`` is not mapped and the row arrays all
    are; one launch per element otherwise."""
    wrapped = jax.custom_batching.custom_vmap(run)
    one_by_one = sequential_vmap(run)

    @wrapped.def_vmap
    def rule(axis_size: int, in_batched: Any, x: jax.Array, scale: jax.Array,
             *more: jax.Array) -> tuple[tuple[jax.Array, ...], Any]:
        x_mapped, scale_mapped, *more_mapped = in_batched
        rows_mapped = (x_mapped, *more_mapped)
        if not any(in_batched):
            outs = tuple(wrapped(x, scale, *more))
            return outs, tuple(False for _ in outs)
        if scale_mapped or not all(rows_mapped):
            axes = tuple(0 if m else None for m in in_batched)
            outs = tuple(jax.vmap(one_by_one, in_axes=axes)(x, scale, *more))
            return outs, tuple(True for _ in outs)
        rows = x.shape[1]

        def fold(a: jax.Array) -> jax.Array:
            return a.reshape(axis_size * rows, *a.shape[2:])

        outs = wrapped(fold(x), scale, *map(fold, more))
        return tuple(o.reshape(axis_size, rows, *o.shape[1:]) for o in outs), tuple(True for _ in outs)

    return wrapped


def forward_with_residuals(x: jax.Array, scale: jax.Array, *, residual: jax.Array | None = None, eps: float = 1e-6,
                           cfg: RmsNormConfig | None = None) -> tuple[Output, Residuals]:
    """``(y, (x, scale, inv_rms))``, ``inv_rms`` the float32 ``1 / sqrt(mean(x²) + eps)`` shaped ``x.shape[:-1]``;
    with ``residual``, ``((y, h), (h, scale, inv_rms, x[..., :0], residual[..., :0]))`` for ``h = x + residual``
    (in ``x.dtype``)."""
    cfg = cfg if cfg is not None else heuristic_config(x, scale, residual)
    rows, d = _shape(x)
    if rows == 0 or d == 0:  # nothing to launch; the statistics of an empty row are NaN, as in XLA
        h = x if residual is None else x + residual
        inv = jax.lax.rsqrt(jnp.mean(jnp.square(h.astype(jnp.float32)), axis=-1) + eps)
        if residual is None:
            return jnp.zeros_like(x), (x, scale, inv)
        return (jnp.zeros_like(x), h), (h, scale, inv, x[..., :0], residual[..., :0])

    def run(x2: jax.Array, s: jax.Array, *r2: jax.Array) -> tuple[jax.Array, ...]:
        n = x2.shape[0]
        args = forward_args(n, d, eps, cfg)
        rows_like = jax.ShapeDtypeStruct((n, d), x2.dtype)
        name = "forward_residual_kernel" if r2 else "forward_kernel"
        return launch(getattr(kernels("_norm_kernels"), name), grid=(cdiv(n, args["BLOCK_R"]),), inputs=(x2, *r2, s),
                      out_shapes=(rows_like, jax.ShapeDtypeStruct((n,), jnp.float32), *((rows_like,) if r2 else ())),
                      **args)

    more = () if residual is None else (residual.reshape(rows, d),)
    y, inv, *h = _fold_vmap(run)(x.reshape(rows, d), scale, *more)
    y, inv = y.reshape(x.shape), inv.reshape(x.shape[:-1])
    if residual is None:
        return y, (x, scale, inv)
    h_full = h[0].reshape(x.shape)
    # The empty slices carry the inputs' types under shard_map: each gradient is summed over the axes its
    # input does not vary along.
    return (y, h_full), (h_full, scale, inv, x[..., :0], residual[..., :0])


def forward(x: jax.Array, scale: jax.Array, *, residual: jax.Array | None = None, eps: float = 1e-6,
            cfg: RmsNormConfig | None = None) -> Output:
    """``x / sqrt(mean(x²) + eps) * scale`` over the last dimension, in ``x.dtype`` (statistics in float32);
    with ``residual``, ``(rms_norm(h), h)`` for ``h = x + residual``."""
    return forward_with_residuals(x, scale, residual=residual, eps=eps, cfg=cfg)[0]


def backward(residuals: Residuals, cotangent: Any, *, eps: float = 1e-6,
             cfg: RmsNormConfig | None = None) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """``(dx, dscale, d residual)`` in the dtypes of ``x``, ``scale`` and ``residual`` (``None`` without one).

    ``cotangent`` is ``dy``, or ``(dy, dh)`` for a call with a residual: ``dh`` is added to ``dx``,
    which is then also the residual's gradient.
    """
    del eps  # the residuals hold the statistics
    dy, dh = cotangent if isinstance(cotangent, tuple) else (cotangent, None)
    x, scale, inv, *inputs = residuals
    cfg = cfg if cfg is not None else heuristic_config(x, scale, dh)
    rows, d = _shape(x)
    if rows == 0 or d == 0:
        return _gradients(jnp.zeros_like(x), cotangent_like(jnp.zeros_like(scale), scale), x, inputs)
    args = backward_args(rows, d, cfg)
    programs = args["PROGRAMS"]

    def run(x2: jax.Array, s: jax.Array, inv1: jax.Array, dy2: jax.Array, *dh2: jax.Array) -> tuple[jax.Array, ...]:
        name = "backward_residual_kernel" if dh2 else "backward_kernel"
        return launch(getattr(kernels("_norm_kernels"), name), grid=(programs,), inputs=(x2, s, inv1, dy2, *dh2),
                      out_shapes=(jax.ShapeDtypeStruct((rows, d), x2.dtype),
                                  jax.ShapeDtypeStruct((programs, d), jnp.float32)),
                      zeroed_outputs=(1,) if args["BLOCK_D"] < d else (), **args)

    more = () if dh is None else (dh.reshape(rows, d).astype(x.dtype),)
    dx, partial = sequential_vmap(run)(x.reshape(rows, d), scale, inv.reshape(rows).astype(jnp.float32),
                                       dy.reshape(rows, d).astype(x.dtype), *more)
    dscale = cotangent_like(jnp.sum(partial, axis=-2).astype(scale.dtype), scale)
    return _gradients(dx.reshape(x.shape), dscale, x, inputs)


def _gradients(dx: jax.Array, dscale: jax.Array, x: jax.Array,
               inputs: list[jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """``(dx, dscale, d residual)``: without a residual (``inputs`` empty) ``dx`` typed like the saved ``x``;
    with one, the same ``dx`` typed like each input (``inputs``: their empty slices)."""
    if not inputs:
        return cotangent_like(dx, x), dscale, None
    return cotangent_like(dx, inputs[0]), dscale, cotangent_like(dx, inputs[1])


#: The custom VJP: residuals ``(x, scale, inv_rms)``, shared with every implementation of the tag.
vjp = VJP(fwd=forward_with_residuals, bwd=backward, residuals=RMS_NORM_RESIDUALS)


def capability(x: Any, scale: Any, residual: Any = None, **_: Any) -> str | None:
    """Why the kernels cannot run a call, or ``None``: ``x``, ``scale`` (and ``residual``) bfloat16 / float16 /
    float32, fewer than 2**31 rows; an NVIDIA GPU of compute capability 8.0+ (or the interpreter)."""
    del residual  # the op checked it has x's shape and dtype
    rows, _d = _shape(x)
    if rows > MAX_ROWS:
        return f"x has {rows} rows (x.shape[:-1] flattened); the kernels take fewer than 2**31"
    return _dots.gate((("x", x), ("scale", scale)), ())


def _column_block(width: int, whole_row: int) -> int:
    """``block_d`` for rows of ``width`` (a power of two) elements: whole up to ``whole_row``, else half that."""
    return 0 if width <= whole_row else whole_row // 2


def _warps_for(elements: int, itemsize: int) -> int:
    """Warps for ``elements`` of each operand per step: :data:`BYTES_PER_THREAD` per thread, 4 to 32 warps."""
    return max(4, min(32, next_pow2(elements * itemsize // (BYTES_PER_THREAD * 32))))


def heuristic_config(x: Any, scale: Any, residual: Any = None, **_: Any) -> RmsNormConfig:
    """By the row width and dtype: :data:`STEP_BYTES` of each operand per program step (one or two rows;
    :data:`NARROW_STEP_BYTES` for rows under 8 KiB, several per step), :data:`BYTES_PER_THREAD` bytes of
    each operand per thread (4 to 32 warps), whole rows up to :data:`WHOLE_ROW_ELEMENTS` (backward:
    :data:`WHOLE_ROW_BYTES_BWD`), and a persistent
    backward grid of :data:`RESIDENT_WARPS` warps per SM. With a ``residual`` the backward also holds the
    sum's cotangent: half the elements per thread (twice the warps up to :data:`RESIDENT_WARPS`, else
    half the rows per step), and the forward at most 16 warps (a 1024-thread program gets 64 registers
    per thread, too few for the wide rows of two operands), so that neither spills."""
    del scale
    rows, d = _shape(x)
    width, itemsize = max(16, next_pow2(d)), jnp.dtype(x.dtype).itemsize
    block_d = _column_block(width, WHOLE_ROW_ELEMENTS)
    bwd_block_d = _column_block(width, WHOLE_ROW_BYTES_BWD // itemsize)
    row_bytes = (block_d or width) * itemsize
    step = STEP_BYTES if row_bytes >= NARROW_STEP_BYTES else NARROW_STEP_BYTES
    block_rows = max(1, min(step // row_bytes, next_pow2(max(rows, 1))))
    if residual is not None and block_rows > 1 and _warps_for(block_rows * (bwd_block_d or width),
                                                              itemsize) >= RESIDENT_WARPS:
        block_rows //= 2
    bwd_warps = _warps_for(block_rows * (bwd_block_d or width), itemsize)
    if residual is not None:
        bwd_warps = max(bwd_warps, min(2 * bwd_warps, RESIDENT_WARPS))
    warps = _warps_for(block_rows * (block_d or width), itemsize)
    if residual is not None:
        warps = min(warps, 16)
    return RmsNormConfig(block_rows=block_rows, block_d=block_d, num_warps=warps, bwd_block_d=bwd_block_d,
                         bwd_num_warps=bwd_warps, programs_per_sm=max(1, RESIDENT_WARPS // bwd_warps))


def config_space(x: Any, scale: Any, residual: Any = None, **_: Any) -> list[RmsNormConfig]:
    """The heuristic and its neighbours: half and twice the rows per step, half the rows with half the warps
    (the same work per thread in smaller programs), half and twice the warps of both kernels, one more and
    one fewer backward program per SM (duplicates after clamping dropped)."""
    base = heuristic_config(x, scale, residual)
    rows, d = _shape(x)
    candidates = [base]
    for block_rows in (base.block_rows // 2, base.block_rows * 2):
        if block_rows >= 1:
            candidates.append(attrs.evolve(base, block_rows=block_rows))
    if base.block_rows > 1 and min(base.num_warps, base.bwd_num_warps) >= 2:  # half the step, same work per thread
        candidates.append(attrs.evolve(base, block_rows=base.block_rows // 2, num_warps=base.num_warps // 2,
                                       bwd_num_warps=base.bwd_num_warps // 2,
                                       programs_per_sm=max(1, RESIDENT_WARPS // (base.bwd_num_warps // 2))))
    for factor in (0.5, 2):
        warps, bwd_warps = int(base.num_warps * factor), int(base.bwd_num_warps * factor)
        if min(warps, bwd_warps) >= 1 and max(warps, bwd_warps) <= 32:
            candidates.append(attrs.evolve(base, num_warps=warps, bwd_num_warps=bwd_warps))
    candidates += [attrs.evolve(base, programs_per_sm=n) for n in (base.programs_per_sm - 1, base.programs_per_sm + 1)
                   if n >= 1]
    seen: dict[tuple[int, ...], RmsNormConfig] = {}
    for cfg in candidates:
        key = (*forward_args(rows, d, 0.0, cfg).values(), *backward_args(rows, d, cfg).values(), cfg.programs_per_sm)
        seen.setdefault(tuple(key), cfg)
    return list(seen.values())
