"""MoE grouped matmul and ragged paged attention on one GPU: ejk's XLA kernels next to baselines.

Lines (same process, same inputs, bf16):

- grouped matmul ``lhs [m, k] x rhs [g, k, n]`` with uneven groups (a seeded Dirichlet split of
  the ``m`` tokens over the ``g`` experts, every token assigned):
  ``ejk xla`` (``ejk_xla._grouped_matmul.grouped_matmul``, best of a few ``block_m``, named),
  ``lax.ragged_dot``, and ``dense equal-groups``: an einsum over ``[g, m/g, k] x [g, k, n]``
  (equal groups, same FLOPs; an upper bound, not the same maths). ``fwd`` and ``fwd+bwd``
  (output plus d lhs, d rhs of ``sum(out * cotangent)`` in one jitted call).
  FLOPs ``2·m·k·n``, fwd+bwd ``3x``.
- ragged paged attention (``ejk_xla._paged_attention.ragged_paged_attention``, best of a few
  ``pages_per_block``, named) against a dense reference that gathers each sequence's pages into
  ``[S, ctx, Hkv, D]``, repeats the kv heads and calls ``jax.nn.dot_product_attention`` (xla);
  the gather is inside the timed call. ``decode`` (one query per sequence): GB/s of the KV
  cache read, ``2·S·ctx·Hkv·D·2`` bytes. ``prefill`` (chunked: ``q`` new tokens at the end of
  each context): TFLOP/s with the exact causal count
  ``4·Hq·D·Σ_seq Σ_i (ctx − q + i + 1)`` (each query sees the keys up to its own position).

Timing: compile, two warm-up calls, then the median of ``--reps`` calls, each ended by
``block_until_ready``. A failure (unsupported, out of memory, …) is reported on its line.
Numerics: each ejk line's output (and the grads, for fwd+bwd) against its baseline, below the table.

Usage:
    python benchmarks/bench_moe_paged_gpu.py            # full shapes (GPU)
    python benchmarks/bench_moe_paged_gpu.py --smoke    # tiny shapes, runs on the CPU

The markdown goes to ``$OUT/moe_paged_gpu.md`` when ``OUT`` is set, else to
``benchmarks/results/moe_paged_gpu.md`` (``--out`` overrides both; a smoke run writes
``moe_paged_gpu_smoke.md`` instead).
"""

from __future__ import annotations

import argparse
import math
import os
import traceback
from collections.abc import Callable
from typing import Any

import _harness
import attrs
import jax
import jax.numpy as jnp
import numpy as np
from _harness import error_text, time_ms

from ejk_xla._grouped_matmul import GroupedMatmulConfig, grouped_matmul
from ejk_xla._paged_attention import PagedAttentionConfig, ragged_paged_attention

DTYPE = jnp.bfloat16
DIRICHLET_ALPHA = 1.0


@attrs.frozen(kw_only=True)
class MoeShape:
    experts: int
    k: int
    n: int
    tokens: int

    def __str__(self) -> str:
        return f"g={self.experts} k={self.k} n={self.n} m={self.tokens}"

    def fwd_flops(self) -> float:
        return 2.0 * self.tokens * self.k * self.n


@attrs.frozen(kw_only=True)
class PagedShape:
    seqs: int
    ctx: int
    q_len: int  # new query tokens per sequence (1: decode)
    hq: int
    hkv: int
    dim: int
    page: int

    def __str__(self) -> str:
        kind = "decode" if self.q_len == 1 else f"prefill q={self.q_len}"
        return f"S={self.seqs} ctx={self.ctx} {kind} Hq={self.hq} Hkv={self.hkv} D={self.dim} page={self.page}"

    def kv_bytes(self) -> float:
        return 2.0 * self.seqs * self.ctx * self.hkv * self.dim * 2

    def causal_flops(self) -> float:
        visible = self.q_len * (self.ctx - self.q_len) + self.q_len * (self.q_len + 1) / 2
        return 4.0 * self.hq * self.dim * self.seqs * visible


FULL_MOE = (MoeShape(experts=64, k=2048, n=1536, tokens=32768), MoeShape(experts=8, k=4096, n=14336, tokens=8192))
SMOKE_MOE = (MoeShape(experts=4, k=64, n=32, tokens=256),)
FULL_BLOCK_M, SMOKE_BLOCK_M = (128, 256, 512), (16, 32)
def _configs(per_token: tuple[int, ...], tiled: tuple[tuple[int, int], ...]) -> tuple[PagedAttentionConfig, ...]:
    """Per-token configs (pages per block) and sequence-tiled ones ((q_block, pages per block))."""
    return (*(PagedAttentionConfig(pages_per_block=b) for b in per_token),
            *(PagedAttentionConfig(pages_per_block=b, q_block=q) for q, b in tiled))


FULL_PAGED = (
    (PagedShape(seqs=16, ctx=4096, q_len=1, hq=32, hkv=8, dim=128, page=64),
     _configs((4, 8, 16, 32), ((1, 8), (1, 32)))),
    (PagedShape(seqs=4, ctx=2048, q_len=256, hq=32, hkv=8, dim=128, page=64),
     _configs((4, 8), ((64, 8), (128, 8), (256, 4), (256, 8), (256, 16)))),
)
SMOKE_PAGED = (
    (PagedShape(seqs=2, ctx=256, q_len=1, hq=4, hkv=2, dim=32, page=16), _configs((2, 4), ((1, 4),))),
    (PagedShape(seqs=2, ctx=128, q_len=32, hq=4, hkv=2, dim=32, page=16), _configs((2,), ((16, 2), (32, 4)))),
)


def bench_line(
    case: str, mode: str, name: str, candidates: dict[str, Callable[..., Any]], args: tuple[Any, ...],
    reps: int, work: float, unit: str,
) -> str:
    """One table row: the best of ``candidates`` (label → fn of ``args``), or why none ran.

    ``work`` is FLOPs when ``unit`` is TFLOP/s, bytes when it is GB/s.
    """
    results: dict[str, float] = {}
    errors: list[str] = []
    for label, fn in candidates.items():
        try:
            results[label] = time_ms(fn, args, reps)
        except Exception as exc:  # report per line, keep going
            errors.append(f"{label}: {error_text(exc)}" if label else error_text(exc))
            if os.environ.get("EJK_BENCH_TRACEBACK"):
                traceback.print_exc()
    if not results:
        return f"| {case} | {mode} | {name} | failed | | {'; '.join(errors)} |"
    label, ms = min(results.items(), key=lambda kv: kv[1])
    note = label + (f" (failed: {'; '.join(errors)})" if errors else "")
    rate = work / ms / (1e9 if unit == "TFLOP/s" else 1e6)
    rate_text = f"{rate:,.1f}" if rate >= 1 else f"{rate:.4f}"
    return f"| {case} | {mode} | {name} | {ms:,.3f} | {rate_text} {unit} | {note} |"


def max_abs_diff(ours: Callable[..., Any], base: Callable[..., Any], args: tuple[Any, ...]) -> str:
    """Max abs difference of every output leaf, ours against the baseline, on the benchmark inputs."""
    try:
        got = jax.tree.leaves(jax.jit(ours)(*args))
        want = jax.tree.leaves(jax.jit(base)(*args))
        diffs = [
            f"{float(jnp.max(jnp.abs(g.astype(jnp.float32) - w.astype(jnp.float32)))):.3g}"
            f" (max |ref| {float(jnp.max(jnp.abs(w.astype(jnp.float32)))):.3g})"
            for g, w in zip(got, want, strict=True)
        ]
        return ", ".join(diffs)
    except Exception as exc:
        return f"check failed: {error_text(exc)}"


# ---- grouped matmul -------------------------------------------------------------------------


def dirichlet_sizes(rng: np.random.Generator, tokens: int, experts: int) -> np.ndarray:
    """A Dirichlet split of ``tokens`` into ``experts`` non-negative sizes that sum to ``tokens``."""
    share = rng.dirichlet(np.full(experts, DIRICHLET_ALPHA)) * tokens
    sizes = np.floor(share).astype(np.int64)
    remainder = np.argsort(sizes - share)[: tokens - int(sizes.sum())]  # largest fractional parts
    sizes[remainder] += 1
    assert sizes.sum() == tokens and sizes.min() >= 0
    return sizes.astype(np.int32)


def ejk_gmm(block_m: int) -> Callable[..., jax.Array]:
    return lambda lhs, rhs, sizes: grouped_matmul(lhs, rhs, sizes, cfg=GroupedMatmulConfig(block_m=block_m))


def ragged_dot(lhs: jax.Array, rhs: jax.Array, sizes: jax.Array) -> jax.Array:
    return jax.lax.ragged_dot(lhs, rhs, sizes)


def dense_equal_groups(lhs: jax.Array, rhs: jax.Array, sizes: jax.Array) -> jax.Array:
    del sizes  # equal groups: the upper bound of the same FLOPs
    g = rhs.shape[0]
    out = jnp.einsum("gtk,gkn->gtn", lhs.reshape(g, lhs.shape[0] // g, lhs.shape[1]), rhs)
    return out.reshape(lhs.shape[0], rhs.shape[2])


def gmm_with_backward(gmm: Callable[..., jax.Array]) -> Callable[..., Any]:
    """Output and (d lhs, d rhs) of ``sum(out * ct)`` in one function."""

    def fn(lhs: jax.Array, rhs: jax.Array, sizes: jax.Array, ct: jax.Array) -> Any:
        out, vjp = jax.vjp(lambda a, b: gmm(a, b, sizes), lhs, rhs)
        return out, vjp(ct)

    return fn


def bench_moe(shape: MoeShape, blocks: tuple[int, ...], reps: int) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(0)
    sizes = dirichlet_sizes(rng, shape.tokens, shape.experts)
    lhs = jnp.asarray(rng.standard_normal((shape.tokens, shape.k), dtype=np.float32)).astype(DTYPE)
    rhs = jnp.asarray(rng.standard_normal((shape.experts, shape.k, shape.n), dtype=np.float32) / math.sqrt(shape.k))
    rhs = rhs.astype(DTYPE)
    ct = jnp.asarray(rng.standard_normal((shape.tokens, shape.n), dtype=np.float32)).astype(DTYPE)
    fwd_args, bwd_args = (lhs, rhs, jnp.asarray(sizes)), (lhs, rhs, jnp.asarray(sizes), ct)
    case = f"{shape} (groups {int(sizes.min())}..{int(sizes.max())})"
    ours = {f"block_m {b}": ejk_gmm(b) for b in blocks}
    impls = (("ejk xla", ours), ("lax.ragged_dot", {"": ragged_dot}), ("dense equal-groups", {"": dense_equal_groups}))
    rows = []
    for mode, args, factor in (("fwd", fwd_args, 1.0), ("fwd+bwd", bwd_args, 3.0)):
        for name, cands in impls:
            if mode == "fwd+bwd":
                cands = {label: gmm_with_backward(fn) for label, fn in cands.items()}
            rows.append(bench_line(case, mode, name, cands, args, reps, shape.fwd_flops() * factor, "TFLOP/s"))
            print(rows[-1], flush=True)
    first = ejk_gmm(blocks[0])
    checks = [
        f"- {shape} fwd, ejk block_m {blocks[0]} vs lax.ragged_dot: {max_abs_diff(first, ragged_dot, fwd_args)}",
        f"- {shape} fwd+bwd (out, d lhs, d rhs), ejk block_m {blocks[0]} vs lax.ragged_dot: "
        + max_abs_diff(gmm_with_backward(first), gmm_with_backward(ragged_dot), bwd_args),
    ]
    return rows, checks


# ---- ragged paged attention -----------------------------------------------------------------


def paged_inputs(shape: PagedShape) -> tuple[jax.Array, ...]:
    rng = np.random.default_rng(1)
    per_seq = shape.ctx // shape.page
    pages = shape.seqs * per_seq

    def normal(*dims: int) -> jax.Array:
        return jnp.asarray(rng.standard_normal(dims, dtype=np.float32)).astype(DTYPE)

    q = normal(shape.seqs * shape.q_len, shape.hq, shape.dim)
    k_pages = normal(pages, shape.page, shape.hkv, shape.dim)
    v_pages = normal(pages, shape.page, shape.hkv, shape.dim)
    kv_lens = jnp.full((shape.seqs,), shape.ctx, jnp.int32)
    page_indices = jnp.asarray(rng.permutation(pages).reshape(shape.seqs, per_seq).astype(np.int32))
    cu_q_lens = jnp.arange(shape.seqs + 1, dtype=jnp.int32) * shape.q_len
    return q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, jnp.int32(shape.seqs)


def ejk_paged(shape: PagedShape, cfg: PagedAttentionConfig) -> Callable[..., jax.Array]:
    def fn(*args: jax.Array) -> jax.Array:
        return ragged_paged_attention(
            *args, softmax_scale=1 / math.sqrt(shape.dim), sliding_window=None, logits_soft_cap=None, cfg=cfg,
        )

    return fn


def dense_paged(shape: PagedShape) -> Callable[..., jax.Array]:
    """Gather the pages into ``[S, ctx, Hkv, D]``, repeat kv heads, ``jax.nn.dot_product_attention`` (xla).

    Every sequence holds ``ctx`` keys and ``q_len`` queries (its last positions), as in the inputs.
    """
    groups = shape.hq // shape.hkv
    q_pos = shape.ctx - shape.q_len + jnp.arange(shape.q_len)
    mask = (jnp.arange(shape.ctx)[None, :] <= q_pos[:, None])[None, None]  # [1, 1, q, ctx], bottom-right causal

    def fn(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, kv_lens: jax.Array, page_indices: jax.Array,
           cu_q_lens: jax.Array, num_seqs: jax.Array) -> jax.Array:
        del kv_lens, cu_q_lens, num_seqs  # all sequences are full and equal here
        dims = (shape.seqs, shape.ctx, shape.hkv, shape.dim)
        k = jnp.repeat(k_pages[page_indices].reshape(dims), groups, axis=2)
        v = jnp.repeat(v_pages[page_indices].reshape(dims), groups, axis=2)
        out = jax.nn.dot_product_attention(
            q.reshape(shape.seqs, shape.q_len, shape.hq, shape.dim), k, v,
            mask=mask, scale=1 / math.sqrt(shape.dim), implementation="xla",
        )
        return out.reshape(q.shape)

    return fn


def _label(cfg: PagedAttentionConfig) -> str:
    if cfg.q_block is None:
        return f"per-token, pages_per_block {cfg.pages_per_block}"
    return f"tiled q_block {cfg.q_block}, pages_per_block {cfg.pages_per_block}"


def bench_paged(shape: PagedShape, blocks: tuple[PagedAttentionConfig, ...], reps: int) -> tuple[list[str], list[str]]:
    args = paged_inputs(shape)
    decode = shape.q_len == 1
    mode, work, unit = ("decode", shape.kv_bytes(), "GB/s") if decode else ("prefill", shape.causal_flops(), "TFLOP/s")
    ours = {_label(b): ejk_paged(shape, b) for b in blocks}
    impls = (("ejk xla paged", ours), ("dense gather + jax.nn xla", {"": dense_paged(shape)}))
    rows = []
    for name, cands in impls:
        rows.append(bench_line(str(shape), mode, name, cands, args, reps, work, unit))
        print(rows[-1], flush=True)
    diff = max_abs_diff(ejk_paged(shape, blocks[0]), dense_paged(shape), args)
    return rows, [f"- {shape}, ejk {_label(blocks[0])} vs dense gather + jax.nn xla: {diff}"]


# ---- driver ---------------------------------------------------------------------------------


def header(args: argparse.Namespace) -> list[str]:
    return _harness.header(
        "MoE grouped matmul and ragged paged attention: ejk XLA kernels vs baselines", args,
        "bfloat16",
        f"grouped matmul: group sizes a Dirichlet(alpha={DIRICHLET_ALPHA}) split of m (seed 0); "
        "FLOPs 2·m·k·n, fwd+bwd 3x; dense equal-groups is an upper bound (equal groups, same FLOPs)",
        "paged attention: decode GB/s of KV read = 2·S·ctx·Hkv·D·2 bytes; prefill TFLOP/s = "
        "4·Hq·D·Σ_seq Σ_i (ctx − q + i + 1) (exact bottom-right causal count); random page table; "
        "the dense reference's page gather is timed with it",
    )


def main() -> None:
    args = _harness.parse(_harness.parser(__doc__))
    lines = header(args)
    checks: list[str] = []
    print("\n".join(lines), flush=True)
    for shape in SMOKE_MOE if args.smoke else FULL_MOE:
        rows, more = bench_moe(shape, SMOKE_BLOCK_M if args.smoke else FULL_BLOCK_M, args.reps)
        lines += rows
        checks += more
    for shape, blocks in SMOKE_PAGED if args.smoke else FULL_PAGED:
        rows, more = bench_paged(shape, blocks, args.reps)
        lines += rows
        checks += more
    lines += ["", "Numerics: max abs diff of each ejk line (its first config) against its baseline, bf16 outputs:",
              *checks]
    print("\n".join(lines[-len(checks) - 2 :]), flush=True)
    _harness.write(lines, args, "moe_paged_gpu.md")


if __name__ == "__main__":
    main()
