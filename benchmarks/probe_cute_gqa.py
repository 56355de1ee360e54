"""GQA in the CuTe attention: query heads packed into a tile's rows against one head per tile, and cuDNN.

Usage (GPU host, nvidia-cutlass-dsl importable): ``python benchmarks/probe_cute_gqa.py``. Forward,
bfloat16, heuristic configs, timed on the GPU's timeline (``_harness.span_ms``). Each shape is
``(B, Sq, Hq, Sk, Hkv, D)``; ``unpacked`` forces ``ejk_cute._flash_attention.pack_of`` to 1 (each tile
one query head, the kernel before packing). Each line checks the packed output against the unpacked one.
cuDNN is timed where its mask is ejk's (``jax.nn``'s ``is_causal`` is top-left aligned, ejk's causal mask
bottom-right aligned, so they differ when Sq != Sk).
"""

from __future__ import annotations

import functools
from typing import Any

import _harness
import jax
import jax.numpy as jnp

from ejk_cute import _flash_attention as fa

SHAPES = (
    (4, 4096, 32, 4096, 8, 128, False),
    (4, 4096, 32, 4096, 8, 128, True),
    (4, 512, 32, 8192, 8, 128, True),  # a prefill chunk against a long cache
    (16, 16, 32, 4096, 4, 128, True),  # speculative decoding: 16 tokens, GQA 8
    (32, 1, 32, 4096, 8, 128, False),  # decode (one query token sees every key)
)


def main() -> None:
    packed_of = fa.pack_of
    for b, sq, hq, sk, hkv, d, causal in SHAPES:
        keys = jax.random.split(jax.random.key(0), 3)
        q = jax.random.normal(keys[0], (b, sq, hq, d), jnp.bfloat16)
        k = jax.random.normal(keys[1], (b, sk, hkv, d), jnp.bfloat16)
        v = jax.random.normal(keys[2], (b, sk, hkv, d), jnp.bfloat16)
        flops = 4.0 * b * hq * sq * sk * d * (0.5 if causal and sq == sk else 1.0)
        label = f"[{b},{sq},{hq},{sk},{hkv},{d}]{' causal' if causal else ''}"

        def cudnn(q: jax.Array, k: jax.Array, v: jax.Array, c: bool = causal) -> jax.Array:
            return jax.nn.dot_product_attention(q, k, v, is_causal=c, implementation="cudnn")

        ours = functools.partial(fa.forward, causal=causal, softmax_scale=d ** -0.5, sliding_window=None,
                                 logits_soft_cap=None, q_segment_ids=None, kv_segment_ids=None, bias=None)
        times, outs = {}, {}
        if causal and sq != sk:  # jax.nn's is_causal is top-left aligned, ejk's bottom-right: another mask
            print(f"{label}: no cuDNN line (its causal mask differs when Sq != Sk)", flush=True)
        else:
            try:
                times["cudnn"] = _harness.span_ms(cudnn, (q, k, v), 10)
            except Exception as exc:
                print(f"{label} cudnn failed: {_harness.error_text(exc)}", flush=True)
        for name, pack in (("packed", packed_of), ("unpacked", lambda *_: 1)):
            fa.pack_of = pack

            def fn(q: jax.Array, k: jax.Array, v: jax.Array, run: Any = ours) -> jax.Array:  # a fresh trace
                return run(q, k, v)

            times[name] = _harness.span_ms(fn, (q, k, v), 10)
            outs[name] = jax.jit(fn)(q, k, v)
        fa.pack_of = packed_of
        diff = float(jnp.max(jnp.abs(outs["packed"].astype(jnp.float32) - outs["unpacked"].astype(jnp.float32))))
        base = times.get("cudnn")
        text = "; ".join(f"{n} {t * 1e3:.1f} us {flops / t / 1e9:.0f} TFLOP/s"
                         + (f" {base / t:.2f}x cudnn" if base else "") for n, t in times.items())
        print(f"{label} (pack {packed_of(hq, hkv)}): {text}; packed vs unpacked max diff {diff:.3g}", flush=True)


if __name__ == "__main__":
    main()
