"""``gated_delta_rule`` in ``ejk bench``: its cases, presets, ``--shapes`` syntax and work.

Work is the chunked algorithm's matmul FLOPs at chunk ``C = 64``, per token and head
``6·C·K + 4·C·V + 6·K·V`` (the chunk's ``KKᵀ``, ``QKᵀ``, ``T·K``, ``T·V``, ``A·u`` and the state
products); forward + backward counts 3x. Inputs as Qwen3-Next feeds them: bfloat16 ``q, k, v``
with ``use_qk_l2norm=True``, float32 log decays ``g`` in about ``[-0.7, 0)``, ``beta = sigmoid(·)``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._workload import TFLOPS, Case, OpBench, Workload, dims, int_options, normal

__all__ = ["BENCH", "GdrBenchCase", "GdrWorkload"]

_CHUNK = 64


@attrs.frozen(kw_only=True)
class GdrBenchCase(Case):
    """``gated_delta_rule``: ``[B, T, H, K]``; ``seqs > 0`` packs ``B = 1`` into that many sequences of random
    lengths."""

    op: ClassVar[str] = "gated_delta_rule"
    x_name: ClassVar[str] = "tokens"
    batch: int
    length: int
    heads: int = 32
    dk: int = 128
    dv: int = 128
    seqs: int = 0

    @property
    def label(self) -> str:
        packed = f" packed {self.seqs}" if self.seqs else ""
        return f"B={self.batch} T={self.length}{packed}"

    @property
    def series(self) -> str:
        return f"H={self.heads} K={self.dk} V={self.dv}"

    @property
    def x(self) -> int:
        return self.batch * self.length


@attrs.frozen(kw_only=True)
class GdrWorkload(Workload):
    case: GdrBenchCase
    diff: tuple[int, ...] = (0, 1, 2, 3, 4)

    def inputs(self, seed: int = 0) -> tuple[Any, ...]:
        c = self.case
        kq, kk, kv, kg, kb = jax.random.split(jax.random.key(seed), 5)
        x = (c.batch, c.length, c.heads)
        g = jnp.log(jax.random.uniform(kg, x, jnp.float32, 0.5, 1.0))
        beta = jax.nn.sigmoid(normal(kb, x, jnp.float32)).astype(self.dtype)
        return (normal(kq, (*x, c.dk), self.dtype), normal(kk, (*x, c.dk), self.dtype),
                normal(kv, (*x, c.dv), self.dtype), g, beta)

    def kwargs(self) -> dict[str, Any]:
        c = self.case
        extra: dict[str, Any] = {"use_qk_l2norm": True}
        if c.seqs:
            rng = np.random.default_rng(0)
            cuts = np.sort(rng.choice(np.arange(1, c.length), size=c.seqs - 1, replace=False))
            extra["cu_seqlens"] = jnp.asarray(np.concatenate([[0], cuts, [c.length]]), jnp.int32)
        return extra

    def out_shape(self) -> tuple[int, ...]:
        c = self.case
        return (c.batch, c.length, c.heads, c.dv)

    def call(self, *, platform: str = "auto", cfg: Any = None) -> Any:
        whole = super().call(platform=platform, cfg=cfg)

        def output(*arrays: Any) -> Any:
            return whole(*arrays)[0]

        return output

    def work(self, mode: str) -> tuple[float, str]:
        c = self.case
        per = 6.0 * _CHUNK * c.dk + 4.0 * _CHUNK * c.dv + 6.0 * c.dk * c.dv
        return per * c.batch * c.length * c.heads * (3.0 if mode == "fwd+bwd" else 1.0), TFLOPS


def _parse(text: str, options: dict[str, str], spec: str) -> GdrBenchCase:
    """``gdr:BxT[:h=32,k=128,v=128,seqs=0]``."""
    batch, length = dims(text, 2, "BxT, e.g. 1x32768")
    opts = int_options(options, ("h", "k", "v", "seqs"), spec)
    seqs = opts.get("seqs", 0)
    if seqs and (batch != 1 or seqs > length):
        raise ValueError(f"{spec}: seqs={seqs} packs sequences into B=1 and needs seqs <= T")
    return GdrBenchCase(batch=batch, length=length, heads=opts.get("h", 32), dk=opts.get("k", 128),
                        dv=opts.get("v", 128), seqs=seqs)


BENCH = OpBench(
    case=GdrBenchCase, workload=GdrWorkload, preset="gdr", aliases=("gated_delta_rule",), parse=_parse,
    # Qwen3-Next-like linear attention: H 32, K = V = 128, 32k tokens a batch.
    presets=(GdrBenchCase(batch=1, length=32768), GdrBenchCase(batch=8, length=4096),
             GdrBenchCase(batch=1, length=32768, seqs=8)),
    quick=(GdrBenchCase(batch=1, length=64, heads=2, dk=16, dv=16),
           GdrBenchCase(batch=1, length=100, heads=2, dk=16, dv=16, seqs=3)),
)
