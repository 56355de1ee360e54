"""``grouped_matmul`` in ``ejk bench``: its cases, presets, ``--shapes`` syntax and work.

FLOPs: ``2·m·k·n``; forward + backward 3x. Runs at ``precision="default"``, the backend's fast
path, as ``a @ b`` does by default. A gated case (``activation="swiglu"``, ``moe:...:swiglu``) has
``n`` output columns and ``rhs [g, k, 2n]``: ``2·m·k·2n`` FLOPs (the backward's recomputed product
not counted).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._workload import TFLOPS, Case, OpBench, Workload, dims, int_options, normal

__all__ = ["BENCH", "DIRICHLET_ALPHA", "MoeCase", "MoeWorkload", "dirichlet_sizes"]

#: Concentration of the Dirichlet split of tokens over experts for skewed groups (seeded).
DIRICHLET_ALPHA = 1.0


def dirichlet_sizes(rng: np.random.Generator, tokens: int, groups: int) -> np.ndarray:
    """A Dirichlet split of ``tokens`` into ``groups`` non-negative sizes summing to ``tokens``."""
    share = rng.dirichlet(np.full(groups, DIRICHLET_ALPHA)) * tokens
    sizes = np.floor(share).astype(np.int64)
    sizes[np.argsort(sizes - share)[: tokens - int(sizes.sum())]] += 1  # the largest fractional parts
    return sizes.astype(np.int32)


@attrs.frozen(kw_only=True)
class MoeCase(Case):
    """``grouped_matmul``: ``tokens`` rows of width ``k`` over ``experts`` weights ``[k, n]``."""

    op: ClassVar[str] = "grouped_matmul"
    x_name: ClassVar[str] = "tokens"
    experts: int
    k: int
    n: int
    tokens: int
    skewed: bool = False
    activation: str | None = None  #: ``"swiglu"``: ``n`` output columns of ``rhs [g, k, 2n]``

    @property
    def label(self) -> str:
        return f"g={self.experts} k={self.k} n={self.n} m={self.tokens} {self._kind}"

    @property
    def series(self) -> str:
        return f"g={self.experts} k={self.k} n={self.n} {self._kind}"

    @property
    def _kind(self) -> str:
        return ("skewed" if self.skewed else "equal") + (f" {self.activation}" if self.activation else "")

    @property
    def rhs_columns(self) -> int:
        return 2 * self.n if self.activation else self.n

    @property
    def x(self) -> int:
        return self.tokens


@attrs.frozen(kw_only=True)
class MoeWorkload(Workload):
    case: MoeCase
    diff: tuple[int, ...] = (0, 1)

    def group_sizes(self, seed: int = 0) -> np.ndarray:
        c = self.case
        if c.skewed:
            return dirichlet_sizes(np.random.default_rng(seed), c.tokens, c.experts)
        sizes = np.full(c.experts, c.tokens // c.experts, np.int32)
        sizes[: c.tokens - int(sizes.sum())] += 1
        return sizes

    def inputs(self, seed: int = 0) -> tuple[Any, ...]:
        c = self.case
        kl, kr = jax.random.split(jax.random.key(seed))
        return (normal(kl, (c.tokens, c.k), self.dtype),
                normal(kr, (c.experts, c.k, c.rhs_columns), self.dtype, 1 / math.sqrt(c.k)),
                jnp.asarray(self.group_sizes(seed)))

    def kwargs(self) -> dict[str, Any]:
        return {"precision": "default", **({"activation": self.case.activation} if self.case.activation else {})}

    def out_shape(self) -> tuple[int, ...]:
        return (self.case.tokens, self.case.n)

    def work(self, mode: str) -> tuple[float, str]:
        c = self.case
        return 2.0 * c.tokens * c.k * c.rhs_columns * (3.0 if mode == "fwd+bwd" else 1.0), TFLOPS


def _parse(text: str, options: dict[str, str], spec: str) -> MoeCase:
    """``moe:GxKxNxM[:skewed][:swiglu]`` (experts, k, n, tokens; ``swiglu``: ``n`` gated output columns)."""
    g, k, n, m = dims(text, 4, "GxKxNxM (experts, k, n, tokens), e.g. 64x2048x1536x32768")
    skewed, gated = "skewed" in options, "swiglu" in options
    for flag in ("skewed", "equal", "swiglu"):
        options.pop(flag, None)
    int_options(options, (), spec)
    return MoeCase(experts=g, k=k, n=n, tokens=m, skewed=skewed, activation="swiglu" if gated else None)


BENCH = OpBench(
    case=MoeCase, workload=MoeWorkload, preset="moe", aliases=("gmm",), parse=_parse,
    presets=(*(MoeCase(experts=64, k=2048, n=1536, tokens=t, skewed=s) for s in (False, True) for t in (8192, 32768)),
             # Mixtral-like: 8 experts of an up projection, 16k tokens.
             *(MoeCase(experts=8, k=4096, n=14336, tokens=16384, skewed=s) for s in (False, True)),
             # DeepSeek-like: 256 experts k7168 n2048, top-8 routing of 16k tokens (131072 rows).
             *(MoeCase(experts=256, k=7168, n=2048, tokens=8 * 16384, skewed=s) for s in (False, True)),
             # The first matmul of a SwiGLU expert and its activation in one call (Mixtral-like, 64 experts).
             MoeCase(experts=8, k=4096, n=14336, tokens=16384, activation="swiglu"),
             MoeCase(experts=64, k=2048, n=1536, tokens=32768, skewed=True, activation="swiglu")),
    quick=(MoeCase(experts=4, k=32, n=32, tokens=64), MoeCase(experts=4, k=32, n=32, tokens=128, skewed=True)),
)
