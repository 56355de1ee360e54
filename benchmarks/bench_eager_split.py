"""Where an eager op call's time goes over ``jax.jit`` of the same call (issue 31's eager target).

For each op's quick case of ``ejk bench`` (``platform="auto"``), the four measures of
``ejk.bench.eager_split`` (eager, jit, the remembered function called directly, ejk's Python alone), each
the best and the median of ``--samples`` samples of ``--number`` back-to-back calls, µs per call.
``eager − jit`` is what the target reads; ``ejk`` and ``fn − jit`` split it. Runs on any backend:

    python3 benchmarks/bench_eager_split.py [--ops flash_attention,matmul] [--out FILE]
"""

from __future__ import annotations

import functools
import statistics

import _harness
import jax
import jax.numpy as jnp

from ejk.bench import EAGER_MEASURES as MEASURES
from ejk.bench import QUICK, eager_split, workload_for


def main() -> None:
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
            t = eager_split(functools.partial(fn, *inputs), functools.partial(jfn, *inputs), number=args.number,
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
