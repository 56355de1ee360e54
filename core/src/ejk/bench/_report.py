"""The report: a rich table per op and mode on the terminal, a JSON file with every number, a markdown
summary (device, date, versions, the tables, the headline ratios)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ejk.bench._peaks import Peak
from ejk.bench._runner import Measurement

__all__ = ["FORMAT", "by_op_and_mode", "headlines", "markdown", "read_json", "table", "write_json"]

FORMAT = "ejk-bench"
SCHEMA = 1
#: Kinds of line whose note the table shows (how tuning went, which config of a sweep, an overhead).
_NOTED = ("ejk-best", "ejk-config", "tuning", "ejk")
_STATUS_STYLE = {"ok": "green", "skipped": "yellow", "failed": "red", "oom": "red"}
#: How the report names each ``--clock``.
_CLOCKS = {"wall": "the wall clock", "device": "the GPU's own timeline (the wall clock where none can be read)",
           "busy": "the time the GPU ran something on its own timeline, gaps between calls left out (the wall clock "
                   "where none can be read)"}


#: What the report of each study other than the comparison says about its lines.
_STUDIES = {
    "overhead": "overhead study: `bare X` is implementation X's own function under jax.jit, called directly; "
                "`ejk X` the public op forcing X, under jax.jit (mode jit) or called eagerly (mode eager); "
                "`vs best baseline` is the bare line's time over the ejk line's",
    "tuning": "tuning study: each line autotunes platform='auto' in a fresh interpreter; ms is the whole tuning "
              "run's wall time, compile s its compile phase's",
}


def by_op_and_mode(measurements: Iterable[Measurement]) -> dict[tuple[str, str], list[Measurement]]:
    """Measurements grouped by (op, mode), in first-seen order."""
    groups: dict[tuple[str, str], list[Measurement]] = {}
    for m in measurements:
        groups.setdefault((m.op, m.mode), []).append(m)
    return groups


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e3:,.3f}"


def _rate(m: Measurement) -> str:
    if m.rate is None:
        return ""
    return f"{m.rate:,.1f} {m.unit}" if m.rate >= 1 else f"{m.rate:.4f} {m.unit}"


def _ratio(m: Measurement) -> str:
    return "" if m.ratio is None else f"{m.ratio:.2f}x"


def _peak(m: Measurement) -> str:
    return "" if m.peak_fraction is None else f"{100 * m.peak_fraction:.0f}%"


def _spread(m: Measurement) -> str:
    return "" if m.iqr_s is None else f"±{m.iqr_s * 1e3:,.3f}"


def _compile(m: Measurement) -> str:
    return "" if m.compile_s is None else f"{m.compile_s:.2f}"


def _note(m: Measurement, width: int | None = 90) -> str:
    if m.status != "ok":
        text = f"{m.status}: {m.error or ''}"
    else:
        parts = []
        if m.kind in ("ejk-auto", "tuning") or m.name == "ejk auto tuned":
            parts.append(f"chose {m.implementation}")
        if m.config and m.config != "None":
            parts.append(m.config)
        if m.kind in _NOTED and m.note:
            parts.append(m.note)
        if m.max_abs_diff is not None:
            parts.append(f"max|Δ| {m.max_abs_diff:.2g} vs {m.diff_against}")
        text = "; ".join(parts)
    text = " ".join(text.split())
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def table(measurements: Sequence[Measurement], title: str) -> Any:
    """A rich table of one (op, mode) group."""
    from rich.markup import escape
    from rich.table import Table

    out = Table(title=escape(title), title_justify="left")
    for column, justify in (("shape", "left"), ("line", "left"), ("ms", "right"), ("IQR", "right"),
                            ("rate", "right"), ("vs best baseline", "right"), ("of peak", "right"),
                            ("compile s", "right"), ("note", "left")):
        out.add_column(column, justify=justify)  # type: ignore[arg-type]
    previous = None
    for m in measurements:
        style = _STATUS_STYLE.get(m.status, "white")
        name = f"[bold]{escape(m.name)}[/bold]" if m.kind != "baseline" else escape(m.name)
        note = escape(_note(m))
        out.add_row(escape(m.case) if m.case != previous else "", name, _ms(m.median_s), _spread(m), _rate(m),
                    _ratio(m), _peak(m), _compile(m), f"[{style}]{note}[/{style}]" if m.status != "ok" else note)
        previous = m.case
    return out


def headlines(measurements: Sequence[Measurement]) -> list[str]:
    """One line per (op, mode): ejk's ``platform="auto"`` rate over the best baseline, across cases."""
    lines = []
    for (op, mode), group in by_op_and_mode(measurements).items():
        ratios = [m.ratio for m in group if m.kind == "ejk-auto" and m.ratio is not None]
        if ratios:
            lines.append(f"{op} {mode}: ejk auto at {statistics.median(ratios):.2f}x the best baseline "
                         f"(median of {len(ratios)} shapes, {min(ratios):.2f}–{max(ratios):.2f}x)")
    return lines


def _document(measurements: Sequence[Measurement], environment: dict[str, Any], options: dict[str, Any],
              peak: Peak | None, wall_s: float | None) -> dict[str, Any]:
    return {
        "format": FORMAT, "schema": SCHEMA, "environment": environment, "options": options,
        "peak": None if peak is None else {"name": peak.name, "tflops": peak.tflops,
                                           "bandwidth_gbs": peak.bandwidth_gbs, "source": peak.source},
        "wall_seconds": wall_s,
        "measurements": [m.to_json() for m in measurements],
    }


def write_json(path: Path, measurements: Sequence[Measurement], environment: dict[str, Any],
               options: dict[str, Any], peak: Peak | None, wall_s: float | None = None) -> None:
    """Write every number (atomically: a run cut short leaves the last complete file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_document(measurements, environment, options, peak, wall_s), indent=1, default=str)
                   + "\n", encoding="utf-8")
    tmp.replace(path)


def read_json(path: Path) -> tuple[list[Measurement], dict[str, Any]]:
    """The measurements and the rest of a file :func:`write_json` wrote.

    Raises:
        ValueError: when the file is not an ``ejk bench`` JSON file.
    """
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not an `ejk bench` JSON file")
    return [Measurement.from_json(m) for m in data.get("measurements", [])], data


def markdown(measurements: Sequence[Measurement], environment: dict[str, Any], options: dict[str, Any],
             peak: Peak | None, plots: Sequence[str] = ()) -> str:
    """A short markdown report: device, date, versions, method, headline ratios, the tables."""
    env = environment
    versions = ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items())
    peak_text = (f"{peak.name}: {', '.join(f'{k} {v:g}' for k, v in peak.tflops.items())} TFLOP/s, "
                 f"{peak.bandwidth_gbs:g} GB/s ({peak.source})" if peak else "unknown device: no fractions of peak")
    lines = [
        "# ejk bench", "",
        f"- date: {env.get('date')}",
        f"- device: {env.get('device_kind')} x{env.get('device_count')} ({env.get('backend')}), "
        f"runtime {env.get('platform_version')}, driver {env.get('driver') or '-'}, python {env.get('python')}",
        f"- versions: {versions}",
        f"- peak: {peak_text}",
        f"- dtype {options.get('dtype')}; median of {options.get('repeats')} samples after {options.get('warmup')} "
        "warm-ups, each sample a loop of back-to-back calls lasting >= "
        f"{options.get('min_sample_seconds')} s (L2 flushed before each on GPUs), timed by "
        f"{_CLOCKS.get(str(options.get('clock', 'wall')), options.get('clock'))}; IQR = interquartile range; "
        "compile time apart",
        "- TFLOP/s: attention 4·B·H·Sq·Sk·D (causal halved), fwd+bwd 3.5x; matmuls 2·m·k·n, fwd+bwd 3x; "
        "paged decode GB/s of KV read",
        "- `vs best baseline`: rate over the fastest baseline computing the same thing, in the same run",
        *([f"- {_STUDIES[study]}"] if (study := str(options.get("study"))) in _STUDIES else []),
        "",
    ]
    heads = headlines(measurements)
    if heads:
        lines += ["## Headline", "", *(f"- {h}" for h in heads), ""]
    for (op, mode), group in by_op_and_mode(measurements).items():
        lines += [f"## {op} {mode}", "",
                  "| shape | line | ms | IQR ms | rate | vs best baseline | of peak | compile s | note |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for m in group:
            note = _note(m, width=160).replace("|", "\\|")
            lines.append(f"| {m.case} | {m.name} | {_ms(m.median_s)} | {_ms(m.iqr_s)} | {_rate(m)} | {_ratio(m)} | "
                         f"{_peak(m)} | {_compile(m)} | {note} |")
        lines.append("")
    if plots:
        lines += ["## Plots", "", *(f"![{Path(p).stem}]({Path(p).name})" for p in plots), ""]
    return "\n".join(lines)
