"""``gla`` and ``ssd`` as Triton kernels (``_linear_kernels``), in phases so that only the state
recurrence is sequential. The residuals are the operands (``GLA_RESIDUALS`` / ``SSD_RESIDUALS``, as
ejk-xla's, so either backward may follow either forward).

Forward: a kernel per (chunk, head) for the chunk-local cumulative log gates; a state kernel per
(sequence·head, K block, V block) walking the sequence chunk by chunk with the float32 state in
registers, writing the state entering every chunk and the final state; for per-channel gates a kernel
per (chunk, 16-token sub-block, head) for the intra-chunk weights ``A`` (``[R, H, chunk]`` float32); then
an output kernel per (chunk, V block, head), ``o = scale ((q ⊙ e^G) S + A v)``. Packed sequences
(``cu_seqlens``) need no layout: each program reads its offsets, no chunk crosses a sequence boundary.
``ssd`` is the same with a scalar gate (its ``A`` formed in the output kernel): ``q = C``, ``k = B`` (read
per group), ``v = dt·x`` (formed by the kernels from ``x`` and ``dt``) and log gate ``dt·A``; the output
kernel adds the ``D`` skip connection.

Backward (in ``backward_chunk`` chunks): the gates and state kernels again, a reverse kernel per
(sequence·head, K block, V block) for the cotangent of the state leaving every chunk and the initial
state's, the intra-chunk weights again, then per (chunk, K block, head) the state terms of ``dq``,
``dk`` and ``dA = scale do vᵀ``, per (chunk, K block · sub-block, head) the intra-chunk terms of ``dq``,
``dk``, and per (chunk, V block, head) ``dv``. The log gates' gradient is, per sequence, the suffix sum of
``q ⊙ dq - k ⊙ dk`` plus ``Σ_v S_T ⊙ dS_T`` (the final state's factor ``e^{G_T}``).
``ssd``'s backward (operands in their dtype, ``B`` / ``C`` read per group, float32 chunk states) has
scalar-gate kernels of its own after the reverse state pass: ``dq``, ``dk`` and the log gates' gradient (from
the token pairs each gate lies between, no suffix sums) in one, ``dv`` in another, each forming the
intra-chunk weights; XLA sums ``dq`` / ``dk`` over each group's heads and carries the rest to ``x``, ``dt``,
``A``, ``D`` and ``dt_bias``.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import jax
import jax.numpy as jnp

from ejk.plugin import GLA_RESIDUALS, SSD_RESIDUALS, VJP, cdiv, cotangent_like, int_in, next_pow2, power_of_two
from ejk_triton import _dots, _env
from ejk_triton._device import compute_capability_reason, widened_block
from ejk_triton._launch import kernels, launch, sequential_vmap

__all__ = ["LinearAttentionConfig", "capability", "config_space", "gla", "gla_vjp", "heuristic_config", "ssd",
           "ssd_capability", "ssd_config_space", "ssd_heuristic_config", "ssd_vjp"]

_DTYPES = ("bfloat16", "float16", "float32")
#: The state ``[K, block_v]`` lives in registers: K (the state's row count) is bounded.
_MAX_K = 256


@attrs.frozen(kw_only=True)
class LinearAttentionConfig:
    """Config of the Triton linear-recurrence kernels.

    Attributes:
        chunk: Tokens per chunk of the forward: the state kernel runs ``T / chunk`` sequential steps and
            stores the state entering every chunk; the other kernels run every chunk at once.
        state_block_k: State rows per program of the forward's state kernel.
        state_block_v: State columns per program of the forward's state kernel (more programs when smaller).
        block_k: State rows per program of the backward's state-sized kernels.
        block_v: State columns per program of the backward's state-sized kernels.
        output_block_v: Value columns per program of the forward's output kernel.
        num_warps: Warps per program.
        intra_warps: Warps per program of the kernel of the intra-chunk weights (one per 16-row sub-block).
        state_warps: Warps per program of the forward's state kernel (the sequential phase).
        state_stages: Software-pipelining stages of the forward's state kernel.
        num_stages: Software-pipelining stages.
        backward_chunk: Tokens per chunk of the backward (its own states and state cotangents).
    """

    chunk: int = attrs.field(default=64, validator=[power_of_two(16), int_in(16, 64)])
    state_block_k: int = attrs.field(default=64, validator=[power_of_two(16), int_in(16, 256)])
    state_block_v: int = attrs.field(default=64, validator=[power_of_two(16), int_in(16, 256)])
    block_k: int = attrs.field(default=64, validator=[power_of_two(16), int_in(16, 256)])
    block_v: int = attrs.field(default=64, validator=[power_of_two(16), int_in(16, 128)])
    output_block_v: int = attrs.field(default=128, validator=[power_of_two(16), int_in(16, 256)])
    num_warps: int = attrs.field(default=4, validator=[power_of_two(), int_in(1, 16)])
    intra_warps: int = attrs.field(default=1, validator=[power_of_two(), int_in(1, 16)])
    state_warps: int = attrs.field(default=8, validator=[power_of_two(), int_in(1, 16)])
    state_stages: int = attrs.field(default=3, validator=int_in(1, 4))
    num_stages: int = attrs.field(default=2, validator=int_in(1, 4))
    backward_chunk: int = attrs.field(default=64, validator=[power_of_two(16), int_in(16, 64)])


#: The interpreter (CPU): two 16-token sub-blocks per forward chunk, one per backward chunk, small blocks.
_INTERPRETER = LinearAttentionConfig(chunk=32, state_block_k=16, state_block_v=16, block_k=16, block_v=16,
                                     output_block_v=16, num_stages=1, backward_chunk=16)


def config_space(**call: Any) -> list[LinearAttentionConfig]:
    """Autotuning candidates: forward chunks of 64 and 32, backward chunks of 32 and 64, state column blocks
    of 64 and 32 (128-column output blocks), 4 or 8 warps; the heuristic's first (its forward state tiles in
    every candidate)."""
    if _env.interpreting_on_cpu():
        return [_INTERPRETER]
    first = heuristic_config(**call)
    space = [attrs.evolve(first, chunk=c, block_v=bv, num_warps=w, backward_chunk=bc)
             for c in (64, 32) for bc in (32, 64) for bv in (64, 32) for w in (4, 8)]
    return [first, *(c for c in space if c != first)]


def ssd_config_space(**call: Any) -> list[LinearAttentionConfig]:
    """:func:`config_space` with :func:`ssd_heuristic_config` first."""
    if _env.interpreting_on_cpu():
        return [_INTERPRETER]
    first = ssd_heuristic_config(**call)
    space = (attrs.evolve(c, state_block_k=first.state_block_k, state_block_v=first.state_block_v)
             for c in config_space())
    return [first, *(c for c in space if c != first)]


def heuristic_config(q: Any = None, v: Any = None, cu_seqlens: Any = None, **_: Any) -> LinearAttentionConfig:
    """What measured fastest on an H100 at 32k tokens, 32 heads, K = V = 128 (bfloat16): chunks of 64 tokens
    forward and backward, ``[64, 64]`` state blocks (8 warps, 3 stages in the forward; the forward's widened
    where its programs would exceed one wave, see :func:`_for_call`), one warp per 16-row sub-block of the
    intra-chunk weights, 128-column output blocks, 4 warps elsewhere (the interpreter: see ``_INTERPRETER``)."""
    return _for_call(None if q is None else int(q.shape[3]), v, cu_seqlens, widen=("state_block_v", "state_block_k"))


def ssd_heuristic_config(x: Any = None, B: Any = None, cu_seqlens: Any = None,  # noqa: N803
                         **_: Any) -> LinearAttentionConfig:
    """:func:`heuristic_config` for the SSD (state ``[N, P]``), whose forward state kernel widens its blocks
    in ``N`` first, then in ``P`` (GLA's: ``V`` first), as measured fastest on an H100."""
    return _for_call(None if B is None else int(B.shape[3]), x, cu_seqlens, widen=("state_block_k", "state_block_v"))


def _for_call(dk: int | None, v: Any, cu_seqlens: Any, *, widen: tuple[str, ...]) -> LinearAttentionConfig:
    """The default config with the forward state kernel's tiles (the fields ``widen``, in order) doubled by
    :func:`ejk_triton._device.widened_block` for a state ``[dk, V]`` per sequence and head of ``v [B, T, H, V]``;
    the interpreter's config on a CPU."""
    if _env.interpreting_on_cpu():
        return _INTERPRETER
    base = LinearAttentionConfig()
    if dk is None or v is None:
        return base
    sequences, heads, dv = _states(int(v.shape[0]), cu_seqlens), int(v.shape[2]), int(v.shape[3])
    tiles = {"state_block_k": base.state_block_k, "state_block_v": base.state_block_v}
    sizes = {"state_block_k": dk, "state_block_v": dv}

    def programs(field: str) -> Any:
        return lambda block: sequences * heads * math.prod(
            cdiv(sizes[name], block if name == field else tiles[name]) for name in tiles)

    for field in widen:
        tiles[field] = widened_block(tiles[field], max(next_pow2(sizes[field]), tiles[field]), programs(field))
    return attrs.evolve(base, **tiles)


def _device_reason() -> str | None:
    if _env.interpret_mode():
        return None
    on_gpu, why = _env.nvidia_gpu()
    if not on_gpu:
        return f"needs an NVIDIA GPU ({why})"
    return compute_capability_reason()


def _common_reason(arrays: tuple[Any, ...], k_dim: int) -> str | None:
    found = sorted({jnp.dtype(x.dtype).name for x in arrays if x is not None} - set(_DTYPES))
    if found:
        return f"{', '.join(found)} not supported (bfloat16, float16 and float32 only)"
    if k_dim > _MAX_K:
        return f"a state of {k_dim} rows not supported (at most {_MAX_K}: the state is held in registers)"
    return _device_reason()


def _states(batch: int, cu_seqlens: Any) -> int:
    return batch if cu_seqlens is None else int(cu_seqlens.shape[0]) - 1


def capability(q: Any, k: Any, v: Any, g: Any, initial_state: Any = None, cu_seqlens: Any = None,
               **_: Any) -> str | None:
    """Why the Triton ``gla`` cannot run a call, or ``None``: bfloat16 / float16 / float32, K and V up to 256,
    an NVIDIA GPU (compute capability 8.0+) unless interpreted."""
    if int(v.shape[3]) > _MAX_K:
        return f"V = {int(v.shape[3])} not supported (at most {_MAX_K}: the backward holds a [K, V] state cotangent)"
    return _common_reason((q, k, v, g, initial_state), int(q.shape[3]))


def ssd_capability(x: Any, dt: Any, A: Any, B: Any, C: Any, D: Any = None, dt_bias: Any = None,  # noqa: N803
                   initial_state: Any = None, cu_seqlens: Any = None, **_: Any) -> str | None:
    """Why the Triton ``ssd`` cannot run a call, or ``None``: as :func:`capability`, N up to 256."""
    return _common_reason((x, dt, A, B, C, D, dt_bias, initial_state), int(B.shape[3]))


def _recurrence(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, initial_state: jax.Array | None,
                cu_seqlens: jax.Array | None, *, scale: float, scalar_gate: bool, out_dtype: Any,
                cfg: LinearAttentionConfig, with_output: bool = True, row_scale: jax.Array | None = None,
                skip: jax.Array | None = None, state_dtype: Any = None) -> tuple[jax.Array, ...]:
    """The forward kernels on ``q, k [B, T, HQK, K]``, ``v [B, T, H, V]``, ``g [B, T, H(, K)]``:
    ``(o, final states, chunk-local cumulative gates [B·T, H(, K)], states entering every chunk)``, the
    latter at the slots :func:`_chunk_slots` counts, in ``state_dtype`` (default: the inputs'); without
    ``with_output`` (the state kernel only) the same less ``o``. With ``row_scale [B, T, H]`` (float32) the
    values are ``v`` times it, rounded to ``q``'s dtype; with ``skip [H]`` (float32) ``o`` adds ``skip · v``."""
    b, t, hqk, dk = q.shape
    h, dv = v.shape[2], v.shape[3]
    n = _states(b, cu_seqlens)
    f32 = jnp.float32
    slots = _chunk_slots(b * t, n, cfg.chunk)
    state_dtype = state_dtype or q.dtype
    if t == 0:
        init = jnp.zeros((n, h, dk, dv), f32) if initial_state is None else initial_state.astype(f32)
        empty = (init, jnp.zeros((0, h, *g.shape[3:]), f32), jnp.zeros((slots, h, dk, dv), state_dtype))
        return (jnp.zeros((b, 0, h, dv), out_dtype), *empty) if with_output else empty
    block_k = next_pow2(max(dk, 16))
    block_v = min(cfg.state_block_v, next_pow2(max(dv, 16)))
    state_k = min(cfg.state_block_k, block_k)
    rows = b * t
    if row_scale is None:
        v = v.astype(q.dtype)  # the products run in the inputs' dtype (the kernels round scaled rows)
    cu = (jnp.zeros((1,), jnp.int32) if cu_seqlens is None else cu_seqlens.astype(jnp.int32))
    sequences = _slot_sequences(b, t, cu_seqlens, cfg.chunk)
    common: dict[str, Any] = dict(T=t, H=h, HQK=hqk, K=dk, V=dv, BT=cfg.chunk, BV=block_v, SCALAR_GATE=scalar_gate,
                  VARLEN=cu_seqlens is not None, PREC=_dots.dot_precision(q.dtype, "high"))
    gates = g.reshape(rows, *g.shape[2:])

    def run(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, h0: jax.Array, cu: jax.Array,
            seq: jax.Array, rs: jax.Array, skip_h: jax.Array) -> tuple[jax.Array, ...]:
        module = kernels("_linear_kernels")
        (gc,) = launch(module.linear_cumsum, grid=(slots, h), inputs=(g, cu, seq),
                       out_shapes=(jax.ShapeDtypeStruct(g.shape, f32),), num_warps=cfg.num_warps, num_stages=1,
                       T=t, H=h, K=dk, BT=cfg.chunk, BK=block_k, SCALAR_GATE=scalar_gate,
                       VARLEN=cu_seqlens is not None)
        hs, final = launch(
            module.linear_states_fwd, grid=(n * h, cdiv(dk, state_k), cdiv(dv, block_v)),
            inputs=(k, v, gc, h0, cu, rs),
            out_shapes=(jax.ShapeDtypeStruct((slots, h, dk, dv), state_dtype),
                        jax.ShapeDtypeStruct((n, h, dk, dv), f32)),
            num_warps=cfg.state_warps, num_stages=cfg.state_stages, BK=state_k, HAS_H0=initial_state is not None,
            ROW_SCALE=row_scale is not None, **common)
        if not with_output:
            return final, gc, hs
        if scalar_gate:
            weights = jnp.zeros((1,), f32)  # the output kernel forms them
        else:
            sub = min(16, cfg.chunk)
            (weights,) = launch(module.gla_intra_fwd, grid=(slots, cfg.chunk // sub, h), inputs=(q, k, gc, cu, seq),
                                out_shapes=(jax.ShapeDtypeStruct((rows, h, cfg.chunk), f32),),
                                num_warps=cfg.intra_warps, num_stages=cfg.num_stages, T=t, H=h, HQK=hqk, K=dk,
                                BT=cfg.chunk, BC=sub, BK=block_k, VARLEN=cu_seqlens is not None,
                                PREC=common["PREC"])
        out_v = min(cfg.output_block_v, next_pow2(max(dv, 16)))
        (o,) = launch(module.linear_output_fwd, grid=(slots, cdiv(dv, out_v), h),
                      inputs=(q, k, v, gc, hs, weights, cu, seq, rs, skip_h),
                      out_shapes=(jax.ShapeDtypeStruct((rows, h, dv), out_dtype),),
                      num_warps=cfg.num_warps, num_stages=cfg.num_stages, BK=block_k, SCALE=float(scale),
                      ROW_SCALE=row_scale is not None, HAS_SKIP=skip is not None, **dict(common, BV=out_v))
        return o, final, gc, hs

    h0 = jnp.zeros((1,), f32) if initial_state is None else initial_state.astype(f32)
    rs = jnp.zeros((1,), f32) if row_scale is None else row_scale.astype(f32).reshape(rows, h)
    skip_h = jnp.zeros((1,), f32) if skip is None else skip.astype(f32)
    outs = sequential_vmap(run)(q.reshape(rows, hqk, dk), k.reshape(rows, hqk, dk), v.reshape(rows, h, dv), gates,
                                h0, cu, sequences, rs, skip_h)
    if not with_output:
        return outs
    o, *rest = outs
    return o.reshape(b, t, h, dv), *rest


def _chunk_slots(rows: int, sequences: int, chunk: int) -> int:
    """Slots for the state entering every chunk: sequence ``n`` starting at row ``bos`` owns slots from
    ``bos // chunk + n`` on (no two sequences overlap, whatever their lengths)."""
    return rows // chunk + sequences + 1


def _slot_sequences(batch: int, length: int, cu_seqlens: jax.Array | None, chunk: int) -> jax.Array:
    """``[slots]`` int32: the sequence each chunk slot belongs to (a slot no chunk uses gets a sequence whose
    chunks it lies past, so its program stores nothing)."""
    n = _states(batch, cu_seqlens)
    cu = (jnp.arange(n + 1, dtype=jnp.int32) * length if cu_seqlens is None else cu_seqlens.astype(jnp.int32))
    first = cu[:-1] // chunk + jnp.arange(n, dtype=jnp.int32)  # strictly increasing
    slot = jnp.arange(_chunk_slots(batch * length, n, chunk), dtype=jnp.int32)
    return jnp.clip(jnp.searchsorted(first, slot, side="right") - 1, 0, max(n - 1, 0)).astype(jnp.int32)


def gla(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, initial_state: jax.Array | None = None,
        cu_seqlens: jax.Array | None = None, *, scale: float,
        cfg: LinearAttentionConfig | None = None) -> tuple[jax.Array, jax.Array]:
    """``ejk.gla``'s forward: ``(o, final_state)``."""
    o, final, *_ = _recurrence(q, k, v, g, initial_state, cu_seqlens, scale=scale, scalar_gate=False,
                              out_dtype=q.dtype, cfg=cfg or heuristic_config(q, v, cu_seqlens))
    return o, final


def _segment_suffix_sums(x: jax.Array, cu_seqlens: jax.Array | None) -> jax.Array:
    """``[B, T, ...]``: the sum of ``x`` over each token and the later tokens of its sequence."""
    t = x.shape[1]
    flipped = jnp.flip(x, 1)
    if cu_seqlens is None:
        return jnp.flip(jnp.cumsum(flipped, axis=1), 1)
    nonempty = (cu_seqlens[1:] > cu_seqlens[:-1]).astype(jnp.int32)  # an empty sequence marks no token
    last = jnp.zeros((t,), jnp.int32).at[jnp.clip(cu_seqlens[1:] - 1, 0, max(t - 1, 0))].max(nonempty) > 0
    starts = jnp.flip(last)[None].reshape((1, t) + (1,) * (x.ndim - 2))

    def combine(a: tuple[jax.Array, jax.Array], b: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        return b[0] + jnp.where(b[1], 0.0, a[0]), a[1] | b[1]

    sums, _ = jax.lax.associative_scan(combine, (flipped, jnp.broadcast_to(starts, x.shape)), axis=1)
    return jnp.flip(sums, 1)


def gla_backward(residuals: tuple[Any, ...], d_out: Any, *, scale: float,
                 cfg: LinearAttentionConfig | None = None) -> tuple[Any, ...]:
    """``gla``'s gradients from its operands, in their dtypes (see :func:`_gradients`)."""
    q, k, v, g, initial_state, _ = residuals
    dq, dk, dv, dg, d_initial = _gradients(residuals, d_out, scale=scale, cfg=cfg)
    return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dg.astype(g.dtype),
            None if initial_state is None else d_initial.astype(initial_state.dtype), None)


@attrs.frozen
class _Backward:
    """What every backward kernel of one call shares: sizes, blocks, offsets, the constexprs."""

    cfg: LinearAttentionConfig  # with ``chunk`` = the backward's chunk
    rows: int
    states: int
    slots: int
    block_k: int  # all of K, padded
    state_k: int  # K rows per program of the state-sized kernels
    block_v: int
    cu: jax.Array
    sequences: jax.Array
    common: dict[str, Any]


def _backward(q: jax.Array, v: jax.Array, cu_seqlens: jax.Array | None, scale: float,
              base: LinearAttentionConfig) -> _Backward:
    cfg = attrs.evolve(base, chunk=base.backward_chunk)
    b, t, _, dk = q.shape
    h, dv = v.shape[2], v.shape[3]
    n = _states(b, cu_seqlens)
    block_k = next_pow2(max(dk, 16))
    return _Backward(
        cfg=cfg, rows=b * t, states=n, slots=_chunk_slots(b * t, n, cfg.chunk), block_k=block_k,
        state_k=min(cfg.block_k, block_k), block_v=min(cfg.block_v, next_pow2(max(dv, 16))),
        cu=jnp.zeros((1,), jnp.int32) if cu_seqlens is None else cu_seqlens.astype(jnp.int32),
        sequences=_slot_sequences(b, t, cu_seqlens, cfg.chunk),
        common=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages, T=t, H=h, HQK=q.shape[2], K=dk, V=dv,
                    BT=cfg.chunk, SCALE=float(scale), VARLEN=cu_seqlens is not None,
                    PREC=_dots.dot_precision(q.dtype, "high")))


def _state_cotangents(plan: _Backward, q: jax.Array, gc: jax.Array, d_o: jax.Array, d_final: jax.Array,
                      states: jax.Array, *, scalar_gate: bool) -> tuple[jax.Array, jax.Array]:
    """The reverse state pass: the cotangent of the state leaving every chunk (``states``' layout and dtype)
    and the initial state's (float32)."""
    c = plan.common
    d_states, d_initial = launch(
        kernels("_linear_kernels").linear_dstates_bwd,
        grid=(plan.states * c["H"], cdiv(c["K"], plan.state_k), cdiv(c["V"], plan.block_v)),
        inputs=(q, gc, d_o, d_final, plan.cu),
        out_shapes=(jax.ShapeDtypeStruct(states.shape, states.dtype),
                    jax.ShapeDtypeStruct((plan.states, c["H"], c["K"], c["V"]), jnp.float32)),
        BK=plan.state_k, BV=plan.block_v, SCALAR_GATE=scalar_gate, **c)
    return d_states, d_initial


def _gradients(residuals: tuple[Any, ...], d_out: Any, *, scale: float,
               cfg: LinearAttentionConfig | None) -> tuple[jax.Array, ...]:
    """``gla``'s gradients ``(dq, dk, dv, dg, d_initial)`` in float32 from its operands, in ``backward_chunk``
    chunks: the gates and state kernels again (the state entering every chunk), the reverse state-cotangent
    kernel, the intra-chunk weights again, ``dq``, ``dk`` (state terms with ``dA``, then intra-chunk terms)
    and ``dv``. ``dg`` is the suffix sum of ``q ⊙ dq - k ⊙ dk`` over each sequence plus ``Σ_v S_T ⊙ dS_T``
    (the final state's gate factor)."""
    q, k, v, g, initial_state, cu_seqlens = residuals
    d_o, d_final = d_out
    plan = _backward(q, v, cu_seqlens, scale, cfg or heuristic_config(q, v, cu_seqlens))
    cfg = plan.cfg
    b, t, h, dk = q.shape
    dv = v.shape[3]
    f32 = jnp.float32
    d_final = jnp.zeros((plan.states, h, dk, dv), f32) if d_final is None else d_final.astype(f32)
    final, gc, states = _recurrence(q, k, v, g, initial_state, cu_seqlens, scale=scale, scalar_gate=False,
                                    out_dtype=q.dtype, cfg=cfg, with_output=False)
    if t == 0:
        return (*(jnp.zeros(x.shape, f32) for x in (q, k, v, g)), d_final)
    d_o = jnp.zeros(v.shape, q.dtype) if d_o is None else d_o.astype(q.dtype)
    common, rows, slots = plan.common, plan.rows, plan.slots
    sub = min(16, cfg.chunk)
    plain = {name: x for name, x in common.items() if name != "HQK"}  # q and k have v's heads
    intra = {name: common[name] for name in ("num_stages", "T", "H", "K", "BT", "VARLEN", "PREC")}
    per_token = (jax.ShapeDtypeStruct((rows, h, dk), f32), jax.ShapeDtypeStruct((rows, h, dk), f32))

    def run(q: jax.Array, k: jax.Array, v: jax.Array, d_o: jax.Array, d_final: jax.Array, cu: jax.Array,
            gc: jax.Array, states: jax.Array, seq: jax.Array) -> tuple[jax.Array, ...]:
        module = kernels("_linear_kernels")
        d_states, d_initial = _state_cotangents(plan, q, gc, d_o, d_final, states, scalar_gate=False)
        (weights,) = launch(module.gla_intra_fwd, grid=(slots, cfg.chunk // sub, h), inputs=(q, k, gc, cu, seq),
                            out_shapes=(jax.ShapeDtypeStruct((rows, h, cfg.chunk), f32),),
                            num_warps=cfg.intra_warps, HQK=h, BC=sub, BK=plan.block_k, **intra)
        d_q, d_k, d_a = launch(
            module.gla_inter_bwd, grid=(slots, cdiv(dk, plan.state_k), h),
            inputs=(q, k, v, gc, d_o, states, d_states, cu, seq),
            out_shapes=(*per_token, jax.ShapeDtypeStruct((rows, h, cfg.chunk), f32)),
            BK=plan.state_k, BV=plan.block_v, **plain)
        d_q, d_k = launch(module.gla_intra_bwd, grid=(slots, cdiv(dk, plan.state_k) * (cfg.chunk // sub), h),
                          inputs=(q, k, gc, d_a, cu, seq, d_q, d_k), out_shapes=per_token,
                          num_warps=cfg.num_warps, BC=sub, BK=plan.state_k, **intra)
        (d_v,) = launch(module.gla_dv_bwd, grid=(slots, cdiv(dv, plan.block_v), h),
                        inputs=(k, gc, d_o, d_states, weights, cu, seq),
                        out_shapes=(jax.ShapeDtypeStruct((rows, h, dv), f32),),
                        BK=plan.block_k, BV=plan.block_v, **plain)
        return d_q, d_k, d_v, d_initial

    flat = [x.reshape(rows, h, x.shape[3]) for x in (q, k, v.astype(q.dtype), d_o)]
    dq, dk_, dv_, d_initial = sequential_vmap(run)(*flat, d_final, plan.cu, gc, states, plan.sequences)
    dq, dk_, dv_ = (x.reshape(b, t, h, x.shape[2]) for x in (dq, dk_, dv_))
    d_gates = _segment_suffix_sums(q.astype(f32) * dq - k.astype(f32) * dk_, cu_seqlens)
    final_term = jnp.sum(final * d_final, axis=-1)  # [N, H, K]
    if cu_seqlens is None:
        d_gates = d_gates + final_term[:, None]
    else:
        owner = jnp.minimum(jnp.searchsorted(cu_seqlens[1:], jnp.arange(t), side="right"), plan.states - 1)
        d_gates = d_gates + final_term[owner][None]
    return dq, dk_, dv_, d_gates, d_initial


def _ssd_gradients(c: jax.Array, b: jax.Array, x: jax.Array, step: jax.Array, log_gates: jax.Array,
                   skip: jax.Array | None, initial_state: jax.Array | None, cu_seqlens: jax.Array | None,
                   d_y: jax.Array | None, d_final: jax.Array | None,
                   cfg: LinearAttentionConfig | None) -> tuple[Any, ...]:
    """The scalar-gate recurrence's gradients for ``ssd`` (``q = C``, ``k = B`` per group, ``v = x ⊙ step``,
    one log gate per head and token; float32 chunk states), in ``backward_chunk`` chunks: the gates and state
    kernels again, the reverse state-cotangent kernel, then ``dq`` / ``dk`` per head with the log gates'
    gradient in one kernel, ``dx`` with ``D``'s and ``step``'s shares in another; ``dC`` / ``dB`` sum each
    group's heads.

    Returns:
        ``(dC, dB [b, T, G, N] float32, dx [b, T, H, P] in x's dtype (skip term included), d step [b, T, H]
        (the values' share), d log gates [b, T, H], d skip [H] or None, d initial state)``.
    """
    plan = _backward(c, x, cu_seqlens, 1.0, cfg or ssd_heuristic_config(x, b, cu_seqlens))
    bsz, t, groups, dn = c.shape
    h, dp = x.shape[2], x.shape[3]
    f32 = jnp.float32
    d_final = jnp.zeros((plan.states, h, dn, dp), f32) if d_final is None else d_final.astype(f32)
    _, gc, states = _recurrence(c, b, x, log_gates, initial_state, cu_seqlens, scale=1.0, scalar_gate=True,
                                out_dtype=x.dtype, cfg=plan.cfg, with_output=False, row_scale=step,
                                state_dtype=f32)
    if t == 0:
        zeros = (jnp.zeros(c.shape, f32), jnp.zeros(b.shape, f32), jnp.zeros(x.shape, x.dtype),
                 jnp.zeros(step.shape, f32), jnp.zeros(step.shape, f32))
        return (*zeros, None if skip is None else jnp.zeros(skip.shape, f32), d_final)
    d_y = jnp.zeros(x.shape, f32) if d_y is None else d_y
    rows, slots, common = plan.rows, plan.slots, plan.common
    k_blocks, v_blocks = cdiv(dn, plan.state_k), cdiv(dp, plan.block_v)
    per_head = jax.ShapeDtypeStruct((rows, h, dn), f32)
    shares = jax.ShapeDtypeStruct((rows, h, v_blocks), f32)  # each V block's share of a per-row sum

    def run(c: jax.Array, b: jax.Array, x: jax.Array, d_y: jax.Array, d_final: jax.Array, cu: jax.Array,
            gc: jax.Array, states: jax.Array, seq: jax.Array, rs: jax.Array,
            skip_h: jax.Array) -> tuple[jax.Array, ...]:
        module = kernels("_linear_kernels")
        d_states, d_initial = _state_cotangents(plan, c, gc, d_y, d_final, states, scalar_gate=True)
        d_q, d_k, d_g = launch(module.scalar_dqk_bwd, grid=(slots, k_blocks, h),
                               inputs=(c, b, x, gc, d_y, states, d_states, cu, seq, rs),
                               out_shapes=(per_head, per_head, jax.ShapeDtypeStruct((rows, h, k_blocks), f32)),
                               BK=plan.state_k, BV=plan.block_v, ROW_SCALE=True, **common)
        d_x, d_r, d_skip = launch(module.scalar_dx_bwd, grid=(slots, v_blocks, h),
                                  inputs=(c, b, x, gc, d_y, d_states, cu, seq, rs, skip_h),
                                  out_shapes=(jax.ShapeDtypeStruct((rows, h, dp), x.dtype), shares,
                                              shares if skip is not None else jax.ShapeDtypeStruct((1,), f32)),
                                  BK=plan.block_k, BV=plan.block_v, HAS_SKIP=skip is not None, **common)
        return d_q, d_k, d_x, d_r.sum(-1), d_g.sum(-1), d_skip.sum(-1), d_initial

    skip_h = jnp.zeros((1,), f32) if skip is None else skip.astype(f32)
    d_q, d_k, dx, d_r, d_g, d_skip, d_initial = sequential_vmap(run)(
        c.reshape(rows, groups, dn), b.reshape(rows, groups, dn), x.reshape(rows, h, dp),
        d_y.astype(c.dtype).reshape(rows, h, dp), d_final, plan.cu, gc, states, plan.sequences,
        step.astype(f32).reshape(rows, h), skip_h)
    per_group = (bsz, t, groups, h // groups, dn)
    d_c, d_b = (jnp.sum(d.reshape(per_group), axis=3) for d in (d_q, d_k))
    d_d = None if skip is None else jnp.sum(d_skip.reshape(bsz, t, h), axis=(0, 1))
    return (d_c, d_b, dx.reshape(x.shape), d_r.reshape(bsz, t, h), d_g.reshape(bsz, t, h), d_d, d_initial)


def ssd(x: jax.Array, dt: jax.Array, A: jax.Array, B: jax.Array, C: jax.Array,  # noqa: N803
        D: jax.Array | None = None, dt_bias: jax.Array | None = None,  # noqa: N803
        initial_state: jax.Array | None = None, cu_seqlens: jax.Array | None = None, *, dt_softplus: bool,
        cfg: LinearAttentionConfig | None = None) -> tuple[jax.Array, jax.Array]:
    """``ejk.ssd``'s forward: ``(y, final_state)``."""
    f32 = jnp.float32
    step = dt.astype(f32) + (0.0 if dt_bias is None else dt_bias.astype(f32))
    step = jax.nn.softplus(step) if dt_softplus else step
    init = None if initial_state is None else jnp.swapaxes(initial_state.astype(f32), -1, -2)  # [N, H, Ns, P]
    y, final, *_ = _recurrence(C, B, x, step * A.astype(f32), init, cu_seqlens, scale=1.0, scalar_gate=True,
                              out_dtype=x.dtype, cfg=cfg or ssd_heuristic_config(x, B, cu_seqlens), row_scale=step,
                              skip=D)
    return y, jnp.swapaxes(final, -1, -2)


def ssd_backward(residuals: tuple[Any, ...], d_out: Any, *, dt_softplus: bool,
                 cfg: LinearAttentionConfig | None = None) -> tuple[Any, ...]:
    """``ssd``'s gradients: the recurrence is ``gla``'s with ``C`` / ``B`` as ``q`` / ``k`` (each group read by
    its heads), ``dt·x`` as ``v`` (formed by the kernels) and one log gate ``dt·A`` for all ``N`` channels;
    :func:`_ssd_gradients` gives the cotangents of ``C``, ``B``, ``x``, the step's share through the values,
    the log gates and ``D``, carried to ``dt``, ``A`` and ``dt_bias`` here."""
    x, dt, A, B, C, D, dt_bias, initial_state, cu_seqlens = residuals  # noqa: N806
    d_y, d_final = d_out
    f32 = jnp.float32
    operand = jnp.result_type(x.dtype, B.dtype, C.dtype)

    def step_of(dt: jax.Array, bias: jax.Array | None) -> jax.Array:
        step = dt.astype(f32) + (0.0 if bias is None else bias.astype(f32))
        return jax.nn.softplus(step) if dt_softplus else step

    step, step_vjp = jax.vjp(step_of, dt, dt_bias)
    a = A.astype(f32)
    init = None if initial_state is None else jnp.swapaxes(initial_state.astype(f32), -1, -2)
    d_final = None if d_final is None else jnp.swapaxes(d_final.astype(f32), -1, -2)
    d_c, d_b, dx, d_step, dg, d_d, d_state = _ssd_gradients(
        C.astype(operand), B.astype(operand), x.astype(operand), step, step * a, D, init, cu_seqlens, d_y, d_final,
        cfg)
    d_dt, d_bias = step_vjp(d_step + dg * a)
    d_init = None if initial_state is None else jnp.swapaxes(d_state, -1, -2).astype(initial_state.dtype)
    return (dx.astype(x.dtype), d_dt.astype(dt.dtype), jnp.sum(dg * step, axis=(0, 1)).astype(A.dtype),
            d_b.astype(B.dtype), d_c.astype(C.dtype), None if D is None else d_d.astype(D.dtype),
            None if dt_bias is None else d_bias.astype(dt_bias.dtype), d_init, None)


def _with_cotangent_types(backward: Any) -> Any:
    def bwd(residuals: tuple[Any, ...], d_out: Any, **static: Any) -> tuple[Any, ...]:
        found = backward(residuals, d_out, **static)
        return tuple(x if x is None or r is None else cotangent_like(x, r)
                     for x, r in zip(found, residuals, strict=True))

    return bwd


def _saving_operands(forward: Any, names: tuple[str, ...]) -> Any:
    def forward_with_residuals(*positional: Any, cfg: Any = None, **named: Any) -> tuple[Any, tuple[Any, ...]]:
        arrays = (*positional, *(named.pop(name) for name in names[len(positional):]))
        return forward(*arrays, **named, cfg=cfg), arrays

    return forward_with_residuals


gla_vjp = VJP(fwd=_saving_operands(gla, ("q", "k", "v", "g", "initial_state", "cu_seqlens")),
              bwd=_with_cotangent_types(gla_backward), residuals=GLA_RESIDUALS)
ssd_vjp = VJP(fwd=_saving_operands(ssd, ("x", "dt", "A", "B", "C", "D", "dt_bias", "initial_state", "cu_seqlens")),
              bwd=_with_cotangent_types(ssd_backward), residuals=SSD_RESIDUALS)
