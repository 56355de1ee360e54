"""The Mosaic GPU attention backward on the GPU host: numerics of the fused and two-kernel backwards against a
float32 reference, then forward+backward timings of ejk's Mosaic pair (fused and deterministic backward), ejk's
``platform="auto"`` and jax's cuDNN, at the shapes of issue 30. torch SDPA runs in its own process
(``--torch``). Prints one JSON line per measurement and a table last.

    python3 benchmarks/bench_mosaic_backward.py [--check] [--time] [--torch] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
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


def _bench(fn: Any, *args: Any, reps: int = 7, calls: int = 5) -> float:
    """Median ms per call of back-to-back calls (jitted ``fn``), after a warm-up."""
    import jax

    jax.block_until_ready(fn(*args))
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / calls * 1e3)
    return statistics.median(times)


def run_torch(quick: bool) -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for label, b, s, hq, hkv, d, causal in SHAPES[:2] if quick else SHAPES:
        q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        do = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16)
        f = flops(b, s, hq, d, causal)
        for name, backend in (("torch sdpa cudnn", SDPBackend.CUDNN_ATTENTION),):
            def fwd() -> Any:
                with sdpa_kernel(backend):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                           enable_gqa=hq != hkv)

            def step() -> None:
                q.grad = k.grad = v.grad = None
                fwd().backward(do)

            for mode, fn, mult in (("fwd", fwd, 1.0), ("fwd+bwd", step, 3.5)):
                with torch.no_grad() if mode == "fwd" else torch.enable_grad():
                    fn()
                    torch.cuda.synchronize()
                    times = []
                    for _ in range(7):
                        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        st.record()
                        for _ in range(5):
                            fn()
                        en.record()
                        torch.cuda.synchronize()
                        times.append(st.elapsed_time(en) / 5)
                ms = statistics.median(times)
                emit({"shape": label, "mode": mode, "impl": name, "ms": round(ms, 4),
                      "tflops": round(f * mult / ms / 1e9, 1)})
        del q, k, v, do
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
    import jax
    import jax.numpy as jnp

    from ejk_pallas import _flash_attention_mgpu as mg
    from ejk_pallas import _flash_attention_mgpu_bwd as bwd

    cases = [  # (B, Sq, Sk, Hq, Hkv, D, causal, window, cap)
        (1, 777, 1025, 4, 2, 64, False, (100, 50), 20.0),
        (2, 700, 900, 4, 1, 64, True, None, None),
    ]
    ok = True
    for n, (b, sq, sk, hq, hkv, d, causal, window, cap) in enumerate(cases):
        keys = jax.random.split(jax.random.key(n), 4)
        q = jax.random.normal(keys[0], (b, sq, hq, d), jnp.bfloat16)
        k = jax.random.normal(keys[1], (b, sk, hkv, d), jnp.bfloat16)
        v = jax.random.normal(keys[2], (b, sk, hkv, d), jnp.bfloat16)
        do = jax.random.normal(keys[3], (b, sq, hq, d), jnp.bfloat16)
        static = dict(causal=causal, softmax_scale=d ** -0.5, sliding_window=window, logits_soft_cap=cap)
        cfg = mg.heuristic_config(q, k, v, causal=causal, sliding_window=window)
        _, res = jax.jit(lambda q, k, v: mg.forward_with_residuals(q, k, v, cfg=cfg, q_segment_ids=None,
                                                                  kv_segment_ids=None, bias=None, **static))(q, k, v)
        f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
        _, vjp = jax.vjp(lambda q, k, v: _reference(q, k, v, causal, window, cap), f32(q), f32(k), f32(v))
        want = vjp(f32(do))
        row: dict[str, Any] = {"check": f"B{b} Sq{sq} Sk{sk} H{hq}/{hkv} D{d} causal={causal} window={window} cap={cap}"}
        for fused in (True,):
            fn = jax.jit(lambda res, do, fused=fused: bwd.backward_impl(
                *res[:3], res[6], res[7], do, block_q=cfg.bwd_block_q, block_kv=cfg.bwd_block_kv, steps=2,
                interpret_params=None, fused=fused, **static))
            got = fn(res, do)
            again = fn(res, do) if fused else got
            for name, g, w in zip("qkv", got, want, strict=True):
                err = float(jnp.linalg.norm(f32(g) - w) / jnp.maximum(jnp.linalg.norm(w), 1e-30))
                finite = bool(jnp.isfinite(f32(g)).all())
                row[f"{'fused' if fused else 'two'} d{name}"] = round(err, 5)
                ok &= finite and err < 2e-2
            if fused:
                row["fused rerun max diff dq"] = float(jnp.max(jnp.abs(f32(again[0]) - f32(got[0]))))
        emit(row)
    return ok


def run_times(quick: bool) -> None:
    import jax
    import jax.numpy as jnp

    import ejk
    from ejk_pallas import _flash_attention_mgpu as mg
    from ejk_pallas import _flash_attention_mgpu_bwd as bwd

    for label, b, s, hq, hkv, d, causal in SHAPES[:2] if quick else SHAPES:
        keys = jax.random.split(jax.random.key(0), 4)
        q = jax.random.normal(keys[0], (b, s, hq, d), jnp.bfloat16)
        k = jax.random.normal(keys[1], (b, s, hkv, d), jnp.bfloat16)
        v = jax.random.normal(keys[2], (b, s, hkv, d), jnp.bfloat16)
        do = jax.random.normal(keys[3], (b, s, hq, d), jnp.bfloat16)
        f = flops(b, s, hq, d, causal)
        heur = mg.heuristic_config(q, k, v, causal=causal)
        impls: dict[str, Any] = {
            "jax cudnn": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                                     implementation="cudnn"),
        }
        impls["ejk mosaic (ImplChoice, no cfg)"] = lambda q, k, v: ejk.flash_attention(
            q, k, v, causal=causal, cfg=ejk.ImplChoice(platform="pallas", backend="gpu", implementation="mosaic"))
        for name, fn in impls.items():
            try:
                fwd = jax.jit(fn)
                step = jax.jit(lambda q, k, v, fn=fn: jax.vjp(fn, q, k, v)[1](do))
                for mode, g, mult in (("fwd", fwd, 1.0), ("fwd+bwd", step, 3.5)):
                    ms = _bench(g, q, k, v)
                    emit({"shape": label, "mode": mode, "impl": name, "ms": round(ms, 4),
                          "tflops": round(f * mult / ms / 1e9, 1)})
            except Exception as exc:
                emit({"shape": label, "impl": name, "error": f"{type(exc).__name__}: {str(exc)[:800]}"})
        # the backward alone (residuals precomputed)
        _, res = jax.jit(lambda q, k, v: mg.forward_with_residuals(
            q, k, v, cfg=heur, causal=causal, softmax_scale=d ** -0.5, sliding_window=None, logits_soft_cap=None,
            q_segment_ids=None, kv_segment_ids=None, bias=None))(q, k, v)
        for fused in (True, False) if d == 64 else ():
            try:
                g = jax.jit(lambda res, do, fused=fused: bwd.backward_impl(
                    *res[:3], res[6], res[7], do, block_q=heur.bwd_block_q, block_kv=heur.bwd_block_kv, steps=2,
                    causal=causal, softmax_scale=d ** -0.5, sliding_window=None, logits_soft_cap=None,
                    interpret_params=None, fused=fused))
                ms = _bench(g, res, do)
                emit({"shape": label, "mode": "bwd", "impl": f"mosaic {'fused' if fused else 'two-kernel'}",
                      "ms": round(ms, 4), "tflops": round(f * 2.5 / ms / 1e9, 1)})
            except Exception as exc:
                emit({"shape": label, "impl": f"bwd fused={fused}", "error": f"{type(exc).__name__}: {str(exc)[:800]}"})


def _fields(cfg: Any) -> dict[str, Any]:
    import attrs

    return attrs.asdict(cfg)


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
    sys.exit(main())
