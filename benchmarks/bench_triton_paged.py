"""Paged-attention decode on one GPU: ejk's Triton kernel against jax's Pallas GPU kernel and ejk-xla.

Lines (same process, same KV cache, bf16 by default), decode (one query per sequence, every
context full), 32 q heads / 8 kv heads, D = 128:

- ``ejk triton``: ``ejk.ragged_paged_attention(platform="triton")`` with the heuristic's config,
  or each config of its ``config_space`` (``--configs space``; the best is reported and named,
  the heuristic's time is in the note),
- ``pallas gpu``: ``jax.experimental.pallas.ops.gpu.paged_attention`` (its own layout
  ``[Hkv, P, page, D]`` and a pre-scaled ``q``, both prepared outside the timing), best of a few ``k_splits`` /
  ``pages_per_compute_block`` that divide the table, when importable,
- ``ejk xla``: ``ejk.ragged_paged_attention(platform="xla")`` with its heuristic config.

Rate: GB/s of KV cache read, ``2 · S · ctx · Hkv · D · itemsize`` bytes (the floor of any exact
kernel), with the share of ``--hbm`` (peak HBM bandwidth, default 3.35 TB/s: H100 SXM) and the
ratios of ejk triton to pallas and to ejk xla. Timing: compile, two warm-up calls, then the
median of ``--reps`` samples (``_harness.time_ms``). Numerics below the table: ejk triton
(heuristic) against ejk xla and pallas.

Usage (on the GPU host, with jax-triton importable):
    python benchmarks/bench_triton_paged.py                      # batch 8/16/32 x ctx 2k/4k/16k, page 64,
                                                                 # plus pages 16 and 32 at batch 8 / 32, ctx 4k
    python benchmarks/bench_triton_paged.py --configs space --batches 8 --contexts 2048 16384
                                                                 # sweep ejk triton's config space (a subset:
                                                                 # each config compiles, ~13 per shape)
    python benchmarks/bench_triton_paged.py --pages 16 32 64     # every page size on the whole grid
    EJK_TRITON_INTERPRET=1 python benchmarks/bench_triton_paged.py --smoke   # CPU, interpreter

Output: ``$OUT/triton_paged.md`` when ``OUT`` is set, else ``benchmarks/results/triton_paged.md``.
"""

from __future__ import annotations

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

import ejk
from ejk_triton._paged_attention import PagedAttentionConfig, config_space, heuristic_config


@attrs.frozen(kw_only=True)
class Shape:
    seqs: int
    ctx: int
    page: int
    hq: int = 32
    hkv: int = 8
    dim: int = 128

    def __str__(self) -> str:
        return f"B={self.seqs} ctx={self.ctx} page={self.page} Hq={self.hq} Hkv={self.hkv} D={self.dim}"

    def kv_bytes(self, itemsize: int) -> float:
        return 2.0 * self.seqs * self.ctx * self.hkv * self.dim * itemsize


BATCHES, CONTEXTS = (8, 16, 32), (2048, 4096, 16384)
EXTRA = tuple(Shape(seqs=b, ctx=4096, page=p) for b in (8, 32) for p in (16, 32))
SMOKE = (Shape(seqs=2, ctx=64, page=16, hq=4, hkv=2, dim=32), Shape(seqs=3, ctx=40, page=8, hq=4, hkv=1, dim=16))
PALLAS_VARIANTS = ((16, 8), (8, 8), (32, 4), (16, 16))  # (k_splits, pages_per_compute_block)


def shapes(pages: list[int] | None, batches: list[int] | None, contexts: list[int] | None,
           smoke: bool) -> tuple[Shape, ...]:
    if smoke:
        return SMOKE
    grid = tuple(Shape(seqs=b, ctx=c, page=p) for p in (pages or [64]) for b in (batches or BATCHES)
                 for c in (contexts or CONTEXTS))
    return grid + (() if pages or batches or contexts else EXTRA)


def make_inputs(shape: Shape, dtype: Any) -> tuple[jax.Array, ...]:
    """Decode inputs: one query per sequence, full contexts, a shuffled page table."""
    rng = np.random.default_rng(0)
    per_seq = shape.ctx // shape.page
    pages = shape.seqs * per_seq
    key = jax.random.key(0)
    kq, kk, kv = jax.random.split(key, 3)
    q = jax.random.normal(kq, (shape.seqs, shape.hq, shape.dim), dtype)
    k_pages = jax.random.normal(kk, (pages, shape.page, shape.hkv, shape.dim), dtype)
    v_pages = jax.random.normal(kv, (pages, shape.page, shape.hkv, shape.dim), dtype)
    kv_lens = jnp.full((shape.seqs,), shape.ctx, jnp.int32)
    table = jnp.asarray(rng.permutation(pages).reshape(shape.seqs, per_seq).astype(np.int32))
    cu_q_lens = jnp.arange(shape.seqs + 1, dtype=jnp.int32)
    return q, k_pages, v_pages, kv_lens, table, cu_q_lens, jnp.int32(shape.seqs)


def ejk_paged(platform: str, cfg: Any) -> Callable[..., jax.Array]:
    def fn(*args: jax.Array) -> jax.Array:
        return ejk.ragged_paged_attention(*args, platform=platform, cfg=cfg)

    return fn


def pallas_paged(k_splits: int, pages_per_block: int) -> Callable[..., jax.Array] | None:
    """jax's Pallas GPU paged attention on ``[Hkv, P, page, D]`` pages, or ``None`` when not importable."""
    try:
        from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention
    except Exception:
        return None

    def fn(q: jax.Array, k_hm: jax.Array, v_hm: jax.Array, lengths: jax.Array, table: jax.Array) -> jax.Array:
        return paged_attention(q, k_hm, v_hm, table, lengths, k_splits=k_splits,
                               pages_per_compute_block=pages_per_block)

    return fn


def cfg_label(cfg: PagedAttentionConfig) -> str:
    return (f"q{cfg.block_q} kv{cfg.block_kv} splits {cfg.num_splits} w{cfg.num_warps} s{cfg.num_stages}")


def best(candidates: dict[str, Callable[..., Any]], args: tuple[Any, ...], reps: int) -> tuple[dict[str, float],
                                                                                              list[str]]:
    times: dict[str, float] = {}
    errors: list[str] = []
    for label, fn in candidates.items():
        try:
            times[label] = time_ms(fn, args, reps)
        except Exception as exc:  # report per line, keep going
            errors.append(f"{label}: {error_text(exc)}")
            if os.environ.get("EJK_BENCH_TRACEBACK"):
                traceback.print_exc()
    return times, errors


def table_row(shape: Shape, work: float, hbm: float, name: str, times: dict[str, float], errors: list[str],
              bases: tuple[float | None, float | None] = (None, None), note: str = "") -> str:
    """One line: the best of ``times`` (label -> ms) with its rate, share of HBM and ratios to ``bases`` (ms)."""
    if not times:
        why = "; ".join(errors) or ("needs a GPU and jax's Pallas GPU ops" if name == "pallas gpu" else "")
        return f"| {shape} | {name} | failed | | | | | {why} |"
    label, ms = min(times.items(), key=lambda kv: kv[1])
    rate = work / ms / 1e6
    ratios = [f"{base / ms:.2f}" if base else "" for base in bases]
    named = f"best: {label}" if len(times) > 1 or name != "ejk xla" else ""
    extra = "; ".join(x for x in (named, note, f"failed: {'; '.join(errors)}" if errors else "") if x)
    return (f"| {shape} | {name} | {ms:,.3f} | {rate:,.1f} | {100 * rate / (hbm * 1e3):.0f}% "
            f"| {ratios[0]} | {ratios[1]} | {extra} |")


def max_diff(got: jax.Array, want: jax.Array) -> str:
    diff = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))))
    return f"{diff:.3g} (max |ref| {float(jnp.max(jnp.abs(want.astype(jnp.float32)))):.3g})"


def main() -> None:
    parser = _harness.parser(__doc__)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--configs", choices=("heuristic", "space"), default="heuristic",
                        help="ejk triton: the heuristic's config only, or its whole config space (best reported)")
    parser.add_argument("--pages", type=int, nargs="+", default=None,
                        help="page sizes for the whole batch x context grid (default: 64, plus 16 and 32 on a few)")
    parser.add_argument("--batches", type=int, nargs="+", default=None, help="batch sizes (default 8 16 32)")
    parser.add_argument("--contexts", type=int, nargs="+", default=None,
                        help="context lengths (default 2048 4096 16384)")
    parser.add_argument("--hbm", type=float, default=3.35, help="peak HBM bandwidth in TB/s (for the %% column)")
    args = _harness.parse(parser)
    dtype = jnp.dtype(args.dtype)
    on_gpu = jax.default_backend() == "gpu"
    lines = _harness.header(
        "Paged attention decode: ejk Triton vs jax Pallas GPU paged_attention and ejk XLA", args,
        f"dtype {args.dtype}; decode, every context full, shuffled page table; rate = GB/s of KV read "
        f"2·B·ctx·Hkv·D·{dtype.itemsize} B; % of {args.hbm} TB/s HBM peak; ejk triton configs: {args.configs}",
        f"triton {_harness.version('triton')}, jax-triton {_harness.version('jax-triton')}, "
        f"ejk-triton {_harness.version('ejk-triton')}",
        case="shape", rate="GB/s",
    )
    lines[-2] = "| shape | implementation | ms | GB/s | % HBM | triton / pallas | triton / xla | note |"
    lines[-1] = "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"
    checks: list[str] = []
    print("\n".join(lines), flush=True)
    for shape in shapes(args.pages, args.batches, args.contexts, args.smoke):
        inputs = make_inputs(shape, dtype)
        work = shape.kv_bytes(dtype.itemsize)
        heuristic = heuristic_config(*inputs)
        space = [heuristic] if args.configs == "heuristic" else config_space(*inputs)
        ours, ours_err = best({cfg_label(c): ejk_paged("triton", c) for c in space}, inputs, args.reps)
        xla, xla_err = best({"heuristic": ejk_paged("xla", None)}, inputs, args.reps)
        pallas: dict[str, float] = {}
        pallas_err: list[str] = []
        pallas_inputs: tuple[jax.Array, ...] = ()
        per_seq = shape.ctx // shape.page
        variants = {f"k_splits {s}, pages/block {p}": fn for s, p in PALLAS_VARIANTS
                    if per_seq % s == 0 and (per_seq // s) % min(p, per_seq // s) == 0
                    and (fn := pallas_paged(s, p)) is not None}
        if on_gpu and variants:
            q, k_pages, v_pages, kv_lens, table = inputs[:5]
            scaled = (q.astype(jnp.float32) / math.sqrt(shape.dim)).astype(q.dtype)  # it applies no scale
            pallas_inputs = (scaled, jnp.transpose(k_pages, (2, 0, 1, 3)), jnp.transpose(v_pages, (2, 0, 1, 3)),
                             kv_lens, table)
            pallas, pallas_err = best(variants, pallas_inputs, args.reps)
        base_pallas = min(pallas.values()) if pallas else None
        base_xla = min(xla.values()) if xla else None

        heur_ms = ours.get(cfg_label(heuristic))
        note = f"heuristic {heur_ms:,.3f} ms" if heur_ms is not None and len(ours) > 1 else ""
        cells = (shape, work, args.hbm)
        rows = [table_row(*cells, "ejk triton", ours, ours_err, (base_pallas, base_xla), note),
                table_row(*cells, "pallas gpu", pallas, pallas_err), table_row(*cells, "ejk xla", xla, xla_err)]
        for r in rows:
            print(r, flush=True)
        lines += rows
        try:
            got = jax.jit(ejk_paged("triton", heuristic))(*inputs)
            check = f"- {shape}: ejk triton ({cfg_label(heuristic)}) vs ejk xla: "
            check += max_diff(got, jax.jit(ejk_paged("xla", None))(*inputs))
            if pallas:
                label = min(pallas.items(), key=lambda kv: kv[1])[0]
                check += f"; vs pallas gpu: {max_diff(got, jax.jit(variants[label])(*pallas_inputs))}"
        except Exception as exc:
            check = f"- {shape}: output check failed: {error_text(exc)}"
        checks.append(check)
        del inputs, pallas_inputs
    lines += ["", f"Outputs ({args.dtype}): max abs difference of ejk triton (heuristic config) from the others:",
              *checks]
    print("\n".join(lines[-len(checks) - 2:]), flush=True)
    _harness.write(lines, args, "triton_paged.md")


if __name__ == "__main__":
    main()
