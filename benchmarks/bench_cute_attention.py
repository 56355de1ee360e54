"""Attention throughput on one Hopper GPU: ejk-cute's FlashAttention-3-style forward against cuDNN.

Lines (same process, same inputs, bf16 by default):

- ``ejk cute``: ``ejk.flash_attention(platform="cute")`` with each config of its ``config_space``
  (``--configs heuristic``: only the heuristic's; ``--wide``: also FlashAttention-3's wider key
  tiles, 176 at D = 128 and 192 at D = 64, which spill registers in this kernel; with ``all`` or
  ``--wide`` also the heuristic's tiles without the warpgroup ping-pong); the best is reported
  and named, the heuristic's time is in the note,
- ``jax.nn cudnn``: ``jax.nn.dot_product_attention(implementation="cudnn")``,

in ``fwd`` (the output; the target is >= 1.15x cuDNN) and, with ``--mode fwd+bwd`` or ``both``,
``fwd+bwd`` (output plus dq, dk, dv: the cute forward paired with the installed backward that
consumes its residuals, ejk-triton's). FLOPs: ``4·B·H·S²·D`` for the forward (halved when
causal), 3.5x that for fwd+bwd. At Sq = Sk the causal masks of both agree.

Usage (on the H100 host with nvidia-cutlass-dsl; see ../shared/gpu/README.md):
    python benchmarks/bench_cute_attention.py                       # 6 shapes (D 128 and 64), forward
    python benchmarks/bench_cute_attention.py --configs heuristic   # one config per shape (faster)
    python benchmarks/bench_cute_attention.py --wide --mode both

Output: ``$OUT/cute_attention.md`` when ``OUT`` is set, else ``benchmarks/results/cute_attention.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import _harness
import attrs
import jax
import jax.numpy as jnp
from _harness import error_text
from bench_attention_gpu import BWD_FACTOR, MODES, Shape, best_of, jax_nn_attention, make_inputs, tflops

import ejk
from ejk_cute._flash_attention import FlashAttentionConfig, config_space, heuristic_config

SHAPES = (
    Shape(batch=4, seq=4096, heads=16, dim=128, causal=False),
    Shape(batch=4, seq=4096, heads=16, dim=128, causal=True),
    Shape(batch=2, seq=8192, heads=16, dim=128, causal=False),
    Shape(batch=2, seq=8192, heads=16, dim=128, causal=True),
    Shape(batch=4, seq=4096, heads=32, dim=64, causal=False),
    Shape(batch=4, seq=4096, heads=32, dim=64, causal=True),
)
SMOKE_SHAPES = (Shape(batch=1, seq=256, heads=2, dim=128, causal=True),)
WIDE = {128: FlashAttentionConfig(block_kv=176, stages=2), 64: FlashAttentionConfig(block_kv=192, stages=2)}


def cute_attention(shape: Shape, cfg: FlashAttentionConfig) -> Callable[..., jax.Array]:
    def fn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return ejk.flash_attention(q, k, v, causal=shape.causal, softmax_scale=1 / math.sqrt(shape.dim),
                                   platform="cute", cfg=cfg)

    return fn


def cfg_label(cfg: FlashAttentionConfig) -> str:
    return (f"{cfg.block_q}x{cfg.block_kv} s{cfg.stages}" + ("" if cfg.pingpong else " no-pingpong")
            + (" persistent" if cfg.persistent else ""))


def output_check(shape: Shape, cfg: FlashAttentionConfig, inputs: tuple[jax.Array, ...]) -> str:
    try:
        got = jax.jit(cute_attention(shape, cfg))(*inputs[:3]).astype(jnp.float32)
        want = jax.jit(jax_nn_attention(shape, "cudnn"))(*inputs[:3]).astype(jnp.float32)
        return f"max abs diff of ejk cute vs jax.nn cudnn: {float(jnp.max(jnp.abs(got - want))):.3g}"
    except Exception as exc:
        return f"output check failed: {error_text(exc)}"


def main() -> None:
    parser = _harness.parser(__doc__)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--configs", choices=("all", "heuristic"), default="all")
    parser.add_argument("--wide", action="store_true", help="also the 176 / 192-key tiles (they spill registers)")
    parser.add_argument("--mode", choices=(*MODES, "both"), default="fwd")
    _harness.add_timer_option(parser)
    args = _harness.parse(parser)
    clock = _harness.timer(args)
    if jax.default_backend() != "gpu":
        raise SystemExit("bench_cute_attention.py needs an NVIDIA Hopper GPU")
    lines = _harness.header(
        "Attention throughput: ejk-cute FlashAttention-3-style forward vs cuDNN (jax.nn.dot_product_attention)",
        args, f"dtype {args.dtype}; FLOPs 4·B·H·S²·D (halved when causal), fwd+bwd = {BWD_FACTOR}x fwd; "
        f"ejk configs: {args.configs}{' + wide' if args.wide else ''}; ratio = ejk TFLOP/s / cuDNN TFLOP/s; "
        "target (issue 10): fwd >= 1.15",
        f"nvidia-cutlass-dsl {_harness.version('nvidia-cutlass-dsl')}, ejk-cute {_harness.version('ejk-cute')}; "
        "fwd+bwd runs the paired backward (see plugins/ejk_cute/docs/flash_attention.md)",
        case="shape [B,S,H,D]", rate="TFLOP/s",
    )
    lines[-2] = "| shape [B,S,H,D] | mode | implementation | ms | TFLOP/s | ratio vs cuDNN | note |"
    lines[-1] = "| --- | --- | --- | ---: | ---: | ---: | --- |"
    checks: list[str] = []
    print("\n".join(lines), flush=True)
    for shape in SMOKE_SHAPES if args.smoke else SHAPES:
        inputs = make_inputs(shape, jnp.dtype(args.dtype))
        heuristic = heuristic_config(*inputs[:3])
        space = [heuristic] if args.configs == "heuristic" else config_space(*inputs[:3])
        if args.wide and shape.dim in WIDE:
            space.append(WIDE[shape.dim])
        if args.configs == "all" or args.wide:
            space.append(attrs.evolve(heuristic, pingpong=False))
        ours = {cfg_label(cfg): cute_attention(shape, cfg) for cfg in dict.fromkeys([heuristic, *space])}
        checks.append(f"- {shape}: {output_check(shape, heuristic, inputs)}")
        for mode in MODES if args.mode == "both" else (args.mode,):
            flops = shape.fwd_flops() * (1.0 if mode == "fwd" else BWD_FACTOR)
            rows = []
            cudnn_times, cudnn_errors = best_of({"cudnn": jax_nn_attention(shape, "cudnn")}, mode, inputs, args.reps,
                                                clock)
            base_ms = cudnn_times.get("cudnn")
            if base_ms is not None:
                rows.append(f"| {shape} | {mode} | jax.nn cudnn | {base_ms:,.2f} | {tflops(flops, base_ms)} | 1.00 | |")
            else:
                rows.append(f"| {shape} | {mode} | jax.nn cudnn | failed | | | {'; '.join(cudnn_errors)} |")
            times, errors = best_of(ours, mode, inputs, args.reps, clock)
            if times:
                label, ms = min(times.items(), key=lambda kv: kv[1])
                ratio = f"{base_ms / ms:.2f}" if base_ms else ""
                note = f"best: {label}"
                heur = times.get(cfg_label(heuristic))
                if heur is not None and len(times) > 1:
                    note += f"; heuristic {heur:,.2f} ms ({tflops(flops, heur)} TFLOP/s)"
                others = [f"{k} {tflops(flops, t)}" for k, t in times.items() if k != label]
                if others:
                    note += f"; others (TFLOP/s): {', '.join(others)}"
                if errors:
                    note += f"; failed: {'; '.join(errors)}"
                rows.append(f"| {shape} | {mode} | ejk cute | {ms:,.2f} | {tflops(flops, ms)} | {ratio} | {note} |")
            else:
                rows.append(f"| {shape} | {mode} | ejk cute | failed | | | {'; '.join(errors)} |")
            for row in rows:
                print(row, flush=True)
            lines += rows
        del inputs
    lines += ["", f"Forward outputs ({args.dtype} inputs), ejk's heuristic config:", *checks]
    print("\n".join(lines[-len(checks) - 2:]), flush=True)
    _harness.write(lines, args, "cute_attention.md")


if __name__ == "__main__":
    main()
