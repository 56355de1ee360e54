"""Where an eager op call's time goes over ``jax.jit`` of the same call (issue 31's eager target).

For each op's quick case of ``ejk bench`` (``platform="auto"``), four measures alternate, each the best and the
median of ``--samples`` samples of ``--number`` back-to-back calls (µs per call, outputs blocked on once per
sample):

- ``eager``: the public call outside ``jax.jit`` (the eager fast path, after warm-up);
- ``jit``: ``jax.jit`` of the same public call;
- ``fn``: the jitted function the fast path remembered for the call, called directly with the arguments the fast
  path passes it;
- ``ejk``: the eager call with that function replaced by a no-op: ejk's Python alone.

``eager − jit`` is what the target reads; ``ejk`` and ``fn − jit`` split it (ejk's Python, and a slower dispatch
of the remembered function than of ``jax.jit``'s). Runs on any backend:

    python3 benchmarks/bench_eager_split.py [--ops flash_attention,matmul] [--out FILE]
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import _harness
import jax
import jax.numpy as jnp

MEASURES = ("eager", "jit", "fn", "ejk")


def _remembered(call: Callable[[], Any]) -> tuple[Any, tuple[Any, ...]]:
    """The fast path's remembered call of ``call`` (it must be remembered already) and the arguments it passes
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


def split(call: Callable[[], Any], jitted: Callable[[], Any], *, number: int, samples: int) -> dict[str, list[float]]:
    """The four measures' samples (µs per call) of one call, alternating."""
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

    times: dict[str, list[float]] = {m: [] for m in MEASURES}
    for _ in range(samples):
        times["eager"].append(_sample(call, number))
        times["jit"].append(_sample(jitted, number))
        times["fn"].append(_sample(direct, number))
        found.fn = lambda *a: None
        try:
            times["ejk"].append(_sample(call, number))
        finally:
            found.fn = real
    return times


def main() -> None:
    from ejk.bench._cases import QUICK
    from ejk.bench._workloads import workload_for

    p = _harness.parser(__doc__)
    p.add_argument("--ops", default="flash_attention,matmul,grouped_matmul,ragged_paged_attention,rms_norm",
                   help="comma-separated ops (their first quick case each)")
    p.add_argument("--number", type=int, default=2000, help="calls per sample")
    p.add_argument("--samples", type=int, default=7)
    args = _harness.parse(p)
    if args.smoke:
        args.number, args.samples = 200, 3
    dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    wanted = args.ops.split(",")
    cases = {case.op: case for cases in QUICK.values() for case in reversed(cases)}
    lines = [*_harness.header("Eager call against jax.jit of the same call, split", args)[:4],
             f"- {args.samples} samples of {args.number} back-to-back calls per measure, the four alternating; "
             "µs per call, best / median" + ("; SMOKE RUN" if args.smoke else ""), "",
             "| op | case | " + " | ".join(f"{m} µs" for m in MEASURES) + " | eager − jit (best) | fn − jit (best) |",
             "| --- | --- |" + " ---: |" * (len(MEASURES) + 2)]
    for op in wanted:
        if op not in cases:
            lines.append(f"| {op} | (no quick case) |" + " |" * (len(MEASURES) + 2))
            continue
        case = cases[op]
        workload = workload_for(case, dtype)
        inputs = workload.inputs()
        fn = workload.call(platform="auto")
        jfn = jax.jit(fn)
        try:
            t = split(functools.partial(fn, *inputs), functools.partial(jfn, *inputs), number=args.number,
                      samples=args.samples)
        except Exception as exc:  # report and go on with the other ops
            lines.append(f"| {op} | {case.label} | failed: {type(exc).__name__}: {str(exc)[:200]} |"
                         + " |" * (len(MEASURES) + 1))
            continue
        best = {m: min(v) for m, v in t.items()}
        cells = " | ".join(f"{best[m]:.1f} / {statistics.median(t[m]):.1f}" for m in MEASURES)
        lines.append(f"| {op} | {case.label} | {cells} | {best['eager'] - best['jit']:+.1f} | "
                     f"{best['fn'] - best['jit']:+.1f} |")
        print(lines[-1], flush=True)
    _harness.write(lines, args, "eager_split.md")


if __name__ == "__main__":
    main()
