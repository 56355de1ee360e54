"""Segment ids and packed sequences on ejk-pallas's Mosaic GPU flash attention (issue 29), on the GPU host.

Forward and forward+backward milliseconds, one JSON line each:

* ``flash_attention`` [4, 4096, 16, 128] causal bf16 on ``pallas/gpu:mosaic``: without segment ids, with one
  segment per row (all ids 0), and with 2 segments per row; ejk-triton's ``segments`` kernel beside it;
* ``flash_attention_varlen`` 16 x 2048 tokens packed (32k) causal on ``pallas/gpu:mosaic`` and on
  ``triton/gpu:flash``, against dense ``flash_attention`` [16, 2048, 16, 128] causal on ``pallas/gpu:mosaic``
  (the same work); the ragged 1k-4k preset packing too.

    python3 benchmarks/bench_mosaic_segments.py            # every line
    python3 benchmarks/bench_mosaic_segments.py --quick    # the two comparisons of issue 29 and checks
    python3 benchmarks/bench_mosaic_segments.py --packed   # the packed 32k-token lines on Mosaic GPU only

``--quick`` also checks on the GPU that one segment per row gives the no-segment call's output and gradients,
and that 16 packed sequences of 2048 give the dense [16, 2048] batch's (the same attention).
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
from typing import Any

import _harness
import jax
import jax.numpy as jnp
import numpy as np

import ejk
from ejk.bench import device_seconds_per_call

RAGGED_32K = (4096, 1024, 1024, 3072, 1024, 2048, 1536, 2560, 3584, 1024, 1536, 1536, 2048, 2048, 1792, 2816)


def _choice(platform: str, implementation: str) -> ejk.ImplChoice:
    return ejk.ImplChoice(platform=platform, backend="gpu", implementation=implementation)


def _fwd_bwd(f: Any) -> Any:
    def loss(q: Any, k: Any, v: Any, *index: Any) -> Any:
        return jnp.sum(f(q, k, v, *index).astype(jnp.float32))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def _device_ms(fn: Any, args: tuple[Any, ...]) -> float | None:
    """Median of 5 samples of 10 back-to-back calls on the GPU's own timeline (``None`` off a GPU)."""
    compiled = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    samples = [device_seconds_per_call(lambda: compiled(*args), 10) for _ in range(5)]
    return None if None in samples else statistics.median(samples) * 1e3  # type: ignore[type-var]


def _row(label: str, f: Any, args: tuple[Any, ...], flops: float) -> None:
    """One JSON line: forward and forward+backward of ``f(q, k, v, *index)`` by the wall clock (``*_ms``) and on
    the device timeline (``*_device_ms``). The segment ids or offsets in ``args[3:]`` are traced arguments, as a
    user's are, so their block bounds are computed at run time and timed."""
    row: dict[str, Any] = {"case": label}
    for mode, fn in (("fwd", jax.jit(f)), ("fwd+bwd", _fwd_bwd(f))):
        try:
            ms = _harness.time_ms(fn, args, reps=5)
            row[f"{mode}_ms"] = round(ms, 4)
            row[f"{mode}_tflops"] = round(flops * (1 if mode == "fwd" else 3.5) / ms / 1e9, 1)
            device = _device_ms(fn, args)
            if device is not None:
                row[f"{mode}_device_ms"] = round(device, 4)
        except Exception as exc:  # a failing line is reported, the others still run
            row[f"{mode}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    print(json.dumps(row), flush=True)


def _max_diff(a: Any, b: Any) -> float:
    return max(float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def _with_ids(f: Any) -> Any:
    """``f(q, k, v, ids)``: one array of segment ids for both sides, a traced argument."""
    return lambda q, k, v, ids: f(q, k, v, q_segment_ids=ids, kv_segment_ids=ids)


def _with_offsets(f: Any) -> Any:
    """``f(q, k, v, cu)``: the same packing on both sides, its offsets a traced argument."""
    return lambda q, k, v, cu: f(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu)


def quick() -> None:
    """Segment ids vs none at [4, 4096, 16, 128] causal, varlen 16 x 2048 vs dense [16, 2048, 16, 128] causal,
    all on pallas/gpu:mosaic (the varlen one beside triton/gpu:flash), with equality checks."""
    rng = np.random.default_rng(0)
    mosaic = _choice("pallas", "mosaic")
    h, d = 16, 128
    for b, s in ((4, 4096), (16, 2048)):
        q, k, v = (jnp.asarray(rng.standard_normal((b, s, h, d)), jnp.bfloat16) for _ in range(3))
        flops = 4.0 * b * h * s * s * d / 2
        dense = functools.partial(ejk.flash_attention, causal=True, platform="pallas", cfg=mosaic)
        if b == 4:
            args = (q, k, v, jnp.zeros((b, s), jnp.int32))
            other = _with_ids(functools.partial(ejk.flash_attention, causal=True, platform="pallas",
                                                cfg=_choice("pallas", "mosaic_segments")))
            name = "[4,4096,16,128] causal mosaic, one segment per row"
            unpack: Any = lambda x: x  # noqa: E731
        else:
            cu = jnp.arange(b + 1, dtype=jnp.int32) * s
            other = _with_offsets(functools.partial(ejk.flash_attention_varlen, causal=True, platform="pallas",
                                                    cfg=mosaic))
            args = (*(x.reshape(b * s, h, d) for x in (q, k, v)), cu)
            name = "varlen 16 x 2048 causal mosaic"
            unpack = functools.partial(jnp.reshape, shape=(b, s, h, d))
        out_d, out_o = jax.jit(dense)(q, k, v), unpack(jax.jit(other)(*args))
        g_d = _fwd_bwd(dense)(q, k, v)
        g_o = tuple(unpack(x) for x in _fwd_bwd(other)(*args))
        print(json.dumps({"check": name, "max_abs_diff_out": _max_diff(out_d, out_o),
                          "max_abs_diff_grads": _max_diff(g_d, g_o)}), flush=True)
        _row(f"dense [{b},{s},16,128] causal mosaic", dense, (q, k, v), flops)
        _row(name, other, args, flops)
        if b == 16:
            f = _with_offsets(functools.partial(ejk.flash_attention_varlen, causal=True, platform="triton",
                                                cfg=_choice("triton", "flash")))
            _row("varlen 16 x 2048 causal triton/flash", f, args, flops)


def main(packed_only: bool = False) -> None:
    """Every line; with ``packed_only`` the packed 32k-token lines on Mosaic GPU alone (varlen and segment ids on
    each packing, and the dense batch of the same work)."""
    rng = np.random.default_rng(0)
    h, d = 16, 128
    if not packed_only:
        _segment_id_lines(rng, h, d)
    _packed_lines(rng, h, d, ("pallas",) if packed_only else ("pallas", "triton"))


def _segment_id_lines(rng: np.random.Generator, h: int, d: int) -> None:
    b, s = 4, 4096
    q, k, v = (jnp.asarray(rng.standard_normal((b, s, h, d)), jnp.bfloat16) for _ in range(3))
    flops = 4.0 * b * h * s * s * d / 2
    mosaic = _choice("pallas", "mosaic")
    _row("[4,4096,16,128] causal mosaic, no segment ids",
         functools.partial(ejk.flash_attention, causal=True, platform="pallas", cfg=mosaic), (q, k, v), flops)
    for name, ids in (("one segment", np.zeros((b, s), np.int32)),
                      ("two segments", np.repeat(np.arange(2, dtype=np.int32), s // 2)[None].repeat(b, 0))):
        for platform, impl in (("pallas", "mosaic_segments"), ("triton", "segments")):
            f = _with_ids(functools.partial(ejk.flash_attention, causal=True, platform=platform,
                                            cfg=_choice(platform, impl)))
            _row(f"[4,4096,16,128] causal {platform}/{impl}, {name}", f, (q, k, v, jnp.asarray(ids)), flops)



def _packed_lines(rng: np.random.Generator, h: int, d: int, platforms: tuple[str, ...]) -> None:
    b, s = 16, 2048
    q, k, v = (jnp.asarray(rng.standard_normal((b, s, h, d)), jnp.bfloat16) for _ in range(3))
    flops = 4.0 * b * h * s * s * d / 2
    mosaic = _choice("pallas", "mosaic")
    _row("dense [16,2048,16,128] causal mosaic",
         functools.partial(ejk.flash_attention, causal=True, platform="pallas", cfg=mosaic), (q, k, v), flops)
    packed = tuple(x.reshape(b * s, h, d) for x in (q, k, v))
    for lens in ((2048,) * 16, RAGGED_32K):
        cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)
        work = 4.0 * h * d * sum(n * (n + 1) / 2 for n in lens)
        for platform, impl in (("pallas", "mosaic"), ("triton", "flash"))[:len(platforms)]:
            f = _with_offsets(functools.partial(ejk.flash_attention_varlen, causal=True, platform=platform,
                                                cfg=_choice(platform, impl)))
            tag = "16 x 2048" if len(set(lens)) == 1 else "16 of 1k-4k"
            _row(f"varlen {tag} (32k tokens) H16 D128 causal {platform}/{impl}", f, (*packed, cu), work)
        seg = jnp.asarray(np.repeat(np.arange(len(lens), dtype=np.int32), lens)[None])
        for platform, impl in (("pallas", "mosaic_segments"), ("xla", "cudnn")):
            f = _with_ids(functools.partial(ejk.flash_attention, causal=True, platform=platform,
                                            cfg=_choice(platform, impl)))
            _row(f"segment ids [1,32768,16,128] {len(lens)} packed causal {platform}/{impl}", f,
                 (*(x[None] for x in packed), seg), work)


if __name__ == "__main__":
    quick() if "--quick" in sys.argv else main(packed_only="--packed" in sys.argv)
