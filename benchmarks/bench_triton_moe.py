"""MoE grouped matmul and dense matmul on one GPU: ejk's Triton kernels against XLA baselines.

Lines (same process, same inputs, bf16):

- grouped matmul ``lhs [m, k] x rhs [g, k, n]`` (64 experts, k 2048, n 1536, 32768 tokens) with
  ``equal`` groups and ``skewed`` ones (a seeded Dirichlet split, every token assigned):
  ``ejk triton`` (``ejk.grouped_matmul(platform="triton")``, each config of ``--configs``, the best
  named, the heuristic's time in the note), ``dense einsum`` over ``[g, m/g, k] x [g, k, n]`` (equal
  groups, same FLOPs: the target, an upper bound, not the same maths for skewed groups),
  ``lax.ragged_dot`` and ``ejk xla tiled`` (ejk-xla's scan, block_m 512); ``fwd`` and ``fwd+bwd``
  (output plus d lhs, d rhs of ``sum(out * cotangent)`` in one jitted call). FLOPs ``2·m·k·n``,
  fwd+bwd ``3x``. Ratio: TFLOP/s over the dense einsum's (target >= 0.8 on an H100).
- matmul ``8192³``: ``ejk triton`` (``ejk.matmul(platform="triton")``, configs as above) against
  ``a @ b`` (XLA, cuBLAS); ratio over XLA's (target >= 0.9).

Timing: ``_harness.time_ms`` (compile, two warm-ups, median of ``--reps`` samples of back-to-back
calls). A failure is reported on its line. Numerics: each Triton line's heuristic config against
its baseline (max abs diff), below the table.

Usage (on the GPU host, with jax-triton importable):
    python benchmarks/bench_triton_moe.py                     # heuristic configs only
    python benchmarks/bench_triton_moe.py --configs space     # every config of the config spaces
    EJK_TRITON_INTERPRET=1 python benchmarks/bench_triton_moe.py --smoke   # CPU, interpreter

Output: ``$OUT/triton_moe.md`` when ``OUT`` is set, else ``benchmarks/results/triton_moe.md``.
"""

from __future__ import annotations

import math
import os
import traceback
from collections.abc import Callable
from typing import Any

import _harness
import attrs
import jax
import jax.numpy as jnp
import numpy as np
from _harness import error_text, time_ms
from bench_moe_paged_gpu import dense_equal_groups, dirichlet_sizes, gmm_with_backward, max_abs_diff, ragged_dot

import ejk
from ejk_triton import _grouped_matmul, _matmul
from ejk_xla._grouped_matmul import GroupedMatmulConfig as XlaGroupedConfig
from ejk_xla._grouped_matmul import grouped_matmul as xla_grouped_matmul

DTYPE = jnp.bfloat16
MODES = (("fwd", 1.0), ("fwd+bwd", 3.0))


@attrs.frozen(kw_only=True)
class MoeShape:
    experts: int
    k: int
    n: int
    tokens: int

    def __str__(self) -> str:
        return f"g={self.experts} k={self.k} n={self.n} m={self.tokens}"

    def flops(self) -> float:
        return 2.0 * self.tokens * self.k * self.n


FULL_MOE = MoeShape(experts=64, k=2048, n=1536, tokens=32768)
SMOKE_MOE = MoeShape(experts=4, k=64, n=32, tokens=256)
FULL_MATMUL, SMOKE_MATMUL = 8192, 64
FULL_XLA_BLOCK, SMOKE_XLA_BLOCK = 512, 32


def rate(flops: float, ms: float) -> str:
    value = flops / ms / 1e9
    return f"{value:,.1f}" if value >= 1 else f"{value:.4f}"


def timed(candidates: dict[str, Callable[..., Any]], args: tuple[Any, ...], reps: int) -> tuple[dict[str, float],
                                                                                                  list[str]]:
    """Milliseconds per candidate (label -> fn of ``args``) and the failures."""
    times: dict[str, float] = {}
    errors: list[str] = []
    for label, fn in candidates.items():
        try:
            times[label] = time_ms(fn, args, reps)
            print(f"  {label}: {times[label]:.3f} ms", flush=True)
        except Exception as exc:  # report per line, keep going
            errors.append(f"{label}: {error_text(exc)}" if label else error_text(exc))
            if os.environ.get("EJK_BENCH_TRACEBACK"):
                traceback.print_exc()
    return times, errors


def row(case: str, mode: str, name: str, times: dict[str, float], errors: list[str], flops: float,
        base_ms: float | None, heuristic: str | None = None) -> str:
    """One table row: the best candidate (named when there are several), its rate and ratio, failures."""
    if not times:
        return f"| {case} | {mode} | {name} | failed | | | {'; '.join(errors)} |"
    label, ms = min(times.items(), key=lambda kv: kv[1])
    notes = [f"best: {label}"] if len(times) > 1 or heuristic else ([label] if label else [])
    if heuristic is not None and heuristic in times and len(times) > 1:
        notes.append(f"heuristic {times[heuristic]:,.3f} ms ({rate(flops, times[heuristic])} TFLOP/s)")
    if errors:
        notes.append(f"failed: {'; '.join(errors)}")
    ratio = f"{base_ms / ms:.2f}" if base_ms else ""
    return f"| {case} | {mode} | {name} | {ms:,.3f} | {rate(flops, ms)} | {ratio} | {'; '.join(notes)} |"


def gmm_label(cfg: Any) -> str:
    return (f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}"
            + (f" p{cfg.programs_per_sm}" if getattr(cfg, "programs_per_sm", 1) != 1 else "")
            + (f" g{cfg.group_m}" if hasattr(cfg, "group_m") else ""))


def triton_gmm(cfg: _grouped_matmul.GroupedMatmulConfig) -> Callable[..., jax.Array]:
    return lambda lhs, rhs, sizes: ejk.grouped_matmul(lhs, rhs, sizes, platform="triton", cfg=cfg)


def xla_tiled(block_m: int) -> Callable[..., jax.Array]:
    return lambda lhs, rhs, sizes: xla_grouped_matmul(lhs, rhs, sizes, cfg=XlaGroupedConfig(block_m=block_m))


def configs(space: list[Any], heuristic: Any, which: str) -> list[Any]:
    return [heuristic] if which == "heuristic" else [heuristic, *(c for c in space if c != heuristic)]


def bench_moe(shape: MoeShape, groups: str, which: str, xla_block: int, reps: int) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(0)
    if groups == "equal":
        sizes = np.full(shape.experts, shape.tokens // shape.experts, np.int32)
    else:
        sizes = dirichlet_sizes(rng, shape.tokens, shape.experts)
    lhs = jnp.asarray(rng.standard_normal((shape.tokens, shape.k), dtype=np.float32)).astype(DTYPE)
    rhs = jnp.asarray(rng.standard_normal((shape.experts, shape.k, shape.n), dtype=np.float32) / math.sqrt(shape.k))
    rhs = rhs.astype(DTYPE)
    ct = jnp.asarray(rng.standard_normal((shape.tokens, shape.n), dtype=np.float32)).astype(DTYPE)
    group_sizes = jnp.asarray(sizes)
    fwd_args, bwd_args = (lhs, rhs, group_sizes), (lhs, rhs, group_sizes, ct)
    case = f"{shape} {groups} (groups {int(sizes.min())}..{int(sizes.max())})"
    heuristic = _grouped_matmul.heuristic_config(lhs, rhs, group_sizes)
    ours = {gmm_label(c): triton_gmm(c) for c in
            configs(_grouped_matmul.config_space(lhs, rhs, group_sizes), heuristic, which)}
    baselines = (("dense einsum", {"": dense_equal_groups}), ("lax.ragged_dot", {"": ragged_dot}),
                 ("ejk xla tiled", {f"block_m {xla_block}": xla_tiled(xla_block)}))
    rows = []
    for mode, factor in MODES:
        args = fwd_args if mode == "fwd" else bwd_args
        flops = shape.flops() * factor
        wrap = (lambda f: f) if mode == "fwd" else gmm_with_backward
        print(f"{case} {mode}", flush=True)
        dense_times, dense_errors = timed({"": wrap(dense_equal_groups)}, args, reps)
        base = dense_times.get("")
        for name, cands in baselines:
            times, errors = (dense_times, dense_errors) if name == "dense einsum" else timed(
                {label: wrap(fn) for label, fn in cands.items()}, args, reps)
            rows.append(row(case, mode, name, times, errors, flops, base))
        times, errors = timed({label: wrap(fn) for label, fn in ours.items()}, args, reps)
        rows.append(row(case, mode, "ejk triton", times, errors, flops, base, gmm_label(heuristic)))
        print("\n".join(rows[-len(baselines) - 1:]), flush=True)
    first = triton_gmm(heuristic)
    checks = [f"- {case} fwd+bwd (out, d lhs, d rhs), ejk triton heuristic vs lax.ragged_dot: "
              + max_abs_diff(gmm_with_backward(first), gmm_with_backward(ragged_dot), bwd_args)]
    return rows, checks


def with_backward(fn: Callable[..., jax.Array]) -> Callable[..., Any]:
    def run(a: jax.Array, b: jax.Array, ct: jax.Array) -> Any:
        out, vjp = jax.vjp(fn, a, b)
        return out, vjp(ct)

    return run


def bench_matmul(size: int, which: str, reps: int) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(1)
    a = jnp.asarray(rng.standard_normal((size, size), dtype=np.float32)).astype(DTYPE)
    b = jnp.asarray(rng.standard_normal((size, size), dtype=np.float32) / math.sqrt(size)).astype(DTYPE)
    ct = jnp.asarray(rng.standard_normal((size, size), dtype=np.float32)).astype(DTYPE)
    case = f"matmul {size}x{size}x{size}"
    heuristic = _matmul.heuristic_config(a, b)

    def triton_mm(cfg: _matmul.MatmulConfig) -> Callable[..., jax.Array]:
        return lambda a, b: ejk.matmul(a, b, platform="triton", cfg=cfg)

    def xla(a: jax.Array, b: jax.Array) -> jax.Array:
        return a @ b

    ours = {gmm_label(c): triton_mm(c) for c in configs(_matmul.config_space(a, b), heuristic, which)}
    rows = []
    for mode, factor in MODES:
        args: tuple[jax.Array, ...] = (a, b) if mode == "fwd" else (a, b, ct)
        wrap = (lambda f: f) if mode == "fwd" else with_backward
        flops = 2.0 * size**3 * factor
        print(f"{case} {mode}", flush=True)
        base_times, base_errors = timed({"": wrap(xla)}, args, reps)
        base = base_times.get("")
        rows.append(row(case, mode, "xla a @ b", base_times, base_errors, flops, base))
        times, errors = timed({label: wrap(fn) for label, fn in ours.items()}, args, reps)
        rows.append(row(case, mode, "ejk triton", times, errors, flops, base, gmm_label(heuristic)))
        print("\n".join(rows[-2:]), flush=True)
    checks = [f"- {case} fwd+bwd (out, d a, d b), ejk triton heuristic vs a @ b: "
              + max_abs_diff(with_backward(triton_mm(heuristic)), with_backward(xla), (a, b, ct))]
    return rows, checks


def main() -> None:
    parser = _harness.parser(__doc__)
    parser.add_argument("--configs", choices=("heuristic", "space"), default="heuristic",
                        help="only the heuristic's config, or every config of the config space (best reported)")
    parser.add_argument("--only", choices=("all", "moe", "matmul"), default="all")
    args = _harness.parse(parser)
    lines = _harness.header(
        "MoE grouped matmul and matmul: ejk Triton kernels vs XLA", args,
        "bfloat16; grouped FLOPs 2·m·k·n, fwd+bwd 3x; skewed groups: Dirichlet(alpha=1) split of m (seed 0); "
        "the dense einsum runs equal groups (same FLOPs); ratio = TFLOP/s over the dense einsum's (MoE) or "
        "XLA's a @ b (matmul)",
        f"ejk configs: {args.configs}; triton {_harness.version('triton')}, jax-triton "
        f"{_harness.version('jax-triton')}, ejk-triton {_harness.version('ejk-triton')}",
        case="case", rate="TFLOP/s",
    )
    lines[-2] = "| case | mode | implementation | ms | TFLOP/s | ratio | note |"
    lines[-1] = "| --- | --- | --- | ---: | ---: | ---: | --- |"
    print("\n".join(lines), flush=True)
    checks: list[str] = []
    if args.only in ("all", "moe"):
        shape = SMOKE_MOE if args.smoke else FULL_MOE
        for groups in ("equal", "skewed"):
            rows, more = bench_moe(shape, groups, args.configs, SMOKE_XLA_BLOCK if args.smoke else FULL_XLA_BLOCK,
                                   args.reps)
            lines += rows
            checks += more
    if args.only in ("all", "matmul"):
        rows, more = bench_matmul(SMOKE_MATMUL if args.smoke else FULL_MATMUL, args.configs, args.reps)
        lines += rows
        checks += more
    lines += ["", "Numerics: max abs diff (and max |ref|) of each ejk triton heuristic line against its baseline:",
              *checks]
    print("\n".join(lines[-len(checks) - 2:]), flush=True)
    _harness.write(lines, args, "triton_moe.md")


if __name__ == "__main__":
    main()
