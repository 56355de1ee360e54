"""Core overheads of ejk, measured on this machine; prints a markdown table.

- `import ejk` (fresh interpreter, minus `import jax` alone),
- loading every installed plugin,
- Executor overhead of a cached eager call (vs calling the same jitted function directly),
- inside `jax.jit`: the run time of a jitted function using the Executor vs the bare kernel
  (must be equal: selection happens at trace time), and that their HLO is identical,
- config cache hit latency: memory, overlay, persistent.

Usage: python benchmarks/bench_core.py [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import attrs
import jax
import jax.numpy as jnp


def _median_us(fn: Callable[[], object], repeats: int = 2000, rounds: int = 5) -> float:
    for _ in range(min(repeats, 200)):
        fn()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        samples.append((time.perf_counter() - start) / repeats * 1e6)
    return statistics.median(samples)


def _paired_us(first: Callable[[], object], second: Callable[[], object], repeats: int = 1000,
               rounds: int = 10) -> tuple[float, float]:
    """Median µs per call of two functions, in rounds of alternating order (ABBA: fair to both)."""
    for fn in (first, second):
        for _ in range(min(repeats, 100)):
            fn()
    samples: tuple[list[float], list[float]] = ([], [])
    pairs = ((first, samples[0]), (second, samples[1]))
    for i in range(rounds):
        for fn, out in pairs if i % 2 == 0 else pairs[::-1]:
            start = time.perf_counter()
            for _ in range(repeats):
                fn()
            out.append((time.perf_counter() - start) / repeats * 1e6)
    return statistics.median(samples[0]), statistics.median(samples[1])


def _subprocess_seconds(code: str, runs: int = 7) -> float:
    times = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", f"import time; t=time.perf_counter(); {code}; "
                              "print(time.perf_counter()-t)"], capture_output=True, text=True, check=True)
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


def _ops(hlo: str) -> list[str]:
    """The HLO instructions' opcodes, without names and metadata (to compare two programs)."""
    ops = []
    for line in hlo.splitlines():
        if " = " in line and "(" in line:
            rhs = line.split(" = ", 1)[1].split("(", 1)[0].split()
            if rhs:
                ops.append(rhs[-1])
    return sorted(ops)


def _import_rows(rows: list[tuple[str, str, str]]) -> None:
    t_jax = _subprocess_seconds("import jax")
    t_ejk = _subprocess_seconds("import ejk")
    rows.append(("`import jax` (fresh process)", f"{t_jax * 1e3:.0f} ms", "baseline"))
    rows.append(("`import ejk` (fresh process, includes jax)", f"{t_ejk * 1e3:.0f} ms",
                 f"+{(t_ejk - t_jax) * 1e3:.0f} ms over jax"))
    t_plugins = _subprocess_seconds("import ejk; ejk.kernel_registry.list_algorithms()")
    rows.append(("`import ejk` + load all plugins", f"{t_plugins * 1e3:.0f} ms",
                 f"plugins: +{(t_plugins - t_ejk) * 1e3:.0f} ms"))


@attrs.frozen
class Cfg:
    scale: float = 2.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--eager-only", action="store_true", help="only the eager-call rows")
    args = parser.parse_args()
    os.environ["EJK_CACHE_DIR"] = tempfile.mkdtemp(prefix="ejk-bench-")  # no user cache is read

    import ejk
    from ejk.config.cache import ConfigCache, overlay_cache
    from ejk.config.persistent import PersistentCache

    rows: list[tuple[str, str, str]] = []
    if not args.eager_only:
        _import_rows(rows)

    class Scale(ejk.Kernel[Cfg, jax.Array]):
        op_id = "bench_scale"

        def run(self, x: jax.Array, *, cfg: Cfg) -> jax.Array:
            return x * cfg.scale

        def heuristic_cfg(self, inv: object) -> Cfg:
            return Cfg()

    kernel = Scale()
    executor = ejk.Executor(ejk.ConfigSelectorChain(persist=False, plugin_host=False))
    x = jnp.ones((8, 8))
    executor.chooser.cache.put(*executor.invocation(kernel, (x,), {}).cache_key, Cfg())
    executor(kernel, x)
    direct = jax.jit(lambda x: kernel.run(x, cfg=Cfg()))
    direct(x)
    t_direct, t_exec = _paired_us(lambda: direct(x), lambda: executor(kernel, x), repeats=2000)
    rows.append(("eager call: jitted kernel called directly", f"{t_direct:.1f} µs", "baseline"))
    rows.append(("eager call through the Executor (memory-cache hit)", f"{t_exec:.1f} µs",
                 f"+{t_exec - t_direct:.1f} µs ({t_exec / t_direct:.2f}×)"))

    # The public operations (default Executor, plugins loaded, heuristics tier, persistent files
    # in an empty directory): eager call vs the same implementation's jitted function.
    from ejk.ops import get_default_executor

    ops_executor = get_default_executor()
    a = jnp.ones((8, 8))
    q = jnp.ones((1, 16, 2, 8))
    from ejk.ops._flash_attention._op import KERNEL as ATTENTION
    from ejk.ops._matmul._op import MATMUL

    for label, call, kernel_, normalized in (
        ("ejk.matmul (8×8)", lambda: ejk.matmul(a, a), MATMUL, MATMUL.normalize(a, a)),
        ("ejk.flash_attention (1×16×2×8)", lambda: ejk.flash_attention(q, q, q), ATTENTION,
         ATTENTION.normalize(q, q, q)),
    ):
        arrays, static = normalized
        static = {"platform": "auto", **static}
        call()
        chosen = ops_executor.choose_config(kernel_, *arrays, **static)
        bound = ops_executor.bind(kernel_, chosen, static, None)
        bound(*arrays)
        t_bound, t_op = _paired_us(lambda fn=bound, xs=arrays: fn(*xs), call, repeats=1000)
        rows.append((f"eager {label}: its implementation, jitted, called directly", f"{t_bound:.1f} µs", "baseline"))
        rows.append((f"eager {label}: the public op (validation + Executor)", f"{t_op:.1f} µs",
                     f"+{t_op - t_bound:.1f} µs ({t_op / t_bound:.2f}×)"))

    if not args.eager_only:
        big = jnp.ones((1024, 1024))
        with_exec = jax.jit(lambda x: executor(kernel, x) + 1)
        bare = jax.jit(lambda x: kernel.run(x, cfg=Cfg()) + 1)
        with_exec(big).block_until_ready()
        bare(big).block_until_ready()
        t_bare, t_in_jit = _paired_us(lambda: bare(big).block_until_ready(),
                                      lambda: with_exec(big).block_until_ready(), repeats=300)
        same_hlo = _ops(with_exec.lower(big).compile().as_text()) == _ops(bare.lower(big).compile().as_text())
        rows.append(("inside jit: bare kernel (1024² elementwise)", f"{t_bare:.1f} µs", "baseline"))
        rows.append(("inside jit: through the Executor", f"{t_in_jit:.1f} µs",
                     f"{t_in_jit / t_bare:.2f}× (same compiled ops: {same_hlo})"))

        cache: ConfigCache[Cfg] = ConfigCache()
        cache.put("dev", "op@1", "key", Cfg())
        rows.append(("ConfigCache.get hit", f"{_median_us(lambda: cache.get('dev', 'op@1', 'key'), 20000):.2f} µs", ""))
        with overlay_cache({("dev", "op@1", "other"): Cfg()}):
            t_overlay = _median_us(lambda: cache.get("dev", "op@1", "other"), 20000)
        rows.append(("overlay hit", f"{t_overlay:.2f} µs", ""))
        with tempfile.TemporaryDirectory() as tmp:
            persistent = PersistentCache("bench", os.path.join(tmp, "bench.json"), cfg_type=Cfg)
            for i in range(200):
                persistent.put("dev", "op@1", f"key{i}", Cfg(float(i)))
            t_persist = _median_us(lambda: persistent.get("dev", "op@1", "key7"), 5000)
            start = time.perf_counter()
            for i in range(20):
                persistent.put("dev", "op@1", f"new{i}", Cfg(float(i)))
            t_put = (time.perf_counter() - start) / 20 * 1e3
        rows.append(("PersistentCache.get hit (200 entries; stat + rebuild)", f"{t_persist:.2f} µs", ""))
        rows.append(("PersistentCache.put (locked read-merge-write, fsync)", f"{t_put:.2f} ms", ""))

    header = (f"# ejk core overheads\n\n{datetime.date.today()}, {platform.node() or 'machine'}: "
              f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
              f"{platform.python_version()}, jax {jax.__version__}, backend {jax.default_backend()}, "
              f"ejk-core {ejk.__version__}\n\n")
    table = "| measurement | value | comparison |\n| --- | --- | --- |\n" + "\n".join(
        f"| {a} | {b} | {c} |" for a, b, c in rows)
    text = header + table + "\n"
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
