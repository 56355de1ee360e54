"""``flash_attention_varlen`` in ``ejk bench``: its cases, presets, ``--shapes`` syntax and work.

FLOPs count exactly what each sequence computes (a multiply-add is 2): ``4·Hq·D·Σ_s Sq_s·Sk_s``
forward, ``4·Hq·D·Σ_s L_s(L_s+1)/2`` when causal (equal lengths); forward + backward is 3.5x the
forward, as for ``flash_attention``. The presets pack 32k tokens: 16 sequences of 1k–4k tokens,
and 16 of 2k, whose TFLOP/s compare directly with ``flash_attention`` at ``[16, 2048]`` (the same
work as dense batched attention).
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._workload import TFLOPS, Case, OpBench, Workload, dims, int_options, normal

__all__ = ["BENCH", "VarlenCase", "VarlenWorkload"]

#: 16 sequences of 1k to 4k tokens, 32768 in all.
RAGGED_32K = (4096, 1024, 1024, 3072, 1024, 2048, 1536, 2560, 3584, 1024, 1536, 1536, 2048, 2048, 1792, 2816)


def _int_tuple(values: Any) -> tuple[int, ...]:
    return tuple(int(n) for n in values)


@attrs.frozen(kw_only=True)
class VarlenCase(Case):
    """``flash_attention_varlen`` on sequences of ``lens`` tokens (queries and keys), ``heads`` query heads."""

    op: ClassVar[str] = "flash_attention_varlen"
    x_name: ClassVar[str] = "packed tokens"
    lens: tuple[int, ...] = attrs.field(converter=_int_tuple)
    heads: int
    dim: int
    kv_heads: int = attrs.field()
    causal: bool = False

    @kv_heads.default
    def _all_heads(self) -> int:
        return self.heads

    @property
    def tokens(self) -> int:
        return sum(self.lens)

    @property
    def label(self) -> str:
        gqa = f" kv={self.kv_heads}" if self.kv_heads != self.heads else ""
        spread = f"{min(self.lens)}-{max(self.lens)}" if min(self.lens) != max(self.lens) else str(self.lens[0])
        return (f"{len(self.lens)} seqs of {spread} ({self.tokens} tokens) H={self.heads} D={self.dim}{gqa} "
                f"{'causal' if self.causal else 'full'}")

    @property
    def series(self) -> str:
        gqa = f" GQA {self.heads // self.kv_heads}:1" if self.kv_heads != self.heads else ""
        return f"D={self.dim} H={self.heads}{gqa} {'causal' if self.causal else 'full'}"

    @property
    def x(self) -> int:
        return self.tokens


@attrs.frozen(kw_only=True)
class VarlenWorkload(Workload):
    case: VarlenCase
    diff: tuple[int, ...] = (0, 1, 2)

    def inputs(self, seed: int = 0) -> tuple[Any, ...]:
        c = self.case
        kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
        cu = jnp.asarray(np.cumsum([0, *c.lens]), jnp.int32)
        return (normal(kq, (c.tokens, c.heads, c.dim), self.dtype),
                normal(kk, (c.tokens, c.kv_heads, c.dim), self.dtype),
                normal(kv, (c.tokens, c.kv_heads, c.dim), self.dtype), cu, cu)

    def kwargs(self) -> dict[str, Any]:
        return {"causal": self.case.causal, "max_seqlen_q": max(self.case.lens),
                "max_seqlen_k": max(self.case.lens)}

    def out_shape(self) -> tuple[int, ...]:
        c = self.case
        return (c.tokens, c.heads, c.dim)

    def work(self, mode: str) -> tuple[float, str]:
        c = self.case
        pairs = sum(n * (n + 1) / 2 if c.causal else n * n for n in c.lens)
        flops = 4.0 * c.heads * c.dim * pairs
        return flops * (3.5 if mode == "fwd+bwd" else 1.0), TFLOPS


def _parse(text: str, options: dict[str, str], spec: str) -> VarlenCase:
    """``varlen:L1+L2+...xHxD[:causal][,kv=Hkv]`` (or ``NxLxHxD`` for N sequences of L tokens)."""
    parts = text.lower().replace("×", "x").split("x")
    if len(parts) == 3 and "+" in parts[0]:
        try:
            lens = tuple(int(p) for p in parts[0].split("+"))
        except ValueError:
            lens = ()
        if not lens or min(lens) <= 0:
            raise ValueError(f"--shapes {spec!r}: needs L1+L2+...xHxD with positive lengths, e.g. 1024+3072x16x128")
        h, d = dims("x".join(parts[1:]), 2, "L1+L2+...xHxD, e.g. 1024+3072x16x128")
    else:
        n, length, h, d = dims(text, 4, "NxLxHxD or L1+L2+...xHxD, e.g. 16x2048x16x128")
        lens = (length,) * n
    causal = "causal" in options
    options.pop("causal", None)
    opts = int_options(options, ("kv",), spec)
    if h % opts.get("kv", h):
        raise ValueError(f"--shapes {spec!r}: kv={opts['kv']} must divide the {h} query heads")
    return VarlenCase(lens=lens, heads=h, dim=d, kv_heads=opts.get("kv", h), causal=causal)


BENCH = OpBench(
    case=VarlenCase, workload=VarlenWorkload, preset="varlen", parse=_parse,
    presets=(VarlenCase(lens=RAGGED_32K, heads=16, dim=128, causal=True),
             VarlenCase(lens=(2048,) * 16, heads=16, dim=128, causal=True),
             VarlenCase(lens=RAGGED_32K, heads=16, dim=128, causal=False),
             VarlenCase(lens=RAGGED_32K, heads=32, dim=128, kv_heads=8, causal=True)),
    quick=(VarlenCase(lens=(40, 24), heads=2, dim=32, causal=True),
           VarlenCase(lens=(64, 64), heads=2, dim=32, causal=True)),
)
