"""Segment ids and packed sequences on ejk-pallas's Mosaic GPU flash attention (issue 29), on the GPU host.

Forward and forward+backward milliseconds, one JSON line each:

* ``flash_attention`` [4, 4096, 16, 128] causal bf16 on ``pallas/gpu:mosaic``: without segment ids, with one
  segment per row (all ids 0), and with 2 segments per row; ejk-triton's ``segments`` kernel beside it;
* ``flash_attention_varlen`` 16 x 2048 tokens packed (32k) causal on ``pallas/gpu:mosaic`` and on
  ``triton/gpu:flash``, against dense ``flash_attention`` [16, 2048, 16, 128] causal on ``pallas/gpu:mosaic``
  (the same work); the ragged 1k-4k preset packing too.

    python3 benchmarks/bench_mosaic_segments.py
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import ejk

RAGGED_32K = (4096, 1024, 1024, 3072, 1024, 2048, 1536, 2560, 3584, 1024, 1536, 1536, 2048, 2048, 1792, 2816)


def _bench(fn: Any, *args: Any, reps: int = 7, calls: int = 10) -> float:
    """Median ms per call of back-to-back calls of the jitted ``fn``, after a warm-up."""
    jax.block_until_ready(fn(*args))
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / calls * 1e3)
    return float(np.median(times))


def _choice(platform: str, implementation: str) -> ejk.ImplChoice:
    return ejk.ImplChoice(platform=platform, backend="gpu", implementation=implementation)


def _fwd_bwd(f: Any) -> Any:
    def loss(q: Any, k: Any, v: Any) -> Any:
        return jnp.sum(f(q, k, v).astype(jnp.float32))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def _row(label: str, f: Any, args: tuple[Any, ...], flops: float) -> None:
    row: dict[str, Any] = {"case": label}
    for mode, fn in (("fwd", jax.jit(f)), ("fwd+bwd", _fwd_bwd(f))):
        try:
            ms = _bench(fn, *args)
            row[f"{mode}_ms"] = round(ms, 4)
            row[f"{mode}_tflops"] = round(flops * (1 if mode == "fwd" else 3.5) / ms / 1e9, 1)
        except Exception as exc:  # a failing line is reported, the others still run
            row[f"{mode}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    print(json.dumps(row), flush=True)


def main() -> None:
    rng = np.random.default_rng(0)
    b, s, h, d = 4, 4096, 16, 128
    q, k, v = (jnp.asarray(rng.standard_normal((b, s, h, d)), jnp.bfloat16) for _ in range(3))
    flops = 4.0 * b * h * s * s * d / 2
    mosaic = _choice("pallas", "mosaic")
    _row("[4,4096,16,128] causal mosaic, no segment ids",
         functools.partial(ejk.flash_attention, causal=True, platform="pallas", cfg=mosaic), (q, k, v), flops)
    for name, ids in (("one segment", np.zeros((b, s), np.int32)),
                      ("two segments", np.repeat(np.arange(2, dtype=np.int32), s // 2)[None].repeat(b, 0))):
        seg = jnp.asarray(ids)
        for platform, impl in (("pallas", "mosaic"), ("triton", "segments")):
            f = functools.partial(ejk.flash_attention, causal=True, q_segment_ids=seg, kv_segment_ids=seg,
                                  platform=platform, cfg=_choice(platform, impl))
            _row(f"[4,4096,16,128] causal {platform}/{impl}, {name}", f, (q, k, v), flops)

    b, s = 16, 2048
    q, k, v = (jnp.asarray(rng.standard_normal((b, s, h, d)), jnp.bfloat16) for _ in range(3))
    flops = 4.0 * b * h * s * s * d / 2
    _row("dense [16,2048,16,128] causal mosaic",
         functools.partial(ejk.flash_attention, causal=True, platform="pallas", cfg=mosaic), (q, k, v), flops)
    packed = tuple(x.reshape(b * s, h, d) for x in (q, k, v))
    for lens in ((2048,) * 16, RAGGED_32K):
        cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)
        work = 4.0 * h * d * sum(n * (n + 1) / 2 for n in lens)
        for platform, impl in (("pallas", "mosaic"), ("triton", "flash")):
            f = functools.partial(ejk.flash_attention_varlen, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True,
                                  platform=platform, cfg=_choice(platform, impl))
            tag = "16 x 2048" if len(set(lens)) == 1 else "16 of 1k-4k"
            _row(f"varlen {tag} (32k tokens) H16 D128 causal {platform}/{impl}", f, packed, work)
        seg = jnp.asarray(np.repeat(np.arange(len(lens), dtype=np.int32), lens)[None])
        f = functools.partial(ejk.flash_attention, causal=True, q_segment_ids=seg, kv_segment_ids=seg,
                              platform="pallas", cfg=mosaic)
        _row(f"segment ids [1,32768,16,128] {len(lens)} packed causal mosaic", f,
             tuple(x[None] for x in packed), work)


if __name__ == "__main__":
    main()
