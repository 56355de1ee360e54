"""``gla`` in ``ejk bench``: its cases, presets, ``--shapes`` syntax and work.

Work is the recurrence's own FLOPs, whatever the algorithm: ``4·tokens·H·K·V`` forward (the state
update and the output, a multiply-add each per state entry), 3x that forward + backward. Inputs are
the dtype measured, the log gates float32 (as models keep them); packed cases hold one row of
``tokens`` split by ``cu_seqlens`` into sequences of ``seq`` tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._workload import TFLOPS, Case, OpBench, Workload, dims, int_options, normal

__all__ = ["BENCH", "GlaCase", "GlaWorkload", "packed_offsets", "recurrent_flops"]


@attrs.frozen(kw_only=True)
class GlaCase(Case):
    """``gla`` over ``tokens`` tokens made of sequences of ``seq`` tokens (a batch, or packed)."""

    op: ClassVar[str] = "gla"
    x_name: ClassVar[str] = "sequence length"
    tokens: int
    seq: int
    heads: int
    dk: int
    dv: int
    packed: bool = False

    @property
    def label(self) -> str:
        rows = self.tokens // self.seq
        layout = f"packed {rows}x{self.seq}" if self.packed else f"[{rows},{self.seq}]"
        return f"{layout} H={self.heads} K={self.dk} V={self.dv}"

    @property
    def series(self) -> str:
        return f"{'packed' if self.packed else 'batch'} {self.tokens} tokens H={self.heads} K={self.dk} V={self.dv}"

    @property
    def x(self) -> int:
        return self.seq


def packed_offsets(tokens: int, seq: int, packed: bool) -> jax.Array | None:
    """``cu_seqlens`` of ``tokens // seq`` packed sequences of ``seq`` tokens (``None`` unpacked)."""
    return jnp.asarray(np.arange(0, tokens + 1, seq), jnp.int32) if packed else None


def recurrent_flops(tokens: int, heads: int, dk: int, dv: int, mode: str) -> float:
    return 4.0 * tokens * heads * dk * dv * (3.0 if mode == "fwd+bwd" else 1.0)


@attrs.frozen(kw_only=True)
class GlaWorkload(Workload):
    case: GlaCase
    diff: tuple[int, ...] = (0, 1, 2, 3)

    def _rows(self) -> tuple[int, int]:
        c = self.case
        return (1, c.tokens) if c.packed else (c.tokens // c.seq, c.seq)

    def inputs(self, seed: int = 0) -> tuple[Any, ...]:
        c = self.case
        b, t = self._rows()
        kq, kk, kv, kg = jax.random.split(jax.random.key(seed), 4)
        g = jax.nn.log_sigmoid(normal(kg, (b, t, c.heads, c.dk), jnp.float32) + 3.0)
        return (normal(kq, (b, t, c.heads, c.dk), self.dtype),
                normal(kk, (b, t, c.heads, c.dk), self.dtype, c.dk ** -0.5),
                normal(kv, (b, t, c.heads, c.dv), self.dtype), g)

    def kwargs(self) -> dict[str, Any]:
        c = self.case
        return {"cu_seqlens": packed_offsets(c.tokens, c.seq, c.packed)}

    def out_shape(self) -> tuple[int, ...]:
        return (*self._rows(), self.case.heads, self.case.dv)

    def work(self, mode: str) -> tuple[float, str]:
        c = self.case
        return recurrent_flops(c.tokens, c.heads, c.dk, c.dv, mode), TFLOPS

    def call(self, *, platform: str = "auto", cfg: Any = None) -> Callable[..., Any]:
        """``f(*inputs) -> o`` (the output only: the final state is not asked for)."""
        whole = super().call(platform=platform, cfg=cfg)
        return lambda *arrays: whole(*arrays)[0]


def _parse(text: str, options: dict[str, str], spec: str) -> GlaCase:
    """``gla:TOKENSxSEQxHxK[:packed][,v=V]``."""
    tokens, seq, h, dk = dims(text, 4, "TOKENSxSEQxHxK, e.g. 32768x4096x32x128")
    packed = "packed" in options
    options.pop("packed", None)
    opts = int_options(options, ("v",), spec)
    if tokens % seq:
        raise ValueError(f"--shapes {spec!r}: SEQ={seq} must divide TOKENS={tokens}")
    return GlaCase(tokens=tokens, seq=seq, heads=h, dk=dk, dv=opts.get("v", dk), packed=packed)


#: Qwen3-Next-like linear-attention layers: 32 heads of K = V = 128 over 32k tokens.
def _qwen(seq: int, packed: bool = False) -> GlaCase:
    return GlaCase(tokens=32768, seq=seq, heads=32, dk=128, dv=128, packed=packed)

BENCH = OpBench(
    case=GlaCase, workload=GlaWorkload, preset="gla", parse=_parse,
    presets=(*(_qwen(s) for s in (4096, 8192, 32768)), *(_qwen(s, packed=True) for s in (4096, 16384))),
    quick=(GlaCase(tokens=128, seq=64, heads=2, dk=32, dv=32), GlaCase(tokens=128, seq=32, heads=2, dk=32, dv=32,
                                                                       packed=True)),
)
