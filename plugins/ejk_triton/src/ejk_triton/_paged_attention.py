"""Ragged paged attention as a Triton kernel: decode and chunked prefill with split-K.

One kernel serves both modes (see ``_paged_kernels``). A program takes a *tile* of up to
``block_q`` query tokens of one sequence and one kv head; the tile's tokens times the kv head's
``G`` q heads are the rows of its ``tl.dot`` (padded to 16), so each page of keys and values is
read once per tile and kv head, whatever the GQA ratio. Decode (``block_q = 1``) thus reads the
KV cache exactly once: ``2 · Σ kv_len · Hkv · D · itemsize`` bytes, the floor for this op,
plus the table and ``q``, which are small. A prefill tile of ``block_q`` tokens reads its
sequence's visible pages once for ``block_q · G`` rows (about ``2 · block_q · G`` FLOPs per byte
read, as in flash attention), so the same kernel is compute-bound there. Sliding
windows and the causal end bound each tile's loop: pages outside are never loaded.

Split-K: the keys a tile sees are cut into ``num_splits`` ranges of whole blocks, one program
each (grid ``(tiles, Hkv, splits)``), so a few long sequences still fill the GPU at batch 8.
Each split writes its unnormalised float32 output with its base-2 running max and sum
(``O(splits · T · Hq · Dv)`` bytes, at most about 3% of the KV read for decode at 2k+ context),
merged by a small JAX computation after the launch (``fused_merge=True``: each split counts itself
in an arrival counter of its tile and the one that arrives last merges in the kernel, at the price
of a memset of the counters before the launch). With one split the kernel writes the normalised
output directly. No output is zeroed before the launch: the rows of no live sequence, which no
program writes, are zeroed after it.

``num_seqs``, ``cu_q_lens`` and ``kv_lens`` are device values, so the grid is static: it has
``min(T, cdiv(T, block_q) + min(S, T))`` tile slots (an upper bound of the tiles of any valid
batch) and the programs past the batch's last tile return at once.

Not differentiable (serving-time attention): registered without a VJP, like ejk-xla's.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import jax
import jax.custom_batching
import jax.numpy as jnp

from ejk.ops import paged_merge_splits, paged_owned_rows
from ejk.plugin import cdiv as _cdiv
from ejk.plugin import int_in, one_of, power_of_two
from ejk.plugin import next_pow2 as _next_pow2
from ejk.plugin import padded_dim as _head_dim
from ejk_triton import _env
from ejk_triton._device import compute_capability_reason as _compute_capability_reason
from ejk_triton._device import sm_count as _sm_count
from ejk_triton._device import smem_limit as _smem_limit
from ejk_triton._dots import dot_precision
from ejk_triton._launch import launch, sequential_vmap

__all__ = ["PagedAttentionConfig", "capability", "config_space", "heuristic_config", "ragged_paged_attention"]

_DTYPES = ("bfloat16", "float16", "float32")
_LOG2E = 1.4426950408889634
_MAX_HEAD_DIM = 256
_MAX_HEAD_DIM_F32 = 128
_MAX_SEQS = 4096  # each program scans all S sequences' query lengths to find its tile
_MAX_GRID_YZ = 65535
_MAX_BLOCK_M = 256  # query rows (tokens x q heads of a kv head) per program
_MAX_SPLITS = 64
_SM_SMEM = 228 * 1024  # shared memory per SM on Hopper
_SM_REGS = 65536
_REGS_PER_THREAD = 160  # about what ptxas gives the decode kernel (sm_90, 4 warps, 64 keys per step)
_MAX_CTAS_PER_SM = 4
_PREFILL_ROWS = 128  # rows a prefill tile aims for (block_q * G)
_MIN_STEPS_PER_SPLIT = 8  # a split gets at least this many blocks of keys (its pipeline ramp amortised)


def _boolean(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{type(instance).__name__}.{attribute.name} is {value!r} but needs a bool")


@attrs.frozen(kw_only=True)
class PagedAttentionConfig:
    """Tiles and launch parameters of the Triton ragged paged attention.

    Attributes:
        block_q: Query tokens per program (a tile never spans two sequences). With the kv
            head's ``G`` q heads they make ``block_q * G`` rows (padded to a power of two
            ``>= 16``, at most 256). 1 for decode.
        block_kv: Keys per loop step, gathered through the page table (any page size).
        num_splits: Programs that share one tile's keys (split-K); their partial results
            are merged afterwards. 1 writes the output directly.
        fused_merge: With several splits, ``True`` has the split that finishes last merge the
            partials in the kernel (arrival counters, zeroed by a memset before the launch);
            ``False`` (the default) merges them in a small JAX computation after it, which
            costs less on the H100 than the memset does.
        num_warps: Warps per program.
        num_stages: Software-pipelining stages of the key loop.
    """

    block_q: int = attrs.field(default=1, validator=power_of_two(1))
    block_kv: int = attrs.field(default=64, validator=power_of_two(16))
    num_splits: int = attrs.field(default=1, validator=int_in(1, _MAX_SPLITS))
    fused_merge: bool = attrs.field(default=False, validator=_boolean)
    num_warps: int = attrs.field(default=4, validator=one_of(1, 2, 4, 8, 16))
    num_stages: int = attrs.field(default=2, validator=int_in(1, 8))


# ----------------------------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------------------------


def _kernels() -> Any:
    _env.import_triton()
    from ejk_triton import _paged_kernels

    return _paged_kernels


def _block_m(block_q: int, groups: int) -> int:
    return max(16, _next_pow2(block_q * groups))


def max_tiles(tokens: int, seqs: int, block_q: int) -> int:
    """Tiles any valid batch of ``T`` tokens and ``S`` sequences can have (the grid's first dim)."""
    return min(tokens, _cdiv(tokens, block_q) + min(seqs, tokens))


def _launch(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, kv_lens: jax.Array, page_indices: jax.Array,
            cu_q_lens: jax.Array, num_seqs: jax.Array, sinks: jax.Array, *, scale: float, left: int | None,
            cap: float | None, cfg: PagedAttentionConfig, has_sinks: bool = False,
            precision: str = "highest") -> jax.Array:
    tokens, hq, _ = q.shape
    hkv, dv = k_pages.shape[2], v_pages.shape[-1]
    seqs = page_indices.shape[0]
    splits = cfg.num_splits
    consts = _kernel_args(q, k_pages, v_pages, page_indices, scale=scale, left=left, cap=cap, cfg=cfg,
                          precision=precision)
    i32 = jnp.int32
    sinks = sinks.astype(jnp.float32) if has_sinks else q  # a placeholder, never read, without sinks
    inputs = (q, k_pages, v_pages, kv_lens.astype(i32), page_indices.astype(i32), cu_q_lens.astype(i32),
              jnp.reshape(num_seqs, (1,)).astype(i32), sinks)
    grid = (max_tiles(tokens, seqs, cfg.block_q), hkv, splits)
    sds = jax.ShapeDtypeStruct
    out = sds((tokens, hq, dv), q.dtype)
    parts = (sds((splits, tokens, hq, dv), jnp.float32), sds((splits, tokens, hq), jnp.float32),
             sds((splits, tokens, hq), jnp.float32))
    unused = sds((1,), jnp.float32)
    # Zeroed outputs cost a memset each before the launch, which on the H100 adds more to a decode call than
    # the merge in JAX: only the fused merge's arrival counters are zeroed; rows of no live sequence are
    # zeroed afterwards (no program writes them).
    zeroed: tuple[int, ...] = ()
    if splits == 1:
        out_shapes = (out, unused, unused, unused, sds((1,), i32))
    elif cfg.fused_merge:
        out_shapes, zeroed = (out, *parts, sds((grid[0] * hkv,), i32)), (4,)
    else:
        out_shapes = (sds((1,), q.dtype), *parts, sds((1,), i32))
    result = launch(_kernels().paged_attention_kernel, grid=grid, inputs=inputs, out_shapes=out_shapes,
                    num_warps=cfg.num_warps, num_stages=cfg.num_stages, zeroed_outputs=zeroed, HAS_SINKS=has_sinks,
                    **consts)
    if splits == 1 or cfg.fused_merge:
        return _owned_only(result[0], cu_q_lens, num_seqs)
    sinks2 = sinks * _LOG2E if has_sinks else None  # [Hq]: broadcasts over the merged rows [T, Hq]
    merged = paged_merge_splits(result[1], result[2], result[3], sinks2)
    return _owned_only(merged, cu_q_lens, num_seqs).astype(q.dtype)


def _owned_only(out: jax.Array, cu_q_lens: jax.Array, num_seqs: jax.Array) -> jax.Array:
    """``out`` with the rows of no live sequence zeroed (no program writes them)."""
    owned = paged_owned_rows(out.shape[0], cu_q_lens, num_seqs)
    return jnp.where(owned[:, None, None], out, jnp.zeros((), out.dtype))


def ragged_paged_attention(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    kv_lens: jax.Array,
    page_indices: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: jax.Array,
    *,
    softmax_scale: float,
    sliding_window: tuple[int, int] | None,
    logits_soft_cap: float | None,
    sinks: jax.Array | None = None,
    precision: str = "highest",
    cfg: PagedAttentionConfig | None = None,
) -> jax.Array:
    """Causal attention of ragged query chunks over a paged KV cache (see ``docs/KERNEL_CONTRACT.md``).

    Arguments arrive validated and normalised by the op layer.

    Args:
        q: ``[T, Hq, D]``.
        k_pages: ``[P, page, Hkv, D]``.
        v_pages: ``[P, page, Hkv, Dv]``.
        kv_lens: ``[S]`` int32.
        page_indices: ``[S, pages_per_seq]`` int32.
        cu_q_lens: ``[S+1]`` int32: sequence ``s`` owns query rows ``cu_q_lens[s]:cu_q_lens[s+1]``,
            the last positions of its context (bottom-right aligned).
        num_seqs: int32 scalar: the live sequences (may be traced).
        softmax_scale: Logit scale (already resolved).
        sliding_window: ``(left, 0)`` or ``None``.
        logits_soft_cap: ``cap * tanh(logits / cap)`` when given.
        sinks: ``[Hq]`` sink logits (added to each seen row's denominator where it is normalised) or ``None``.
        precision: Of float32 dots: ``"highest"`` (IEEE), ``"high"`` (3xTF32) or ``"default"`` (TF32).
        cfg: The config; ``None`` means :func:`heuristic_config` for these shapes.

    Returns:
        ``[T, Hq, Dv]`` in ``q.dtype``; rows of no live sequence, and rows that see no key, are zeros.
    """
    tokens, hq, _ = q.shape
    seqs, pages_per_seq = page_indices.shape
    if min(tokens, hq, seqs, pages_per_seq, k_pages.shape[0], k_pages.shape[1]) == 0:
        return jnp.zeros((tokens, hq, v_pages.shape[-1]), q.dtype)
    if cfg is None:
        cfg = heuristic_config(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs)
    run = functools.partial(
        _launch, scale=float(softmax_scale), left=None if sliding_window is None else int(sliding_window[0]),
        cap=None if logits_soft_cap is None else float(logits_soft_cap), cfg=cfg, has_sinks=sinks is not None,
        precision=str(precision),
    )
    sink_arg = jnp.zeros((hq,), jnp.float32) if sinks is None else sinks
    (out,) = sequential_vmap(lambda *arrays: (run(*arrays),))(  # each mapped problem keeps its own page table
        q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, jnp.asarray(num_seqs), sink_arg)
    return out


# ----------------------------------------------------------------------------------------------
# Capability gate and configs
# ----------------------------------------------------------------------------------------------


def capability(q: Any, k_pages: Any, v_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any,
               num_seqs: Any, **_: Any) -> str | None:
    """Why this implementation cannot run a call, or ``None`` when it can (abstract arguments suffice).

    Supported: bfloat16 / float16 q, k_pages, v_pages of one dtype with head dims up to 256
    (q/k and v may differ), float32 up to 128; any page size; GQA ratios up to 256 q heads per
    kv head; up to 4096 sequences; sliding windows; soft cap. Needs an NVIDIA GPU (compute
    capability 8.0+), except in the interpreter mode (``EJK_TRITON_INTERPRET=1``).
    """
    del kv_lens, cu_q_lens, num_seqs
    dtypes = {jnp.dtype(x.dtype).name for x in (q, k_pages, v_pages)}
    unsupported = sorted(dtypes - set(_DTYPES))
    if unsupported:
        return f"{', '.join(unsupported)} not supported (bfloat16, float16 and float32 only)"
    if len(dtypes) > 1:
        return f"q, k_pages, v_pages must share one dtype (got {', '.join(sorted(dtypes))})"
    limit = _MAX_HEAD_DIM_F32 if "float32" in dtypes else _MAX_HEAD_DIM
    for name, dim in (("head_dim", int(q.shape[2])), ("v head_dim", int(v_pages.shape[3]))):
        if dim > limit:
            return f"{name} {dim} not supported{' in float32' if 'float32' in dtypes else ''} (at most {limit})"
    groups = int(q.shape[1]) // max(int(k_pages.shape[2]), 1)
    if groups > _MAX_BLOCK_M:
        return f"{groups} q heads per kv head not supported (at most {_MAX_BLOCK_M})"
    if int(k_pages.shape[2]) > _MAX_GRID_YZ:
        return f"{int(k_pages.shape[2])} kv heads exceed the grid limit {_MAX_GRID_YZ}"
    if int(page_indices.shape[0]) > _MAX_SEQS:
        return f"{int(page_indices.shape[0])} sequences not supported (at most {_MAX_SEQS})"
    if _env.interpret_mode():
        return None
    on_gpu, why = _env.nvidia_gpu()
    if not on_gpu:
        return f"needs an NVIDIA GPU ({why})"
    return _compute_capability_reason()


def smem_bytes(cfg: PagedAttentionConfig, q: Any, v_pages: Any) -> int:
    """Shared memory estimate (bytes): ``num_stages - 1`` buffers of keys and values, the query
    tile and the probabilities (matches triton 3.6 for sm_90 on decode shapes)."""
    itemsize = jnp.dtype(q.dtype).itemsize
    d, dv = _head_dim(int(q.shape[2])), _head_dim(int(v_pages.shape[3]))
    groups = int(q.shape[1]) // max(int(v_pages.shape[2]), 1)
    rows = _block_m(cfg.block_q, groups)
    return int((max(1, cfg.num_stages - 1) * cfg.block_kv * (d + dv) + rows * (d + cfg.block_kv)) * itemsize)


def _kernel_args(q: Any, k_pages: Any, v_pages: Any, page_indices: Any, *, scale: float, left: int | None,
                 cap: float | None, cfg: PagedAttentionConfig, precision: str = "highest") -> dict[str, Any]:
    """The kernel's ``constexpr`` arguments for one call."""
    tokens, hq, d = (int(n) for n in q.shape)
    num_pages, page, hkv, _ = (int(n) for n in k_pages.shape)
    dv = int(v_pages.shape[-1])
    seqs, pages_per_seq = (int(n) for n in page_indices.shape)
    groups = hq // hkv
    return dict(
        SCALE=scale, CAP=float(cap or 1.0), T=tokens, HQ=hq, GROUP=groups, D=d, DV=dv, HEAD_DIM=_head_dim(d),
        HEAD_DIM_V=_head_dim(dv), NUM_PAGES=num_pages, PAGE=page, PAGES_PER_SEQ=pages_per_seq, SEQS=seqs,
        SEQS_POW2=_next_pow2(seqs), WINDOW=left is not None, WIN_L=int(left or 0), HAS_CAP=cap is not None,
        DOT_PREC=dot_precision(q.dtype, precision),  # 16-bit operands ignore it
        BLOCK_Q=cfg.block_q, BLOCK_M=_block_m(cfg.block_q, groups), BLOCK_N=cfg.block_kv, NUM_SPLITS=cfg.num_splits,
        MERGE=cfg.fused_merge and cfg.num_splits > 1,
        ONE_LOOP=cfg.block_q == 1,
    )


def _is_decode(q: Any, page_indices: Any) -> bool:
    """At most one query per sequence on average (``T <= S``)."""
    return int(q.shape[0]) <= int(page_indices.shape[0])


def _block_q(q: Any, k_pages: Any, page_indices: Any) -> int:
    """1 for decode; else about the average query length, with at most 128 rows per tile."""
    if _is_decode(q, page_indices):
        return 1
    groups = int(q.shape[1]) // int(k_pages.shape[2])
    average = _cdiv(int(q.shape[0]), max(int(page_indices.shape[0]), 1))
    return max(1, min(_next_pow2(average), _PREFILL_ROWS // _next_pow2(groups)))


def _capacity(k_pages: Any, page_indices: Any) -> int:
    """Keys of the longest context the page table can hold (pages per sequence x page size)."""
    return int(page_indices.shape[1]) * int(k_pages.shape[1])


def _splits(cfg: PagedAttentionConfig, q: Any, k_pages: Any, v_pages: Any, page_indices: Any) -> int:
    """Split-K so that the programs fill the GPU's resident slots in about one wave, each split
    keeping at least 8 key steps.

    Without splits there are ``tiles · Hkv`` programs (``tiles`` estimated as ``cdiv(T, block_q)``).
    Slots = SMs x CTAs per SM (from shared memory and registers, at most 4; 3 for the decode
    config on an H100). Splits = ``slots // programs`` (one wave), at most the number of
    ``8 · block_kv``-key pieces of the longest possible context, and at most 64 (what it measured
    against other split counts: ``benchmarks/results/kernel_defaults_h100.md``).
    """
    programs = _cdiv(int(q.shape[0]), cfg.block_q) * int(k_pages.shape[2])
    by_smem = _SM_SMEM // max(smem_bytes(cfg, q, v_pages) + 1024, 1)
    by_regs = _SM_REGS // (cfg.num_warps * 32 * _REGS_PER_THREAD)
    slots = _sm_count() * max(1, min(_MAX_CTAS_PER_SM, by_smem, by_regs))
    pieces = max(1, _capacity(k_pages, page_indices) // (_MIN_STEPS_PER_SPLIT * cfg.block_kv))
    return max(1, min(slots // max(programs, 1), pieces, _MAX_SPLITS))


def _base_config(q: Any, k_pages: Any, v_pages: Any, page_indices: Any) -> PagedAttentionConfig:
    d = max(_head_dim(int(q.shape[2])), _head_dim(int(v_pages.shape[3])))
    f32 = jnp.dtype(q.dtype) == jnp.float32
    block_q = _block_q(q, k_pages, page_indices)
    rows = _block_m(block_q, int(q.shape[1]) // int(k_pages.shape[2]))
    block_kv = 32 if d > 128 or (f32 and d > 64) else 64
    warps = 8 if rows * max(d, 64) >= 128 * 128 else 4
    stages = 3 if rows <= 64 and not f32 else 2
    return PagedAttentionConfig(block_q=block_q, block_kv=block_kv, num_warps=warps, num_stages=stages)


def _fits(cfg: PagedAttentionConfig, q: Any, v_pages: Any) -> bool:
    return smem_bytes(cfg, q, v_pages) <= _smem_limit()


def heuristic_config(q: Any, k_pages: Any, v_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any,
                     num_seqs: Any, **_: Any) -> PagedAttentionConfig:
    """Decode (``T <= S``): one token per tile; else about the average query length (<= 128 rows).

    Keys per step: 64 (32 for head dims over 128, or float32 over 64); 4 warps, 8 from 128 x 128
    rows x head dim; 3 stages up to 64 rows (2 above, and for float32); split-K by
    :func:`_splits` (decode at batch 8, 8 kv heads on an H100: 4 splits, 256 programs), merged in
    JAX.
    In the interpreter mode (CPU), 16 keys per step and at most 2 splits keep the Python-level
    work small.

    Args:
        q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs: The operation's arrays
            (anything with ``.shape`` and ``.dtype``).
    """
    del kv_lens, cu_q_lens, num_seqs
    cfg = _base_config(q, k_pages, v_pages, page_indices)
    if _env.interpreting_on_cpu():
        return attrs.evolve(cfg, block_kv=16, num_splits=2 if _is_decode(q, page_indices) else 1)
    while not _fits(cfg, q, v_pages) and (cfg.num_stages > 1 or cfg.block_kv > 16):
        cfg = (attrs.evolve(cfg, num_stages=cfg.num_stages - 1) if cfg.num_stages > 1
               else attrs.evolve(cfg, block_kv=cfg.block_kv // 2))
    return attrs.evolve(cfg, num_splits=_splits(cfg, q, k_pages, v_pages, page_indices))


def config_space(q: Any, k_pages: Any, v_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any,
                 num_seqs: Any, **_: Any) -> list[PagedAttentionConfig]:
    """Autotuning candidates around the heuristic's config, pruned by a shared-memory estimate.

    Varies keys per step (32, 64, 128; 8 warps with 128), stages (2-4), warps (4, 8), split-K
    (the heuristic's, halved, doubled, and 1), the merge (in the kernel or in JAX) and, for
    prefill, tokens per tile (half and double). The heuristic's config comes first.

    Args: as for :func:`heuristic_config`.

    Returns:
        At most 16 distinct configs.
    """
    base = heuristic_config(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs)
    if _env.interpreting_on_cpu():
        return [base, attrs.evolve(base, block_kv=32, num_splits=1)]
    evolve = attrs.evolve
    candidates = [base]
    for block_kv in (32, 64, 128):
        for stages in (2, 3, 4):  # 128 keys per step need 8 warps to hold their tiles in registers
            warps = max(base.num_warps, 8) if block_kv == 128 else base.num_warps
            candidates.append(evolve(base, block_kv=block_kv, num_stages=stages, num_warps=warps))
    candidates.append(evolve(base, num_warps=8 if base.num_warps == 4 else 4))
    for splits in (1, max(1, base.num_splits // 2), min(_MAX_SPLITS, base.num_splits * 2)):
        candidates.append(evolve(base, num_splits=splits))
    if base.num_splits > 1:
        candidates.append(evolve(base, fused_merge=not base.fused_merge))
    if not _is_decode(q, page_indices):
        groups = int(q.shape[1]) // int(k_pages.shape[2])
        for block_q in (max(1, base.block_q // 2), base.block_q * 2):
            if _block_m(block_q, groups) <= _MAX_BLOCK_M:
                candidates.append(evolve(base, block_q=block_q))
    fitting = [c for c in dict.fromkeys(candidates) if c is base or _fits(c, q, v_pages)]
    return fitting[:16]
