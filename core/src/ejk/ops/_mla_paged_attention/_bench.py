"""``mla_paged_attention`` in ``ejk bench``: FlashMLA's published decode shapes, ``--shapes`` syntax and work.

A call reads the latent cache once, ``Σ ctx · Dk · itemsize`` bytes, and does
``2 · Hq · (Dk + Dv)`` FLOPs per (query, visible key). At ``Sq · Hq`` query rows per sequence
that is about ``Sq · Hq · (Dk + Dv) / (Dk · itemsize)`` FLOPs per byte: memory bound below
the H100's ridge (about 295 FLOPs per byte of HBM), so cases with fewer than 156 rows
(``Sq · Hq``) are measured in GB/s of cache read and the others (Hq 128, Sq 2) in TFLOP/s.
Forward only (an inference op).
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._workload import GBPS, TFLOPS, Case, OpBench, Workload, dims, int_options, normal

__all__ = ["BENCH", "MlaCase", "MlaWorkload"]

#: Query rows per sequence (``Sq · Hq``) from which a case is measured in TFLOP/s.
COMPUTE_BOUND_ROWS = 156


@attrs.frozen(kw_only=True)
class MlaCase(Case):
    """``mla_paged_attention``: ``batch`` sequences of ``ctx`` latent positions, the last ``sq`` queried
    by ``hq`` heads."""

    op: ClassVar[str] = "mla_paged_attention"
    x_name: ClassVar[str] = "context length"
    batch: int
    ctx: int
    sq: int = 1
    hq: int = 16
    dk: int = 576
    dv: int = 512
    page: int = 64

    @property
    def compute_bound(self) -> bool:
        """Measured in TFLOP/s (``Sq · Hq >= 156``), else in GB/s of cache read."""
        return self.sq * self.hq >= COMPUTE_BOUND_ROWS

    @property
    def label(self) -> str:
        return f"B={self.batch} ctx={self.ctx} Sq={self.sq} Hq={self.hq}"

    @property
    def series(self) -> str:
        return f"Sq={self.sq} B={self.batch} Hq={self.hq} Dk={self.dk} Dv={self.dv} page={self.page}"

    @property
    def x(self) -> int:
        return self.ctx


@attrs.frozen(kw_only=True)
class MlaWorkload(Workload):
    case: MlaCase
    modes: tuple[str, ...] = ("fwd",)

    def inputs(self, seed: int = 0) -> tuple[Any, ...]:
        c = self.case
        per_seq = -(-c.ctx // c.page)
        pages = c.batch * per_seq
        kq, kv = jax.random.split(jax.random.key(seed))
        table = np.random.default_rng(seed).permutation(pages).reshape(c.batch, per_seq).astype(np.int32)
        return (normal(kq, (c.batch, c.sq, c.hq, c.dk), self.dtype), normal(kv, (pages, c.page, c.dk), self.dtype),
                jnp.full((c.batch,), c.ctx, jnp.int32), jnp.asarray(table))

    def kwargs(self) -> dict[str, Any]:
        return {"v_head_dim": self.case.dv}

    def out_shape(self) -> tuple[int, ...]:
        c = self.case
        return (c.batch, c.sq, c.hq, c.dv)

    def kv_bytes(self) -> float:
        """Bytes of latent cache read: every sequence's context once."""
        c = self.case
        return float(c.batch * c.ctx * c.dk * self.dtype.itemsize)

    def flops(self) -> float:
        """``2 · Hq · (Dk + Dv)`` per (query, key it sees), causal."""
        c = self.case
        visible = c.sq * (c.ctx - c.sq) + c.sq * (c.sq + 1) / 2
        return 2.0 * c.batch * c.hq * (c.dk + c.dv) * visible

    def work(self, mode: str) -> tuple[float, str]:
        return (self.flops(), TFLOPS) if self.case.compute_bound else (self.kv_bytes(), GBPS)


def _parse(text: str, options: dict[str, str], spec: str) -> MlaCase:
    """``mla:BxCTX[:sq=1,hq=16,dk=576,dv=512,page=64]``."""
    batch, ctx = dims(text, 2, "BATCHxCTX, e.g. 64x4096")
    opts = int_options(options, ("sq", "hq", "dk", "dv", "page"), spec)
    dk = opts.get("dk", 576)
    dv = opts.get("dv", min(512, dk))
    if dv > dk:
        raise ValueError(f"--shapes {spec!r}: dv={dv} needs to be at most dk={dk}")
    return MlaCase(batch=batch, ctx=ctx, sq=opts.get("sq", 1), hq=opts.get("hq", 16), dk=dk, dv=dv,
                   page=opts.get("page", 64))


BENCH = OpBench(
    case=MlaCase, workload=MlaWorkload, preset="mla", aliases=("mla_decode",), parse=_parse,
    presets=tuple(MlaCase(batch=b, ctx=c, sq=sq, hq=hq) for sq in (1, 2) for hq in (16, 64, 128)
                  for b in (64, 128) for c in (4096, 8192)),  # FlashMLA's published shapes
    quick=(MlaCase(batch=2, ctx=64, hq=4, dk=80, dv=64, page=16),
           MlaCase(batch=2, ctx=128, sq=2, hq=4, dk=80, dv=64, page=16)),
)
