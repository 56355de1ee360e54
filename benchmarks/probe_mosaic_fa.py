"""Time a list of Mosaic GPU flash attention forward configs side by side (one line per config).

Usage (GPU host): ``python benchmarks/probe_mosaic_fa.py 4,4096,16,128 "128,2,0 128,2,1"`` with configs
``block_kv,max_concurrent_steps,overlap[,block_q[,persistent]]``; add ``--causal``. Set ``MOSAIC_GPU_DUMP_PTXAS=1`` to
see each kernel's ptxas report (registers, spills, wgmma serialisation warnings).
``bench_pallas_attention.py --mosaic-configs all`` reports only the best of the config space.
"""

from __future__ import annotations

import argparse

import _harness
import jax
import jax.numpy as jnp
from bench_attention_gpu import Shape, make_inputs
from bench_pallas_attention import cudnn_attention, mosaic_attention, mosaic_label

from ejk_pallas._flash_attention_mgpu import MosaicFlashAttentionConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("shape")
    p.add_argument("configs")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--reps", type=int, default=10)
    _harness.add_timer_option(p)
    args = p.parse_args()
    args.smoke = False
    time_ms = _harness.timer(args)
    batch, seq, heads, dim = (int(x) for x in args.shape.split(","))
    shape = Shape(batch=batch, seq=seq, heads=heads, dim=dim, causal=args.causal)
    q, k, v = make_inputs(shape, jnp.bfloat16)[:3]
    flops = shape.fwd_flops()
    cudnn = time_ms(cudnn_attention(shape), (q, k, v), args.reps)
    print(f"{shape} cudnn {cudnn:.3f} ms {flops / cudnn / 1e9:.1f} TFLOP/s", flush=True)
    want = jax.jit(cudnn_attention(shape))(q, k, v).astype(jnp.float32)
    for spec in args.configs.split():
        bk, steps, overlap, bq, persistent = ([int(x) for x in spec.split(",")] + [128, 0][spec.count(",") - 2:])[:5]
        cfg = MosaicFlashAttentionConfig(block_q=bq, block_kv=bk, max_concurrent_steps=steps, overlap=bool(overlap),
                                         persistent=bool(persistent))
        attention = mosaic_attention(shape, cfg)
        try:
            ms = time_ms(attention, (q, k, v), args.reps)
            diff = float(jnp.max(jnp.abs(jax.jit(attention)(q, k, v).astype(jnp.float32) - want)))
            print(f"  {mosaic_label(cfg)}: {ms:.3f} ms {flops / ms / 1e9:.1f} TFLOP/s ({cudnn / ms:.2f}x cudnn) "
                  f"max diff {diff:.4f}", flush=True)
        except Exception as exc:  # report and go on
            print(f"  {mosaic_label(cfg)}: failed: {_harness.error_text(exc)}", flush=True)


if __name__ == "__main__":
    main()
