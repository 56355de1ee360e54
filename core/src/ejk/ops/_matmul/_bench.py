"""``matmul`` in ``ejk bench``: its cases, presets, ``--shapes`` syntax and work.

FLOPs: ``2·m·k·n``; forward + backward 3x. Runs at ``precision="default"``, the backend's fast
path, as ``a @ b`` does by default.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import attrs
import jax

from ejk.ops._workload import TFLOPS, Case, OpBench, Workload, dims, int_options, normal

__all__ = ["BENCH", "MatmulCase", "MatmulWorkload"]


@attrs.frozen(kw_only=True)
class MatmulCase(Case):
    """``matmul``: ``[m, k] @ [k, n]``."""

    op: ClassVar[str] = "matmul"
    x_name: ClassVar[str] = "m"
    m: int
    k: int
    n: int

    @property
    def label(self) -> str:
        return f"{self.m}x{self.k}x{self.n}"

    @property
    def series(self) -> str:
        return "square" if self.m == self.k == self.n else f"k={self.k} n={self.n}"

    @property
    def x(self) -> int:
        return self.m


@attrs.frozen(kw_only=True)
class MatmulWorkload(Workload):
    case: MatmulCase
    diff: tuple[int, ...] = (0, 1)

    def inputs(self, seed: int = 0) -> tuple[Any, ...]:
        c = self.case
        ka, kb = jax.random.split(jax.random.key(seed))
        return (normal(ka, (c.m, c.k), self.dtype), normal(kb, (c.k, c.n), self.dtype, 1 / math.sqrt(c.k)))

    def kwargs(self) -> dict[str, Any]:
        return {"precision": "default"}

    def out_shape(self) -> tuple[int, ...]:
        return (self.case.m, self.case.n)

    def work(self, mode: str) -> tuple[float, str]:
        c = self.case
        return 2.0 * c.m * c.k * c.n * (3.0 if mode == "fwd+bwd" else 1.0), TFLOPS


def _parse(text: str, options: dict[str, str], spec: str) -> MatmulCase:
    """``matmul:MxKxN``."""
    m, k, n = dims(text, 3, "MxKxN, e.g. 4096x4096x4096")
    int_options(options, (), spec)
    return MatmulCase(m=m, k=k, n=n)


BENCH = OpBench(
    case=MatmulCase, workload=MatmulWorkload, preset="matmul", parse=_parse,
    # Squares, then an LLM MLP's up / gate (k 4096, n 14336) and down (k 14336, n 4096) projections at every
    # token count from one decode step (memory bound) to a 16k-token prefill (compute bound).
    presets=(*(MatmulCase(m=s, k=s, n=s) for s in (2048, 4096, 8192)),
             *(MatmulCase(m=m, k=k, n=n) for k, n in ((4096, 14336), (14336, 4096))
               for m in (1, 16, 128, 1024, 4096, 16384))),
    quick=(MatmulCase(m=64, k=64, n=64), MatmulCase(m=128, k=128, n=128)),
)
