"""Attention throughput on one GPU: ejk's XLA flash attention next to ``jax.nn.dot_product_attention``.

Lines (same process, same inputs):

- ``ejk xla flash``: ``ejk_xla._flash_attention.flash_attention`` with a few block configs; the
  best one is reported (and named),
- ``jax.nn xla``: ``jax.nn.dot_product_attention(implementation="xla")`` (materialised logits),
- ``jax.nn cudnn``: ``jax.nn.dot_product_attention(implementation="cudnn")`` (skipped off GPU),
- ``ejk auto heuristics`` / ``ejk auto tuned``: the public ``ejk.flash_attention`` with
  ``platform="auto"``, its choice made by the heuristics tier, or by autotuning every usable
  implementation (objective = the line's mode; the tuning time is in the note). The ratios of
  these to cuDNN close the report.

Each in ``fwd`` (the output) and ``fwd+bwd`` (output plus dq, dk, dv in one jitted call).
FLOPs: ``4·B·H·Sq·Sk·D`` for the forward (halved when causal), ``3.5x`` that for fwd+bwd.
Timing: compile, two warm-up calls, then the median of ``--reps`` calls, each ended by
``block_until_ready``. A failure (unsupported, out of memory, …) is reported on its line.

Usage:
    python benchmarks/bench_attention_gpu.py            # full shapes (GPU)
    python benchmarks/bench_attention_gpu.py --smoke    # tiny shapes, runs on the CPU

The markdown table goes to ``$OUT/attention_gpu.md`` when ``OUT`` is set, else to
``benchmarks/results/attention_gpu.md`` (``--out`` overrides both; a smoke run writes
``attention_gpu_smoke.md`` instead).
"""

from __future__ import annotations

import argparse
import math
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

import _harness
import attrs
import jax
import jax.numpy as jnp
import numpy as np
from _harness import error_text, time_ms

import ejk
from ejk_xla._flash_attention import FlashAttentionConfig, flash_attention

MODES = ("fwd", "fwd+bwd")
BWD_FACTOR = 3.5


@attrs.frozen(kw_only=True)
class Shape:
    batch: int
    seq: int
    heads: int
    dim: int
    causal: bool

    def __str__(self) -> str:
        kind = "causal" if self.causal else "full"
        return f"[{self.batch},{self.seq},{self.heads},{self.dim}] {kind}"

    def fwd_flops(self) -> float:
        flops = 4.0 * self.batch * self.heads * self.seq * self.seq * self.dim
        return flops / 2 if self.causal else flops


FULL_SHAPES = (
    Shape(batch=4, seq=4096, heads=16, dim=128, causal=False),
    Shape(batch=4, seq=4096, heads=16, dim=128, causal=True),
    Shape(batch=2, seq=8192, heads=16, dim=128, causal=True),
)
SMOKE_SHAPES = (
    Shape(batch=1, seq=128, heads=2, dim=64, causal=False),
    Shape(batch=1, seq=128, heads=2, dim=64, causal=True),
)
FULL_CONFIGS = ((1024, 1024), (512, 512))
SMOKE_CONFIGS = ((64, 64), (128, 64))


# -- shared with the plugin benchmarks (bench_triton_attention.py, bench_pallas_attention.py) --------

D64_SHAPES = (  # issue 8 also asks for head_dim 64: same FLOPs as the first two rows
    Shape(batch=4, seq=4096, heads=32, dim=64, causal=False),
    Shape(batch=4, seq=4096, heads=32, dim=64, causal=True),
)
PLUGIN_SMOKE_SHAPES = (Shape(batch=1, seq=64, heads=2, dim=64, causal=False),
                Shape(batch=1, seq=64, heads=2, dim=64, causal=True))


def best_of(candidates: dict[str, Callable[..., jax.Array]], mode: str, inputs: tuple[jax.Array, ...],
            reps: int, timer: Callable[..., float] = time_ms) -> tuple[dict[str, float], list[str]]:
    times: dict[str, float] = {}
    errors: list[str] = []
    for label, attention in candidates.items():
        try:
            times[label] = measure(attention, mode, inputs, reps, timer)
            print(f"  {mode} {label}: {times[label]:.3f} ms", flush=True)
        except Exception as exc:  # report per line, keep going
            errors.append(f"{label}: {error_text(exc)}")
            if os.environ.get("EJK_BENCH_TRACEBACK"):
                traceback.print_exc()
    return times, errors


def tflops(flops: float, ms: float) -> str:
    rate = flops / ms / 1e9
    return f"{rate:,.1f}" if rate >= 1 else f"{rate:.4f}"


def ejk_attention(shape: Shape, cfg: FlashAttentionConfig) -> Callable[..., jax.Array]:
    def fn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return flash_attention(
            q, k, v, causal=shape.causal, softmax_scale=1 / math.sqrt(shape.dim), sliding_window=None,
            logits_soft_cap=None, q_segment_ids=None, kv_segment_ids=None, bias=None, cfg=cfg,
        )

    return fn


def jax_nn_attention(shape: Shape, implementation: str) -> Callable[..., jax.Array]:
    def fn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return jax.nn.dot_product_attention(q, k, v, is_causal=shape.causal, implementation=implementation)

    return fn


def ejk_auto(shape: Shape, executor: ejk.Executor[Any, Any]) -> Callable[..., jax.Array]:
    def fn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        with ejk.use_executor(executor):
            return ejk.flash_attention(q, k, v, causal=shape.causal)

    return fn


def auto_executor(mode: str, objective: str) -> ejk.Executor[Any, Any]:
    policy = ejk.AutotunePolicy(mode=mode, objective=objective, persist=False)
    return ejk.Executor(ejk.ConfigSelectorChain(policy=policy, persist=False, on_event=EVENTS.append))


EVENTS: list[Any] = []


def with_backward(attention: Callable[..., jax.Array]) -> Callable[..., Any]:
    """Output and (dq, dk, dv) for the cotangent ``do`` in one function."""

    def fn(q: jax.Array, k: jax.Array, v: jax.Array, do: jax.Array) -> Any:
        out, vjp = jax.vjp(attention, q, k, v)
        return out, vjp(do)

    return fn


def make_inputs(shape: Shape, dtype: Any) -> tuple[jax.Array, ...]:
    rng = np.random.default_rng(0)
    dims = (shape.batch, shape.seq, shape.heads, shape.dim)
    return tuple(jnp.asarray(rng.standard_normal(dims, dtype=np.float32)).astype(dtype) for _ in range(4))


def measure(attention: Callable[..., jax.Array], mode: str, inputs: tuple[jax.Array, ...], reps: int,
            timer: Callable[..., float] = time_ms) -> float:
    """Milliseconds per call of the forward (``fwd``) or of the output and its VJP (``fwd+bwd``)."""
    if mode == "fwd":
        return timer(attention, inputs[:3], reps)
    return timer(with_backward(attention), inputs, reps)


def bench_line(
    name: str, candidates: dict[str, Callable[..., jax.Array]], shape: Shape, mode: str,
    inputs: tuple[jax.Array, ...], reps: int, times: dict[str, float] | None = None,
) -> str:
    """One table row: the best of ``candidates`` (label → attention fn), or why none ran."""
    flops = shape.fwd_flops() * (1.0 if mode == "fwd" else BWD_FACTOR)
    results: dict[str, float] = {}
    errors: list[str] = []
    for label, attention in candidates.items():
        try:
            results[label] = measure(attention, mode, inputs, reps)
        except Exception as exc:  # report per line, keep going
            errors.append(f"{label}: {error_text(exc)}" if label else error_text(exc))
            if os.environ.get("EJK_BENCH_TRACEBACK"):
                traceback.print_exc()
    if not results:
        return f"| {shape} | {mode} | {name} | failed | | {'; '.join(errors)} |"
    label, ms = min(results.items(), key=lambda kv: kv[1])
    if times is not None:
        times[name] = ms
    note = label + (f" (failed: {'; '.join(errors)})" if errors else "")
    tflops = flops / ms / 1e9
    rate = f"{tflops:,.1f}" if tflops >= 1 else f"{tflops:.4f}"
    return f"| {shape} | {mode} | {name} | {ms:,.2f} | {rate} | {note} |"


def max_abs_diff(ours: Callable[..., jax.Array], inputs: tuple[jax.Array, ...], shape: Shape) -> str:
    """A correctness sanity check of our forward against ``jax.nn`` (xla) on the benchmark inputs."""
    try:
        got = jax.jit(ours)(*inputs[:3]).astype(jnp.float32)
        want = jax.jit(jax_nn_attention(shape, "xla"))(*inputs[:3]).astype(jnp.float32)
        return f"max abs diff of ejk vs jax.nn xla output: {float(jnp.max(jnp.abs(got - want))):.3g}"
    except Exception as exc:
        return f"output check failed: {error_text(exc)}"


def header(args: argparse.Namespace) -> list[str]:
    return _harness.header(
        "Attention throughput: ejk XLA flash attention vs jax.nn.dot_product_attention", args,
        f"dtype {args.dtype}; FLOPs 4·B·H·Sq·Sk·D (halved when causal), fwd+bwd = {BWD_FACTOR}x fwd",
        case="shape [B,S,H,D]", rate="TFLOP/s",
    )


def main() -> None:
    parser = _harness.parser(__doc__)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--only-auto", action="store_true", help="only cuDNN and ejk's public op (the ratio check)")
    args = _harness.parse(parser)
    shapes = SMOKE_SHAPES if args.smoke else FULL_SHAPES
    configs = SMOKE_CONFIGS if args.smoke else FULL_CONFIGS
    on_gpu = jax.default_backend() == "gpu"
    lines = header(args)
    checks: list[str] = []
    ratios: list[str] = ["", "Throughput of ejk's public op relative to cuDNN (higher is better; >= 0.98 is the bar):",
                         "", "| shape | mode | ejk | ratio to cuDNN |", "| --- | --- | --- | ---: |"]
    print("\n".join(lines), flush=True)
    for shape in shapes:
        inputs = make_inputs(shape, jnp.dtype(args.dtype))
        ours = {
            f"block {bq}x{bk}": ejk_attention(shape, FlashAttentionConfig(block_q=bq, block_k=bk)) for bq, bk in configs
        }
        if not args.only_auto:
            checks.append(f"- {shape}: {max_abs_diff(next(iter(ours.values())), inputs, shape)}")
        for mode in MODES:
            times: dict[str, float] = {}
            rows = [] if args.only_auto else [
                bench_line("ejk xla flash", ours, shape, mode, inputs, args.reps),
                bench_line("jax.nn xla", {"": jax_nn_attention(shape, "xla")}, shape, mode, inputs, args.reps),
            ]
            if on_gpu:
                cudnn = {"": jax_nn_attention(shape, "cudnn")}
                rows.append(bench_line("jax.nn cudnn", cudnn, shape, mode, inputs, args.reps, times))
            else:
                rows.append(f"| {shape} | {mode} | jax.nn cudnn | skipped | | needs a GPU |")
            objective = "forward" if mode == "fwd" else "forward_backward"
            for policy in ("heuristics", "autotune"):
                fn = ejk_auto(shape, auto_executor(policy, objective))
                del EVENTS[:]
                start = time.perf_counter()
                jax.jit(fn).lower(*inputs[:3])  # the choice (and tuning) happens while tracing
                chose = f"{time.perf_counter() - start:.1f}s to choose: " + "; ".join(
                    f"{e.tier} {e.cfg}" + (f" ({e.detail})" if e.detail else "") for e in EVENTS)
                name = f"ejk auto {'tuned' if policy == 'autotune' else policy}"
                rows.append(bench_line(name, {chose: fn}, shape, mode, inputs, args.reps, times))
            for row in rows:
                print(row, flush=True)
            lines += rows
            if "jax.nn cudnn" in times:
                for name in ("ejk auto heuristics", "ejk auto tuned"):
                    if name in times:
                        ratios.append(f"| {shape} | {mode} | {name} | {times['jax.nn cudnn'] / times[name]:.3f} |")
        del inputs
    lines += ratios
    lines += ["", f"Forward outputs ({args.dtype} inputs), ejk's first block config against jax.nn xla:", *checks]
    print("\n".join(lines[-len(checks) - 2 :]), flush=True)
    _harness.write(lines, args, "attention_gpu.md")


if __name__ == "__main__":
    main()
