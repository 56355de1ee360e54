"""The overhead study: what going through ejk costs a call, against the implementation called bare.

For each case and each implementation that can run here, two modes:

- ``jit``: ``bare <label>``, the implementation's own function with its heuristic config under
  ``jax.jit``, against ``ejk <label>``, the public op with that implementation forced, under
  ``jax.jit``; both compiled once and called back to back. ejk chooses while tracing, so the two
  programs should hold the same operations (the note says whether they do) and take the same time.
- ``eager``: the same bare jitted function called directly, against the public op called without
  ``jax.jit`` (argument checks, the Executor's cached choice, then the same compiled function):
  the host time ejk adds to each eager call, in microseconds in the note, which also gives the time
  over ``jax.jit`` of the same public call (both times printed).

``ejk auto`` (``platform="auto"``) is measured against the bare function of the implementation it
chooses. A ratio is the bare line's time over the ejk line's (1.00x: no overhead). The startup
group times ``import jax``, ``import ejk`` and loading every plugin in fresh interpreters, and
:func:`profile_eager` says where an eager call spends its host time (cProfile).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs
import jax

from ejk.bench._cases import Case
from ejk.bench._runner import Measurement, Options, _EjkLines, _failure, timed
from ejk.bench._workloads import Workload, workload_for
from ejk.config.tuning import measure

__all__ = ["OVERHEAD_MODES", "eager_overhead", "profile_eager", "run_overhead", "startup"]

OVERHEAD_MODES = ("jit", "eager")
#: Python statements timed in fresh interpreters by :func:`startup`, the first one the baseline.
STARTUP = (("import jax", "import jax"), ("import ejk", "import ejk"),
           ("import ejk + plugins", "import ejk; ejk.kernel_registry.list_algorithms()"))


@attrs.frozen(kw_only=True)
class _Pair:
    """One implementation's bare function and the public op forcing it (``auto``: the op's own choice)."""

    label: str
    bare: Callable[..., Any]
    public: Callable[..., Any]
    auto: bool = False
    implementation: str | None = None


def _opcodes(compiled: Any) -> list[str]:
    """The compiled program's opcodes, without names and metadata (to compare two programs)."""
    ops = []
    for line in compiled.as_text().splitlines():
        if " = " in line and "(" in line:
            words = line.split(" = ", 1)[1].split("(", 1)[0].split()
            if words:
                ops.append(words[-1])
    return sorted(ops)


def _pairs(lines: _EjkLines) -> Iterator[_Pair | tuple[str, str]]:
    """A :class:`_Pair` per implementation that can run, ``(label, reason)`` for one that cannot; then auto."""
    kernel, workload = lines.kernel, lines.workload
    arrays, static = workload.normalize(lines.inputs)

    def bare_of(choice: Any) -> Callable[..., Any]:
        return lambda *xs: kernel.run(*xs, cfg=choice, **static)

    for spec, choice, skip in lines.implementations():
        if choice is None:
            yield spec.label, str(skip)
            continue
        yield _Pair(label=spec.label, bare=bare_of(choice), public=workload.call(platform=str(spec.platform),
                                                                                  cfg=choice))
    if "auto" in lines.options.impls or not lines.options.impls:
        try:
            chosen = lines.executor.choose_config(kernel, *arrays, platform="auto", **static)
        except Exception as exc:
            yield "auto", _failure("dispatch", exc)[1]
            return
        yield _Pair(label="auto", bare=bare_of(chosen), public=workload.call(platform="auto"), auto=True,
                    implementation=kernel.cfg_label(chosen))


def _base(workload: Workload, mode: str, name: str, kind: str, implementation: str | None) -> Measurement:
    case = workload.case
    work, unit = workload.work("fwd")
    return Measurement(op=workload.op, case=case.label, series=case.series, x=case.x, mode=mode, name=name,
                       kind=kind, status="skipped", implementation=implementation, work=work, unit=unit)


def _time(base: Measurement, call: Callable[[], Any], options: Options, compile_s: float | None = None,
          note: str | None = None) -> Measurement:
    try:
        jax.block_until_ready(call())
        calls, times = measure(call, options.policy)
    except Exception as exc:
        status, text = _failure("run", exc)
        return attrs.evolve(base, status=status, error=text)
    return attrs.evolve(timed(base, times, calls, compile_s), note=note)


def _compiled(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, float]:
    start = time.perf_counter()
    return jax.jit(fn).lower(*args).compile(), time.perf_counter() - start


def _pair_group(pair: _Pair, workload: Workload, inputs: tuple[Any, ...], arrays: tuple[Any, ...], mode: str,
                lines: _EjkLines, options: Options) -> tuple[Measurement, Measurement]:
    """The bare line and the ejk line of one implementation in one mode."""
    ejk_name = "ejk auto" if pair.auto else f"ejk {pair.label}"
    implementation = pair.implementation or pair.label
    bare = _base(workload, mode, f"bare {pair.label}", "baseline", implementation)
    ours = _base(workload, mode, ejk_name, "ejk", implementation)
    if mode == "eager":
        jitted = jax.jit(pair.bare)
        bare = _time(bare, lambda: jitted(*arrays), options)
        public_jitted = jax.jit(pair.public)  # the same public call under jax.jit (the yardstick)
        try:
            with _use(lines):
                calls, eager_times, jit_times = _paired(lambda: pair.public(*inputs),
                                                        lambda: public_jitted(*inputs), options)
        except Exception as exc:
            status, text = _failure("run", exc)
            return bare, attrs.evolve(ours, status=status, error=text)
        ours, under_jit = timed(ours, eager_times, calls), timed(ours, jit_times, calls)
        assert ours.median_s is not None and under_jit.median_s is not None
        over = (ours.median_s - under_jit.median_s) * 1e6
        return bare, attrs.evolve(ours, jit_s=under_jit.median_s, jit_min_s=under_jit.min_s,
                                  note=f"{over:+.1f} µs per call over jit({ejk_name}) "
                                       f"({under_jit.median_s * 1e6:.1f} µs)")
    try:
        bare_exe, bare_s = _compiled(pair.bare, arrays)
    except Exception as exc:
        status, text = _failure("compile", exc)
        return attrs.evolve(bare, status=status, error=text), attrs.evolve(ours, error="its bare line failed")
    bare = _time(bare, lambda: bare_exe(*arrays), options, bare_s)
    try:
        with _use(lines):
            ours_exe, ours_s = _compiled(pair.public, inputs)
    except Exception as exc:
        status, text = _failure("compile", exc)
        return bare, attrs.evolve(ours, status=status, error=text)
    same = "yes" if _opcodes(ours_exe) == _opcodes(bare_exe) else "no"
    return bare, _time(ours, lambda: ours_exe(*inputs), options, ours_s, note=f"same compiled ops as bare: {same}")


def _paired(eager: Callable[[], Any], jitted: Callable[[], Any],
            options: Options) -> tuple[int, list[float], list[float]]:
    """``(calls per sample, eager seconds per call, jit seconds per call)``: samples of the two taken
    alternately, in alternating order (a busy host slows both alike), each a loop of back-to-back calls
    lasting about ``min_sample_seconds`` for the jitted one, by the host's clock (the time ejk adds
    is host time)."""
    policy = options.policy
    for _ in range(max(1, policy.warmup)):
        jax.block_until_ready(eager())
        jax.block_until_ready(jitted())
    start = time.perf_counter()
    jax.block_until_ready(jitted())
    calls = max(1, min(10_000, int(policy.min_sample_seconds / max(time.perf_counter() - start, 1e-7))))
    found: tuple[list[float], list[float]] = ([], [])
    for rep in range(max(3, policy.repeats)):
        for i in ((0, 1) if rep % 2 == 0 else (1, 0)):
            call = (eager, jitted)[i]
            start = time.perf_counter()
            for _ in range(calls):
                out = call()
            jax.block_until_ready(out)
            found[i].append((time.perf_counter() - start) / calls)
    return calls, found[0], found[1]


def _use(lines: _EjkLines) -> Any:
    import ejk

    return ejk.use_executor(lines.executor)


def _compared(bare: Measurement, ours: Measurement) -> Measurement:
    """``ours`` with its ratio to ``bare`` and the time it adds per call in the note."""
    if ours.status != "ok" or bare.status != "ok" or not bare.median_s or not ours.median_s:
        return ours
    added = f"{(ours.median_s - bare.median_s) * 1e6:+.1f} µs per call over bare ({bare.median_s * 1e6:.1f} µs)"
    return attrs.evolve(ours, ratio=bare.median_s / ours.median_s,
                        note=added if ours.note is None else f"{added}; {ours.note}")


def run_overhead(cases: Iterable[Case], options: Options | None = None, *,
                 on_measurement: Callable[[Measurement], None] | None = None,
                 on_group: Callable[[list[Measurement]], None] | None = None) -> list[Measurement]:
    """Measure the overhead study (see the module) on every case; groups of (op, ``jit``/``eager``)."""
    options = options or Options()
    results: list[Measurement] = []
    for case in cases:
        workload = workload_for(case, options.dtype)
        try:
            inputs = workload.inputs(options.seed)
            lines = _EjkLines(workload, inputs, options)
            arrays = workload.normalize(inputs)[0]
            pairs = list(_pairs(lines))
        except Exception as exc:
            status, text = _failure("dispatch", exc)
            pairs, failed = [], [attrs.evolve(_base(workload, m, "ejk", "ejk", None), status=status, error=text)
                                 for m in OVERHEAD_MODES]
            results += failed
            for m in failed:
                if on_measurement is not None:
                    on_measurement(m)
            continue
        for mode in OVERHEAD_MODES:
            group: list[Measurement] = []
            for pair in pairs:
                if isinstance(pair, tuple):
                    found = [attrs.evolve(_base(workload, mode, f"ejk {pair[0]}", "ejk", pair[0]), error=pair[1])]
                else:
                    bare, ours = _pair_group(pair, workload, inputs, arrays, mode, lines, options)
                    found = [bare, _compared(bare, ours)]
                for m in found:
                    if on_measurement is not None:
                        on_measurement(m)
                group += found
            results += group
            if on_group is not None:
                on_group(group)
    return results


def eager_overhead(found: Iterable[Measurement]) -> str:
    """A Markdown table of every eager line of the study: the public op called eagerly, the same call under
    ``jax.jit`` (medians of samples taken alternately), and the difference (issue 31's yardstick: at
    most 15 µs), also between the best samples (the least disturbed by other work), in microseconds."""
    rows = ["| op | shape | line | eager µs | jit µs | eager − jit µs | best eager − best jit µs |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for m in found:
        if m.mode != "eager" or m.kind == "baseline":
            continue
        if m.status != "ok" or not m.median_s or not m.jit_s or not m.min_s or not m.jit_min_s:
            rows.append(f"| {m.op} | {m.case} | {m.name} | {m.status} | | | |")
            continue
        rows.append(f"| {m.op} | {m.case} | {m.name} | {m.median_s * 1e6:.1f} | {m.jit_s * 1e6:.1f} | "
                    f"{(m.median_s - m.jit_s) * 1e6:+.1f} | {(m.min_s - m.jit_min_s) * 1e6:+.1f} |")
    return "\n".join(rows) + "\n"


def startup(runs: int = 5) -> list[Measurement]:
    """Median seconds of each :data:`STARTUP` statement in ``runs`` fresh interpreters (group ``ejk startup``)."""
    found: list[Measurement] = []
    for name, code in STARTUP:
        base = Measurement(op="ejk", case="fresh interpreter", series="startup", x=0, mode="startup", name=name,
                           kind="baseline" if not found else "ejk", status="skipped")
        script = f"import time; t = time.perf_counter(); {code}; print(time.perf_counter() - t)"
        try:
            times = [float(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                          check=True).stdout.split()[-1]) for _ in range(runs)]
        except (subprocess.CalledProcessError, ValueError, IndexError) as exc:
            found.append(attrs.evolve(base, status="failed", error=f"{name}: {exc}"))
            continue
        measured = timed(base, times, 1)
        first = found[0] if found else None
        if first is not None and first.median_s is not None:
            measured = attrs.evolve(measured, note=f"{(statistics.median(times) - first.median_s) * 1e3:+.0f} ms "
                                                   f"over {first.name}")
        found.append(measured)
    return found


def profile_eager(case: Case, options: Options | None = None, *, calls: int = 2000, top: int = 25) -> str:
    """Where ``calls`` eager ``platform="auto"`` calls of ``case``'s public op spend their host time: the
    ``top`` functions by own time, then by cumulative time (cProfile), after warm-up calls."""
    options = options or Options()
    workload = workload_for(case, options.dtype)
    inputs = workload.inputs(options.seed)
    lines = _EjkLines(workload, inputs, options)
    call = workload.call(platform="auto")
    profiler = cProfile.Profile()
    with _use(lines):
        for _ in range(max(1, options.policy.warmup)):
            jax.block_until_ready(call(*inputs))
        profiler.enable()
        for _ in range(calls):
            call(*inputs)
        jax.block_until_ready(call(*inputs))
        profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    per_call = stats.total_tt / (calls + 1) * 1e6  # type: ignore[attr-defined]
    text.write(f"# {workload.op} {case.label}: {calls} eager calls, {per_call:.1f} µs per call (profiled)\n")
    for key in ("tottime", "cumulative"):
        text.write(f"\n## by {key}\n")
        stats.sort_stats(key).print_stats(top)
    return text.getvalue()
