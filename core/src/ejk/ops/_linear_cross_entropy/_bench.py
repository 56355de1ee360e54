"""``linear_cross_entropy`` in ``ejk bench``: its cases, presets, ``--shapes`` syntax and work.

FLOPs: the logits' product ``2·T·H·V``; forward + backward 3x (the gradients' two products; the
recomputation of the logits in the backward pass is not counted as useful work). Runs at
``precision="default"``, the backend's fast path, as ``x @ w`` does by default. Labels are
uniform over the vocabulary, none ignored. The loss is the plain mean unless the spec asks for
z-loss (``zloss``: ``z_loss=1e-4``, PaLM's weight) or label smoothing (``smooth``: ``0.1``).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import attrs
import jax
import jax.numpy as jnp

from ejk.ops._workload import TFLOPS, Case, OpBench, Workload, dims, normal

__all__ = ["BENCH", "LABEL_SMOOTHING", "Z_LOSS", "LinearCrossEntropyCase", "LinearCrossEntropyWorkload"]

#: The z-loss weight of a ``zloss`` case and the smoothing of a ``smooth`` one.
Z_LOSS = 1e-4
LABEL_SMOOTHING = 0.1


@attrs.frozen(kw_only=True)
class LinearCrossEntropyCase(Case):
    """``linear_cross_entropy``: ``tokens`` hidden states of width ``hidden`` over ``vocab`` classes."""

    op: ClassVar[str] = "linear_cross_entropy"
    x_name: ClassVar[str] = "vocab"
    tokens: int
    hidden: int
    vocab: int
    #: With ``z_loss`` = :data:`Z_LOSS`.
    z_loss: bool = False
    #: With ``label_smoothing`` = :data:`LABEL_SMOOTHING`.
    smoothing: bool = False

    @property
    def _options(self) -> str:
        return "".join((" zloss" if self.z_loss else "", " smooth" if self.smoothing else ""))

    @property
    def label(self) -> str:
        return f"T={self.tokens} H={self.hidden} V={self.vocab}{self._options}"

    @property
    def series(self) -> str:
        return f"T={self.tokens} H={self.hidden}{self._options}"

    @property
    def x(self) -> int:
        return self.vocab


@attrs.frozen(kw_only=True)
class LinearCrossEntropyWorkload(Workload):
    case: LinearCrossEntropyCase
    diff: tuple[int, ...] = (0, 1)

    def inputs(self, seed: int = 0) -> tuple[Any, ...]:
        c = self.case
        kx, kw, kl = jax.random.split(jax.random.key(seed), 3)
        labels = jax.random.randint(kl, (c.tokens,), 0, c.vocab, jnp.int32)
        return (normal(kx, (c.tokens, c.hidden), self.dtype),
                normal(kw, (c.hidden, c.vocab), self.dtype, 1 / math.sqrt(c.hidden)), labels)

    def kwargs(self) -> dict[str, Any]:
        c = self.case
        return {"precision": "default", **({"z_loss": Z_LOSS} if c.z_loss else {}),
                **({"label_smoothing": LABEL_SMOOTHING} if c.smoothing else {})}

    def out_shape(self) -> tuple[int, ...]:
        return ()

    def cotangent(self, seed: int = 1) -> jax.Array:
        return jnp.ones((), jnp.float32)

    def work(self, mode: str) -> tuple[float, str]:
        c = self.case
        return 2.0 * c.tokens * c.hidden * c.vocab * (3.0 if mode == "fwd+bwd" else 1.0), TFLOPS


def _parse(text: str, options: dict[str, str], spec: str) -> LinearCrossEntropyCase:
    """``lce:TxHxV[:zloss][,smooth]``: z-loss 1e-4 and label smoothing 0.1 when named."""
    t, h, v = dims(text, 3, "TxHxV (tokens x hidden x vocab), e.g. 16384x4096x131072")
    flags = {}
    for name in ("zloss", "smooth"):
        value = options.pop(name, None)
        if value:
            raise ValueError(f"--shapes {spec!r}: {name} is a flag and takes no value ({name}={value} given)")
        flags[name] = value is not None
    if options:
        raise ValueError(f"--shapes {spec!r}: unknown option(s) {', '.join(sorted(options))}; allowed: zloss, smooth")
    return LinearCrossEntropyCase(tokens=t, hidden=h, vocab=v, z_loss=flags["zloss"], smoothing=flags["smooth"])


BENCH = OpBench(
    case=LinearCrossEntropyCase, workload=LinearCrossEntropyWorkload, preset="lce",
    aliases=("cross_entropy",), parse=_parse,
    presets=tuple(LinearCrossEntropyCase(tokens=16384, hidden=4096, vocab=v) for v in (131072, 262144)),
    quick=(LinearCrossEntropyCase(tokens=64, hidden=32, vocab=500),
           LinearCrossEntropyCase(tokens=128, hidden=64, vocab=1000)),
)
