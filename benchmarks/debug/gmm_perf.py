"""Debug: the Mosaic GPU grouped matmul's time by config, with and without its MMAs (GPU host)."""
import sys
sys.path.insert(0, "benchmarks")
import _harness
import jax, jax.numpy as jnp, numpy as np
from jax.experimental.pallas import mosaic_gpu as plgpu
from ejk_pallas import _grouped_matmul_mgpu as mg

m, k, n, g = 32768, 2048, 1536, 64
x = jax.random.normal(jax.random.key(0), (m, k), jnp.bfloat16)
w = jax.random.normal(jax.random.key(1), (g, k, n), jnp.bfloat16)
flops = 2.0 * m * k * n
C = mg.MosaicGroupedMatmulConfig
real_wgmma = plgpu.wgmma
for sizes_name, sizes in (("equal", [m // g] * g), ("one group", [m] + [0] * (g - 1))):
    gs = jnp.asarray(sizes, jnp.int32)
    for cfg in (C(), C(max_concurrent_steps=3), C(block_n=128, max_concurrent_steps=6), C(block_n=64, max_concurrent_steps=8)):
        for variant in ("normal", "no-mma"):
            if sizes_name != "equal" and variant != "normal":
                continue
            plgpu.wgmma = real_wgmma if variant == "normal" else (lambda *a, **kw: None)
            f = jax.jit(lambda x, w, gs, c=cfg: mg.grouped_product(x, w, gs, transpose_rhs=False, out_dtype=jnp.bfloat16, cfg=c))
            try:
                ms = _harness.time_ms(f, (x, w, gs), 10)
                print(f"{sizes_name:9s} n{cfg.block_n} s{cfg.max_concurrent_steps} {variant:7s}: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s", flush=True)
            except Exception as e:
                print(f"{sizes_name} {cfg} {variant}: {type(e).__name__}: {str(e)[:200]}", flush=True)
plgpu.wgmma = real_wgmma
print("dense einsum", _harness.time_ms(jax.jit(lambda x, w: jnp.einsum("gmk,gkn->gmn", x.reshape(g, m // g, k), w)), (x, w), 10))
