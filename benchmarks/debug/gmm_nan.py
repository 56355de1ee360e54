"""Debug: where the Mosaic GPU grouped matmul gives NaN / wrong values (GPU host)."""
import sys
import jax, jax.numpy as jnp, numpy as np
from ejk_pallas import _grouped_matmul_mgpu as mg, _grouped_matmul as tl

SIZES = [0, 300, 1, 0, 450, 100, 0, 49, 2048, 700, 0, 352]

def run(m, k, n, sizes, cfg, ctas=None, label=""):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((len(sizes), k, n)) / np.sqrt(k), jnp.bfloat16)
    gs = jnp.asarray(sizes, jnp.int32)
    old = tl._sm_count
    if ctas is not None:
        tl._sm_count = lambda: ctas
    try:
        got = np.asarray(jax.jit(lambda x, w, gs: mg.grouped_product(x, w, gs, transpose_rhs=False, out_dtype=jnp.bfloat16, cfg=cfg))(x, w, gs)).astype(np.float32)
    finally:
        tl._sm_count = old
    want = np.array(jax.lax.ragged_dot(x.astype(jnp.float32), w.astype(jnp.float32), gs))
    want[sum(sizes):] = 0
    bad = ~np.isclose(got, want, atol=0.05, rtol=0.02)
    rows = np.nonzero(bad.any(1))[0]
    cols = np.nonzero(bad.any(0))[0]
    print(f"{label} m={m} k={k} n={n} cfg={cfg} ctas={ctas}: bad={bad.sum()} nan={np.isnan(got).sum()} "
          f"rows {rows[:3]}..{rows[-3:] if len(rows) else ''} ({len(rows)}) cols {cols[:3]}..{cols[-3:] if len(cols) else ''} ({len(cols)})",
          flush=True)
    if len(rows):
        tiles = sorted(set((rows // 64).tolist()))
        print("   bad 64-row halves:", tiles[:20], " col chunks:", sorted(set((cols // 64).tolist()))[:20], flush=True)
        r = rows[0]
        print("   first bad row", r, "bad cols", np.nonzero(bad[r])[0][:8], "got", got[r, np.nonzero(bad[r])[0][:4]], flush=True)

C = mg.MosaicGroupedMatmulConfig
for cfg in mg._fitting(jnp.zeros((1, 1), jnp.bfloat16), jnp.bfloat16):
    run(4100, 768, 1100, SIZES, cfg, label="space")
run(4096, 768, 1024, [256] * 16, C(), label="equal aligned groups")
