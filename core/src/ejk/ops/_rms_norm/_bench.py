"""``rms_norm`` in ``ejk bench``: its cases, presets, ``--shapes`` syntax and work.

Bytes: the forward pass reads ``x`` and writes the output (``2·R·D`` elements); forward +
backward adds reading ``x`` and the output's cotangent and writing ``dx`` (``5·R·D`` in all);
``scale``, its gradient and the per-row statistics are negligible and not counted. With
``:residual`` (``residual=``) the forward also reads the residual and writes the sum (``4·R·D``)
and the backward also reads the sum's cotangent (``8·R·D`` in all; ``dx`` is also the residual's
gradient).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import attrs
import jax

from ejk.ops._workload import GBPS, Case, OpBench, Workload, dims, normal

__all__ = ["BENCH", "RmsNormCase", "RmsNormWorkload"]


@attrs.frozen(kw_only=True)
class RmsNormCase(Case):
    """``rms_norm``: ``rows`` rows of width ``dim``, with ``residual=`` when ``residual``."""

    op: ClassVar[str] = "rms_norm"
    x_name: ClassVar[str] = "rows"
    rows: int
    dim: int
    residual: bool = False

    @property
    def label(self) -> str:
        return f"{self.rows}x{self.dim}" + (" residual" if self.residual else "")

    @property
    def series(self) -> str:
        return f"D={self.dim}" + (" residual" if self.residual else "")

    @property
    def x(self) -> int:
        return self.rows


@attrs.frozen(kw_only=True)
class RmsNormWorkload(Workload):
    case: RmsNormCase
    diff: tuple[int, ...] = attrs.field(
        default=attrs.Factory(lambda self: (0, 1, 2) if self.case.residual else (0, 1), takes_self=True))

    def inputs(self, seed: int = 0) -> tuple[Any, ...]:
        c = self.case
        kx, ks, kr = jax.random.split(jax.random.key(seed), 3)
        x = normal(kx, (c.rows, c.dim), self.dtype)
        scale = (1.0 + normal(ks, (c.dim,), self.dtype, 0.1)).astype(self.dtype)
        return (x, scale, normal(kr, (c.rows, c.dim), self.dtype)) if c.residual else (x, scale)

    def split_inputs(self, inputs: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self.case.residual:
            return tuple(inputs[:2]), {"residual": inputs[2]}
        return tuple(inputs), {}

    def out_shape(self) -> tuple[int, ...]:
        return (self.case.rows, self.case.dim)

    def cotangent(self, seed: int = 1) -> Any:
        if not self.case.residual:
            return super().cotangent(seed)
        ky, kh = jax.random.split(jax.random.key(seed))
        return tuple(normal(k, self.out_shape(), self.dtype) for k in (ky, kh))

    def work(self, mode: str) -> tuple[float, str]:
        c = self.case
        arrays = (8.0 if mode == "fwd+bwd" else 4.0) if c.residual else (5.0 if mode == "fwd+bwd" else 2.0)
        return c.rows * c.dim * self.dtype.itemsize * arrays, GBPS


def _parse(text: str, options: dict[str, str], spec: str) -> RmsNormCase:
    """``rms_norm:RxD[:residual]``."""
    rows, dim = dims(text, 2, "RxD (rows x width), e.g. 16384x4096")
    unknown = sorted(set(options) - {"residual"})
    if unknown:
        raise ValueError(f"--shapes {spec!r}: unknown option(s) {', '.join(unknown)}; allowed: residual (a flag)")
    if options.get("residual"):
        raise ValueError(f"--shapes {spec!r}: residual is a flag (no value)")
    return RmsNormCase(rows=rows, dim=dim, residual="residual" in options)


BENCH = OpBench(
    case=RmsNormCase, workload=RmsNormWorkload, preset="rmsnorm", aliases=("norm",), parse=_parse,
    presets=(RmsNormCase(rows=16384, dim=4096), RmsNormCase(rows=16384, dim=8192),
             RmsNormCase(rows=16384, dim=4096, residual=True)),
    quick=(RmsNormCase(rows=64, dim=128), RmsNormCase(rows=256, dim=512), RmsNormCase(rows=64, dim=128, residual=True)),
)
