"""Time ejk-triton's matmul and grouped matmul configs side by side on the GPU's timeline.

Usage (GPU host): ``python benchmarks/probe_triton_gemm.py [--matmul "128,256,64,8,3,p ..."]
[--grouped "128,256,64,8,3,flat ..."] [--groups equal,skewed] [--backward]``.

- matmul configs ``block_m,block_n,block_k,num_warps,num_stages[,p][,gN]`` (``p``: persistent; ``gN``:
  ``group_m`` N, default 8), 8192³ bf16,
  against XLA's ``a @ b``;
- grouped configs ``block_m,block_n,block_k,num_warps,num_stages,flat|walk`` (``walk``: the forward
  kernel walks the groups instead of holding the work list in registers), ``bench_triton_moe.py``'s
  MoE inputs (``ejk.bench``'s: 64 experts, k 2048, n 1536, 32k tokens), against the dense einsum over equal groups;
  ``--backward`` also times the backward (``d lhs`` and ``d rhs``) on its own.

Each line checks the output against XLA in float32 (max abs difference).
"""

from __future__ import annotations

import argparse

import _harness
import jax
import jax.numpy as jnp

from ejk.bench import MoeCase, workload_for
from ejk_triton import _grouped_matmul, _matmul


def _max_diff(got: jax.Array, want: jax.Array) -> float:
    return float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))))


def probe_matmul(specs: list[str], reps: int) -> None:
    size = 8192
    a = jax.random.normal(jax.random.key(0), (size, size), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (size, size), jnp.bfloat16)
    flops = 2.0 * size**3
    want = jax.jit(lambda x, y: x @ y)(a, b)
    base = _harness.span_ms(lambda x, y: x @ y, (a, b), reps)
    print(f"matmul a @ b: {base:.3f} ms {flops / base / 1e9:.0f} TFLOP/s", flush=True)
    for spec in specs:
        f = spec.split(",")
        group_m = next((int(t[1:]) for t in f[5:] if t.startswith("g")), 8)
        cfg = _matmul.MatmulConfig(block_m=int(f[0]), block_n=int(f[1]), block_k=int(f[2]), num_warps=int(f[3]),
                                   num_stages=int(f[4]), persistent="p" in f[5:], group_m=group_m)

        def run(x: jax.Array, y: jax.Array, c: _matmul.MatmulConfig = cfg) -> jax.Array:
            return _matmul.forward(x, y, cfg=c)

        try:
            ms = _harness.span_ms(run, (a, b), reps)
            diff = _max_diff(jax.jit(run)(a, b), want)
            print(f"matmul {spec}: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s {base / ms:.3f}x  diff {diff:.3g}",
                  flush=True)
        except Exception as exc:
            print(f"matmul {spec}: failed {_harness.error_text(exc)}", flush=True)


def probe_grouped(specs: list[str], kinds: list[str], backward: bool, reps: int) -> None:
    m, k, n, g = 32768, 2048, 1536, 64
    lhs, rhs, _ = workload_for(MoeCase(experts=g, k=k, n=n, tokens=m), jnp.bfloat16).inputs()
    d_out = jax.random.normal(jax.random.key(2), (m, n), jnp.bfloat16)
    flops = 2.0 * m * k * n
    dense = _harness.span_ms(lambda x, w: jnp.einsum("gmk,gkn->gmn", x.reshape(g, m // g, k), w), (lhs, rhs), reps)
    print(f"dense einsum {dense:.3f} ms {flops / dense / 1e9:.0f} TFLOP/s", flush=True)
    flat_default = _grouped_matmul.FLAT_GROUPS
    for kind in kinds:
        sizes = workload_for(MoeCase(experts=g, k=k, n=n, tokens=m, skewed=kind == "skewed"), jnp.bfloat16).inputs()[2]
        want = jax.jit(lambda x, w, s: jax.lax.ragged_dot(x, w, s, preferred_element_type=jnp.float32))(lhs, rhs,
                                                                                                        sizes)
        for spec in specs:
            f = spec.split(",")
            cfg = _grouped_matmul.GroupedMatmulConfig(block_m=int(f[0]), block_n=int(f[1]), block_k=int(f[2]),
                                                      num_warps=int(f[3]), num_stages=int(f[4]))
            _grouped_matmul.FLAT_GROUPS = 0 if f[5] == "walk" else flat_default

            def fwd(x: jax.Array, w: jax.Array, s: jax.Array,
                    c: _grouped_matmul.GroupedMatmulConfig = cfg) -> jax.Array:
                return _grouped_matmul.forward(x, w, s, precision="default", cfg=c)

            def bwd(x: jax.Array, w: jax.Array, s: jax.Array, dy: jax.Array,
                    c: _grouped_matmul.GroupedMatmulConfig = cfg) -> tuple[jax.Array, ...]:
                return _grouped_matmul.backward((x, w, s), dy, precision="default", cfg=c)[:2]

            try:
                ms = _harness.span_ms(fwd, (lhs, rhs, sizes), reps)
                diff = _max_diff(jax.jit(fwd)(lhs, rhs, sizes), want)
                text = f"grouped {kind} {spec}: fwd {ms:.3f} ms {dense / ms:.3f}x diff {diff:.3g}"
                if backward:
                    bms = _harness.span_ms(bwd, (lhs, rhs, sizes, d_out), reps)
                    text += f"; bwd {bms:.3f} ms; fwd+bwd {3 * dense / (ms + bms):.3f}x"
                print(text, flush=True)
            except Exception as exc:
                print(f"grouped {kind} {spec}: failed {_harness.error_text(exc)}", flush=True)
    _grouped_matmul.FLAT_GROUPS = flat_default


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--matmul", default="")
    p.add_argument("--grouped", default="")
    p.add_argument("--groups", default="equal,skewed")
    p.add_argument("--backward", action="store_true")
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    if args.matmul:
        probe_matmul(args.matmul.split(), args.reps)
    if args.grouped:
        probe_grouped(args.grouped.split(), args.groups.split(","), args.backward, args.reps)


if __name__ == "__main__":
    main()
