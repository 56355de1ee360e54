"""Sharded ``ejk.grouped_matmul`` without ``shard_map``: expert, row and column parallelism on all GPUs.

A mixture-of-experts layer (``--tokens`` rows sorted by expert, ``--experts`` experts of
``k × n``, bfloat16, uneven routing), called under ``jax.jit`` with ``Explicit`` mesh axes
(``ejk.ops._sharded`` runs it per shard). Lines:

- ``1 GPU``: the unsharded op on one device (the reference),
- ``experts, psum``: rhs split by experts, lhs replicated; partial outputs all-reduced,
- ``experts, reduce-scatter``: rhs split by experts, lhs rows split over the same axis; lhs
  all-gathered, partial outputs reduce-scattered (the output stays row-split),
- ``columns``: rhs split along n; no communication,
- ``rows``: lhs rows split, rhs replicated; no communication forward (d rhs all-reduced),

each ``fwd`` and ``fwd+bwd`` (output, d lhs, d rhs). The note gives the speed-up over ``1 GPU``.

Usage (all visible GPUs; ``--smoke``: tiny shapes on two CPU devices):
    python benchmarks/bench_sharded_moe.py
    python benchmarks/bench_sharded_moe.py --tokens 32768 --experts 64 --k 2048 --n 1536
    python benchmarks/bench_sharded_moe.py --smoke

Writes ``$OUT/sharded_moe_gpu.md`` when ``OUT`` is set, else ``benchmarks/results/`` (``--out`` overrides).
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

if "--smoke" in sys.argv:  # two CPU devices; must be set before JAX starts
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import _harness
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import ejk


def _inputs(tokens: int, experts: int, k: int, n: int, dtype: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    rng = np.random.default_rng(0)
    sizes = np.floor(rng.dirichlet(np.ones(experts) * 2) * tokens).astype(np.int32)
    sizes[0] += tokens - int(sizes.sum())
    lhs = jnp.asarray(rng.standard_normal((tokens, k)) / np.sqrt(k), dtype)
    rhs = jnp.asarray(rng.standard_normal((experts, k, n)) / np.sqrt(k), dtype)
    return lhs, rhs, jnp.asarray(sizes)


def _step(mode: str) -> Any:
    if mode == "fwd":
        return ejk.grouped_matmul
    return jax.value_and_grad(lambda lhs, rhs, sizes: ejk.grouped_matmul(lhs, rhs, sizes).astype(jnp.float32).sum(),
                              argnums=(0, 1))


def main() -> None:
    p = _harness.parser(__doc__)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--n", type=int, default=1536)
    p.add_argument("--modes", default="fwd,fwd+bwd")
    args = _harness.parse(p)
    if args.smoke:
        args.tokens, args.experts, args.k, args.n = 256, 8, 64, 32
    dtype = jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    devices = len(jax.devices())
    lhs, rhs, sizes = _inputs(args.tokens, args.experts, args.k, args.n, dtype)
    flops = 2 * args.tokens * args.k * args.n
    lines = _harness.header(f"Sharded grouped_matmul on {devices} devices", args,
                            f"tokens {args.tokens}, experts {args.experts}, k {args.k}, n {args.n}, "
                            f"{jnp.dtype(dtype).name}, uneven routing (Dirichlet)",
                            case="layout", rate="TFLOP/s (fwd)")
    mesh = jax.make_mesh((devices,), ("e",), axis_types=(AxisType.Explicit,))
    layouts = {"1 GPU": None, "experts, psum": (P(), P("e")), "experts, reduce-scatter": (P("e"), P("e")),
               "columns": (P(), P(None, None, "e")), "rows": (P("e"), P())}
    for mode in args.modes.split(","):
        base = None
        for name, specs in layouts.items():
            try:
                if specs is None:
                    ms = _harness.time_ms(_step(mode), (lhs, rhs, sizes), args.reps)
                    base = ms
                else:
                    with jax.set_mesh(mesh):
                        placed = (jax.device_put(lhs, NamedSharding(mesh, specs[0])),
                                  jax.device_put(rhs, NamedSharding(mesh, specs[1])), sizes)
                        ms = _harness.time_ms(_step(mode), placed, args.reps)
                rate = f"{flops / ms / 1e9:.1f}" if mode == "fwd" else "—"
                note = "" if base is None or specs is None else f"{base / ms:.2f}x vs 1 GPU"
                lines.append(f"| {name} | {mode} | ejk auto | {ms:.3f} | {rate} | {note} |")
            except Exception as exc:  # a failing line is reported, the others still run
                traceback.print_exc()
                lines.append(f"| {name} | {mode} | ejk auto | — | — | {_harness.error_text(exc)} |")
            print(lines[-1], flush=True)
    _harness.write(lines, args, "sharded_moe_gpu.md")


if __name__ == "__main__":
    main()
