"""Where an eager op call's time goes over ``jax.jit`` of the same call: four measures, alternating.

- ``eager``: the public call outside ``jax.jit`` (the eager fast path, after warm-up);
- ``jit``: ``jax.jit`` of the same public call;
- ``fn``: the jitted function the fast path remembered for the call, called directly with the arguments it passes;
- ``ejk``: the eager call with that function replaced by a no-op (it returns the function's result, computed
  once): ejk's Python alone.

``eager − jit`` is the overhead; ``ejk`` and ``fn − jit`` split it (ejk's Python, and a slower dispatch of the
remembered function than of ``jax.jit``'s own). ``benchmarks/bench_eager_split.py`` runs it per op.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax

__all__ = ["EAGER_MEASURES", "eager_split"]

#: The measures of :func:`eager_split`, in the order they alternate.
EAGER_MEASURES = ("eager", "jit", "fn", "ejk")


def _remembered(call: Callable[[], Any]) -> tuple[Any, tuple[Any, ...]]:
    """The fast path's one remembered call (``call`` must be remembered already) and the arguments it passes
    its function."""
    from ejk.ops import _eager

    raws = [found for found in _eager._MEMO.values() if type(found) is _eager._Raw]
    if len(raws) != 1 or raws[0].fn is None:
        raise RuntimeError(f"expected one remembered eager call with its jitted function, found {len(raws)}")
    found = raws[0]
    real: Callable[..., Any] = found.fn  # type: ignore[assignment]  # not None: checked above
    seen: list[tuple[Any, ...]] = []

    def capture(*args: Any) -> Any:
        seen.append(args)
        return real(*args)

    found.fn = capture
    try:
        jax.block_until_ready(call())
    finally:
        found.fn = real
    if not seen:
        raise RuntimeError("the eager call did not take the fast path")
    return found, seen[0]


def _sample(fn: Callable[[], Any], number: int) -> float:
    start = time.perf_counter()
    out = None
    for _ in range(number):
        out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / number * 1e6


def eager_split(call: Callable[[], Any], jitted: Callable[[], Any], *, number: int = 2000,
                samples: int = 7) -> dict[str, list[float]]:
    """The samples (µs per call, ``number`` back-to-back calls each, outputs blocked on once per sample) of the
    four :data:`EAGER_MEASURES` of one eager op call ``call`` and its ``jax.jit`` form ``jitted``.

    Clears the fast path's memory of earlier calls first (it then holds ``call``'s alone).

    Raises:
        RuntimeError: when the call does not take the eager fast path.
    """
    from ejk.ops import _eager

    for _ in range(3):  # decide, remember, confirm
        jax.block_until_ready(call())
        jax.block_until_ready(jitted())
    _eager._MEMO.clear()
    for _ in range(3):
        jax.block_until_ready(call())
    found, args = _remembered(call)
    real = found.fn

    def direct() -> Any:
        return real(*args)

    result = jax.block_until_ready(direct())

    def no_op(*_: Any) -> Any:  # the real function's result, already computed: the caller may index it
        return result

    times: dict[str, list[float]] = {m: [] for m in EAGER_MEASURES}
    for _ in range(samples):
        times["eager"].append(_sample(call, number))
        times["jit"].append(_sample(jitted, number))
        times["fn"].append(_sample(direct, number))
        found.fn = no_op
        try:
            times["ejk"].append(_sample(call, number))
        finally:
            found.fn = real
    return times
