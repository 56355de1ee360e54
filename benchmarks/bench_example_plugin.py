"""The example third-party plugin (examples/ejk-example-plugin) on this machine's device.

- ``rms_norm``: the fused kernel (``xla/any:fused``, analytic backward from saved ``1/rms``) through
  ``ejk.rms_norm`` vs the plain reference under ``jax.jit`` (XLA fuses it itself; autodiff backward),
  forward and forward+backward, for transformer-like shapes; every ``block_rows`` config too.
- ``matmul`` on skinny shapes (long K): the split-K implementation the example's team policy picks
  vs ejk-xla's ``dot`` (the default without the policy).

Needs ejk-core, ejk-xla and the example plugin installed. Usage:
python benchmarks/bench_example_plugin.py [--smoke] [--reps N] [--out FILE]
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _harness import error_text, header, parse, parser, time_ms, write

import ejk

RMS_SHAPES = [(8192, 4096), (16384, 8192), (4, 4096, 5120)]
SKINNY = [((16, 65536), (65536, 16)), ((64, 131072), (131072, 64)), ((8, 262144), (262144, 256))]


def _rms_lines(args: Any) -> list[str]:
    from ejk_example import RmsNormConfig, reference_rms_norm

    lines = []
    shapes = [(64, 256)] if args.smoke else RMS_SHAPES
    for shape in shapes:
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal(shape, np.float32), jnp.bfloat16)
        w = jnp.asarray(1 + rng.standard_normal(shape[-1:], np.float32) / 8, jnp.bfloat16)
        nbytes = 2 * x.size * x.dtype.itemsize  # read x, write y
        variants: list[tuple[str, Any]] = [("reference (jit)", lambda x, w: reference_rms_norm(x, w))]
        for block in (0, 1024, 4096):
            variants.append((f"xla/any:fused block_rows={block}",
                             lambda x, w, b=block: ejk.rms_norm(x, w, cfg=RmsNormConfig(block_rows=b))))
        for name, fn in variants:
            for mode in ("fwd", "fwd+bwd"):
                run = fn if mode == "fwd" else jax.grad(lambda x, w, f=fn: f(x, w).astype(jnp.float32).sum(),
                                                        argnums=(0, 1))
                try:
                    ms = time_ms(run, (x, w), args.reps)
                    rate = f"{nbytes / ms / 1e6:.0f} GB/s" if mode == "fwd" else ""
                    lines.append(f"| rms_norm {shape} bf16 | {mode} | {name} | {ms:.3f} | {rate} | |")
                except Exception as exc:  # a failing variant is a table line, not the end of the run
                    lines.append(f"| rms_norm {shape} bf16 | {mode} | {name} | | | {error_text(exc)} |")
    return lines


def _matmul_lines(args: Any) -> list[str]:
    from ejk_example import SplitKConfig

    lines = []
    shapes = [((4, 1024), (1024, 4))] if args.smoke else SKINNY
    for sa, sb in shapes:
        rng = np.random.default_rng(1)
        a = jnp.asarray(rng.standard_normal(sa, np.float32), jnp.bfloat16)
        b = jnp.asarray(rng.standard_normal(sb, np.float32), jnp.bfloat16)
        flops = 2 * sa[0] * sa[1] * sb[1]
        variants: list[tuple[str, Any]] = [
            ("xla/any:dot", ejk.ImplChoice(platform="xla", backend="any", implementation="dot")),
            ("policy (auto)", None),
            *[(f"xla/any:split_k splits={s}",
               ejk.ImplChoice(platform="xla", backend="any", implementation="split_k", cfg=SplitKConfig(splits=s)))
              for s in (2, 4, 8, 16)],
        ]
        for name, cfg in variants:
            try:
                ms = time_ms(lambda a, b, c=cfg: ejk.matmul(a, b, precision="default", cfg=c), (a, b), args.reps)
                lines.append(f"| matmul {sa}x{sb} bf16 | fwd | {name} | {ms:.3f} | {flops / ms / 1e9:.1f} TFLOP/s | |")
            except Exception as exc:
                lines.append(f"| matmul {sa}x{sb} bf16 | fwd | {name} | | | {error_text(exc)} |")
    return lines


def main() -> None:
    args = parse(parser(__doc__))
    lines = header("The example plugin: fused RMSNorm and split-K matmul", args,
                   "rms_norm rate: bytes of x read + y written per forward; matmul precision='default'")
    for line in (*_rms_lines(args), *_matmul_lines(args)):
        print(line, flush=True)
        lines.append(line)
    write(lines, args, "example_plugin_gpu.md" if jax.default_backend() == "gpu" else "example_plugin_cpu.md")


if __name__ == "__main__":
    main()
