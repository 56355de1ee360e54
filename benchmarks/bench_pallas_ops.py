"""ejk-pallas's ragged_paged_attention, grouped_matmul and matmul (Triton-lowered and Mosaic GPU) on one GPU,
in one run.

Sections (bf16, same process; the report is rewritten as results come, so a timeout keeps them):

- paged decode: batch 8 / 16 / 64, context 2k / 8k / 16k, 32 q heads over 8 kv heads, D = 128,
  page 64 (plus page 16 at batch 16): GB/s of KV cache read (``2·B·ctx·Hkv·D·2`` bytes) and the
  fraction of 3.0 TB/s (what an H100 copies); ``ejk triton`` lines for reference (``ejk xla`` at 8k);
- grouped_matmul forward: 64 experts, k = 2048, n = 1536, 32k tokens, equal and skewed groups
  (a Zipf-like split with empty experts), against a dense batched einsum over equal groups
  (``[64, 512, 2048] x [64, 2048, 1536]``, the ratio's base), ``jax.lax.ragged_dot`` and (with the
  ``mosaic`` implementation) jax's own Mosaic GPU ragged dot; plus the heuristic's forward+backward;
- matmul 8192³, both implementations (Triton-lowered and Mosaic GPU), forward and the heuristic's
  forward+backward: against XLA's ``a @ b`` and its gradient.

Each ejk-pallas line is the best of the heuristic's config and the next ``--configs`` entries of
the config space (the heuristic's time is in the note). Timing: ``--timer span`` (the default,
``_harness.span_ms``: per-call time on the GPU's own timeline) or ``loop`` (``_harness.time_ms``:
wall time of back-to-back calls), median of ``--reps`` samples; the paged decode, whose kernels are
shorter than a host dispatch (about 40 µs), by ``_harness.device_ms`` (20 dependent calls in one
program, so the host is out of the way; each call adds one tiny elementwise op on q).

Usage (GPU host): ``python benchmarks/bench_pallas_ops.py`` (about 3 minutes on an H100, estimated);
``EJK_PALLAS_INTERPRET=1 JAX_PLATFORMS=cpu python benchmarks/bench_pallas_ops.py --smoke`` on a CPU.
Output: ``$OUT/pallas_ops.md`` (else ``benchmarks/results/pallas_ops.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import _harness
import jax
import jax.numpy as jnp
import numpy as np
from _harness import error_text

import ejk
from ejk_pallas import _grouped_matmul, _grouped_matmul_mgpu, _matmul, _matmul_mgpu, _paged_attention

HBM_GBS = 3000.0  # an H100 SXM copies about 3.0 TB/s
PAGED = [(b, c, 64) for b in (8, 16, 64) for c in (2048, 8192, 16384)] + [(16, 8192, 16)]
SMOKE_PAGED = [(2, 64, 16)]


def pallas(cfg: Any, implementation: str = "triton_lowered") -> ejk.ImplChoice:
    backend = "gpu" if jax.default_backend() == "gpu" else "cpu"
    return ejk.ImplChoice(platform="pallas", backend=backend, implementation=implementation, cfg=cfg)


def grouped_label(cfg: Any) -> str:
    if isinstance(cfg, _grouped_matmul_mgpu.MosaicGroupedMatmulConfig):
        return f"mosaic 128x{cfg.block_n}x64/{cfg.split}/c{cfg.cluster}/s{cfg.stages}"
    return f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k}/w{cfg.num_warps}/s{cfg.num_stages}"


#: grouped_matmul's implementations: (name, module with its config space).
GROUPED_IMPLS = {"triton_lowered": _grouped_matmul, "mosaic": _grouped_matmul_mgpu}


def best(candidates: list[tuple[str, Callable[..., Any]]], args: tuple[Any, ...],
         reps: int, timer: Callable[..., float] = _harness.time_ms) -> tuple[str, float, str]:
    """``(label, ms, note)`` of the fastest candidate; the note has the first (heuristic) one's time and failures."""
    times: dict[str, float] = {}
    errors: list[str] = []
    for label, fn in candidates:
        try:
            times[label] = timer(fn, args, reps)
        except Exception as exc:
            errors.append(f"{label}: {error_text(exc)}")
    if not times:
        return "-", float("nan"), "; ".join(errors)
    label = min(times, key=lambda k: times[k])
    first = candidates[0][0]
    note = f"heuristic {first}: {times[first]:.3f} ms" if first in times else ""
    return label, times[label], "; ".join([note, *errors[:2]]).strip("; ")


def timed(fn: Callable[..., Any], args: tuple[Any, ...], reps: int,
          timer: Callable[..., float] = _harness.time_ms) -> tuple[float, str]:
    try:
        return timer(fn, args, reps), ""
    except Exception as exc:
        return float("nan"), error_text(exc)


def paged_inputs(b: int, ctx: int, page: int, hq: int, hkv: int, d: int) -> tuple[Any, ...]:
    per_seq = ctx // page
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (b, hq, d), jnp.bfloat16)
    k = jax.random.normal(keys[1], (b * per_seq, page, hkv, d), jnp.bfloat16)
    v = jax.random.normal(keys[2], (b * per_seq, page, hkv, d), jnp.bfloat16)
    table = jnp.asarray(np.random.default_rng(0).permutation(b * per_seq).reshape(b, per_seq).astype(np.int32))
    return (q, k, v, jnp.full((b,), ctx, jnp.int32), table, jnp.arange(b + 1, dtype=jnp.int32), jnp.int32(b))


def paged_section(args: Any, lines: list[str]) -> None:
    hq, hkv, d = (4, 2, 16) if args.smoke else (32, 8, 128)
    for b, ctx, page in SMOKE_PAGED if args.smoke else PAGED:
        inputs = paged_inputs(b, ctx, page, hq, hkv, d)
        gbytes = 2.0 * b * ctx * hkv * d * 2 / 1e9
        space = _paged_attention.config_space(*inputs)[: 1 + args.configs]
        cands = [(f"kv{c.block_kv}/z{c.num_splits}/s{c.num_stages}/w{c.num_warps}",
                  lambda *a, c=c: ejk.ragged_paged_attention(*a, platform="pallas", cfg=pallas(c))) for c in space]
        label, ms, note = best(cands, inputs, args.reps, _harness.device_ms)
        case = f"B={b} ctx={ctx} page={page}"
        rate = gbytes / (ms * 1e-3)
        lines.append(f"| {case} | decode | ejk pallas ({label}) | {ms:.3f} | {rate:.0f} GB/s "
                     f"({100 * rate / HBM_GBS:.0f}% HBM) | {note} |")
        others = () if args.smoke else ("triton", "xla") if ctx == 8192 and page == 64 else ("triton",)
        for platform in others:
            ms2, err = timed(lambda *a, p=platform: ejk.ragged_paged_attention(*a, platform=p), inputs, args.reps,
                             _harness.device_ms)
            lines.append(f"| {case} | decode | ejk {platform} | {ms2:.3f} | {gbytes / (ms2 * 1e-3):.0f} GB/s | {err} |")
        _harness.write(lines, args, "pallas_ops.md")  # after each shape: a timeout keeps what was measured


def grouped_sizes(m: int, g: int, skewed: bool) -> np.ndarray:
    if not skewed:
        return np.full(g, m // g, np.int64)
    weights = 1.0 / np.arange(1, g + 1) ** 1.1
    weights[g // 2::7] = 0.0  # some experts get no token
    sizes = np.floor(weights / weights.sum() * m).astype(np.int64)
    sizes[0] += m - sizes.sum()
    return np.random.default_rng(0).permutation(sizes)


#: Configs of jax's own Mosaic GPU ragged dot timed as a baseline: (block_m, block_n, max steps, grid_block_n).
JAX_MOSAIC_RAGGED_DOT = ((128, 128, 4, 4), (128, 192, 4, 4), (128, 128, 5, 2))


def jax_mosaic_ragged_dot(gs: jax.Array) -> list[tuple[str, Callable[..., Any]]]:
    """jax's example Hopper ragged dot (``jax.experimental.pallas.ops.gpu.ragged_dot_mgpu``), a baseline."""
    from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu

    return [(f"{bm}x{bn}x64/s{steps}/g{gb}", lambda x, w, bm=bm, bn=bn, steps=steps, gb=gb: ragged_dot_mgpu.ragged_dot(
        x, w, group_sizes=gs, block_m=bm, block_n=bn, block_k=64, max_concurrent_steps=steps, grid_block_n=gb))
        for bm, bn, steps, gb in JAX_MOSAIC_RAGGED_DOT]


def grouped_section(args: Any, lines: list[str]) -> None:
    m, k, n, g = (64, 128, 128, 4) if args.smoke else (32768, 2048, 1536, 64)
    keys = jax.random.split(jax.random.key(1), 2)
    lhs = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
    rhs = jax.random.normal(keys[1], (g, k, n), jnp.bfloat16) * 0.02
    flops = 2.0 * m * k * n
    case = f"m={m} k={k} n={n} g={g}"
    clock = _harness.timer(args)
    dense_ms, err = timed(lambda x, w: jnp.einsum("gmk,gkn->gmn", x.reshape(g, m // g, k), w,
                                                  preferred_element_type=jnp.bfloat16), (lhs, rhs), args.reps, clock)
    lines.append(f"| {case} | dense einsum | jnp.einsum (equal groups) | {dense_ms:.3f} | "
                 f"{flops / dense_ms / 1e9:.0f} TFLOP/s | {err} |")
    for skewed in (False, True):
        gs = jnp.asarray(grouped_sizes(m, g, skewed), jnp.int32)
        mode = "skewed" if skewed else "equal"
        for impl in args.grouped_impls.split(","):
            space = GROUPED_IMPLS[impl].config_space(lhs, rhs, gs)[: 1 + args.configs]
            cands = [(grouped_label(c), lambda x, w, c=c, gs=gs, i=impl: ejk.grouped_matmul(
                x, w, gs, platform="pallas", cfg=pallas(c, i))) for c in space]
            label, ms, note = best(cands, (lhs, rhs), args.reps, clock)
            lines.append(f"| {case} | fwd {mode} | ejk pallas ({label}) | {ms:.3f} | {flops / ms / 1e9:.0f} TFLOP/s "
                         f"({dense_ms / ms:.2f}x dense) | {note} |")

            def fwd_bwd(x: jax.Array, w: jax.Array, gs: jax.Array = gs, cfg: Any = space[0], i: str = impl) -> Any:
                out, vjp = jax.vjp(lambda x, w: ejk.grouped_matmul(x, w, gs, platform="pallas", cfg=pallas(cfg, i)),
                                   x, w)
                return vjp(out)

            ms2, err = timed(fwd_bwd, (lhs, rhs), args.reps, clock)
            lines.append(f"| {case} | fwd+bwd {mode} | ejk pallas {impl} (heuristic) | {ms2:.3f} | "
                         f"{3 * flops / ms2 / 1e9:.0f} TFLOP/s | {err} |")
            _harness.write(lines, args, "pallas_ops.md")
        if not args.smoke and "mosaic" in args.grouped_impls:
            label, ms4, note = best(jax_mosaic_ragged_dot(gs), (lhs, rhs), args.reps, clock)
            lines.append(f"| {case} | fwd {mode} | jax's Pallas ragged_dot_mgpu ({label}) | {ms4:.3f} | "
                         f"{flops / ms4 / 1e9:.0f} TFLOP/s ({dense_ms / ms4:.2f}x dense) | {note} |")
        if not args.smoke:
            ms3, err = timed(lambda x, w, gs=gs: jax.lax.ragged_dot(x, w, gs), (lhs, rhs), args.reps, clock)
            lines.append(f"| {case} | fwd {mode} | jax.lax.ragged_dot | {ms3:.3f} | {flops / ms3 / 1e9:.0f} TFLOP/s "
                         f"| {err} |")


def matmul_label(cfg: Any) -> str:
    if isinstance(cfg, _matmul_mgpu.MosaicMatmulConfig):
        return (f"mosaic {cfg.block_m}x{cfg.block_n}/{cfg.split}/c{cfg.cluster}/s{cfg.stages}/"
                f"{cfg.order}{cfg.band}")
    return f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k}/g{cfg.group_m}/w{cfg.num_warps}/s{cfg.num_stages}"


#: matmul's implementations: (name, module with its config space).
MATMUL_IMPLS = {"triton_lowered": _matmul, "mosaic": _matmul_mgpu}


def fwd_bwd_of(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``(a, b) -> (d a, d b)`` of ``fn`` with a cotangent of ones (forward and backward in one program)."""
    def run(a: jax.Array, b: jax.Array) -> Any:
        out, vjp = jax.vjp(fn, a, b)
        return vjp(jnp.ones_like(out))

    return run


def matmul_section(args: Any, lines: list[str]) -> None:
    size = 64 if args.smoke else 8192
    keys = jax.random.split(jax.random.key(2), 2)
    a = jax.random.normal(keys[0], (size, size), jnp.bfloat16)
    b = jax.random.normal(keys[1], (size, size), jnp.bfloat16)
    flops = 2.0 * size**3
    case = f"{size}^3"
    clock = _harness.timer(args)
    xla_ms, err = timed(lambda a, b: a @ b, (a, b), args.reps, clock)
    lines.append(f"| {case} | fwd | XLA a @ b | {xla_ms:.3f} | {flops / xla_ms / 1e9:.0f} TFLOP/s | {err} |")
    xla_bwd_ms, err = timed(fwd_bwd_of(lambda a, b: a @ b), (a, b), args.reps, clock)
    lines.append(f"| {case} | fwd+bwd | XLA a @ b | {xla_bwd_ms:.3f} | {3 * flops / xla_bwd_ms / 1e9:.0f} TFLOP/s "
                 f"| {err} |")
    for impl in args.matmul_impls.split(","):
        module = MATMUL_IMPLS[impl]
        space = module.config_space(a, b)[: 1 + args.configs]
        cands = [(matmul_label(c), lambda a, b, c=c, i=impl: ejk.matmul(a, b, platform="pallas", precision="default",
                                                                       cfg=pallas(c, i)))
                 for c in space]
        label, ms, note = best(cands, (a, b), args.reps, clock)
        lines.append(f"| {case} | fwd | ejk pallas ({label}) | {ms:.3f} | {flops / ms / 1e9:.0f} TFLOP/s "
                     f"({xla_ms / ms:.2f}x a @ b) | {note} |")
        bwd_ms, err = timed(fwd_bwd_of(lambda a, b, i=impl: ejk.matmul(a, b, platform="pallas", precision="default",
                                                                      cfg=pallas(None, i))), (a, b), args.reps, clock)
        lines.append(f"| {case} | fwd+bwd | ejk pallas {impl} (heuristic) | {bwd_ms:.3f} | "
                     f"{3 * flops / bwd_ms / 1e9:.0f} TFLOP/s ({xla_bwd_ms / bwd_ms:.2f}x a @ b) | {err} |")


def main() -> None:
    p = _harness.parser(__doc__)
    p.add_argument("--configs", type=int, default=2, help="config-space entries timed after the heuristic's")
    p.add_argument("--sections", default="matmul,grouped,paged", help="comma-separated: matmul, grouped, paged")
    p.add_argument("--matmul-impls", default="triton_lowered,mosaic",
                   help="comma-separated matmul implementations: triton_lowered, mosaic (Hopper)")
    p.add_argument("--grouped-impls", default="triton_lowered,mosaic",
                   help="comma-separated grouped_matmul implementations: triton_lowered, mosaic (Hopper)")
    _harness.add_timer_option(p)
    args = _harness.parse(p)
    sections = {"matmul": matmul_section, "grouped": grouped_section, "paged": paged_section}
    unknown = set(args.sections.split(",")) - set(sections)
    if unknown:
        p.error(f"--sections: unknown {', '.join(sorted(unknown))} (choose from {', '.join(sections)})")
    if args.smoke:
        args.configs = 0
    lines = _harness.header("ejk-pallas: paged decode, grouped matmul, matmul", args,
                            f"HBM reference {HBM_GBS:.0f} GB/s; bf16; targets: paged >= 70% HBM, grouped >= 0.7x "
                            "dense einsum, matmul >= 0.9x a @ b; paged decode timed by _harness.device_ms "
                            "(20 dependent calls in one program: host dispatch out of the way)", rate="rate")
    for name, section in sections.items():  # the longest last
        if name not in args.sections.split(","):
            continue
        try:
            section(args, lines)
        except Exception as exc:
            lines.append(f"| {section.__name__} | - | - | - | - | {error_text(exc)} |")
        _harness.write(lines, args, "pallas_ops.md")  # after each section: a timeout keeps what was measured
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
