"""``rms_norm`` in ``ejk bench``: its cases, presets, ``--shapes`` syntax and work.

Bytes: the forward pass reads ``x`` and writes the output (``2·R·D`` elements); forward +
backward adds reading ``x`` and the output's cotangent and writing ``dx`` (``5·R·D`` in all);
``scale``, its gradient and the per-row statistics are negligible and not counted.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import jax

from ejk.ops._workload import GBPS, Case, OpBench, Workload, dims, int_options, normal

__all__ = ["BENCH", "RmsNormCase", "RmsNormWorkload"]


@attrs.frozen(kw_only=True)
class RmsNormCase(Case):
    """``rms_norm``: ``rows`` rows of width ``dim``."""

    op: ClassVar[str] = "rms_norm"
    x_name: ClassVar[str] = "rows"
    rows: int
    dim: int

    @property
    def label(self) -> str:
        return f"{self.rows}x{self.dim}"

    @property
    def series(self) -> str:
        return f"D={self.dim}"

    @property
    def x(self) -> int:
        return self.rows


@attrs.frozen(kw_only=True)
class RmsNormWorkload(Workload):
    case: RmsNormCase
    diff: tuple[int, ...] = (0, 1)

    def inputs(self, seed: int = 0) -> tuple[Any, ...]:
        c = self.case
        kx, ks = jax.random.split(jax.random.key(seed))
        return normal(kx, (c.rows, c.dim), self.dtype), (1.0 + normal(ks, (c.dim,), self.dtype, 0.1)).astype(self.dtype)

    def out_shape(self) -> tuple[int, ...]:
        return (self.case.rows, self.case.dim)

    def work(self, mode: str) -> tuple[float, str]:
        c = self.case
        return c.rows * c.dim * self.dtype.itemsize * (5.0 if mode == "fwd+bwd" else 2.0), GBPS


def _parse(text: str, options: dict[str, str], spec: str) -> RmsNormCase:
    """``rms_norm:RxD``."""
    rows, dim = dims(text, 2, "RxD (rows x width), e.g. 16384x4096")
    int_options(options, (), spec)
    return RmsNormCase(rows=rows, dim=dim)


BENCH = OpBench(
    case=RmsNormCase, workload=RmsNormWorkload, preset="rmsnorm", aliases=("norm",), parse=_parse,
    presets=(RmsNormCase(rows=16384, dim=4096), RmsNormCase(rows=16384, dim=8192)),
    quick=(RmsNormCase(rows=64, dim=128), RmsNormCase(rows=256, dim=512)),
)
