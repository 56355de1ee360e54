"""MoE grouped matmul and dense matmul on one GPU: ejk's Triton kernels against XLA baselines.

Inputs, FLOP counts and baselines are ``ejk.bench``'s (bf16, precision ``"default"``): ``ejk bench
moe matmul`` times every implementation with its heuristic (or tuned) config; this script sweeps the
Triton kernels' configs, labelled, so the best can be picked. Lines, same process and inputs:

- grouped matmul ``lhs [m, k] x rhs [g, k, n]`` (64 experts, k 2048, n 1536, 32768 tokens) with
  ``equal`` groups and ``skewed`` ones (a seeded Dirichlet split, every token assigned):
  ``lax.ragged_dot``, ``dense einsum (equal groups)`` over ``[g, m/g, k] x [g, k, n]`` (the same
  FLOPs over equal groups: the target, an upper bound for skewed groups), ``ejk xla tiled``
  (ejk-xla's scan, block_m 512) and ``ejk triton`` (``ejk.grouped_matmul(platform="triton")``, each
  config of ``--configs``, the best named, the heuristic's time in the note); ``fwd`` and
  ``fwd+bwd`` (output plus d lhs, d rhs in one jitted call). FLOPs ``2·m·k·n``, fwd+bwd ``3x``.
  Ratio: the dense einsum's time over the line's (target >= 0.8 on an H100).
- matmul ``8192³``: ``a @ b`` (XLA, cuBLAS) and ``ejk triton`` (``ejk.matmul(platform="triton")``,
  configs as above); ratio: XLA's time over Triton's (target >= 0.9).

Timing: ``_harness.time_ms`` (compile, two warm-ups, median of ``--reps`` samples of back-to-back
calls). A failure is reported on its line. Numerics: the Triton heuristic config's output and
gradients against ``lax.ragged_dot`` / ``a @ b`` (max abs diff), below the table.

Usage (on the GPU host, with jax-triton importable):
    python benchmarks/bench_triton_moe.py                     # heuristic configs only (~2 min)
    python benchmarks/bench_triton_moe.py --configs space     # every config of the config spaces
    python benchmarks/bench_triton_moe.py --only moe          # or --only matmul
    EJK_TRITON_INTERPRET=1 python benchmarks/bench_triton_moe.py --smoke   # CPU, interpreter

Output: ``$OUT/triton_moe.md`` when ``OUT`` is set, else ``benchmarks/results/triton_moe.md``.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import Any

import _harness
import jax
import jax.numpy as jnp
from _harness import error_text, time_ms

from ejk.bench import MatmulCase, MoeCase, Workload, baselines_for, workload_for
from ejk.bench._workloads import with_backward
from ejk_triton import _grouped_matmul, _matmul
from ejk_xla._grouped_matmul import GroupedMatmulConfig as XlaGroupedConfig

DTYPE = jnp.bfloat16
MODES = ("fwd", "fwd+bwd")
FULL_MOE = {groups: MoeCase(experts=64, k=2048, n=1536, tokens=32768, skewed=groups == "skewed")
            for groups in ("equal", "skewed")}
SMOKE_MOE = {groups: MoeCase(experts=4, k=64, n=32, tokens=256, skewed=groups == "skewed")
             for groups in ("equal", "skewed")}
FULL_MATMUL, SMOKE_MATMUL = MatmulCase(m=8192, k=8192, n=8192), MatmulCase(m=64, k=64, n=64)
FULL_XLA_BLOCK, SMOKE_XLA_BLOCK = 512, 32
#: The baseline each op's ratio is taken against (``ejk.bench``'s names).
RATIO_BASE = {"grouped_matmul": "dense einsum (equal groups)", "matmul": "a @ b"}


def rate(flops: float, ms: float) -> str:
    value = flops / ms / 1e9
    return f"{value:,.1f}" if value >= 1 else f"{value:.4f}"


def timed(candidates: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]],
          reps: int, timer: Callable[..., float] = time_ms) -> tuple[dict[str, float], list[str]]:
    """Milliseconds per candidate (label -> (fn, args)) by ``timer`` and the failures."""
    times: dict[str, float] = {}
    errors: list[str] = []
    for label, (fn, args) in candidates.items():
        try:
            times[label] = timer(fn, args, reps)
            print(f"  {label or 'baseline'}: {times[label]:.3f} ms", flush=True)
        except Exception as exc:  # report per line, keep going
            errors.append(f"{label}: {error_text(exc)}" if label else error_text(exc))
            if os.environ.get("EJK_BENCH_TRACEBACK"):
                traceback.print_exc()
    return times, errors


def row(case: str, mode: str, name: str, times: dict[str, float], errors: list[str], flops: float,
        base_ms: float | None, heuristic: str | None = None) -> str:
    """One table row: the best candidate (named), its rate and ratio to the baseline, the failures."""
    if not times:
        return f"| {case} | {mode} | {name} | failed | | | {'; '.join(errors)} |"
    label, ms = min(times.items(), key=lambda kv: kv[1])
    notes = [f"best: {label}" if heuristic is not None else label] if label else []
    if heuristic is not None and heuristic in times and len(times) > 1:
        notes.append(f"heuristic {times[heuristic]:,.3f} ms ({rate(flops, times[heuristic])} TFLOP/s)")
    if errors:
        notes.append(f"failed: {'; '.join(errors)}")
    ratio = f"{base_ms / ms:.2f}" if base_ms else ""
    return f"| {case} | {mode} | {name} | {ms:,.3f} | {rate(flops, ms)} | {ratio} | {'; '.join(notes)} |"


def cfg_label(cfg: Any) -> str:
    text = f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}"
    if getattr(cfg, "programs_per_sm", 1) != 1:
        text += f" p{cfg.programs_per_sm}"
    if getattr(cfg, "persistent", False):
        text += " persistent"
    return text + (f" g{cfg.group_m}" if hasattr(cfg, "group_m") else "")


def in_mode(fn: Callable[..., Any], args: tuple[Any, ...], diff: tuple[int, ...], mode: str,
            ct: jax.Array) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """``(fn, args)`` for ``fwd``; output plus the VJP of ``ct`` in one function for ``fwd+bwd``."""
    return (fn, args) if mode == "fwd" else (with_backward(fn, diff), (*args, ct))


def max_abs_diff(ours: tuple[Callable[..., Any], tuple[Any, ...]],
                 base: tuple[Callable[..., Any], tuple[Any, ...]]) -> str:
    """Max abs difference of every output leaf (and the baseline's max magnitude)."""
    try:
        got = jax.tree.leaves(jax.jit(ours[0])(*ours[1]))
        want = jax.tree.leaves(jax.jit(base[0])(*base[1]))
        diffs = []
        for g, w in zip(got, want, strict=True):
            g32, w32 = g.astype(jnp.float32), w.astype(jnp.float32)
            diffs.append(f"{float(jnp.max(jnp.abs(g32 - w32))):.3g} (max |ref| {float(jnp.max(jnp.abs(w32))):.3g})")
        return ", ".join(diffs)
    except Exception as exc:
        return f"check failed: {error_text(exc)}"


def bench_case(label: str, workload: Workload, ours: dict[str, Any], heuristic: Any, extra: dict[str, Any],
               reps: int, timer: Callable[..., float] = time_ms) -> tuple[list[str], list[str]]:
    """Rows of one case: ``ejk.bench``'s baselines, ``extra`` (name -> cfg of another ejk implementation
    through the public op) and the Triton configs ``ours`` (label -> cfg); then a numerics line."""
    inputs, ct = workload.inputs(), workload.cotangent()
    diff = workload.diff
    rows, checks = [], []
    for mode in MODES:
        flops = workload.work(mode)[0]
        print(f"{label} {mode}", flush=True)
        base_ms, lines = None, []
        for baseline in baselines_for(workload.op):
            why = baseline.unsupported(workload) if baseline.unsupported else None
            if why:
                lines.append(f"| {label} | {mode} | {baseline.name} | skipped | | | {why} |")
                continue
            prepared = baseline.build(workload, inputs)
            times, errors = timed({"": in_mode(prepared.fn, prepared.args, prepared.diff, mode, ct)}, reps, timer)
            if baseline.name == RATIO_BASE[workload.op]:
                base_ms = times.get("")
            lines.append((baseline.name, times, errors))  # type: ignore[arg-type]
        for name, (platform, cfg) in extra.items():
            times, errors = timed({"": in_mode(workload.call(platform=platform, cfg=cfg), inputs, diff, mode, ct)},
                                  reps, timer)
            lines.append((name, times, errors))  # type: ignore[arg-type]
        candidates = {cfg_label(c): in_mode(workload.call(platform="triton", cfg=c), inputs, diff, mode, ct)
                      for c in ours.values()}
        times, errors = timed(candidates, reps, timer)
        lines.append(("ejk triton", times, errors, cfg_label(heuristic)))  # type: ignore[arg-type]
        for line in lines:
            text = line if isinstance(line, str) else row(label, mode, line[0], line[1], line[2], flops, base_ms,
                                                           *line[3:])
            rows.append(text)
            print(text, flush=True)
    base = next(b for b in baselines_for(workload.op) if b.name == ("lax.ragged_dot" if workload.op ==
                                                                   "grouped_matmul" else "a @ b"))
    prepared = base.build(workload, inputs)
    checks.append(f"- {label} fwd+bwd (out and gradients), ejk triton heuristic vs {base.name}: " + max_abs_diff(
        in_mode(workload.call(platform="triton", cfg=heuristic), inputs, diff, "fwd+bwd", ct),
        in_mode(prepared.fn, prepared.args, prepared.diff, "fwd+bwd", ct)))
    return rows, checks


def configs(space: list[Any], heuristic: Any, which: str) -> dict[str, Any]:
    chosen = [heuristic] if which == "heuristic" else [heuristic, *(c for c in space if c != heuristic)]
    return {cfg_label(c): c for c in chosen}


def main() -> None:
    parser = _harness.parser(__doc__)
    parser.add_argument("--configs", choices=("heuristic", "space"), default="heuristic",
                        help="only the heuristic's config, or every config of the config space (best reported)")
    parser.add_argument("--only", choices=("all", "moe", "matmul"), default="all")
    _harness.add_timer_option(parser)
    args = _harness.parse(parser)
    timer = _harness.timer(args)
    lines = _harness.header(
        "MoE grouped matmul and matmul: ejk Triton kernels vs XLA", args,
        "bfloat16, precision 'default' (ejk bench's workloads and baselines); grouped FLOPs 2·m·k·n, fwd+bwd 3x; "
        "skewed groups: Dirichlet(alpha=1) split of m (seed 0); the dense einsum runs equal groups (same FLOPs); "
        "ratio = time of the dense einsum (MoE) or of XLA's a @ b (matmul) over the line's",
        f"ejk configs: {args.configs}; triton {_harness.version('triton')}, jax-triton "
        f"{_harness.version('jax-triton')}, ejk-triton {_harness.version('ejk-triton')}",
        case="case", rate="TFLOP/s",
    )
    lines[-2] = "| case | mode | implementation | ms | TFLOP/s | ratio | note |"
    lines[-1] = "| --- | --- | --- | ---: | ---: | ---: | --- |"
    print("\n".join(lines), flush=True)
    checks: list[str] = []
    if args.only in ("all", "moe"):
        xla_block = SMOKE_XLA_BLOCK if args.smoke else FULL_XLA_BLOCK
        for groups, case in (SMOKE_MOE if args.smoke else FULL_MOE).items():
            workload = workload_for(case, DTYPE)
            lhs, rhs, sizes = workload.inputs()
            heuristic = _grouped_matmul.heuristic_config(lhs, rhs, sizes)
            ours = configs(_grouped_matmul.config_space(lhs, rhs, sizes), heuristic, args.configs)
            label = f"g={case.experts} k={case.k} n={case.n} m={case.tokens} {groups} (groups " \
                    f"{int(sizes.min())}..{int(sizes.max())})"
            extra = {f"ejk xla tiled (block_m {xla_block})": ("xla", XlaGroupedConfig(block_m=xla_block))}
            rows, more = bench_case(label, workload, ours, heuristic, extra, args.reps, timer)
            lines += rows
            checks += more
    if args.only in ("all", "matmul"):
        case = SMOKE_MATMUL if args.smoke else FULL_MATMUL
        workload = workload_for(case, DTYPE)
        a, b = workload.inputs()
        heuristic = _matmul.heuristic_config(a, b)
        ours = configs(_matmul.config_space(a, b), heuristic, args.configs)
        rows, more = bench_case(f"matmul {case.m}x{case.k}x{case.n}", workload, ours, heuristic, {}, args.reps,
                                timer)
        lines += rows
        checks += more
    lines += ["", "Numerics: max abs diff (and max |ref|) of each ejk triton heuristic line against a baseline:",
              *checks]
    print("\n".join(lines[-len(checks) - 2:]), flush=True)
    _harness.write(lines, args, "triton_moe.md")


if __name__ == "__main__":
    main()
