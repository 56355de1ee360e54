"""Attention throughput on one GPU: ejk's Pallas flash attentions against cuDNN and jax's own Pallas kernels.

Lines (same process, same inputs, bf16 by default):

- ``ejk pallas``: ``ejk.flash_attention(..., platform="pallas", cfg=cfg)`` with each config of
  ``ejk_pallas._flash_attention.config_space`` (or only the heuristic's, ``--configs heuristic``);
  the best is reported and named, the heuristic's time is in the note,
- ``ejk pallas mosaic``: the Mosaic GPU forward (``pallas/gpu:mosaic``, Hopper only) with each
  config of ``ejk_pallas._flash_attention_mgpu.config_space`` (``--mosaic-configs all``; default: the heuristic's);
  ``fwd+bwd`` pairs it with the Mosaic GPU backward (its default on a GPU, line ``ejk pallas
  mosaic+mbwd``, its gradients checked against jax.nn's) and times only the heuristic's and the best
  forward config; ``--mosaic-backward triton_lowered`` (or ``both``) times the Triton-lowered backward
  (its heuristic config, line ``ejk pallas mosaic``),
- ``jax.nn cudnn``: ``jax.nn.dot_product_attention(implementation="cudnn")`` (the ratio's base),
- ``jax pallas mha``: ``jax.experimental.pallas.ops.gpu.attention.mha`` with its default blocks
  (128 x 128 forward, 32 x 32 backward),
- ``jax attention_mgpu``: ``jax.experimental.pallas.ops.gpu.attention_mgpu.attention`` (Mosaic GPU,
  FlashAttention-3 style, run in float16, the one dtype it takes; 2 x 64 query rows, 128 keys, 2 slots;
  it applies no softmax scale, which changes no FLOPs; its backward has no causal mask, so causal
  ``fwd+bwd`` is not timed),

each in ``fwd`` (the output) and ``fwd+bwd`` (output plus dq, dk, dv in one jitted call), with
the ratio to cuDNN. FLOPs: ``4·B·H·S²·D`` for the forward (halved when causal), ``3.5x`` that
for fwd+bwd. Timing: compile, warm-up calls, then the median of ``--reps`` samples.
At Sq = Sk the causal masks of all three agree (bottom-right = top-left alignment).

Usage (on the GPU host; see ../shared/gpu/README.md):
    python benchmarks/bench_pallas_attention.py                     # three shapes, whole config space
    python benchmarks/bench_pallas_attention.py --configs heuristic # one config per shape (faster)
    python benchmarks/bench_pallas_attention.py --d64               # also head_dim 64
    python benchmarks/bench_pallas_attention.py --impl mosaic --mode fwd --d64   # the Mosaic GPU forward only
    python benchmarks/bench_pallas_attention.py --impl mosaic --mode fwd --mosaic-configs all   # its config sweep
    python benchmarks/bench_pallas_attention.py --impl mosaic --mode fwd+bwd --mosaic-backward both  # both backwards
    EJK_PALLAS_INTERPRET=1 python benchmarks/bench_pallas_attention.py --smoke   # CPU, interpret mode

Output: ``$OUT/pallas_attention.md`` when ``OUT`` is set, else ``benchmarks/results/pallas_attention.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
from ejk_pallas import _flash_attention_mgpu as mosaic
from ejk_pallas._flash_attention import FlashAttentionConfig, config_space, heuristic_config
from ejk_pallas._flash_attention_mgpu import MosaicFlashAttentionConfig

SMOKE_SHAPES = PLUGIN_SMOKE_SHAPES


def pallas_attention(shape: Shape, cfg: FlashAttentionConfig) -> Callable[..., jax.Array]:
    def fn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return ejk.flash_attention(q, k, v, causal=shape.causal, platform="pallas", cfg=cfg)

    return fn


def mosaic_attention(shape: Shape, cfg: MosaicFlashAttentionConfig) -> Callable[..., jax.Array]:
    backend = "gpu" if jax.default_backend() == "gpu" else "cpu"
    choice = ejk.ImplChoice(platform="pallas", backend=backend, implementation="mosaic", cfg=cfg)

    def fn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return ejk.flash_attention(q, k, v, causal=shape.causal, platform="pallas", cfg=choice)

    return fn


def mosaic_label(cfg: MosaicFlashAttentionConfig) -> str:
    return (f"{cfg.block_q}x{cfg.block_kv} slots {cfg.max_concurrent_steps}{' overlap' if cfg.overlap else ''}"
            f"{' persistent' if cfg.persistent else ''}")


def grad_check(shape: Shape, name: str, attention: Callable[..., jax.Array], inputs: tuple[jax.Array, ...],
               on_gpu: bool) -> str:
    """Max abs differences of dq, dk, dv (cotangent ``inputs[3]``) against jax.nn's attention."""
    impl = "cudnn" if on_gpu else "xla"

    def grads(fn: Callable[..., jax.Array]) -> Any:
        return jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32)
                                                        * inputs[3].astype(jnp.float32)), argnums=(0, 1, 2)))

    try:
        got = grads(attention)(*inputs[:3])
        want = grads(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=shape.causal,
                                                                  implementation=impl))(*inputs[:3])
        diffs = ", ".join(f"d{n} {float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))):.3g}"
                          for n, a, b in zip("qkv", got, want, strict=True))
        return f"max abs grad diff of {name} vs jax.nn {impl}: {diffs}"
    except Exception as exc:
        return f"{name}: gradient check failed: {error_text(exc)}"


def mbwd_label(cfg: MosaicFlashAttentionConfig) -> str:
    return f"dkdv rows {cfg.bwd_block_q}, dq keys {cfg.bwd_block_kv}, slots {cfg.bwd_max_concurrent_steps}"


def jax_attention_mgpu(shape: Shape, mode: str) -> Callable[..., jax.Array]:
    from jax.experimental.pallas.ops.gpu import attention_mgpu

    blocks = {} if mode == "fwd" else dict(block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
    config = attention_mgpu.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2, causal=shape.causal,
                                         **blocks)

    def fn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        # jax's kernel takes float16 only (jax 0.11.2 rejects bfloat16): the same bytes and FLOPs.
        q, k, v = (x.astype(jnp.float16) for x in (q, k, v))
        return attention_mgpu.attention(q, k, v, config)  # type: ignore[no-any-return]

    return fn


def cudnn_attention(shape: Shape) -> Callable[..., jax.Array]:
    return jax_nn_attention(shape, "cudnn")


def jax_mha(shape: Shape) -> Callable[..., jax.Array]:
    from jax.experimental.pallas.ops.gpu import attention

    def fn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return attention.mha(q, k, v, None, sm_scale=shape.dim ** -0.5, causal=shape.causal)  # type: ignore[no-any-return]

    return fn


def cfg_label(cfg: FlashAttentionConfig) -> str:
    return (f"fwd {cfg.block_q}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}, "
            f"bwd {cfg.bwd_block_q}x{cfg.bwd_block_k} w{cfg.bwd_num_warps} s{cfg.bwd_num_stages}")


def output_check(shape: Shape, name: str, attention: Callable[..., jax.Array], inputs: tuple[jax.Array, ...],
                 on_gpu: bool) -> str:
    try:
        got = jax.jit(attention)(*inputs[:3]).astype(jnp.float32)
        impl = "cudnn" if on_gpu else "xla"
        want = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=shape.causal,
                                                                    implementation=impl))(*inputs[:3])
        return f"max abs diff of {name} vs jax.nn {impl}: {float(jnp.max(jnp.abs(got - want))):.3g}"
    except Exception as exc:
        return f"{name}: output check failed: {error_text(exc)}"


def best_note(times: dict[str, float], heuristic_label: str, flops: float) -> str:
    if not times:
        return ""
    note = f"best: {min(times.items(), key=lambda kv: kv[1])[0]}"
    heur = times.get(heuristic_label)
    if heur is not None and len(times) > 1:
        note += f"; heuristic {heur:,.2f} ms ({tflops(flops, heur)} TFLOP/s)"
    return note


def row(shape: Shape, mode: str, name: str, times: dict[str, float], errors: list[str], flops: float,
        base_ms: float | None, note: str = "") -> str:
    if not times:
        return f"| {shape} | {mode} | {name} | failed | | | {'; '.join(errors)} |"
    _, ms = min(times.items(), key=lambda kv: kv[1])
    ratio = f"{base_ms / ms:.2f}" if base_ms else ""
    if errors:
        note += f"; failed: {'; '.join(errors)}"
    return f"| {shape} | {mode} | {name} | {ms:,.2f} | {tflops(flops, ms)} | {ratio} | {note} |"


def main() -> None:
    parser = _harness.parser(__doc__)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--configs", choices=("all", "heuristic"), default="all",
                        help="the whole config space (best reported) or only the heuristic's config")
    parser.add_argument("--d64", action="store_true", help="also head_dim 64 ([4,4096,32,64] full and causal)")
    parser.add_argument("--no-mha", action="store_true", help="skip jax's own Pallas mha")
    parser.add_argument("--no-attention-mgpu", action="store_true", help="skip jax's own Mosaic GPU attention")
    parser.add_argument("--impl", choices=("triton_lowered", "mosaic", "all"), default="all",
                        help="which ejk Pallas implementations to time")
    parser.add_argument("--mosaic-configs", choices=("all", "heuristic"), default="heuristic",
                        help="the Mosaic GPU forward's whole config space (best reported) or its heuristic's")
    parser.add_argument("--mosaic-backward", choices=("triton_lowered", "mosaic", "both"), default="mosaic",
                        help="the backward paired with the Mosaic GPU forward in fwd+bwd: the Mosaic GPU one "
                             "(default), the Triton-lowered one or both")
    parser.add_argument("--mosaic-bwd-tiles", default="heuristic",
                        help="the Mosaic GPU backward's bwd_block_q,bwd_block_kv,bwd_max_concurrent_steps, or "
                             "'heuristic' (the forward config's, by head dim)")
    parser.add_argument("--mode", choices=(*MODES, "both"), default="both", help="forward, forward+backward or both")
    _harness.add_timer_option(parser)
    args = _harness.parse(parser)
    clock = _harness.timer(args)
    on_gpu = jax.default_backend() == "gpu"
    shapes = SMOKE_SHAPES if args.smoke else FULL_SHAPES + (D64_SHAPES if args.d64 else ())
    lines = _harness.header(
        "Attention throughput: ejk Pallas flash attention vs cuDNN and jax's Pallas mha / attention_mgpu", args,
        f"dtype {args.dtype}; FLOPs 4·B·H·S²·D (halved when causal), fwd+bwd = {BWD_FACTOR}x fwd; "
        f"ejk configs: {args.configs}; ratio = TFLOP/s / cuDNN TFLOP/s",
        f"ejk-pallas {_harness.version('ejk-pallas')}",
        case="shape [B,S,H,D]", rate="TFLOP/s",
    )
    lines[-2] = "| shape [B,S,H,D] | mode | implementation | ms | TFLOP/s | ratio vs cuDNN | note |"
    lines[-1] = "| --- | --- | --- | ---: | ---: | ---: | --- |"
    checks: list[str] = []
    print("\n".join(lines), flush=True)
    triton_on = args.impl in ("triton_lowered", "all")
    mosaic_on = args.impl in ("mosaic", "all")
    mbwd_fields: dict[str, int] = {}
    if args.mosaic_bwd_tiles != "heuristic":
        bq, bk, slots = (int(x) for x in args.mosaic_bwd_tiles.split(","))
        mbwd_fields = dict(bwd_block_q=bq, bwd_block_kv=bk, bwd_max_concurrent_steps=slots)
    backwards = (("triton_lowered", "mosaic") if args.mosaic_backward == "both" else (args.mosaic_backward,))
    for shape in shapes:
        inputs = make_inputs(shape, jnp.dtype(args.dtype))
        heuristic = heuristic_config(*inputs[:3])
        space = [heuristic] if args.configs == "heuristic" else config_space(*inputs[:3])
        if heuristic not in space:
            space.insert(0, heuristic)
        ours = {cfg_label(cfg): pallas_attention(shape, cfg) for cfg in space} if triton_on else {}
        mosaic_reason = mosaic.capability(*inputs[:3], causal=shape.causal)
        mosaic_heuristic = mosaic.heuristic_config(*inputs[:3], causal=shape.causal)
        mosaic_space = ([mosaic_heuristic] if args.mosaic_configs == "heuristic"
                        else mosaic.config_space(*inputs[:3]))
        if mosaic_heuristic not in mosaic_space:
            mosaic_space.insert(0, mosaic_heuristic)
        mosaic_best: MosaicFlashAttentionConfig | None = None
        if triton_on:
            check = output_check(shape, "ejk pallas", pallas_attention(shape, heuristic), inputs, on_gpu)
            checks.append(f"- {shape}: {check}")
        if mosaic_on and mosaic_reason is None:
            check = output_check(shape, "ejk pallas mosaic", mosaic_attention(shape, mosaic_heuristic), inputs, on_gpu)
            checks.append(f"- {shape}: {check}")
            if "mosaic" in backwards and args.mode != "fwd":
                mbwd = attrs.evolve(mosaic_heuristic, backward="mosaic", **mbwd_fields)
                check = grad_check(shape, "ejk pallas mosaic+mbwd", mosaic_attention(shape, mbwd), inputs, on_gpu)
                checks.append(f"- {shape}: {check}")
        for mode in MODES if args.mode == "both" else (args.mode,):
            flops = shape.fwd_flops() * (1.0 if mode == "fwd" else BWD_FACTOR)
            rows = []
            base_ms = None
            if on_gpu:
                cudnn_times, cudnn_errors = best_of({"cudnn": cudnn_attention(shape)}, mode, inputs, args.reps, clock)
                base_ms = cudnn_times.get("cudnn")
                rows.append(row(shape, mode, "jax.nn cudnn", cudnn_times, cudnn_errors, flops, base_ms))
                if not args.no_mha:
                    mha_times, mha_errors = best_of({"mha": jax_mha(shape)}, mode, inputs, args.reps, clock)
                    rows.append(row(shape, mode, "jax pallas mha", mha_times, mha_errors, flops, base_ms))
                if not args.no_attention_mgpu:
                    if mode != "fwd" and shape.causal:
                        rows.append(f"| {shape} | {mode} | jax attention_mgpu | skipped | | | "
                                    "its backward has no causal mask |")
                    else:
                        amg_times, amg_errors = best_of({"attention_mgpu": jax_attention_mgpu(shape, mode)}, mode,
                                                        inputs, args.reps, clock)
                        rows.append(row(shape, mode, "jax attention_mgpu", amg_times, amg_errors, flops, base_ms))
            else:
                rows.append(f"| {shape} | {mode} | jax.nn cudnn | skipped | | | needs a GPU |")
            if triton_on:
                times, errors = best_of(ours, mode, inputs, args.reps, clock)
                rows.append(row(shape, mode, "ejk pallas", times, errors, flops, base_ms,
                                best_note(times, cfg_label(heuristic), flops)))
            if mosaic_on and mosaic_reason is not None:
                rows.append(f"| {shape} | {mode} | ejk pallas mosaic | skipped | | | {mosaic_reason} |")
            elif mosaic_on:
                cfgs = mosaic_space if mode == "fwd" or mosaic_best is None else list(
                    dict.fromkeys([mosaic_heuristic, mosaic_best]))
                for bwd in ("triton_lowered",) if mode == "fwd" else backwards:
                    bcfgs = [attrs.evolve(c, backward=bwd, **(mbwd_fields if bwd == "mosaic" else {})) for c in cfgs]
                    candidates = {mosaic_label(c): mosaic_attention(shape, c) for c in bcfgs}
                    times, errors = best_of(candidates, mode, inputs, args.reps, clock)
                    if mode == "fwd" and times:
                        best_label = min(times.items(), key=lambda kv: kv[1])[0]
                        mosaic_best = next(c for c in cfgs if mosaic_label(c) == best_label)
                    note = best_note(times, mosaic_label(mosaic_heuristic), flops)
                    if mode != "fwd":
                        note += ("; backward: ejk pallas (Triton-lowered) heuristic" if bwd == "triton_lowered"
                                 else f"; backward: Mosaic GPU (bwd {mbwd_label(bcfgs[0])})")
                    name = "ejk pallas mosaic" if bwd == "triton_lowered" else "ejk pallas mosaic+mbwd"
                    rows.append(row(shape, mode, name, times, errors, flops, base_ms, note))
            for line in rows:
                print(line, flush=True)
            lines += rows
        del inputs
    lines += ["", f"Forward outputs ({args.dtype} inputs), ejk's heuristic configs:", *checks]
    print("\n".join(lines[-len(checks) - 2 :]), flush=True)
    _harness.write(lines, args, "pallas_attention.md")


if __name__ == "__main__":
    main()
