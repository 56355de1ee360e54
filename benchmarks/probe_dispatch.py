"""Per-call time of ragged paged decode through ejk-triton (jax-triton's custom call) and ejk-pallas
(XLA's own Triton call), timed three ways: 20 and 100 dependent calls in one program
(``_harness.device_ms``), and single-call programs back to back (``_harness.time_ms``).

Usage: ``python benchmarks/probe_dispatch.py 8,2048 [8,8192 ...]`` (batch, context; 32/8 heads, D 128,
page 64, bf16). A cost paid once per program execution, not per call, shows as a per-call time that
falls from 20 to 100 chained calls; one paid per call does not.
"""

from __future__ import annotations

import argparse
from typing import Any

import _harness
import attrs
from bench_pallas_ops import paged_inputs
from probe_paged_configs import paged_call


def cases(inputs: tuple[Any, ...]) -> list[tuple[str, Any]]:
    import ejk_pallas._paged_attention as pallas_paged
    import ejk_triton._paged_attention as triton_paged

    triton = triton_paged.heuristic_config(*inputs)
    fused = attrs.evolve(triton, fused_merge=True)
    pallas = pallas_paged.heuristic_config(*inputs)
    return [("ejk-triton heuristic", paged_call("triton", "paged", triton, "gpu")),
            ("ejk-triton heuristic, merge in the kernel", paged_call("triton", "paged", fused, "gpu")),
            ("ejk-pallas heuristic", paged_call("pallas", "triton_lowered", pallas, "gpu"))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("shapes", nargs="+")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    for shape in args.shapes:
        b, ctx = (int(x) for x in shape.split(","))
        inputs = paged_inputs(b, ctx, 64, 32, 8, 128)
        for name, fn in cases(inputs):
            chain20 = _harness.device_ms(fn, inputs, args.reps) * 1e3
            chain100 = _harness.device_ms(fn, inputs, args.reps, chain=100) * 1e3
            single = _harness.time_ms(fn, inputs, args.reps) * 1e3
            print(f"B={b} ctx={ctx} {name}: chained x20 {chain20:.1f} us, x100 {chain100:.1f} us; "
                  f"single-call programs {single:.1f} us", flush=True)


if __name__ == "__main__":
    main()
