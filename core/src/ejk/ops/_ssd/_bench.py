"""``ssd`` in ``ejk bench``: its cases, presets, ``--shapes`` syntax and work.

Work is the recurrence's own FLOPs: ``4·tokens·H·P·N`` forward, 3x that forward + backward (as
``gla``'s, so the two read alike). ``x``, ``B`` and ``C`` are the dtype measured; ``dt``, ``A``,
``D`` and ``dt_bias`` float32, with ``dt_softplus`` (as Mamba-2 layers call it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import attrs
import jax
import jax.numpy as jnp

from ejk.ops._gla._bench import packed_offsets, recurrent_flops
from ejk.ops._workload import TFLOPS, Case, OpBench, Workload, dims, int_options, normal

__all__ = ["BENCH", "SsdCase", "SsdWorkload"]


@attrs.frozen(kw_only=True)
class SsdCase(Case):
    """``ssd`` over ``tokens`` tokens made of sequences of ``seq`` tokens (a batch, or packed)."""

    op: ClassVar[str] = "ssd"
    x_name: ClassVar[str] = "sequence length"
    tokens: int
    seq: int
    heads: int
    headdim: int
    state: int
    groups: int = 1
    packed: bool = False

    @property
    def label(self) -> str:
        rows = self.tokens // self.seq
        layout = f"packed {rows}x{self.seq}" if self.packed else f"[{rows},{self.seq}]"
        return f"{layout} H={self.heads} P={self.headdim} N={self.state} G={self.groups}"

    @property
    def series(self) -> str:
        return (f"{'packed' if self.packed else 'batch'} {self.tokens} tokens H={self.heads} P={self.headdim} "
                f"N={self.state} G={self.groups}")

    @property
    def x(self) -> int:
        return self.seq


@attrs.frozen(kw_only=True)
class SsdWorkload(Workload):
    case: SsdCase
    diff: tuple[int, ...] = (0, 1, 2, 3, 4)

    def _rows(self) -> tuple[int, int]:
        c = self.case
        return (1, c.tokens) if c.packed else (c.tokens // c.seq, c.seq)

    def inputs(self, seed: int = 0) -> tuple[Any, ...]:
        c = self.case
        b, t = self._rows()
        kx, kd, ka, kb, kc = jax.random.split(jax.random.key(seed), 5)
        f32 = jnp.float32
        return (normal(kx, (b, t, c.heads, c.headdim), self.dtype), normal(kd, (b, t, c.heads), f32) - 2.0,
                -jnp.exp(normal(ka, (c.heads,), f32)), normal(kb, (b, t, c.groups, c.state), self.dtype),
                normal(kc, (b, t, c.groups, c.state), self.dtype, c.state ** -0.5))

    def kwargs(self) -> dict[str, Any]:
        c = self.case
        ones = jnp.ones((c.heads,), jnp.float32)
        return {"D": ones, "dt_bias": 0.5 * ones, "dt_softplus": True,
                "cu_seqlens": packed_offsets(c.tokens, c.seq, c.packed)}

    def out_shape(self) -> tuple[int, ...]:
        return (*self._rows(), self.case.heads, self.case.headdim)

    def work(self, mode: str) -> tuple[float, str]:
        c = self.case
        return recurrent_flops(c.tokens, c.heads, c.headdim, c.state, mode), TFLOPS

    def call(self, *, platform: str = "auto", cfg: Any = None) -> Callable[..., Any]:
        """``f(*inputs) -> y`` (the output only: the final state is not asked for)."""
        whole = super().call(platform=platform, cfg=cfg)
        return lambda *arrays: whole(*arrays)[0]


def _parse(text: str, options: dict[str, str], spec: str) -> SsdCase:
    """``ssd:TOKENSxSEQxHxP[:packed][,n=N][,g=G]``."""
    tokens, seq, h, p = dims(text, 4, "TOKENSxSEQxHxP, e.g. 32768x4096x32x128")
    packed = "packed" in options
    options.pop("packed", None)
    opts = int_options(options, ("n", "g"), spec)
    if tokens % seq:
        raise ValueError(f"--shapes {spec!r}: SEQ={seq} must divide TOKENS={tokens}")
    groups = opts.get("g", 1)
    if h % groups:
        raise ValueError(f"--shapes {spec!r}: g={groups} must divide the {h} heads")
    return SsdCase(tokens=tokens, seq=seq, heads=h, headdim=p, state=opts.get("n", 128), groups=groups, packed=packed)


#: The size of the Qwen3-Next-like ``gla`` presets (32 heads, 128 x 128 states, 32k tokens), one group.
def _sized(seq: int, packed: bool = False) -> SsdCase:
    return SsdCase(tokens=32768, seq=seq, heads=32, headdim=128, state=128, packed=packed)

BENCH = OpBench(
    case=SsdCase, workload=SsdWorkload, preset="ssd", parse=_parse,
    presets=(*(_sized(s) for s in (4096, 8192, 32768)), *(_sized(s, packed=True) for s in (4096, 16384))),
    quick=(SsdCase(tokens=128, seq=64, heads=2, headdim=32, state=16),
           SsdCase(tokens=128, seq=32, heads=2, headdim=32, state=16, packed=True)),
)
