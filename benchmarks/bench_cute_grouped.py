"""MoE grouped matmul on one Hopper GPU: ejk-cute's grouped wgmma kernel against XLA and ejk-triton, one run.

Inputs, FLOP counts and baselines are ``ejk.bench``'s (bf16, precision ``"default"``): ``lhs [m, k] x
rhs [g, k, n]``, 64 experts, k 2048, n 1536, 32768 tokens, ``equal`` groups and ``skewed`` ones (a
seeded Dirichlet split, every token assigned). Lines, same process and inputs:

- ``lax.ragged_dot`` (XLA) and ``dense einsum (equal groups)`` over ``[g, m/g, k] x [g, k, n]`` (the
  same FLOPs over equal groups: the target, an upper bound for skewed groups);
- ``ejk triton`` (``ejk.grouped_matmul(platform="triton")``, its heuristic), when ejk-triton and
  jax-triton are installed;
- ``ejk cute`` (``ejk.grouped_matmul(platform="cute")``, the heuristic's config; with ``--configs
  space`` every config of the space too, labelled, the best named);
- ``ejk cute fwd + triton bwd`` (fwd+bwd only, when ejk-triton is there): the CuTe forward paired
  with the Triton backward through the shared residuals (``ImplChoice(backward=...)``).

Modes ``fwd`` and ``fwd+bwd`` (output plus d lhs, d rhs in one jitted call). FLOPs ``2·m·k·n``,
fwd+bwd ``3x``. Ratio: the dense einsum's time over the line's. Timing: ``--timer`` (default
``span``: per call on the GPU's own timeline, ``_harness.span_ms``; ``loop``: the wall clock of
back-to-back calls, ``_harness.time_ms``, which counts host waits in jax-triton's launch). A failure is reported
on its line. Numerics below the table: the ejk cute heuristic line's output and gradients against
``lax.ragged_dot`` (max abs diff).

Usage (on the GPU host, CuTe DSL importable):
    python benchmarks/bench_cute_grouped.py                    # heuristic configs (~2 min)
    python benchmarks/bench_cute_grouped.py --configs space    # every config of the space (~2 min more)
    python benchmarks/bench_cute_grouped.py --smoke            # tiny shapes (the ejk lines need a GPU)

Output: ``$OUT/cute_grouped.md`` when ``OUT`` is set, else ``benchmarks/results/cute_grouped.md``.
"""

from __future__ import annotations

import importlib.util
import traceback
from collections.abc import Callable
from typing import Any

import _harness
import jax
import jax.numpy as jnp
from _harness import error_text

import ejk
from ejk.bench import MoeCase, Workload, baselines_for, workload_for
from ejk.bench._workloads import with_backward
from ejk_cute import _grouped_matmul

DTYPE = jnp.bfloat16
MODES = ("fwd", "fwd+bwd")
FULL = {groups: MoeCase(experts=64, k=2048, n=1536, tokens=32768, skewed=groups == "skewed")
        for groups in ("equal", "skewed")}
SMOKE = {groups: MoeCase(experts=4, k=64, n=32, tokens=256, skewed=groups == "skewed")
         for groups in ("equal", "skewed")}
RATIO_BASE = "dense einsum (equal groups)"
HAVE_TRITON = all(importlib.util.find_spec(m) is not None for m in ("ejk_triton", "jax_triton"))


def _label(cfg: Any) -> str:
    return f"{cfg.tile_m}x{cfg.tile_n} cluster {cfg.cluster_m}x1 stages {cfg.stages}"


def _pairing(cfg: Any) -> Any:
    """The CuTe forward with ejk-triton's backward (both save ``"grouped_matmul:inputs"``)."""
    return ejk.ImplChoice(platform="cute", backend="gpu", implementation="grouped", cfg=cfg,
                          backward=ejk.ImplChoice(platform="triton", backend="gpu", implementation="persistent"))


def _row(case: str, mode: str, name: str, ms: float | None, flops: float, base_ms: float | None,
         note: str = "") -> str:
    if ms is None:
        return f"| {case} | {mode} | {name} | failed | | | {note} |"
    ratio = f"{base_ms / ms:.2f}" if base_ms else ""
    return f"| {case} | {mode} | {name} | {ms:.3f} | {flops / ms / 1e9:,.1f} | {ratio} | {note} |"


def _timed(fn: Callable[..., Any], args: tuple[Any, ...], run: Any) -> tuple[float | None, str]:
    """``fn(*args)`` timed by ``run``'s ``--timer``, ``--reps`` samples; on failure the error, for its line."""
    try:
        return _harness.timer(run)(fn, args, run.reps), ""
    except Exception as exc:  # reported on its line
        traceback.print_exc()
        return None, error_text(exc)


def _max_abs_diff(ours: tuple[Callable[..., Any], tuple[Any, ...]],
                  base: tuple[Callable[..., Any], tuple[Any, ...]]) -> str:
    try:
        got = jax.tree.leaves(jax.jit(ours[0])(*ours[1]))
        want = jax.tree.leaves(jax.jit(base[0])(*base[1]))
        parts = []
        for g, w in zip(got, want, strict=True):
            g32, w32 = g.astype(jnp.float32), w.astype(jnp.float32)
            parts.append(f"{float(jnp.max(jnp.abs(g32 - w32))):.3g} (max |ref| {float(jnp.max(jnp.abs(w32))):.3g})")
        return ", ".join(parts)
    except Exception as exc:
        return f"check failed: {error_text(exc)}"


def bench_case(label: str, workload: Workload, args: Any) -> tuple[list[str], str]:
    inputs, ct = workload.inputs(), workload.cotangent()
    lhs, rhs, sizes = inputs
    heuristic = _grouped_matmul.heuristic_config(lhs, rhs, sizes)
    space = [heuristic]
    if args.configs == "space":
        space += [c for c in _grouped_matmul.config_space(lhs, rhs, sizes) if c != heuristic]
    unavailable = _grouped_matmul.capability(lhs, rhs, sizes)
    rows: list[str] = []

    def in_mode(fn: Callable[..., Any], diff: tuple[int, ...], args_: tuple[Any, ...],
                mode: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return (fn, args_) if mode == "fwd" else (with_backward(fn, diff), (*args_, ct))

    for mode in MODES:
        flops = workload.work(mode)[0]
        print(f"{label} {mode}", flush=True)
        base_ms = None
        lines: list[tuple[str, float | None, str]] = []
        for baseline in baselines_for(workload.op):
            why = baseline.unsupported(workload) if baseline.unsupported else None
            if why:
                lines.append((baseline.name, None, f"skipped: {why}"))
                continue
            prepared = baseline.build(workload, inputs)
            ms, err = _timed(*in_mode(prepared.fn, prepared.diff, prepared.args, mode), args)
            base_ms = ms if baseline.name == RATIO_BASE else base_ms
            lines.append((baseline.name, ms, err))
        if HAVE_TRITON:
            ms, err = _timed(*in_mode(workload.call(platform="triton"), workload.diff, inputs, mode), args)
            lines.append(("ejk triton", ms, err or "heuristic"))
        if unavailable:
            lines.append(("ejk cute", None, f"unavailable: {unavailable}"))
        else:
            best: tuple[float, str] | None = None
            for cfg in space:
                name = "ejk cute" + (" (heuristic)" if cfg == heuristic and len(space) > 1 else "")
                ms, err = _timed(*in_mode(workload.call(platform="cute", cfg=cfg), workload.diff, inputs, mode), args)
                lines.append((name, ms, f"{_label(cfg)}{'; ' + err if err else ''}"))
                if ms is not None:
                    best = min(best or (ms, ""), (ms, _label(cfg)))
            if best is not None and len(space) > 1:
                lines.append(("ejk cute (best)", best[0], best[1]))
            if HAVE_TRITON and mode == "fwd+bwd":
                ms, err = _timed(*in_mode(workload.call(platform="cute", cfg=_pairing(heuristic)), workload.diff,
                                          inputs, mode), args)
                lines.append(("ejk cute fwd + triton bwd", ms, err or _label(heuristic)))
        for name, ms, note in lines:
            text = _row(label, mode, name, ms, flops, base_ms, note)
            rows.append(text)
            print(text, flush=True)
    check = "unavailable"
    if not unavailable:
        base = next(b for b in baselines_for(workload.op) if b.name == "lax.ragged_dot")
        prepared = base.build(workload, inputs)
        check = _max_abs_diff(in_mode(workload.call(platform="cute", cfg=heuristic), workload.diff, inputs, "fwd+bwd"),
                              in_mode(prepared.fn, prepared.diff, prepared.args, "fwd+bwd"))
    return rows, f"- {label} fwd+bwd (out, d lhs, d rhs), ejk cute heuristic vs lax.ragged_dot: {check}"


def main() -> None:
    parser = _harness.parser(__doc__)
    parser.add_argument("--configs", choices=("heuristic", "space"), default="heuristic",
                        help="only the heuristic's config, or every config of the config space (best named)")
    _harness.add_timer_option(parser)
    args = _harness.parse(parser)
    lines = _harness.header(
        "MoE grouped matmul: ejk-cute (CuTe DSL grouped wgmma) vs XLA and ejk-triton", args,
        "bfloat16, precision 'default' (ejk bench's workloads and baselines); FLOPs 2·m·k·n, fwd+bwd 3x; skewed "
        "groups: Dirichlet(alpha=1) split of m (seed 0); the dense einsum runs equal groups (same FLOPs); "
        "ratio = the dense einsum's time over the line's",
        f"nvidia-cutlass-dsl {_harness.version('nvidia-cutlass-dsl')}, ejk-cute {_harness.version('ejk-cute')}, "
        f"ejk-triton {_harness.version('ejk-triton') if HAVE_TRITON else 'not installed'}; configs: {args.configs}",
        rate="TFLOP/s",
    )
    lines[-2] = "| case | mode | implementation | ms | TFLOP/s | ratio | note |"
    lines[-1] = "| --- | --- | --- | ---: | ---: | ---: | --- |"
    print("\n".join(lines), flush=True)
    checks = []
    for groups, case in (SMOKE if args.smoke else FULL).items():
        workload = workload_for(case, DTYPE)
        sizes = workload.inputs()[2]
        label = (f"g={case.experts} k={case.k} n={case.n} m={case.tokens} {groups} "
                 f"(groups {int(sizes.min())}..{int(sizes.max())})")
        rows, check = bench_case(label, workload, args)
        lines += rows
        checks.append(check)
    lines += ["", "Numerics: max abs diff (and max |ref|), output then gradients:", *checks]
    print("\n".join(lines[-len(checks) - 2:]), flush=True)
    _harness.write(lines, args, "cute_grouped.md")


if __name__ == "__main__":
    main()
