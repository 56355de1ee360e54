"""Run the benchmark: every implementation and baseline of every case, timed the same way.

Each line is a jitted function of the case's inputs, compiled once (the compile time is kept
apart), then timed with the autotuner's loop (:func:`ejk.config.tuning.measure`: warm-up,
``repeats`` samples of back-to-back calls, the L2 cache flushed before each sample on GPUs).
ejk's lines call the public op (``platform=`` and the implementation forced through an
:class:`~ejk.ops.ImplChoice` with its heuristic config), so whatever ejk adds to the computation
is in the time. A line that cannot run (refused by a capability gate, unavailable platform,
exception, out of memory) becomes a measurement with a status and a reason, never a crash.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import statistics
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import attrs
import jax
import jax.numpy as jnp

from ejk.bench._baselines import Baseline, Prepared, baselines_for
from ejk.bench._cases import Case
from ejk.bench._peaks import Peak
from ejk.bench._workloads import MODES, Workload, with_backward, workload_for
from ejk.config.tuning import AutotunePolicy, _error_text, autotune, l2_flusher, measure

__all__ = ["Measurement", "Options", "run", "timed"]

#: Statuses of a measurement.
STATUSES = ("ok", "skipped", "failed", "oom")
_clock = time.perf_counter


@attrs.frozen(kw_only=True)
class Options:
    """How to run.

    Attributes:
        dtype: Element type of the floating inputs.
        modes: ``"fwd"`` and/or ``"fwd+bwd"`` (ops that have no backward run ``fwd`` only).
        impls: Keep only ejk lines whose implementation label starts with one of these
            (``"auto"`` names the line of ``platform="auto"``); empty: all.
        baselines: Keep only baselines whose name starts with one of these; ``None``: all.
        best_config: Also tune each implementation over its config space and time the winner.
        all_configs: Also time every config of each implementation's config space, one line each.
        backward: In ``fwd+bwd``, also pair each implementation's forward with the backward of every
            implementation whose label starts with one of these and consumes its residuals
            (``ImplChoice(backward=...)``).
        max_configs: At most this many configs of each implementation are tuned.
        tune_seconds: Wall-time budget of each implementation's tuning.
        policy: Timing: ``warmup``, ``repeats``, ``min_sample_seconds``, L2 flush.
        seed: Seed of the random inputs.
        compile_workers: Threads compiling the lines of one case at once (then timed one at a time).
    """

    dtype: str = "bfloat16"
    modes: tuple[str, ...] = MODES
    impls: tuple[str, ...] = ()
    baselines: tuple[str, ...] | None = None
    best_config: bool = False
    all_configs: bool = False
    backward: tuple[str, ...] = ()
    max_configs: int = 8
    tune_seconds: float = 60.0
    policy: AutotunePolicy = attrs.field(factory=lambda: AutotunePolicy(
        warmup=2, repeats=10, min_sample_seconds=0.02, progress=False, persist=False))
    seed: int = 0
    compile_workers: int = attrs.field(factory=lambda: max(1, min(4, os.cpu_count() or 1)))


@attrs.frozen(kw_only=True)
class Measurement:
    """One line of the report: one implementation or baseline on one case in one mode.

    Times are seconds per call; ``rate`` is in ``unit`` (TFLOP/s or GB/s); ``ratio`` is the rate
    over the best comparable baseline's; ``peak_fraction`` the rate over the device's peak.
    """

    op: str
    case: str
    series: str
    x: int
    mode: str
    name: str
    kind: str  # "ejk", "ejk-auto", "ejk-best", "ejk-config" (one config of a sweep) or "baseline"
    status: str = attrs.field(validator=attrs.validators.in_(STATUSES))
    implementation: str | None = None
    config: str | None = None
    error: str | None = None
    note: str | None = None
    comparable: bool = True
    compile_s: float | None = None
    median_s: float | None = None
    iqr_s: float | None = None
    min_s: float | None = None
    max_s: float | None = None
    times: tuple[float, ...] = ()
    calls_per_sample: int | None = None
    work: float | None = None
    unit: str | None = None
    rate: float | None = None
    ratio: float | None = None
    peak_fraction: float | None = None
    max_abs_diff: float | None = None
    diff_against: str | None = None
    #: Eager lines of the overhead study: the median and the best time of the same public call under
    #: ``jax.jit`` (its samples taken alternately with this line's).
    jit_s: float | None = None
    jit_min_s: float | None = None
    #: The case's call as implementations see it (arrays as ``{"shape", "dtype"}``, static arguments as
    #: values): what ``ejk bench --write-pack`` groups shape classes by.
    call: dict[str, Any] | None = attrs.field(default=None, eq=False)

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self, recurse=False) | {"times": list(self.times)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measurement:
        """The measurement :meth:`to_json` wrote (unknown keys are ignored)."""
        names = {field.name for field in attrs.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        return cls(**values | {"times": tuple(values.get("times") or ())})


@attrs.frozen(kw_only=True)
class _Line:
    """A line to measure: how to build its function, or why it is skipped."""

    name: str
    kind: str
    build: Callable[[str], Prepared] | None = attrs.field(default=None, eq=False)
    implementation: str | None = None
    config: str | None = None
    skip: str | None = None
    note: str | None = None
    comparable: bool = True
    modes: tuple[str, ...] | None = None  # None: every mode


def _selected(label: str, prefixes: Sequence[str] | None) -> bool:
    """Whether ``label`` starts with one of ``prefixes`` (``None``: every label is selected)."""
    return prefixes is None or any(label.startswith(p) for p in prefixes)


def _where(exc: BaseException, frames: int = 3) -> str:
    """`` (at file:line function ← …)``: the innermost ``frames`` of ``exc``'s traceback, innermost first
    (where a baseline's own library failed, which its message alone may not say); empty without one."""
    found = traceback.extract_tb(exc.__traceback__)[-frames:]
    if not found:
        return ""
    return " (at " + " ← ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(found)) + ")"


def _failure(stage: str, exc: BaseException) -> tuple[str, str]:
    text = _error_text(stage, exc) + _where(exc)
    oom = "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()
    return ("oom" if oom else "failed"), text


# -- the lines of one case ----------------------------------------------------------------------------


class _EjkLines:
    """ejk's lines of one case: each usable implementation forced, ``platform="auto"``, and the tuned ones."""

    def __init__(self, workload: Workload, inputs: tuple[Any, ...], options: Options) -> None:
        import ejk
        from ejk.ops import get_op

        self.workload = workload
        self.inputs = inputs
        self.options = options
        self.kernel = get_op(workload.op).kernel
        self.events: list[Any] = []
        chain: ejk.ConfigSelectorChain[Any] = ejk.ConfigSelectorChain(
            policy=ejk.AutotunePolicy(mode="heuristics"), persist=False, on_event=self.events.append)
        self.executor: ejk.Executor[Any, Any] = ejk.Executor(chain)
        arrays, static = workload.normalize(inputs)
        self.inv = self.executor.invocation(self.kernel, arrays, {**static, "platform": "auto"})

    def call_summary(self) -> dict[str, Any]:
        """The case's call as JSON: each array's shape and dtype, each scalar static argument."""
        summary: dict[str, Any] = {}
        for name, value in self.kernel.call_view(self.inv).items():
            if hasattr(value, "shape") and hasattr(value, "dtype"):
                summary[name] = {"shape": [int(n) for n in value.shape], "dtype": jnp.dtype(value.dtype).name}
            elif value is None or isinstance(value, bool | int | float | str):
                summary[name] = value
        return summary

    def _through_executor(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        import ejk

        def traced(*args: Any) -> Any:
            with ejk.use_executor(self.executor):  # the choice is made while tracing
                return fn(*args)

        return traced

    def _prepared(self, platform: str, cfg: Any) -> Prepared:
        fn = self._through_executor(self.workload.call(platform=platform, cfg=cfg))
        return Prepared(fn=fn, args=self.inputs, diff=self.workload.diff)

    def _forced(self, platform: str, choice: Any, mode: str) -> Prepared:
        return self._prepared(platform, choice)

    def implementations(self) -> Iterator[tuple[Any, Any, str | None]]:
        """``(spec, its choice with the heuristic's config, None)`` for each selected implementation written
        for this backend, or ``(spec, None, why it cannot run)``."""
        from ejk.ops import ImplChoice
        from ejk.registry import Backend, default_backend

        backend = default_backend()
        for candidate in self.kernel.candidates(self.inv):
            spec = candidate.spec
            if spec.backend not in (Backend.ANY, backend) or not _selected(spec.label, self.options.impls or None):
                continue  # written for another backend: not a line here
            if candidate.reason is not None:
                yield spec, None, candidate.reason
                continue
            try:
                cfg = self.kernel.heuristic_of(spec, self.inv)
            except Exception as exc:
                yield spec, None, _error_text("heuristic config", exc)
                continue
            yield spec, ImplChoice(platform=spec.platform, backend=spec.backend, implementation=spec.name,
                                   cfg=cfg), None

    def lines(self) -> Iterator[_Line]:
        for spec, choice, skip in self.implementations():
            name = f"ejk {spec.label}"
            if skip is not None:
                yield _Line(name=name, kind="ejk", implementation=spec.label, skip=skip)
                continue
            cfg = choice.cfg
            yield _Line(name=name, kind="ejk", implementation=spec.label, config=repr(cfg),
                        build=functools.partial(self._forced, str(spec.platform), choice))
            if self.options.best_config:
                yield from self._best_line(spec)
            if self.options.all_configs:
                yield from self._config_lines(spec, cfg)
            if self.options.backward:
                yield from self._paired_lines(spec, choice)
        if _selected("auto", self.options.impls or None):
            yield _Line(name="ejk auto", kind="ejk-auto", build=lambda mode: self._prepared("auto", None),
                        note="platform='auto', heuristics tier")
            if self.options.best_config:
                yield _Line(name="ejk auto tuned", kind="ejk-best", build=self._auto_tuned)

    def _config_lines(self, spec: Any, heuristic: Any) -> Iterator[_Line]:
        """One line per config of ``spec``'s config space (the heuristic's marked)."""
        from ejk.ops import ImplChoice

        try:
            space = self.kernel.config_space_of(spec, self.inv)
        except Exception as exc:
            yield _Line(name=f"ejk {spec.label} #*", kind="ejk-config", implementation=spec.label,
                        skip=_error_text("config space", exc))
            return
        for i, cfg in enumerate(space):
            choice = ImplChoice(platform=spec.platform, backend=spec.backend, implementation=spec.name, cfg=cfg)
            yield _Line(name=f"ejk {spec.label} #{i}", kind="ejk-config", implementation=spec.label,
                        config=repr(cfg), note="the heuristic's config" if cfg == heuristic else None,
                        build=functools.partial(self._forced, str(spec.platform), choice))

    def _paired_lines(self, spec: Any, choice: Any) -> Iterator[_Line]:
        """``spec``'s forward with the backward of each implementation ``options.backward`` names that
        consumes the residuals ``spec`` saves (``fwd+bwd`` only; the pairing's gate may skip it)."""
        from ejk.ops import ImplChoice
        from ejk.registry import Backend, default_backend

        if spec.vjp is None:
            return
        for other in self.kernel.registry.list_implementations(self.workload.op):
            named = any(other.label.startswith(b) for b in self.options.backward)
            if (not named or other.label == spec.label or other.backend not in (Backend.ANY, default_backend())
                    or other.vjp is None or other.vjp.paired or other.vjp.residuals != spec.vjp.residuals):
                continue
            name = f"ejk {spec.label} + bwd {other.label}"
            backward = ImplChoice(platform=other.platform, backend=other.backend, implementation=other.name)
            try:  # the gate first: a backward's heuristic may assume a call its gate refuses
                skip = self.kernel.unusable_reason(self.inv, attrs.evolve(choice, backward=backward))
                if skip is None:
                    backward = attrs.evolve(backward, cfg=self.kernel.heuristic_of(other, self.inv))
                paired = attrs.evolve(choice, backward=backward)
            except Exception as exc:
                yield _Line(name=name, kind="ejk", implementation=spec.label, modes=("fwd+bwd",),
                            skip=_error_text("backward pairing", exc))
                continue
            yield _Line(name=name, kind="ejk", implementation=spec.label, config=str(paired), skip=skip,
                        modes=("fwd+bwd",), build=functools.partial(self._forced, str(spec.platform), paired))

    def _tuning_policy(self, mode: str) -> AutotunePolicy:
        return attrs.evolve(self.options.policy, objective="forward" if mode == "fwd" else "forward_backward",
                            max_seconds=self.options.tune_seconds, max_candidates=None, persist=False,
                            progress=False, compile_workers=self.options.compile_workers)

    def _auto_tuned(self, mode: str) -> Prepared:
        """``platform="auto"`` with autotuning over every implementation's configs (tuned here, untimed)."""
        import ejk

        events: list[Any] = []
        policy = attrs.evolve(self._tuning_policy(mode), mode="autotune")
        chain: ejk.ConfigSelectorChain[Any] = ejk.ConfigSelectorChain(policy=policy, persist=False,
                                                                       on_event=events.append)
        arrays, static = self.workload.normalize(self.inputs)
        choice = ejk.Executor(chain).choose_config(self.kernel, *arrays, platform="auto", **static)
        tuned = next((e for e in events if e.tune is not None), None)
        note = tuned.tune.describe() if tuned is not None else f"chosen by the {events[-1].tier} tier"
        prepared = self._prepared("auto", choice)
        return attrs.evolve(prepared, fn=_Tuned(prepared.fn, repr(choice.cfg), note, self.kernel.cfg_label(choice)))

    def _best_line(self, spec: Any) -> Iterator[_Line]:
        try:
            space = self.kernel.config_space_of(spec, self.inv)[: self.options.max_configs]
        except Exception as exc:
            yield _Line(name=f"ejk {spec.label} best", kind="ejk-best", implementation=spec.label,
                        skip=_error_text("config space", exc))
            return
        if len(space) < 2:
            return  # nothing to choose from: the heuristic line is the best line
        yield _Line(name=f"ejk {spec.label} best", kind="ejk-best", implementation=spec.label,
                    build=lambda mode: self._tuned(spec, space, mode))

    def _tuned(self, spec: Any, space: list[Any], mode: str) -> Prepared:
        from ejk.ops import ImplChoice

        policy = self._tuning_policy(mode)
        choices = [ImplChoice(platform=spec.platform, backend=spec.backend, implementation=spec.name, cfg=c)
                   for c in space]
        result = autotune(self.kernel, self.inv, choices, policy)
        if result.best is None:
            errors = "; ".join(sorted({t.error for t in result.trials if t.error}))
            raise RuntimeError(f"no config of {spec.label} ran: {errors}")
        prepared = self._prepared(str(spec.platform), result.best)
        return attrs.evolve(prepared, fn=_Tuned(prepared.fn, repr(result.best.cfg), result.describe(), spec.label))

    def auto_choice(self) -> str | None:
        """The implementation ``platform="auto"`` chose (from the executor's last event)."""
        for event in reversed(self.events):
            if event.tier != "override":
                return str(self.kernel.cfg_label(event.cfg))
        return None


class _Tuned:
    """A tuned line's function, carrying its winning config and how tuning went."""

    def __init__(self, fn: Callable[..., Any], config: str, note: str, implementation: str | None) -> None:
        self.fn, self.config, self.note, self.implementation = fn, config, note, implementation

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def _baseline_lines(workload: Workload, inputs: tuple[Any, ...], options: Options) -> Iterator[_Line]:
    for baseline in baselines_for(workload.op):
        if _selected(baseline.name, options.baselines):
            yield _baseline_line(baseline, workload, inputs)


def _baseline_line(baseline: Baseline, workload: Workload, inputs: tuple[Any, ...]) -> _Line:
    try:
        skip = baseline.unsupported(workload)
        comparable = baseline.comparable(workload)
    except Exception as exc:
        return _Line(name=baseline.name, kind="baseline", skip=_error_text("support check", exc))
    return _Line(name=baseline.name, kind="baseline", skip=skip, note=baseline.note, comparable=comparable,
                 build=lambda mode: baseline.build(workload, inputs))


# -- measuring ------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class _Lowered:
    """A line traced and lowered (in the calling thread), ready to compile in any thread."""

    line: _Line
    base: Measurement
    lowered: Any
    args: tuple[Any, ...]
    seconds: float


def _lower(line: _Line, workload: Workload, mode: str, ct: Any) -> _Lowered | Measurement:
    """Build and lower one line, or the measurement saying why it cannot run."""
    work, unit = workload.work(mode)
    case = workload.case
    base = Measurement(op=workload.op, case=case.label, series=case.series, x=case.x, mode=mode, name=line.name,
                       kind=line.kind, status="skipped", implementation=line.implementation, config=line.config,
                       note=line.note, comparable=line.comparable, work=work, unit=unit)
    if line.skip is not None or line.build is None:
        return attrs.evolve(base, error=line.skip)
    stage = "build"
    try:
        prepared = line.build(mode)
        if isinstance(prepared.fn, _Tuned):
            base = attrs.evolve(base, config=prepared.fn.config, note=prepared.fn.note,
                                implementation=prepared.fn.implementation)
        if prepared.external is not None:  # timed outside JAX: nothing to lower or compile
            start = _clock()
            external = prepared.external(mode, ct)
            return _Lowered(line=line, base=base, lowered=external, args=(), seconds=_clock() - start)
        fn, args = prepared.fn, prepared.args
        if mode != "fwd":
            fn, args = with_backward(prepared.fn, prepared.diff), (*prepared.args, ct)
        stage = "compile"
        start = _clock()
        lowered = jax.jit(fn).lower(*args)
    except Exception as exc:
        status, text = _failure(stage, exc)
        return attrs.evolve(base, status=status, error=text)
    return _Lowered(line=line, base=base, lowered=lowered, args=args, seconds=_clock() - start)


def _compile(item: _Lowered) -> tuple[Any, float]:
    """``(executable or the exception, seconds)`` (XLA releases the GIL while it compiles)."""
    if not hasattr(item.lowered, "compile"):  # a line timed outside JAX (see Prepared.external)
        return item.lowered, 0.0
    start = _clock()
    try:
        return item.lowered.compile(), _clock() - start
    except Exception as exc:
        return exc, _clock() - start


def _time(item: _Lowered, compiled: Any, compile_s: float, options: Options,
          flush: Callable[[], None] | None) -> tuple[Measurement, Any]:
    """Run a compiled line once, then time it; returns the measurement and the first run's output."""
    base = item.base
    if isinstance(compiled, BaseException):
        status, text = _failure("compile", compiled)
        return attrs.evolve(base, status=status, error=text), None
    args = item.args
    external = item.lowered is compiled  # timed outside JAX: by the wall clock, released afterwards
    policy = attrs.evolve(options.policy, clock="wall") if external else options.policy
    try:
        out = jax.block_until_ready(compiled(*args))
        if external:
            out = out.to_jax() if hasattr(out, "to_jax") else None
        calls, times = measure(lambda: compiled(*args), policy, flush)
    except Exception as exc:
        status, text = _failure("run", exc)
        return attrs.evolve(base, status=status, error=text), None
    finally:
        if external and hasattr(compiled, "close"):
            compiled.close()
    return timed(base, times, calls, compile_s), out


def timed(base: Measurement, times: Sequence[float], calls: int | None,
          compile_s: float | None = None) -> Measurement:
    """``base`` measured: status ``ok``, the median, spread and rate of ``times`` (seconds per call)."""
    median = statistics.median(times)
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else (median,) * 3
    scale = 1e12 if base.unit == "TFLOP/s" else 1e9
    rate = None if base.work is None else base.work / median / scale
    return attrs.evolve(base, status="ok", compile_s=compile_s, median_s=median, iqr_s=q3 - q1, min_s=min(times),
                        max_s=max(times), times=tuple(times), calls_per_sample=calls, rate=rate)


def _measure_group(lines: Sequence[_Line], workload: Workload, mode: str, options: Options,
                   flush: Callable[[], None] | None, ct: Any) -> Iterator[tuple[Measurement, Any]]:
    """Measure every line of one (case, mode): lower one after another, compile in parallel threads,
    then time one at a time (nothing else running). Yields ``(measurement, forward output or None)``."""
    lowered: list[_Lowered | Measurement] = [_lower(line, workload, mode, ct) for line in lines
                                               if line.modes is None or mode in line.modes]
    todo = [item for item in lowered if isinstance(item, _Lowered)]
    workers = max(1, min(options.compile_workers, len(todo)))
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ejk-bench") as pool:
        compiled = dict(zip((id(item) for item in todo), pool.map(_compile, todo), strict=True))
    for item in lowered:
        if isinstance(item, Measurement):
            yield item, None
            continue
        executable, seconds = compiled.pop(id(item))
        measured, out = _time(item, executable, item.seconds + seconds, options, flush)
        del executable
        yield measured, (out if mode == "fwd" and measured.status == "ok" else None)


@jax.jit
def _shapes(out: Any) -> list[tuple[int, ...]]:
    """The shapes of an output's arrays (several for an op with several outputs)."""
    return [jnp.shape(leaf) for leaf in jax.tree.leaves(out)]


def _max_abs_diff(got: Any, want: Any) -> jax.Array:
    """The largest difference over every array of two outputs of the same structure."""
    return jnp.max(jnp.stack([jnp.max(jnp.abs(g.astype(jnp.float32) - w.astype(jnp.float32)), initial=0.0)
                              for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)]))


def _finish(group: list[Measurement], outputs: dict[str, Any], peak: Peak | None, dtype: str) -> list[Measurement]:
    """Ratios to the best comparable baseline, fractions of peak, output differences; fastest first."""
    ok = [m for m in group if m.status == "ok" and m.rate is not None]
    baseline_rates = [m.rate for m in ok if m.kind == "baseline" and m.comparable and m.rate]
    best = max(baseline_rates) if baseline_rates else None
    reference = next((m.name for m in group if m.kind == "baseline" and m.comparable and m.name in outputs),
                     next(iter(outputs), None))
    finished = []
    for m in group:
        changes: dict[str, Any] = {}
        if m.status == "ok" and m.rate is not None:
            if best:
                changes["ratio"] = m.rate / best
            limit = None if peak is None else (peak.compute(dtype) if m.unit == "TFLOP/s" else peak.bandwidth_gbs)
            if limit:
                changes["peak_fraction"] = m.rate / limit
        if reference is not None and m.comparable and m.name in outputs and m.name != reference:
            try:
                got, want = outputs[m.name], outputs[reference]
                if _shapes(got) == _shapes(want) and _shapes(got):
                    changes.update(max_abs_diff=float(_max_abs_diff(got, want)), diff_against=reference)
            except Exception:  # a diff that cannot be taken is not a benchmark failure
                pass
        finished.append(attrs.evolve(m, **changes))
    finished.sort(key=lambda m: (m.status != "ok", -(m.rate or 0.0)))
    return finished


def _case_lines(workload: Workload, inputs: tuple[Any, ...], options: Options) -> tuple[list[_Line], Any]:
    ejk_lines: _EjkLines | None = None
    try:
        ejk_lines = _EjkLines(workload, inputs, options)
        lines = list(ejk_lines.lines())
    except Exception as exc:  # the op itself refused the inputs (or no implementation is registered)
        lines = [_Line(name="ejk", kind="ejk", skip=_error_text("dispatch", exc))]
    lines += list(_baseline_lines(workload, inputs, options))
    return lines, ejk_lines


def run(cases: Iterable[Case], options: Options | None = None, *, peak: Peak | None = None,
        on_measurement: Callable[[Measurement], None] | None = None,
        on_group: Callable[[list[Measurement]], None] | None = None) -> list[Measurement]:
    """Measure every line of every case in every mode of ``options``.

    Args:
        cases: The shapes.
        options: How to run.
        peak: The device's peaks (for fractions of peak).
        on_measurement: Called with each measurement as soon as it is taken (progress).
        on_group: Called with each finished (case, mode) group, sorted fastest first.

    Returns:
        Every measurement, group after group, each group fastest first.
    """
    options = options or Options()
    results: list[Measurement] = []
    flush: Callable[[], None] | None = None
    flush_made = False
    for case in cases:
        workload = workload_for(case, options.dtype)
        modes = [mode for mode in options.modes if mode in workload.modes]
        if not modes:
            continue
        try:
            inputs = workload.inputs(options.seed)
            ct = workload.cotangent(options.seed + 1) if any(m != "fwd" for m in modes) else None
        except Exception as exc:
            status, text = _failure("inputs", exc)
            for mode in modes:
                failed = Measurement(op=workload.op, case=case.label, series=case.series, x=case.x, mode=mode,
                                     name="inputs", kind="ejk", status=status, error=text)
                results.append(failed)
                if on_measurement is not None:
                    on_measurement(failed)
            continue
        if not flush_made:
            flush, flush_made = l2_flusher(options.policy, inputs), True
        try:
            lines, ejk_lines = _case_lines(workload, inputs, options)
            for mode in modes:
                group: list[Measurement] = []
                outputs: dict[str, Any] = {}
                for measured, out in _measure_group(lines, workload, mode, options, flush, ct):
                    if measured.kind == "ejk-auto" and ejk_lines is not None and measured.status == "ok":
                        measured = attrs.evolve(measured, implementation=ejk_lines.auto_choice())
                    if ejk_lines is not None:
                        measured = attrs.evolve(measured, call=ejk_lines.call_summary())
                    if out is not None:
                        outputs[measured.name] = out
                    group.append(measured)
                    if on_measurement is not None:
                        on_measurement(measured)
                finished = _finish(group, outputs, peak, options.dtype)
                del outputs
                results.extend(finished)
                if on_group is not None:
                    on_group(finished)
        finally:
            del inputs, ct
    return results
