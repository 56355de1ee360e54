"""Time a list of Mosaic GPU flash attention forward configs side by side (one line per config).

Usage (GPU host): ``python benchmarks/probe_mosaic_fa.py 4,4096,16,128 "128,2,0 128,2,1"`` with configs
``block_kv,max_concurrent_steps,overlap[,block_q]``; add ``--causal``. Set ``MOSAIC_GPU_DUMP_PTXAS=1
MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_TO=<dir>`` to keep each kernel's ptxas report and SASS.
"""

from __future__ import annotations

import argparse

import _harness
import jax
import jax.numpy as jnp

import ejk
from ejk_pallas._flash_attention_mgpu import MosaicFlashAttentionConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("shape")
    p.add_argument("configs")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    b, s, h, d = (int(x) for x in args.shape.split(","))
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(kk, (b, s, h, d), jnp.bfloat16) for kk in keys)
    flops = 4 * b * h * s * s * d / (2 if args.causal else 1)
    cudnn = _harness.time_ms(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=args.causal,
                                                                         implementation="cudnn"), (q, k, v), args.reps)
    print(f"{args.shape} causal={args.causal} cudnn {cudnn:.3f} ms {flops / cudnn / 1e9:.1f} TFLOP/s", flush=True)
    want = jax.nn.dot_product_attention(q, k, v, is_causal=args.causal, implementation="cudnn")
    for spec in args.configs.split():
        bk, steps, overlap, bq = ([int(x) for x in spec.split(",")] + [128])[:4]
        cfg = MosaicFlashAttentionConfig(block_q=bq, block_kv=bk, max_concurrent_steps=steps, overlap=bool(overlap))
        choice = ejk.ImplChoice(platform="pallas", backend="gpu", implementation="mosaic", cfg=cfg)

        def f(q: jax.Array, k: jax.Array, v: jax.Array, choice: ejk.ImplChoice = choice) -> jax.Array:
            return ejk.flash_attention(q, k, v, causal=args.causal, platform="pallas", cfg=choice)

        try:
            ms = _harness.time_ms(f, (q, k, v), args.reps)
            diff = float(jnp.max(jnp.abs(jax.jit(f)(q, k, v).astype(jnp.float32) - want.astype(jnp.float32))))
            print(f"  q{bq} kv{bk} s{steps} overlap={bool(overlap)}: {ms:.3f} ms {flops / ms / 1e9:.1f} TFLOP/s "
                  f"({cudnn / ms:.2f}x cudnn) max diff {diff:.4f}", flush=True)
        except Exception as exc:  # report and go on
            print(f"  kv{bk} s{steps} overlap={bool(overlap)}: failed: {_harness.error_text(exc)}", flush=True)


if __name__ == "__main__":
    main()
