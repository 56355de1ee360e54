"""The Mosaic GPU attention backward on the GPU host (issue 30): the fused backward against a float32
reference (and run twice: its dQ adds land in no fixed order); forward and forward+backward timings of
jax's cuDNN and of ejk's Mosaic pair as ``ImplChoice(platform="pallas", backend="gpu",
implementation="mosaic")`` without a config; the backward alone, fused and two kernels (which one
``deterministic=None`` takes per head dim is decided from these lines).
``--torch``: torch SDPA's cuDNN backend, in its own process. One JSON line per measurement.

    python3 benchmarks/bench_mosaic_backward.py --check --time
    python3 benchmarks/bench_mosaic_backward.py --torch
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from typing import Any

SHAPES = [  # (label, B, S, Hq, Hkv, D, causal)
    ("[4,4096,16,128] full", 4, 4096, 16, 16, 128, False),
    ("[4,4096,16,128] causal", 4, 4096, 16, 16, 128, True),
    ("[2,8192,16,128] full", 2, 8192, 16, 16, 128, False),
    ("[2,8192,16,128] causal", 2, 8192, 16, 16, 128, True),
    ("[4,4096,32,64] causal", 4, 4096, 32, 32, 64, True),
    ("[4,4096,32/8,128] GQA causal", 4, 4096, 32, 8, 128, True),
    ("[1,16384,16,128] causal", 1, 16384, 16, 16, 128, True),
    ("[4,4096,32,64] full", 4, 4096, 32, 32, 64, False),
]


def flops(b: int, s: int, h: int, d: int, causal: bool) -> float:
    return 4.0 * b * h * s * s * d / (2 if causal else 1)


def emit(row: dict[str, Any]) -> None:
    print(json.dumps(row), flush=True)


def _torch_time(fn: Any) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 5)
    return float(statistics.median(times))


def _torch_shape(label: str, b: int, s: int, hq: int, hkv: int, d: int, causal: bool) -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def make(h: int, grad: bool = True) -> Any:
        return torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=grad)

    q, k, v, do = make(hq), make(hkv), make(hkv), make(hq, False)
    f = flops(b, s, hq, d, causal)

    def fwd() -> Any:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv)

    def step() -> None:
        q.grad = k.grad = v.grad = None
        fwd().backward(do)

    with torch.no_grad():
        ms = _torch_time(fwd)
    emit({"shape": label, "mode": "fwd", "impl": "torch sdpa cudnn", "ms": round(ms, 4),
          "tflops": round(f / ms / 1e9, 1)})
    ms = _torch_time(step)
    emit({"shape": label, "mode": "fwd+bwd", "impl": "torch sdpa cudnn", "ms": round(ms, 4),
          "tflops": round(f * 3.5 / ms / 1e9, 1)})


def run_torch(quick: bool) -> None:
    import torch

    for shape in SHAPES[:2] if quick else SHAPES:
        _torch_shape(*shape)
        torch.cuda.empty_cache()


def _reference(q: Any, k: Any, v: Any, causal: bool, window: Any, cap: Any) -> Any:
    import jax.numpy as jnp

    sq, sk, hq, hkv, d = q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3]
    kr, vr = jnp.repeat(k, hq // hkv, 2), jnp.repeat(v, hq // hkv, 2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, kr, precision="highest") * d ** -0.5
    if cap is not None:
        s = cap * jnp.tanh(s / cap)
    i, j = jnp.arange(sq)[:, None] + (sk - sq), jnp.arange(sk)[None]
    vis = jnp.ones((sq, sk), bool)
    if causal:
        vis &= j <= i
    if window is not None:
        vis &= (j >= i - window[0]) & (j <= i + window[1])
    s = jnp.where(vis, s, -jnp.inf)
    m = jnp.max(s, -1, keepdims=True)
    p = jnp.where(vis, jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0)), 0)
    p = p / jnp.maximum(p.sum(-1, keepdims=True), 1e-30)
    return jnp.einsum("bhqk,bkhd->bqhd", p, vr, precision="highest")


def run_checks() -> bool:


    cases = [  # (B, Sq, Sk, Hq, Hkv, D, causal, window, cap)
        (1, 777, 1025, 4, 2, 64, False, (100, 50), 20.0),
        (2, 700, 900, 4, 1, 64, True, None, None),
        (1, 640, 1000, 4, 2, 128, True, None, None),
        (1, 512, 512, 2, 2, 128, False, None, 30.0),
    ]
    return all([_check(n, *case) for n, case in enumerate(cases)])


def _check(n: int, b: int, sq: int, sk: int, hq: int, hkv: int, d: int, causal: bool, window: Any,
           cap: Any) -> bool:
    """The fused backward against the float32 reference; run twice (dQ's adds land in no fixed order)."""
    import jax
    import jax.numpy as jnp

    from ejk_pallas import _flash_attention_mgpu as mg
    from ejk_pallas import _flash_attention_mgpu_bwd as bwd

    keys = jax.random.split(jax.random.key(n), 4)
    q = jax.random.normal(keys[0], (b, sq, hq, d), jnp.bfloat16)
    k = jax.random.normal(keys[1], (b, sk, hkv, d), jnp.bfloat16)
    v = jax.random.normal(keys[2], (b, sk, hkv, d), jnp.bfloat16)
    do = jax.random.normal(keys[3], (b, sq, hq, d), jnp.bfloat16)
    static: dict[str, Any] = dict(causal=causal, softmax_scale=d ** -0.5, sliding_window=window,
                                  logits_soft_cap=cap)
    cfg = mg.heuristic_config(q, k, v, causal=causal, sliding_window=window)
    fwd = functools.partial(mg.forward_with_residuals, cfg=cfg, q_segment_ids=None, kv_segment_ids=None, bias=None,
                            **static)
    _, res = jax.jit(fwd)(q, k, v)

    def f32(x: Any) -> Any:
        return x.astype(jnp.float32)

    ref = functools.partial(_reference, causal=causal, window=window, cap=cap)
    _, vjp = jax.vjp(ref, f32(q), f32(k), f32(v))
    want = vjp(f32(do))

    def backward(res: Any, do: Any) -> Any:
        return bwd.backward_impl(res[0], res[1], res[2], res[6], res[7], do, block_q=cfg.bwd_block_q,
                                 block_kv=cfg.bwd_block_kv, steps=2, interpret_params=None, fused=True, **static)

    fn = jax.jit(backward)
    got, again = fn(res, do), fn(res, do)
    row: dict[str, Any] = {"check": f"B{b} Sq{sq} Sk{sk} H{hq}/{hkv} D{d} causal={causal} window={window} cap={cap}"}
    ok = True
    for name, g, w in zip("qkv", got, want, strict=True):
        err = float(jnp.linalg.norm(f32(g) - w) / jnp.maximum(jnp.linalg.norm(w), 1e-30))
        row[f"fused d{name}"] = round(err, 5)
        ok &= bool(jnp.isfinite(f32(g)).all()) and err < 2e-2
    row["fused rerun max diff dq"] = float(jnp.max(jnp.abs(f32(again[0]) - f32(got[0]))))
    emit(row)
    return ok


def _time_shape(label: str, b: int, s: int, hq: int, hkv: int, d: int, causal: bool) -> None:
    import _harness
    import jax
    import jax.numpy as jnp

    import ejk
    from ejk_pallas import _flash_attention_mgpu as mg
    from ejk_pallas import _flash_attention_mgpu_bwd as bwd

    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (b, s, hq, d), jnp.bfloat16)
    k = jax.random.normal(keys[1], (b, s, hkv, d), jnp.bfloat16)
    v = jax.random.normal(keys[2], (b, s, hkv, d), jnp.bfloat16)
    do = jax.random.normal(keys[3], (b, s, hq, d), jnp.bfloat16)
    f = flops(b, s, hq, d, causal)
    mosaic = ejk.ImplChoice(platform="pallas", backend="gpu", implementation="mosaic")
    impls: dict[str, Any] = {
        "jax cudnn": functools.partial(jax.nn.dot_product_attention, is_causal=causal, implementation="cudnn"),
        "ejk mosaic (ImplChoice, no cfg)": functools.partial(ejk.flash_attention, causal=causal, cfg=mosaic),
    }
    for name, fn in impls.items():

        def step(q: Any, k: Any, v: Any, do: Any, fn: Any = fn) -> Any:
            return jax.vjp(fn, q, k, v)[1](do)

        try:
            for mode, g, args, mult in (("fwd", jax.jit(fn), (q, k, v), 1.0),
                                        ("fwd+bwd", jax.jit(step), (q, k, v, do), 3.5)):
                ms = _harness.time_ms(g, args, reps=7)
                emit({"shape": label, "mode": mode, "impl": name, "ms": round(ms, 4),
                      "tflops": round(f * mult / ms / 1e9, 1)})
        except Exception as exc:
            emit({"shape": label, "impl": name, "error": f"{type(exc).__name__}: {str(exc)[:800]}"})
    # the backward alone (residuals precomputed), fused and the two kernels
    static: dict[str, Any] = dict(causal=causal, softmax_scale=d ** -0.5, sliding_window=None,
                                  logits_soft_cap=None)
    heur = mg.heuristic_config(q, k, v, causal=causal)
    fwd = functools.partial(mg.forward_with_residuals, cfg=heur, q_segment_ids=None, kv_segment_ids=None, bias=None,
                            **static)
    _, res = jax.jit(fwd)(q, k, v)
    for fused in (True, False):

        def backward(res: Any, do: Any, fused: bool = fused) -> Any:
            return bwd.backward_impl(res[0], res[1], res[2], res[6], res[7], do, block_q=heur.bwd_block_q,
                                     block_kv=heur.bwd_block_kv, steps=2, interpret_params=None, fused=fused,
                                     **static)

        ms = _harness.time_ms(backward, (res, do), reps=7)
        emit({"shape": label, "mode": "bwd", "impl": f"mosaic {'fused' if fused else 'two-kernel'}",
              "ms": round(ms, 4), "tflops": round(f * 2.5 / ms / 1e9, 1)})


def run_times(quick: bool) -> None:
    for shape in SHAPES[:2] if quick else SHAPES:
        _time_shape(*shape)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.torch:
        run_torch(a.quick)
        return
    if a.check:
        print("checks ok" if run_checks() else "CHECKS FAILED", flush=True)
    if a.time:
        run_times(a.quick)


if __name__ == "__main__":
    main()
