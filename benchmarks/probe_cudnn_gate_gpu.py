"""Check ejk-xla's cuDNN capability gate against what cuDNN really does, on this GPU.

For a grid of flash-attention calls it records the gate's decision and what
``jax.nn.dot_product_attention(implementation="cudnn")`` (through ejk's argument mapping) does:
runs and matches the float32 reference (forward and gradients), fails, or gives other values.
A call the gate accepts must run and match; a call it refuses may run (the gate is then only
conservative). The markdown table goes to ``$OUT/cudnn_gate.md`` (or ``--out``).
"""

from __future__ import annotations

import itertools
from typing import Any

import _harness
import jax
import jax.numpy as jnp
from _harness import error_text

from ejk.testing import TOLERANCES, reference_flash_attention
from ejk_xla._cudnn_attention import capability, cudnn_attention

# (B, Sq, Hq, Sk, Hkv, D, Dv)
SHAPES = [
    (2, 256, 8, 256, 2, 128, 128), (2, 255, 4, 255, 4, 64, 64), (1, 1, 4, 4096, 4, 128, 128),
    (1, 2, 4, 4096, 4, 128, 128), (1, 7, 4, 512, 4, 128, 128), (1, 64, 4, 512, 4, 128, 128),
    (1, 512, 4, 64, 4, 128, 128), (1, 128, 4, 128, 4, 256, 256), (1, 128, 4, 128, 4, 96, 96),
    (1, 128, 4, 128, 4, 120, 120), (1, 128, 4, 128, 4, 128, 64),
]
OPTIONS: list[dict[str, Any]] = [
    {}, {"causal": True}, {"sliding_window": (16, 0)}, {"sliding_window": (16, 16)},
    {"causal": True, "sliding_window": (16, 0)}, {"bias": "1h"}, {"bias": "b1"}, {"bias": "11q"},
    {"logits_soft_cap": 20.0},
]


def _bias_shape(kind: str, b: int, hq: int, sq: int, sk: int) -> tuple[int, ...]:
    return {"1h": (1, hq, sq, sk), "b1": (b, 1, sq, sk), "11q": (1, 1, 1, sk)}[kind]


def probe(shape: tuple[int, ...], options: dict[str, Any], dtype: Any) -> tuple[str, str]:
    b, sq, hq, sk, hkv, d, dv = shape
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (b, sq, hq, d), dtype)
    k = jax.random.normal(keys[1], (b, sk, hkv, d), dtype)
    v = jax.random.normal(keys[2], (b, sk, hkv, dv), dtype)
    options = dict(options)
    bias = None
    if "bias" in options:
        bias = jax.random.normal(keys[3], _bias_shape(options.pop("bias"), b, hq, sq, sk), dtype)
    causal = bool(options.get("causal", False))
    window = options.get("sliding_window")
    if window is not None and causal:
        window = (window[0], 0)
    static = {"causal": causal, "softmax_scale": d ** -0.5, "sliding_window": window,
              "logits_soft_cap": options.get("logits_soft_cap"), "q_segment_ids": None, "kv_segment_ids": None}
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (q, k, v, bias))
    gate = capability(*abstract[:3], bias=abstract[3], **static) or "accepts"

    def ours(q: Any, k: Any, v: Any, bias: Any) -> Any:
        return cudnn_attention(q, k, v, bias=bias, **static)

    def ref(q: Any, k: Any, v: Any, bias: Any) -> Any:
        return reference_flash_attention(q, k, v, bias=bias, causal=causal, sliding_window=window,
                                         logits_soft_cap=static["logits_soft_cap"])

    try:
        out, vjp = jax.vjp(ours, q, k, v, bias)
        grads = vjp(jnp.ones_like(out))
        jax.block_until_ready(grads)
    except Exception as exc:
        return gate, f"fails: {error_text(exc)}"
    want, ref_vjp = jax.vjp(ref, q, k, v, bias)
    want_grads = ref_vjp(jnp.ones_like(want))
    atol, _ = TOLERANCES[jnp.dtype(dtype).name]
    worst = 0.0
    for got, expected in zip((out, *grads), (want, *want_grads), strict=True):
        if expected is None:
            continue
        scale = max(float(jnp.max(jnp.abs(expected.astype(jnp.float32)))), 1.0)
        worst = max(worst, float(jnp.max(jnp.abs(got.astype(jnp.float32) - expected.astype(jnp.float32)))) / scale)
    return gate, ("matches" if worst <= 2 * atol else "DIFFERS") + f" (max rel err {worst:.2g})"


def main() -> None:
    parser = _harness.parser(__doc__)
    args = _harness.parse(parser)
    lines = [
        "# cuDNN attention: ejk-xla's capability gate against what cuDNN does",
        "",
        *_harness.header("", args)[2:4],
        "- gate: `ejk_xla._cudnn_attention.capability`; result: forward + gradients through ejk's argument "
        "mapping against the float32 reference",
        "- a row where the gate accepts but the result is not `matches` is a gate bug",
        "",
        "| shape (B,Sq,Hq,Sk,Hkv,D,Dv) | options | dtype | gate | cuDNN |",
        "| --- | --- | --- | --- | --- |",
    ]
    bugs = 0
    for shape, options, dtype in itertools.product(SHAPES, OPTIONS, (jnp.bfloat16,)):
        gate, result = probe(shape, options, dtype)
        bug = gate == "accepts" and not result.startswith("matches")
        bugs += bug
        row = f"| {shape} | {options} | {jnp.dtype(dtype).name} | {gate} | {result}{' **GATE BUG**' if bug else ''} |"
        print(row, flush=True)
        lines.append(row)
    for dtype in (jnp.float16, jnp.float32):
        gate, result = probe(SHAPES[0], {"causal": True}, dtype)
        lines.append(f"| {SHAPES[0]} | causal | {jnp.dtype(dtype).name} | {gate} | {result} |")
        print(lines[-1], flush=True)
    lines += ["", f"gate bugs: {bugs}"]
    print(f"gate bugs: {bugs}")
    _harness.write(lines, args, "cudnn_gate.md")


if __name__ == "__main__":
    main()
