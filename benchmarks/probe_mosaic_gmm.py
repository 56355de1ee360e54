"""Time a list of Mosaic GPU grouped matmul configs side by side (one line per config), optionally with
the MMAs removed (what the loads alone cost).

Usage (GPU host): ``python benchmarks/probe_mosaic_gmm.py "256,n,3,n 256,m,3,none" [--groups equal,skewed,one]
[--no-mma]`` with configs ``block_n,split,stages,cluster``, timed on the GPU's timeline (``_harness.span_ms``).
Shapes: 64 experts, k = 2048, n = 1536, 32k tokens (``bench_pallas_ops.py``'s); ``one`` puts every token in
the first expert (its ``rhs`` stays in L2). Each line checks the values against ``jax.lax.ragged_dot`` in
float32 (skipped with ``--no-mma``).
Set ``MOSAIC_GPU_DUMP_PTXAS=1`` for the ptxas report. ``bench_pallas_ops.py`` reports only the best of
the config space.
"""

from __future__ import annotations

import argparse

import _harness
import jax
import jax.numpy as jnp
import numpy as np
from bench_pallas_ops import grouped_sizes
from jax.experimental.pallas import mosaic_gpu as plgpu

from ejk_pallas import _grouped_matmul_mgpu as mgpu
from ejk_pallas import _matmul_mgpu


def group_sizes(kind: str, m: int, g: int) -> jax.Array:
    sizes = [m] + [0] * (g - 1) if kind == "one" else grouped_sizes(m, g, skewed=kind == "skewed")
    return jnp.asarray(sizes, jnp.int32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("configs")
    p.add_argument("--groups", default="equal,skewed")
    p.add_argument("--no-mma", action="store_true", help="replace every warpgroup MMA by nothing")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--dense", default="", help="also time ejk's Mosaic GPU matmul on one [m, k] x [k, n] product of "
                   "the same FLOPs, configs block_m,block_n,split,cluster,stages (what the grouping costs)")
    args = p.parse_args()
    m, k, n, g = 32768, 2048, 1536, 64
    lhs = jax.random.normal(jax.random.key(0), (m, k), jnp.bfloat16)
    rhs = jax.random.normal(jax.random.key(1), (g, k, n), jnp.bfloat16) * 0.02
    flops = 2.0 * m * k * n
    dense = _harness.span_ms(lambda x, w: jnp.einsum("gmk,gkn->gmn", x.reshape(g, m // g, k), w), (lhs, rhs),
                             args.reps)
    print(f"dense einsum {dense:.3f} ms {flops / dense / 1e9:.0f} TFLOP/s", flush=True)
    for spec in args.dense.split():
        bm, bn, split, cluster, stages = spec.split(",")
        mcfg = _matmul_mgpu.MosaicMatmulConfig(block_m=int(bm), block_n=int(bn), split=split, cluster=cluster,
                                               stages=int(stages))
        ms = _harness.span_ms(lambda x, w, c=mcfg: _matmul_mgpu.product(x[None], w[:1], out_dtype=jnp.bfloat16,
                                                                        cfg=c), (lhs, rhs), args.reps)
        print(f"dense  {spec}: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s ({dense / ms:.2f}x dense einsum)",
              flush=True)
    if args.no_mma:
        plgpu.wgmma = lambda *a, **kw: None  # the kernel module looks it up on each trace
    for kind in args.groups.split(","):
        gs = group_sizes(kind, m, g)
        want = None if args.no_mma else np.asarray(jax.lax.ragged_dot(lhs.astype(jnp.float32),
                                                                      rhs.astype(jnp.float32), gs))
        for spec in args.configs.split():
            block_n, split, stages, cluster = spec.split(",")
            cfg = mgpu.MosaicGroupedMatmulConfig(block_n=int(block_n), split=split, stages=int(stages),
                                                 cluster=cluster)
            fn = jax.jit(lambda x, w, c=cfg, gs=gs: mgpu.grouped_product(x, w, gs, transpose_rhs=False,
                                                                         out_dtype=jnp.bfloat16, cfg=c))
            try:
                ms = _harness.span_ms(fn, (lhs, rhs), args.reps)
                diff = "" if want is None else \
                    f" max diff {float(np.max(np.abs(np.asarray(fn(lhs, rhs), np.float32) - want))):.4f}"
                print(f"{kind:6s} {spec}: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s "
                      f"({dense / ms:.2f}x dense){diff}", flush=True)
            except Exception as exc:  # report and go on
                print(f"{kind:6s} {spec}: failed: {_harness.error_text(exc)}", flush=True)


if __name__ == "__main__":
    main()
