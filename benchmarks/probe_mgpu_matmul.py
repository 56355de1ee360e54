"""How fast can a Pallas Mosaic GPU matmul run on this host? jax's own Hopper example kernel
(``jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu``) over a few configs, against ``a @ b``, on the
device timeline (``_harness.span_ms``). Reference only: ejk's own kernels are timed by the benches.

Usage (GPU host): ``python benchmarks/probe_mgpu_matmul.py [M K N]``.
"""

from __future__ import annotations

import functools
import itertools
import sys

import _harness
import jax
import jax.numpy as jnp


def main() -> None:
    m, k, n = (int(x) for x in sys.argv[1:4]) if len(sys.argv) >= 4 else (8192, 8192, 8192)
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm
    a = jax.random.normal(jax.random.key(0), (m, k), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (k, n), jnp.bfloat16)
    flops = 2 * m * n * k
    ref_ms = _harness.span_ms(lambda x, y: x @ y, (a, b), 5)
    print(f"a @ b {m}x{k}x{n}: {ref_ms:.3f} ms {flops / ref_ms / 1e9:.0f} TFLOP/s", flush=True)
    ref = (a @ b).astype(jnp.float32)
    dims = hm.MatmulDimension
    for tm, tn, steps, minor, width, wg, cluster in itertools.product(
            (128,), (128,), (4,), (dims.N, dims.M), (16,), (dims.N, dims.M), (None, dims.M, dims.N)):
        cfg = hm.TuningConfig(tile_m=tm, tile_n=tn, tile_k=64, max_concurrent_steps=steps, grid_minor_dim=minor,
                              grid_tile_width=width, wg_dimension=wg, cluster_dimension=cluster)
        fn = functools.partial(hm.matmul, c=None, config=cfg)
        try:
            ms = _harness.span_ms(fn, (a, b), 3)
            err = float(jnp.max(jnp.abs(jax.jit(fn)(a, b).astype(jnp.float32) - ref)))
        except Exception as exc:
            print(f"  {cfg}: {_harness.error_text(exc)}", flush=True)
            continue
        print(f"  tm{tm} tn{tn} s{steps} minor={minor} w{width} wg={wg} cluster={cluster}: {ms:.3f} ms "
              f"{flops / ms / 1e9:.0f} TFLOP/s ({ref_ms / ms:.2f}x) maxerr {err:.3g}", flush=True)


if __name__ == "__main__":
    main()
