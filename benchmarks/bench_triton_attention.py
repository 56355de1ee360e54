"""Attention throughput on one GPU: ejk's Triton flash attention against cuDNN through ``jax.nn``.

Lines (same process, same inputs, bf16 by default):

- ``ejk triton``: ``ejk.flash_attention(platform="triton")`` with each config of its
  ``config_space`` (or only the heuristic's, ``--configs heuristic``); the best is reported
  and named, the heuristic's time is in the note,
- ``jax.nn cudnn``: ``jax.nn.dot_product_attention(implementation="cudnn")``,

each in ``fwd`` (the output) and ``fwd+bwd`` (output plus dq, dk, dv in one jitted call), with
the ratio ejk / cuDNN. FLOPs: ``4·B·H·S²·D`` for the forward (halved when causal), ``3.5x``
that for fwd+bwd. Timing: compile, two warm-up calls, then the median of ``--reps`` calls.
At Sq = Sk the causal masks of both agree (bottom-right = top-left alignment).

Usage (on the GPU host, with jax-triton importable; see ../shared/gpu/README.md):
    python benchmarks/bench_triton_attention.py                     # three shapes, whole config space
    python benchmarks/bench_triton_attention.py --configs heuristic # one config per shape (faster)
    python benchmarks/bench_triton_attention.py --d64               # also head_dim 64
    EJK_TRITON_INTERPRET=1 python benchmarks/bench_triton_attention.py --smoke   # CPU, interpreter

Output: ``$OUT/triton_attention.md`` when ``OUT`` is set, else ``benchmarks/results/triton_attention.md``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import _harness
import attrs
import jax
import jax.numpy as jnp
from _harness import error_text
from bench_attention_gpu import (  # the shapes, inputs and timing shared with the XLA/cuDNN benchmark
    BWD_FACTOR,
    D64_SHAPES,
    FULL_SHAPES,
    MODES,
    PLUGIN_SMOKE_SHAPES,
    Shape,
    best_of,
    jax_nn_attention,
    make_inputs,
    tflops,
)

import ejk
from ejk_triton._flash_attention import FlashAttentionConfig, config_space, heuristic_config

SMOKE_SHAPES = PLUGIN_SMOKE_SHAPES


def triton_attention(shape: Shape, cfg: FlashAttentionConfig) -> Callable[..., jax.Array]:
    def fn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return ejk.flash_attention(q, k, v, causal=shape.causal, softmax_scale=1 / math.sqrt(shape.dim),
                                   platform="triton", cfg=cfg)

    return fn


def cudnn_attention(shape: Shape) -> Callable[..., jax.Array]:
    return jax_nn_attention(shape, "cudnn")


def cfg_label(cfg: FlashAttentionConfig) -> str:
    return (f"fwd {cfg.block_m}x{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}, "
            f"bwd {cfg.bwd_block_m}x{cfg.bwd_block_n} w{cfg.bwd_num_warps} s{cfg.bwd_num_stages}")


def with_bwd_tiles(cfg: FlashAttentionConfig, spec: str) -> FlashAttentionConfig:
    """``cfg`` with the backward tiles of ``spec`` (``MxNwWsS``, e.g. ``32x128w8s3``)."""
    match = re.fullmatch(r"(\d+)x(\d+)w(\d+)s(\d+)", spec.strip())
    if not match:
        raise SystemExit(f"--bwd-tiles: {spec!r} is not MxNwWsS (e.g. 32x128w8s3)")
    m, n, w, st = (int(g) for g in match.groups())
    return attrs.evolve(cfg, bwd_block_m=m, bwd_block_n=n, bwd_num_warps=w, bwd_num_stages=st)


def output_check(shape: Shape, cfg: FlashAttentionConfig, inputs: tuple[jax.Array, ...], on_gpu: bool) -> str:
    try:
        got = jax.jit(triton_attention(shape, cfg))(*inputs[:3]).astype(jnp.float32)
        impl = "cudnn" if on_gpu else "xla"
        want = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=shape.causal,
                                                                    implementation=impl))(*inputs[:3])
        return f"max abs diff of ejk triton vs jax.nn {impl}: {float(jnp.max(jnp.abs(got - want))):.3g}"
    except Exception as exc:
        return f"output check failed: {error_text(exc)}"


def main() -> None:
    parser = _harness.parser(__doc__)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--configs", choices=("all", "heuristic"), default="all",
                        help="the whole config space (best reported) or only the heuristic's config")
    parser.add_argument("--d64", action="store_true", help="also head_dim 64 ([4,4096,32,64] full and causal)")
    parser.add_argument("--mode", choices=(*MODES, "both"), default="both", help="forward, forward+backward or both")
    parser.add_argument("--bwd-tiles", default=None,
                        help="instead of the config space: the heuristic's forward with each of these backward "
                             "tiles, e.g. 32x128w8s3,64x128w8s1 (bwd_block_m x bwd_block_n, warps, stages)")
    _harness.add_timer_option(parser)
    args = _harness.parse(parser)
    clock = _harness.timer(args)
    on_gpu = jax.default_backend() == "gpu"
    shapes = SMOKE_SHAPES if args.smoke else FULL_SHAPES + (D64_SHAPES if args.d64 else ())
    lines = _harness.header(
        "Attention throughput: ejk Triton flash attention vs cuDNN (jax.nn.dot_product_attention)", args,
        f"dtype {args.dtype}; FLOPs 4·B·H·S²·D (halved when causal), fwd+bwd = {BWD_FACTOR}x fwd; "
        f"ejk configs: {args.configs}; ratio = ejk TFLOP/s / cuDNN TFLOP/s",
        f"triton {_harness.version('triton')}, jax-triton {_harness.version('jax-triton')}, "
        f"ejk-triton {_harness.version('ejk-triton')}",
        case="shape [B,S,H,D]", rate="TFLOP/s",
    )
    lines[-2] = "| shape [B,S,H,D] | mode | implementation | ms | TFLOP/s | ratio vs cuDNN | note |"
    lines[-1] = "| --- | --- | --- | ---: | ---: | ---: | --- |"
    checks: list[str] = []
    print("\n".join(lines), flush=True)
    for shape in shapes:
        inputs = make_inputs(shape, jnp.dtype(args.dtype))
        heuristic = heuristic_config(*inputs[:3])
        space = [heuristic] if args.configs == "heuristic" else config_space(*inputs[:3])
        if args.bwd_tiles:
            space = [with_bwd_tiles(heuristic, spec) for spec in args.bwd_tiles.split(",")]
        if heuristic not in space:
            space.insert(0, heuristic)
        ours = {cfg_label(cfg): triton_attention(shape, cfg) for cfg in space}
        checks.append(f"- {shape}: {output_check(shape, heuristic, inputs, on_gpu)}")
        for mode in MODES if args.mode == "both" else (args.mode,):
            flops = shape.fwd_flops() * (1.0 if mode == "fwd" else BWD_FACTOR)
            rows = []
            base_ms = None
            if on_gpu:
                (cudnn_times, cudnn_errors) = best_of({"cudnn": cudnn_attention(shape)}, mode, inputs, args.reps, clock)
                if cudnn_times:
                    base_ms = cudnn_times["cudnn"]
                    rows.append(f"| {shape} | {mode} | jax.nn cudnn | {base_ms:,.2f} | {tflops(flops, base_ms)} "
                                f"| 1.00 | |")
                else:
                    rows.append(f"| {shape} | {mode} | jax.nn cudnn | failed | | | {'; '.join(cudnn_errors)} |")
            else:
                rows.append(f"| {shape} | {mode} | jax.nn cudnn | skipped | | | needs a GPU |")
            times, errors = best_of(ours, mode, inputs, args.reps, clock)
            if times:
                label, ms = min(times.items(), key=lambda kv: kv[1])
                ratio = f"{base_ms / ms:.2f}" if base_ms else ""
                note = f"best: {label}"
                heur = times.get(cfg_label(heuristic))
                if heur is not None and len(times) > 1:
                    note += f"; heuristic {heur:,.2f} ms ({tflops(flops, heur)} TFLOP/s)"
                if errors:
                    note += f"; failed: {'; '.join(errors)}"
                rows.append(f"| {shape} | {mode} | ejk triton | {ms:,.2f} | {tflops(flops, ms)} | {ratio} | {note} |")
            else:
                rows.append(f"| {shape} | {mode} | ejk triton | failed | | | {'; '.join(errors)} |")
            for row in rows:
                print(row, flush=True)
            lines += rows
        del inputs
    lines += ["", f"Forward outputs ({args.dtype} inputs), ejk's heuristic config:", *checks]
    print("\n".join(lines[-len(checks) - 2 :]), flush=True)
    _harness.write(lines, args, "triton_attention.md")


if __name__ == "__main__":
    main()
