"""Dense bf16 matmul on one Hopper GPU: ejk-cute's wgmma kernel against XLA's ``a @ b`` in the same run.

Lines, same process and inputs (bf16 ``a [m, k] @ b [k, n]``, bf16 output, float32 accumulation):

- ``a @ b``: XLA (cuBLAS), the baseline;
- ``ejk cute``: ``ejk.matmul(platform="cute")`` with the heuristic's config; with ``--configs space``
  every config of the config space too (labelled; the best one named).

Cases ``m x k x n``: 8192x8192x8192, 4096x4096x4096, 8192x2048x8192 (k = 2048); modes ``fwd`` and
``fwd+bwd`` (output plus d a, d b in one jitted call; FLOPs ``2·m·k·n``, fwd+bwd ``3x``). Ratio: the
time of ``a @ b`` over the line's (target >= 0.95 at 8192³). Timing: ``_harness.time_ms`` (compile,
two warm-ups, median of ``--reps`` samples of back-to-back calls). A failure is reported on its line.
Numerics below the table: max abs diff of the heuristic line's output and gradients against XLA.

Usage (on the GPU host, CuTe DSL importable):
    python benchmarks/bench_cute_matmul.py                      # heuristic configs (~1 min)
    python benchmarks/bench_cute_matmul.py --configs space      # + every config at 8192³ fwd (~2 min more)
    python benchmarks/bench_cute_matmul.py --smoke              # tiny shapes (the ejk cute lines need a GPU)

Output: ``$OUT/cute_matmul.md`` when ``OUT`` is set, else ``benchmarks/results/cute_matmul.md``.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import _harness
import jax
import jax.numpy as jnp
from _harness import error_text, time_ms

import ejk
from ejk_cute import _matmul, _status

DTYPE = jnp.bfloat16
FULL = ((8192, 8192, 8192), (4096, 4096, 4096), (8192, 2048, 8192))
SMOKE = ((256, 128, 256),)
MODES = ("fwd", "fwd+bwd")


def _inputs(m: int, k: int, n: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    ka, kb, kc = jax.random.split(jax.random.key(0), 3)
    return (jax.random.normal(ka, (m, k), DTYPE), jax.random.normal(kb, (k, n), DTYPE),
            jax.random.normal(kc, (m, n), DTYPE))


def _with_backward(mm: Callable[[jax.Array, jax.Array], jax.Array]) -> Callable[..., Any]:
    def fn(a: jax.Array, b: jax.Array, cot: jax.Array) -> tuple[jax.Array, ...]:
        out, pull = jax.vjp(mm, a, b)
        return (out, *pull(cot))

    return fn


def _xla(a: jax.Array, b: jax.Array) -> jax.Array:
    return a @ b


def _cute(cfg: Any) -> Callable[[jax.Array, jax.Array], jax.Array]:
    def mm(a: jax.Array, b: jax.Array) -> jax.Array:
        return ejk.matmul(a, b, platform="cute", cfg=cfg)

    return mm


def _label(cfg: Any) -> str:
    return f"{cfg.tile_m}x{cfg.tile_n} cluster {cfg.cluster_m}x{cfg.cluster_n} stages {cfg.stages}"


def bench_case(m: int, k: int, n: int, args: Any) -> tuple[list[str], list[str]]:
    a, b, cot = _inputs(m, k, n)
    heuristic = _matmul.heuristic_config(a, b)
    space = _matmul.config_space(a, b) if args.configs == "space" and (m, k, n) == FULL[0] else [heuristic]
    unavailable = _status.runtime_reason() or _matmul.capability(a, b)
    rows, checks = [], []
    for mode in MODES:
        flops = 2.0 * m * k * n * (3 if mode == "fwd+bwd" else 1)
        operands: tuple[jax.Array, ...] = (a, b) if mode == "fwd" else (a, b, cot)

        def wrap(mm: Callable[[jax.Array, jax.Array], jax.Array]) -> Callable[..., Any]:
            return mm if mode == "fwd" else _with_backward(mm)  # noqa: B023

        base_ms = time_ms(wrap(_xla), operands, args.reps)
        case = f"{m}x{k}x{n}"
        rows.append(f"| {case} | {mode} | a @ b (XLA) | {base_ms:.3f} | {flops / base_ms / 1e9:.0f} | 1.00 | |")
        if unavailable:
            rows.append(f"| {case} | {mode} | ejk cute | | | | unavailable: {unavailable} |")
            continue
        best: tuple[float, str] | None = None
        for cfg in space:
            name = "ejk cute" + (" (heuristic)" if cfg == heuristic else "")
            try:
                ms = time_ms(wrap(_cute(cfg)), operands, args.reps)
            except Exception as exc:  # a failing config is reported on its line
                traceback.print_exc()
                rows.append(f"| {case} | {mode} | {name} | | | | {_label(cfg)}: {error_text(exc)} |")
                continue
            rows.append(f"| {case} | {mode} | {name} | {ms:.3f} | {flops / ms / 1e9:.0f} | {base_ms / ms:.2f} | "
                        f"{_label(cfg)} |")
            best = min(best or (ms, ""), (ms, _label(cfg)))
        if best is not None and len(space) > 1:
            rows.append(f"| {case} | {mode} | ejk cute (best) | {best[0]:.3f} | {flops / best[0] / 1e9:.0f} | "
                        f"{base_ms / best[0]:.2f} | {best[1]} |")
        try:
            got = jax.tree.leaves(jax.jit(wrap(_cute(heuristic)))(*operands))
            want = jax.tree.leaves(jax.jit(wrap(_xla))(*operands))
            diffs = [float(jnp.max(jnp.abs(g.astype(jnp.float32) - w.astype(jnp.float32))))
                     for g, w in zip(got, want, strict=True)]
            scale = [float(jnp.max(jnp.abs(w.astype(jnp.float32)))) for w in want]
            checks.append(f"- {case} {mode}: max abs diff " + ", ".join(
                f"{d:.3g} (max |ref| {s:.3g})" for d, s in zip(diffs, scale, strict=True)))
        except Exception as exc:  # reported below the table
            checks.append(f"- {case} {mode}: {error_text(exc)}")
    return rows, checks


def main() -> None:
    parser = _harness.parser(__doc__)
    parser.add_argument("--configs", choices=("heuristic", "space"), default="heuristic",
                        help="only the heuristic's config, or also every config of the space at 8192³ (best named)")
    args = _harness.parse(parser)
    lines = _harness.header(
        "matmul: ejk-cute (CuTe DSL wgmma) vs XLA", args,
        "bfloat16 in and out, float32 accumulation; FLOPs 2·m·k·n, fwd+bwd 3x; ratio = XLA's time over the line's",
        f"nvidia-cutlass-dsl {_harness.version('nvidia-cutlass-dsl')}, ejk-cute {_harness.version('ejk-cute')}; "
        f"configs: {args.configs}",
        rate="TFLOP/s",
    )
    lines[-2] = "| case | mode | implementation | ms | TFLOP/s | ratio | note |"
    lines[-1] = "| --- | --- | --- | ---: | ---: | ---: | --- |"
    print("\n".join(lines), flush=True)
    checks: list[str] = []
    for m, k, n in SMOKE if args.smoke else FULL:
        rows, more = bench_case(m, k, n, args)
        print("\n".join(rows), flush=True)
        lines += rows
        checks += more
    lines += ["", "Numerics: max abs diff of the ejk cute heuristic line against XLA (output, then d a, d b):", *checks]
    print("\n".join(lines[-len(checks) - 2:]), flush=True)
    _harness.write(lines, args, "cute_matmul.md")


if __name__ == "__main__":
    main()
