"""``ragged_paged_attention`` in ``ejk bench``: its cases, presets, ``--shapes`` syntax and work.

Decode is memory bound, so it is measured in GB/s of the KV cache read,
``2·Σ ctx·Hkv·D·itemsize``; chunked prefill counts exactly what each query sees,
``4·Hq·D·Σ_seq Σ_i (ctx − q + i + 1)`` FLOPs. Forward only (an inference op).
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._workload import GBPS, TFLOPS, Case, OpBench, Workload, dims, int_options, normal

__all__ = ["BENCH", "PagedCase", "PagedWorkload"]


@attrs.frozen(kw_only=True)
class PagedCase(Case):
    """``ragged_paged_attention``: ``seqs`` sequences of ``ctx`` positions each, the last ``q_len`` new."""

    op: ClassVar[str] = "ragged_paged_attention"
    x_name: ClassVar[str] = "context length"
    seqs: int
    ctx: int
    q_len: int = 1
    hq: int = 32
    hkv: int = 8
    dim: int = 128
    page: int = 64

    @property
    def decode(self) -> bool:
        return self.q_len == 1

    @property
    def kind(self) -> str:
        return "decode" if self.decode else f"prefill q={self.q_len}"

    @property
    def label(self) -> str:
        return f"S={self.seqs} ctx={self.ctx} {self.kind}"

    @property
    def series(self) -> str:
        return f"{self.kind} S={self.seqs} Hq={self.hq} Hkv={self.hkv} D={self.dim}"

    @property
    def x(self) -> int:
        return self.ctx


@attrs.frozen(kw_only=True)
class PagedWorkload(Workload):
    case: PagedCase
    modes: tuple[str, ...] = ("fwd",)

    def inputs(self, seed: int = 0) -> tuple[Any, ...]:
        c = self.case
        per_seq = -(-c.ctx // c.page)
        pages = c.seqs * per_seq
        kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
        rng = np.random.default_rng(seed)
        table = rng.permutation(pages).reshape(c.seqs, per_seq).astype(np.int32)  # scattered pages
        return (normal(kq, (c.seqs * c.q_len, c.hq, c.dim), self.dtype),
                normal(kk, (pages, c.page, c.hkv, c.dim), self.dtype),
                normal(kv, (pages, c.page, c.hkv, c.dim), self.dtype),
                jnp.full((c.seqs,), c.ctx, jnp.int32), jnp.asarray(table),
                jnp.arange(c.seqs + 1, dtype=jnp.int32) * c.q_len, jnp.int32(c.seqs))

    def out_shape(self) -> tuple[int, ...]:
        c = self.case
        return (c.seqs * c.q_len, c.hq, c.dim)

    def work(self, mode: str) -> tuple[float, str]:
        c = self.case
        if c.decode:
            return 2.0 * c.seqs * c.ctx * c.hkv * c.dim * self.dtype.itemsize, GBPS
        visible = c.q_len * (c.ctx - c.q_len) + c.q_len * (c.q_len + 1) / 2
        return 4.0 * c.hq * c.dim * c.seqs * visible, TFLOPS


def _parse(text: str, options: dict[str, str], spec: str) -> PagedCase:
    """``decode:SEQSxCTX[:q=1,hq=32,hkv=8,d=128,page=64]``."""
    seqs, ctx = dims(text, 2, "SEQSxCTX, e.g. 8x4096")
    opts = int_options(options, ("q", "hq", "hkv", "d", "page"), spec)
    return PagedCase(seqs=seqs, ctx=ctx, q_len=opts.get("q", 1), hq=opts.get("hq", 32),
                     hkv=opts.get("hkv", 8), dim=opts.get("d", 128), page=opts.get("page", 64))


BENCH = OpBench(
    case=PagedCase, workload=PagedWorkload, preset="decode", aliases=("paged",), parse=_parse,
    presets=(*(PagedCase(seqs=s, ctx=c) for s in (8, 64) for c in (1024, 4096, 16384, 32768)),
             PagedCase(seqs=4, ctx=2048, q_len=256)),  # the last: chunked prefill
    quick=(PagedCase(seqs=2, ctx=64, hq=4, hkv=2, dim=32, page=16),
           PagedCase(seqs=2, ctx=128, hq=4, hkv=2, dim=32, page=16)),
)
