"""What going through ejk costs a Triton kernel: a jitted ``ejk.matmul(platform="triton")`` against a
bare jax-triton ``triton_call`` of the same kernel with the same config, in one run (issue 8's target:
at most 1.1x).

Both sides are ``jax.jit`` functions of ``(a, b)`` that return ``a @ b`` (bf16, the ejk-triton heuristic's
config for the shape, pinned on the ejk side with ``cfg=``). Shapes 256³ (launch-bound), 1024³, 4096³
and 8192³. Each pair is timed by ``_harness.time_ms`` (calls back to back: host dispatch overlapped)
and by ``_harness.device_ms`` (20 dependent calls in one program: the device time alone), and the two
compiled programs' opcodes are compared: the same kernel with nothing around it is the same time.

Usage (GPU host, jax-triton importable): ``python benchmarks/bench_triton_overhead.py``;
``EJK_TRITON_INTERPRET=1 JAX_PLATFORMS=cpu python benchmarks/bench_triton_overhead.py --smoke`` on a
CPU, where ejk-triton's interpreter launch stands in for ``triton_call`` (a check of the script, no
timing worth reading). Output: ``$OUT/triton_overhead.md`` (else ``benchmarks/results/``).
"""

from __future__ import annotations

from collections.abc import Callable

import _harness
import jax
import jax.numpy as jnp
from bench_core import _ops

import ejk
from ejk_triton import _env, _launch, _matmul

SHAPES = (256, 1024, 4096, 8192)


def bare_matmul(m: int, k: int, n: int, cfg: _matmul.MatmulConfig) -> Callable[..., jax.Array]:
    """``a @ b`` by one ``triton_call`` of ejk-triton's matmul kernel (the interpreter's launch when asked for)."""
    args = _matmul.kernel_args(batch=1, red=1, m=m, n=n, k=k, a=(0, 0, k, 1), b=(0, 0, n, 1), dtype=jnp.bfloat16,
                               out_dtype=jnp.bfloat16, precision="default", cfg=cfg)
    kernel = _launch.kernels("_matmul_kernels").matmul_kernel

    def call(a: jax.Array, b: jax.Array) -> jax.Array:
        if _env.interpret_mode():
            (out,) = _launch.launch(kernel, inputs=(a, b), **args)
        else:
            import jax_triton as jt

            launch = dict(args)
            out_shapes = launch.pop("out_shapes")
            (out,) = jt.triton_call(a, b, kernel=kernel, out_shape=list(out_shapes), **launch)
        return out.reshape(m, n)

    return call


def ejk_matmul(cfg: _matmul.MatmulConfig) -> Callable[..., jax.Array]:
    backend = "gpu" if jax.default_backend() == "gpu" else "cpu"
    choice = ejk.ImplChoice(platform="triton", backend=backend, implementation="gemm", cfg=cfg)
    return lambda a, b: ejk.matmul(a, b, platform="triton", precision="default", cfg=choice)


def main() -> None:
    p = _harness.parser(__doc__)
    args = _harness.parse(p)
    lines = _harness.header("ejk-triton: a jitted call through ejk against a bare triton_call", args,
                            "bf16 matmul, the ejk-triton heuristic's config on both sides; ratio = ejk / bare "
                            "(target <= 1.1); device: 20 dependent calls in one program (one tiny op each)",
                            f"triton {_harness.version('triton')}, jax-triton {_harness.version('jax-triton')}, "
                            f"ejk-triton {_harness.version('ejk-triton')}", rate="ejk / bare")
    for size in (64,) if args.smoke else SHAPES:
        keys = jax.random.split(jax.random.key(0), 2)
        a = jax.random.normal(keys[0], (size, size), jnp.bfloat16)
        b = jax.random.normal(keys[1], (size, size), jnp.bfloat16)
        cfg = _matmul.heuristic_config(a, b)
        sides = {"bare triton_call": bare_matmul(size, size, size, cfg), "ejk.matmul": ejk_matmul(cfg)}
        outs = [jax.jit(fn)(a, b) for fn in sides.values()]
        same_values = bool(jnp.array_equal(outs[0], outs[1]))
        programs = [_ops(jax.jit(fn).lower(a, b).compile().as_text()) for fn in sides.values()]
        note = f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k}/w{cfg.num_warps}/s{cfg.num_stages}; same compiled ops: " \
               f"{programs[0] == programs[1]}; same values: {same_values}"
        for mode, timer in (("back to back", _harness.time_ms), ("device", _harness.device_ms)):
            times = [timer(fn, (a, b), args.reps) for fn in sides.values()]
            for (name, _), ms in zip(sides.items(), times, strict=True):
                ratio = f"{ms / times[0]:.3f}" if name == "ejk.matmul" else "1 (baseline)"
                lines.append(f"| {size}³ | {mode} | {name} | {ms:.4f} | {ratio} | {note} |")
        _harness.write(lines, args, "triton_overhead.md")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
