"""``gated_delta_rule`` as Triton kernels: the chunked (WY / UT-transform) algorithm, forward and backward.

The kernels read and write the caller's tokens in place (``[B·T, H, D]``: batch rows and packed
sequences alike, no copy): each sequence is cut into ``C``-token chunks, its last one short, and a
chunk's rows past its tokens are masked to ``k = v = β = g = 0`` (they leave the state unchanged).
What passes between kernels sits in rows of whole chunks (``[R, H, ·]``, ``R = chunks·C``). The layout
(:func:`_layout`) gives each chunk's first token and count, each sequence's chunks (``cstart [N + 1]``)
and tokens (``seq [N + 1]``).

Forward, three launches:

- ``gdr_prep_kernel`` (chunk, head): the cumulative log decay ``gc``, the unit lower-triangular
  ``T = (I + strictly_lower(β k kᵀ Γ))⁻¹`` from 16-token blocks (all by products), ``W = T β e^gc k``
  and ``U = T β v``;
- ``gdr_state_kernel`` (V block, sequence·head): the state entering each chunk and every chunk's
  ``N = U − W S``, ``S ← e^{gc_C} S + kᵀ (N e^{gc_C − gc})`` (kept in float32), and the final state;
- ``gdr_output_kernel`` (chunk, head, V block): ``o = scale (e^gc ⊙ (q S) + lower(q kᵀ Γ) N)``.

``W``, ``U`` and the per-chunk states are stored in the inputs' dtype, and the products that read them
take 16-bit operands with float32 sums for 16-bit inputs (what fla's kernels do); float32 inputs keep
float32 throughout.

Backward, six launches (its own chunk, ``backward_chunk``):

- the forward's first two again at the backward's chunk (nothing is kept from the forward): ``T`` and
  ``N`` are among their outputs;
- ``gdr_dv_local_kernel`` (chunk, head, V block): the chunk's own part of ``dN``, ``scale Pᵀ dO``;
- ``gdr_state_bwd_kernel`` (V block, sequence·head), chunks in reverse: the gradient ``dS'`` of the
  state leaving every chunk, the chunk's whole ``dN``, and the initial state's gradient;
- ``gdr_dqkw_kernel`` (K block, chunk, head): ``dq``, the ``k`` gradient through ``P`` and ``S'``,
  ``dW = −dN Sᵀ`` and its K block's part of the ``gc`` gradient;
- ``gdr_wy_bwd_kernel`` (chunk, head): the gradients through ``W``, ``U`` and ``T``: the rest of ``dk``,
  ``dv``, ``dβ`` and of the ``gc`` gradient; ``dg`` is its reverse cumulative sum per chunk (XLA).

``use_qk_l2norm`` normalises ``q`` and ``k`` before the kernels (``_l2norm_kernels``: float32 sums, back to the
input dtype; its backward recomputes the norms).
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from ejk.plugin import cdiv, int_in, next_pow2, one_of, power_of_two
from ejk_triton import _device, _dots, _env
from ejk_triton._launch import kernels, launch, sequential_vmap

__all__ = ["GatedDeltaRuleConfig", "capability", "config_space", "forward", "heuristic_config"]

_EPS = 1e-6


@attrs.frozen(kw_only=True)
class GatedDeltaRuleConfig:
    """Chunk and tiles of the Triton gated delta rule.

    Attributes:
        chunk: Tokens per chunk of the forward (16, 32 or 64): the state kernels run ``T / chunk``
            sequential steps.
        state_block_v: Columns of ``V`` per program of the state kernel (forward, and recomputed in the
            backward; clamped to ``V``).
        output_block_v: Columns of ``V`` per program of the output kernel (clamped to ``V``).
        output_block_k: Rows of ``K`` per step of the output kernel's loop (clamped to ``K``).
        prep_warps: Warps per program of the prep kernel (``T``, ``W``, ``U``; forward and backward).
        num_warps: Warps per program of the state and output kernels.
        num_stages: Software-pipelining stages.
        backward_chunk: Tokens per chunk of the backward kernels (at most ``chunk``).
        backward_warps: Warps per program of the backward kernels.
        block_v: Columns of ``V`` per program of the backward kernels (clamped to ``V``).
        backward_block_k: Columns of ``K`` per program of the backward's ``dq`` / ``dk`` / ``dW`` kernel (clamped to
            ``K``).
        state_bwd_block_v: Columns of ``V`` per program of the backward's reverse state pass (clamped to ``V``).
        state_bwd_warps: Warps per program of the reverse state pass.
        dv_local_block_v: Columns of ``V`` per program of the backward's ``scale Pᵀ dO`` kernel (clamped to
            ``V``; each program forms ``P`` once).
        wy_warps: Warps per program of the backward's kernel through ``W``, ``U`` and ``T``.
    """

    chunk: int = attrs.field(default=64, validator=one_of(16, 32, 64))
    state_block_v: int = attrs.field(default=32, validator=power_of_two(16))
    output_block_v: int = attrs.field(default=128, validator=power_of_two(16))
    output_block_k: int = attrs.field(default=64, validator=power_of_two(16))
    prep_warps: int = attrs.field(default=2, validator=one_of(1, 2, 4, 8))
    num_warps: int = attrs.field(default=4, validator=one_of(1, 2, 4, 8))
    num_stages: int = attrs.field(default=3, validator=int_in(1, 4))
    backward_chunk: int = attrs.field(default=64, validator=one_of(16, 32, 64))
    backward_warps: int = attrs.field(default=8, validator=one_of(1, 2, 4, 8))
    block_v: int = attrs.field(default=64, validator=power_of_two(16))
    backward_block_k: int = attrs.field(default=64, validator=power_of_two(16))
    state_bwd_block_v: int = attrs.field(default=32, validator=power_of_two(16))
    state_bwd_warps: int = attrs.field(default=4, validator=one_of(1, 2, 4, 8))
    dv_local_block_v: int = attrs.field(default=128, validator=power_of_two(16))
    wy_warps: int = attrs.field(default=4, validator=one_of(1, 2, 4, 8))

    def __attrs_post_init__(self) -> None:
        if self.backward_chunk > self.chunk:
            raise ValueError(f"GatedDeltaRuleConfig: backward_chunk={self.backward_chunk} but needs at most "
                             f"chunk={self.chunk} (the backward splits the forward's chunks)")


class _Layout(NamedTuple):
    """Chunks of one chunk size (all int32): ``cstart [N + 1]`` the first chunk of each sequence (the last
    sequence owns the padding chunks), ``seq [N + 1]`` its first token, ``tok [2 · chunks]`` each chunk's first
    token and token count (0 for a padding chunk), ``order [N]`` the sequences from the most chunks to the
    fewest: the per-sequence kernels start the longest first (their time is the longest sequence's walk)."""

    cstart: jax.Array
    seq: jax.Array
    tok: jax.Array
    order: jax.Array


def _layout(batch: int, length: int, cu_seqlens: jax.Array | None, chunk: int) -> _Layout:
    """The chunks of ``batch`` rows of ``length`` tokens, or of the packed sequences of ``cu_seqlens``."""
    if cu_seqlens is None:
        per = cdiv(length, chunk)
        c = jnp.arange(batch * per, dtype=jnp.int32)
        first = c // per * length + c % per * chunk
        count = jnp.minimum(chunk, length - c % per * chunk)
        return _Layout(jnp.arange(batch + 1, dtype=jnp.int32) * per, jnp.arange(batch + 1, dtype=jnp.int32) * length,
                       jnp.stack([first, count], 1).reshape(-1), jnp.arange(batch, dtype=jnp.int32))
    cu = cu_seqlens.astype(jnp.int32)
    sequences = cu.shape[0] - 1
    lens = cu[1:] - cu[:-1]
    cum = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum((lens + chunk - 1) // chunk, dtype=jnp.int32)])
    chunks = cdiv(length, chunk) + sequences  # a static bound on the sequences' chunks
    c = jnp.arange(chunks, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cum[1:], c, side="right", method="compare_all"), 0, sequences - 1)
    start = (c - cum[seq]) * chunk
    count = jnp.where(c < cum[-1], jnp.clip(lens[seq] - start, 0, chunk), 0)
    first = jnp.where(count > 0, cu[seq] + start, 0)
    cstart = jnp.concatenate([cum[:-1], jnp.full((1,), chunks, jnp.int32)])
    order = jnp.argsort(cstart[:-1] - cstart[1:], stable=True).astype(jnp.int32)
    return _Layout(cstart, cu, jnp.stack([first, count], 1).reshape(-1), order)


class _Static(NamedTuple):
    scale: float
    chunk: int
    state_block_v: int
    output_block_v: int
    output_block_k: int
    prep_warps: int
    block_v: int
    num_warps: int
    num_stages: int
    prec: str
    in_prec: str
    backward_chunk: int
    backward_warps: int
    backward_block_k: int
    state_bwd_block_v: int
    state_bwd_warps: int
    dv_local_block_v: int
    wy_warps: int


def _shapes(q: jax.Array, v: jax.Array) -> tuple[int, int, int, int, int]:
    tokens, heads, dk = q.shape
    return tokens, heads, dk, v.shape[-1], max(16, 1 << (dk - 1).bit_length())


def _launch(name: str, *, inputs: tuple[jax.Array, ...], **args: Any) -> tuple[jax.Array, ...]:
    """``launch`` of kernel ``name`` of ``_gdr_kernels``, once per element under ``jax.vmap``."""
    def run(*xs: jax.Array) -> tuple[jax.Array, ...]:
        return launch(getattr(kernels("_gdr_kernels"), name), inputs=xs, **args)

    return sequential_vmap(run)(*inputs)


def _prep_and_states(st: _Static, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array, init: jax.Array,
                     layout: _Layout) -> tuple[jax.Array, ...]:
    """``(w, gc, t, h, new, final)``: the prep kernel's ``W``, ``gc`` and ``T``; the states entering each chunk,
    every chunk's ``N = U − W S`` and the final states (rows of ``st.chunk``-token chunks)."""
    _, heads, dk, dv, bk = _shapes(k, v)
    chunks, sequences = layout.tok.shape[0] // 2, init.shape[0]
    rows = chunks * st.chunk
    bv_all = max(16, 1 << (dv - 1).bit_length())
    f32 = jnp.float32
    common = dict(num_stages=st.num_stages, H=heads, K=dk, V=dv, C=st.chunk, BK=bk, PREC=st.prec)
    w, u, gc, t = _launch("gdr_prep_kernel", grid=(chunks, heads), inputs=(k, v, g, beta, layout.tok),
                          out_shapes=(jax.ShapeDtypeStruct((rows, heads, dk), k.dtype),
                                      jax.ShapeDtypeStruct((rows, heads, dv), k.dtype),
                                      jax.ShapeDtypeStruct((rows, heads), f32),
                                      jax.ShapeDtypeStruct((rows, heads, st.chunk), f32)),
                          **common, num_warps=st.prep_warps, BV=bv_all, IN_PREC=st.in_prec)
    bv = min(st.state_block_v, bv_all)
    h, final, new = _launch("gdr_state_kernel", grid=(cdiv(dv, bv), sequences * heads),
                            inputs=(w, u, k, gc, init, layout.cstart, layout.seq, layout.order),
                            out_shapes=(jax.ShapeDtypeStruct((chunks, heads, dk, dv), k.dtype),
                                        jax.ShapeDtypeStruct((sequences, heads, dk, dv), f32),
                                        jax.ShapeDtypeStruct((rows, heads, dv), k.dtype)),
                            **common, num_warps=st.num_warps, BV=bv, HAS_INIT=True)
    return w, gc, t, h, new, final


def _forward_tokens(st: _Static, q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array,
                    init: jax.Array, layout: _Layout, backward_layout: _Layout) -> tuple[jax.Array, jax.Array]:
    """``(o, final)``; ``backward_layout`` (the backward's chunks) is unused here."""
    del backward_layout
    tokens, heads, dk, dv, bk = _shapes(q, v)
    _, gc, _, h, new, final = _prep_and_states(st, k, v, g, beta, init, layout)
    bv = min(st.output_block_v, max(16, 1 << (dv - 1).bit_length()))
    (o,) = _launch("gdr_output_kernel", grid=(layout.tok.shape[0] // 2, heads, cdiv(dv, bv)),
                  inputs=(q, k, new, gc, h, layout.tok),
                  out_shapes=(jax.ShapeDtypeStruct((tokens, heads, dv), q.dtype),),
                  num_warps=st.num_warps, num_stages=st.num_stages, SCALE=st.scale, H=heads, K=dk, V=dv,
                  C=st.chunk, BK=min(bk, st.output_block_k), BV=bv, PREC=st.prec, IN_PREC=st.in_prec)
    return o, final


def _backward_tokens(st: _Static, residuals: tuple[Any, ...], cotangents: tuple[jax.Array, jax.Array]
                     ) -> tuple[Any, ...]:
    """Recompute ``W, U, T``, the states and ``N`` (in the backward's chunks); then ``scale Pᵀ dO``, the reverse
    state pass (``dS'``, ``dN``), ``dq`` / ``dk`` / ``dW`` per K block, and the gradients through ``W, U, T``
    with ``dg`` (see ``_gdr_kernels``)."""
    q, k, v, g, beta, init, forward_layout, layout = residuals
    d_o, d_final = cotangents
    st = st._replace(chunk=st.backward_chunk)  # the forward's kernels recomputed at the forward's warps
    _, heads, dk, dv, bk = _shapes(q, v)
    chunks, sequences, c = layout.tok.shape[0] // 2, init.shape[0], st.chunk
    rows = chunks * c
    w, gc, t, h, new, _ = _prep_and_states(st, k, v, g, beta, init, layout)
    st = st._replace(num_warps=st.backward_warps)
    bv_all = max(16, 1 << (dv - 1).bit_length())
    bv = min(st.block_v, bv_all)
    f32, low = jnp.float32, k.dtype
    d_o = d_o.astype(low)
    common = dict(num_stages=st.num_stages, H=heads, K=dk, V=dv, C=c)
    bv_local = min(st.dv_local_block_v, bv_all)
    (dvl,) = _launch("gdr_dv_local_kernel", grid=(chunks, heads, cdiv(dv, bv_local)),
                     inputs=(q, k, gc, d_o, layout.tok), out_shapes=(jax.ShapeDtypeStruct((rows, heads, dv), low),),
                     **common, num_warps=st.num_warps, SCALE=st.scale, BK=bk, BV=bv_local, IN_PREC=st.in_prec)
    bv_state = min(st.state_bwd_block_v, bv_all)
    dh, dn, d_init = _launch("gdr_state_bwd_kernel", grid=(cdiv(dv, bv_state), sequences * heads),
                             inputs=(q, k, w, gc, d_o, dvl, d_final.astype(f32), layout.cstart, layout.seq,
                                     layout.order),
                             out_shapes=(jax.ShapeDtypeStruct((chunks, heads, dk, dv), low),
                                         jax.ShapeDtypeStruct((rows, heads, dv), low),
                                         jax.ShapeDtypeStruct((sequences, heads, dk, dv), f32)),
                             **common, num_warps=st.state_bwd_warps, SCALE=st.scale, BK=bk, BV=bv_state,
                             PREC=st.prec)
    bk_part = min(bk, st.backward_block_k)
    k_blocks = cdiv(dk, bk_part)
    dq, dk_part, dw, dgc = _launch(
        "gdr_dqkw_kernel", grid=(k_blocks, chunks, heads), inputs=(q, k, new, gc, h, dh, d_o, dn, layout.tok),
        out_shapes=(jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((rows, heads, dk), f32),
                    jax.ShapeDtypeStruct((rows, heads, dk), low), jax.ShapeDtypeStruct((k_blocks, rows, heads), f32)),
        **common, num_warps=st.num_warps, SCALE=st.scale, BK=bk_part, BV=bv, PREC=st.prec, IN_PREC=st.in_prec)
    dk_, dv_, db, dg = _launch(
        "gdr_wy_bwd_kernel", grid=(chunks, heads), inputs=(k, v, beta, gc, t, dw, dn, dk_part, dgc, layout.tok),
        out_shapes=(jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype),
                    jax.ShapeDtypeStruct(beta.shape, beta.dtype), jax.ShapeDtypeStruct(g.shape, g.dtype)),
        **common, num_warps=st.wy_warps, BK=bk, BV=bv, KB=k_blocks, PREC=st.prec, IN_PREC=st.in_prec)
    no_gradient = tuple(jax.tree.map(lambda x: np.zeros(x.shape, jax.dtypes.float0), lay)
                        for lay in (forward_layout, layout))
    return dq, dk_, dv_, dg, db, d_init.astype(init.dtype), *no_gradient


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _tokens_op(st: _Static, q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array,
               init: jax.Array, layout: _Layout, backward_layout: _Layout) -> tuple[jax.Array, jax.Array]:
    return _forward_tokens(st, q, k, v, g, beta, init, layout, backward_layout)


def _tokens_fwd(st: _Static, *args: Any) -> tuple[tuple[jax.Array, jax.Array], tuple[Any, ...]]:
    return _forward_tokens(st, *args), args


_tokens_op.defvjp(_tokens_fwd, _backward_tokens)


def _l2_launch(name: str, x: jax.Array, *more: jax.Array) -> jax.Array:
    """Kernel ``name`` of ``_l2norm_kernels`` over the rows of ``x`` (``[..., D]``), output shaped like ``x``."""
    d = x.shape[-1]
    rows = x.size // d
    bd = max(16, 1 << (d - 1).bit_length())
    block = min(128, 8192 // bd)  # rows per program: 8192 elements (64 rows of 128)

    def run(*xs: jax.Array) -> tuple[jax.Array, ...]:
        return launch(getattr(kernels("_l2norm_kernels"), name), grid=(cdiv(rows, block),), inputs=xs,
                      out_shapes=(jax.ShapeDtypeStruct(x.shape, x.dtype),), num_warps=4, num_stages=1, ROWS=rows,
                      D=d, BR=block, BD=bd, EPS=_EPS)

    return sequential_vmap(run)(x, *more)[0]


@jax.custom_vjp
def _l2(x: jax.Array) -> jax.Array:
    """``x / sqrt(Σ x² + 1e-6)`` per row (float32 sums, in ``x``'s dtype): one read and one write (the backward
    reads ``x`` and ``dy``, writes ``dx``), where XLA's fusion reads ``x`` twice."""
    return _l2_launch("l2norm_fwd_kernel", x)


def _l2_fwd(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return _l2(x), x


def _l2_bwd(x: jax.Array, dy: jax.Array) -> tuple[jax.Array]:
    return (_l2_launch("l2norm_bwd_kernel", x, dy.astype(x.dtype)),)


_l2.defvjp(_l2_fwd, _l2_bwd)


def _sequences(batch: int, cu_seqlens: Any) -> int:
    """Sequences of a call: the batch, or ``len(cu_seqlens) - 1`` when packed."""
    return batch if cu_seqlens is None else int(cu_seqlens.shape[0]) - 1


def forward(
    q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array, initial_state: jax.Array | None = None,
    cu_seqlens: jax.Array | None = None, *, scale: float, use_qk_l2norm: bool,
    cfg: GatedDeltaRuleConfig | None = None,
) -> tuple[jax.Array, jax.Array]:
    """``(o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32)``; differentiable in every floating input."""
    cfg = cfg or heuristic_config(q, v, cu_seqlens)
    batch, length, heads, dk = q.shape
    dv = v.shape[-1]
    sequences = _sequences(batch, cu_seqlens)
    init = (jnp.zeros((sequences, heads, dk, dv), jnp.float32) if initial_state is None
            else initial_state.astype(jnp.float32))
    if length == 0 or sequences == 0:
        return jnp.zeros(v.shape, q.dtype), init
    if use_qk_l2norm:
        q, k = _l2(q), _l2(k)
    layout = _layout(batch, length, cu_seqlens, cfg.chunk)
    dtype = q.dtype
    st = _Static(scale=float(scale), chunk=cfg.chunk, state_block_v=cfg.state_block_v,
                 output_block_v=cfg.output_block_v, output_block_k=cfg.output_block_k, prep_warps=cfg.prep_warps,
                 block_v=cfg.block_v, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                 prec=_dots.dot_precision(dtype, "highest" if dtype == jnp.float32 else "high"),
                 in_prec=_dots.dot_precision(dtype, "highest"), backward_chunk=cfg.backward_chunk,
                 backward_warps=cfg.backward_warps, backward_block_k=cfg.backward_block_k,
                 state_bwd_block_v=cfg.state_bwd_block_v, state_bwd_warps=cfg.state_bwd_warps,
                 dv_local_block_v=cfg.dv_local_block_v, wy_warps=cfg.wy_warps)
    flat = [x.reshape(batch * length, *x.shape[2:]) for x in (q, k, v, g, beta)]
    o, final = _tokens_op(st, *flat, init, layout, _layout(batch, length, cu_seqlens, cfg.backward_chunk))
    return o.reshape(batch, length, heads, dv), final


def capability(q: Any, k: Any, v: Any, g: Any, beta: Any, initial_state: Any = None, cu_seqlens: Any = None,
               **_: Any) -> str | None:
    """Why this implementation cannot run a call, or ``None`` when it can (abstract arguments suffice).

    Supported: ``K`` and ``V`` up to 256, bfloat16 / float16 / float32 ``q, k, v``, any lengths
    (padded to chunks; the kernels index with int64), packed sequences.
    Needs an NVIDIA GPU (compute capability 8.0+), except in the interpreter mode.
    """
    del g, beta, initial_state
    dk, dv = int(q.shape[-1]), int(v.shape[-1])
    if dk > 256 or dv > 256:
        return f"K={dk}, V={dv}: the kernels hold a [K, V] state tile, K and V up to 256"
    return _dots.gate((("q", q), ("k", k), ("v", v)), (), int64_offsets=True)


_INTERPRETER = GatedDeltaRuleConfig(chunk=16, state_block_v=16, output_block_v=16, output_block_k=16, num_warps=4,
                                    num_stages=1, backward_chunk=16, block_v=16, state_bwd_block_v=16,
                                    dv_local_block_v=16)
#: The forward state kernel's widest ``V`` block (:func:`heuristic_config`).
_WIDEST_STATE_BLOCK_V = 64
_FLOAT32 = GatedDeltaRuleConfig(output_block_v=64, output_block_k=32, prep_warps=8, num_stages=2, block_v=32,
                                state_bwd_warps=8, dv_local_block_v=32, wy_warps=8)


def config_space(q: Any, v: Any = None, cu_seqlens: Any = None, **__: Any) -> list[GatedDeltaRuleConfig]:
    """Autotuning candidates: the heuristic's config (first) with chunks of 64 and 32 tokens (the backward at
    the same chunk), state ``V`` blocks of 32 and 64, 4 or 8 warps for the state and output kernels, output
    ``V`` blocks of 64 and 128."""
    if _env.interpreting_on_cpu():
        return [_INTERPRETER]
    first = heuristic_config(q, v, cu_seqlens)
    space = [attrs.evolve(first, chunk=c, backward_chunk=c, state_block_v=b, output_block_v=o, num_warps=w)
             for c in (64, 32) for b in (32, 64) for w in (4, 8) for o in (64, 128)]
    return [first, *(c for c in space if c != first)]


def heuristic_config(q: Any, v: Any = None, cu_seqlens: Any = None, **__: Any) -> GatedDeltaRuleConfig:
    """Chunks of 64 tokens forward and backward; ``V`` blocks of 32 for the sequential state kernels (forward
    and reverse; the forward's doubled, up to 64, by :func:`ejk_triton._device.widened_block`: 128 was no
    faster), 128 (with ``K`` steps of 64) for the output and the backward's ``scale Pᵀ dO``, 64 for the other
    backward kernels; 2 warps for the prep kernel, 4 for the state, reverse state, output and WY-gradient
    kernels, 8 for the other backward kernels; 3 pipeline stages; ``K`` blocks of 64 in the backward's
    ``dq / dk`` kernel (the fastest measured per kernel on an H100 at Qwen3-Next sizes, no register spills);
    for float32 inputs (tiles twice the size) smaller output and backward tiles and 2 stages, which fit an
    H100's shared memory. 16-token chunks and blocks in the interpreter mode (CPU)."""
    if _env.interpreting_on_cpu():
        return _INTERPRETER
    if q is not None and jnp.dtype(q.dtype) == jnp.float32:
        return _FLOAT32
    base = GatedDeltaRuleConfig()
    if q is None or v is None:
        return base
    heads, dv = int(v.shape[2]), int(v.shape[3])
    sequences = _sequences(int(q.shape[0]), cu_seqlens)
    widest = max(min(next_pow2(dv), _WIDEST_STATE_BLOCK_V), base.state_block_v)
    block = _device.widened_block(base.state_block_v, widest, lambda bv: sequences * heads * cdiv(dv, bv))
    return attrs.evolve(base, state_block_v=block)


def compile_kernels(k_dim: int = 128, v_dim: int = 128, dtype: Any = jnp.bfloat16, *,
                    cfg: GatedDeltaRuleConfig | None = None, arch: int = 90) -> dict[str, Any]:
    """Compile the kernels a forward and a backward launch (at their own chunks and warps) for compute
    capability ``arch``, without a GPU, at ``H = 32``.

    Returns each kernel's shared memory (bytes) and PTX. Needs compiled Triton (not the interpreter
    mode), like ``ejk_triton._aot``.
    """
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ejk_triton._aot import _compiled_mode, _ptr

    cfg = cfg or GatedDeltaRuleConfig()

    def build(fn: Any, pointers: list[str], consts: dict[str, Any], warps: int) -> dict[str, Any]:
        signature: dict[str, str] = {fn.arg_names[i]: p for i, p in enumerate(pointers)}
        signature.update({name: "constexpr" for name in consts})
        attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(pointers))}
        kernel = triton_compile(ASTSource(fn, signature=signature, constexprs=consts, attrs=attrs),
                                target=GPUTarget("cuda", arch, 32),
                                options={"num_warps": warps, "num_stages": cfg.num_stages})
        return {"shared": int(kernel.metadata.shared), "ptx": kernel.asm["ptx"]}

    _compiled_mode()
    bk, bv_all = max(16, 1 << (k_dim - 1).bit_length()), max(16, 1 << (v_dim - 1).bit_length())
    bv = min(cfg.block_v, bv_all)
    dtype = jnp.dtype(dtype)
    prec = _dots.dot_precision(dtype, "highest" if dtype == jnp.float32 else "high")
    in_prec = _dots.dot_precision(dtype, "highest")
    x, f32, i32 = _ptr(dtype), _ptr(jnp.float32), _ptr(jnp.int32)
    module = kernels("_gdr_kernels")
    report = {}
    for phase, chunk in (("", cfg.chunk), (" (backward)", cfg.backward_chunk)):
        base = dict(H=32, K=k_dim, V=v_dim, C=chunk, BK=bk, PREC=prec)
        launches: dict[str, tuple[str, list[str], dict[str, Any], int]] = {
            "prep": ("gdr_prep_kernel", [x, x, f32, x, i32, x, x, f32, f32], dict(base, BV=bv_all, IN_PREC=in_prec),
                     cfg.prep_warps),
            "state": ("gdr_state_kernel", [x, x, x, f32, f32, i32, i32, i32, x, f32, x],
                      dict(base, BV=min(cfg.state_block_v, bv_all), HAS_INIT=True), cfg.num_warps),
        }
        if phase:
            scaled = dict(base, SCALE=0.0884, BV=bv)
            warps = cfg.backward_warps
            launches.update({
                "dv_local": ("gdr_dv_local_kernel", [x, x, f32, x, i32, x],
                             {**{n: v for n, v in scaled.items() if n != "PREC"}, "IN_PREC": in_prec,
                              "BV": min(cfg.dv_local_block_v, bv_all)}, warps),
                "state_bwd": ("gdr_state_bwd_kernel", [x, x, x, f32, x, x, f32, i32, i32, i32, x, x, f32],
                              dict(scaled, BV=min(cfg.state_bwd_block_v, bv_all)), cfg.state_bwd_warps),
                "dqkw": ("gdr_dqkw_kernel", [x, x, x, f32, x, x, x, x, i32, x, f32, x, f32],
                         dict(scaled, BK=min(bk, cfg.backward_block_k), IN_PREC=in_prec), warps),
                "wy_bwd": ("gdr_wy_bwd_kernel", [x, x, x, f32, f32, x, x, f32, f32, i32, x, x, x, f32],
                           dict(base, BV=bv, KB=cdiv(k_dim, min(bk, cfg.backward_block_k)), IN_PREC=in_prec),
                           cfg.wy_warps),
            })
        else:
            launches["output"] = ("gdr_output_kernel", [x, x, x, f32, x, i32, x],
                                  dict(base, SCALE=0.0884, BK=min(bk, cfg.output_block_k),
                                       BV=min(cfg.output_block_v, bv_all), IN_PREC=in_prec), cfg.num_warps)
        for name, (fn, pointers, consts, warps) in launches.items():
            report[name + phase] = build(getattr(module, fn), pointers, consts, warps)
    return report
