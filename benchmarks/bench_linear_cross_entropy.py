"""Forward + backward of ``ejk.linear_cross_entropy``'s XLA implementations against the unfused loss.

Times ``jax.value_and_grad`` (for x and w) of each case under ``jax.jit`` — the unfused
``(x @ w).astype(float32)`` + ``optax.softmax_cross_entropy_with_integer_labels`` mean, ejk-xla's
``grad_in_forward`` at several chunks, with label smoothing and with z-loss (both folded into the
gradients it saves), the chunked implementation (plain and with z-loss), and ``platform="auto"``
(plain, with z-loss, and ``reduction="none"`` averaged, which auto sends to the chunked one) — and
prints one line each: the median wall time of
``--reps`` calls after one warm call, the speed-up over the unfused loss, the compiled program's
temporary memory (``memory_analysis().temp_size_in_bytes``) and its share of the unfused one's, and
the gradients' largest difference from the unfused ones (relative to their largest magnitude; the
smoothing and z-loss cases differ from them by what those terms add).

    python3 benchmarks/bench_linear_cross_entropy.py [--vocab 131072,262144] [--only "gif 1024,chunked 2048x16384"]
    python3 benchmarks/bench_linear_cross_entropy.py --smoke   # tiny shapes (CPU is fine)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import ejk
from ejk.ops import ImplChoice


def _cases(labels: jax.Array) -> dict[str, Callable[[jax.Array, jax.Array], jax.Array]]:
    from ejk_xla import LinearCrossEntropyConfig
    from ejk_xla._lce_grad_in_forward import GradInForwardConfig

    def unfused(x: jax.Array, w: jax.Array) -> jax.Array:
        import optax

        return optax.softmax_cross_entropy_with_integer_labels((x @ w).astype(jnp.float32), labels).mean()

    def ejk_loss(cfg: Any = None, **options: Any) -> Callable[[jax.Array, jax.Array], jax.Array]:
        return lambda x, w: ejk.linear_cross_entropy(x, w, labels, precision="default", cfg=cfg, **options)

    def gif(block_t: int) -> ImplChoice:
        return ImplChoice(platform="xla", backend="any", implementation="grad_in_forward",
                          cfg=GradInForwardConfig(block_t=block_t))

    chunked = ImplChoice(platform="xla", backend="any", implementation="chunked",
                         cfg=LinearCrossEntropyConfig(block_t=2048, block_v=16384))
    def mean_of_none(x: jax.Array, w: jax.Array) -> jax.Array:
        return ejk_loss(reduction="none")(x, w).mean()

    z = {"z_loss": 1e-4}
    return {"unfused optax": unfused, "gif 512": ejk_loss(gif(512)), "gif 1024": ejk_loss(gif(1024)),
            "gif 2048": ejk_loss(gif(2048)), "gif 1024 smoothing": ejk_loss(gif(1024), label_smoothing=0.1),
            "gif 1024 zloss": ejk_loss(gif(1024), **z), "chunked 2048x16384": ejk_loss(chunked),
            "chunked 2048x16384 zloss": ejk_loss(chunked, **z), "auto": ejk_loss(), "auto zloss": ejk_loss(**z),
            "auto none": mean_of_none}


def _relative(a: jax.Array, b: jax.Array) -> float:
    a32, b32 = a.astype(jnp.float32), b.astype(jnp.float32)
    return float(jnp.max(jnp.abs(a32 - b32)) / jnp.max(jnp.abs(b32)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", default="131072,262144", help="comma-separated vocabulary sizes")
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--only", default=None, help="comma-separated case names (the unfused loss always runs)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="T 256, H 64, V 2048")
    args = p.parse_args(argv)
    t, h = (256, 64) if args.smoke else (args.tokens, args.hidden)
    vocabs = [2048] if args.smoke else [int(v) for v in args.vocab.split(",")]
    only = None if args.only is None else set(args.only.split(","))
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}, T={t} H={h}, bfloat16, fwd+bwd", flush=True)
    for v in vocabs:
        kx, kw, kl = jax.random.split(jax.random.key(0), 3)
        x = jax.random.normal(kx, (t, h), jnp.bfloat16)
        w = (jax.random.normal(kw, (h, v), jnp.float32) / h**0.5).astype(jnp.bfloat16)
        labels = jax.random.randint(kl, (t,), 0, v, jnp.int32)
        base: tuple[float, int, Any] | None = None
        for name, loss in _cases(labels).items():
            if only is not None and name not in only and name != "unfused optax":
                continue
            compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(x, w).compile()
            temp = int(compiled.memory_analysis().temp_size_in_bytes)
            out = jax.block_until_ready(compiled(x, w))
            times = []
            for _ in range(args.reps):
                start = time.perf_counter()
                out = jax.block_until_ready(compiled(x, w))
                times.append(time.perf_counter() - start)
            ms = statistics.median(times) * 1e3
            if base is None:
                base = (ms, temp, out)
            _, (dx, dw) = out
            _, (dx0, dw0) = base[2]
            print(f"V={v} {name}: {ms:.2f} ms, {base[0] / ms:.2f}x, temp {temp / 2**20:.0f} MiB "
                  f"({temp / base[1]:.3f} of the unfused), dx {_relative(dx, dx0):.1e} dw {_relative(dw, dw0):.1e} "
                  "from the unfused", flush=True)
            del compiled, out
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
