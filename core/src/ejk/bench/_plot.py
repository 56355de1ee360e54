"""PNG plots: throughput against the swept size, one file per op and mode, one panel per series.

ejk's lines are solid with markers, the baselines dashed. Needs matplotlib, the optional extra
``ejk-core[plot]`` (imported only here, when plotting).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ejk.bench._cases import CASE_TYPES
from ejk.bench._report import by_op_and_mode
from ejk.bench._runner import Measurement

__all__ = ["MISSING", "plot", "plotting_available"]

MISSING = ("plots need matplotlib, the optional extra of ejk-core: pip install 'ejk-core[plot]' "
           "(the table and the JSON file are written without it)")


#: Lines that are no curve: a config sweep's configs differ from one shape to the next.
_NOT_CURVES = ("ejk-config",)


def plotting_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _x_name(op: str) -> str:
    case_type = CASE_TYPES.get(op)
    return case_type.x_name if case_type is not None else "size"


def _file_name(op: str, mode: str) -> str:
    return f"{op}_{mode.replace('+', '_')}.png"


def _panel(ax: Any, series: str, group: Sequence[Measurement], x_name: str, colours: dict[str, Any]) -> None:
    units = sorted({m.unit for m in group if m.unit})
    for name, colour in colours.items():
        points = sorted((m.x, m.rate) for m in group if m.name == name and m.status == "ok" and m.rate)
        if not points:
            continue
        baseline = next(m.kind == "baseline" for m in group if m.name == name)
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, linestyle="--" if baseline else "-", marker="x" if baseline else "o", markersize=5,
                linewidth=1.2 if baseline else 1.8, color=colour, label=name)
    xs_all = sorted({m.x for m in group})
    if len(xs_all) > 1 and xs_all[-1] / max(xs_all[0], 1) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs_all)
    ax.set_xticklabels([str(x) for x in xs_all], fontsize=8)
    ax.set_title(series, fontsize=10)
    ax.set_xlabel(x_name)
    ax.set_ylabel(" / ".join(units) or "rate")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def plot(measurements: Sequence[Measurement], out_dir: Path, device: str = "") -> list[Path]:
    """Write ``<op>_<mode>.png`` for every (op, mode) with a measured line; returns the files.

    Raises:
        ImportError: with :data:`MISSING` as the message when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(MISSING) from exc
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    curves = [m for m in measurements if m.kind not in _NOT_CURVES]
    for (op, mode), group in by_op_and_mode(curves).items():
        if not any(m.status == "ok" for m in group):
            continue
        series = list(dict.fromkeys(m.series for m in group))
        palette = [plt.get_cmap("tab10")(i) for i in range(10)]
        names = list(dict.fromkeys(m.name for m in group))  # one colour per line across the panels
        colours = {name: palette[i % len(palette)] for i, name in enumerate(names)}
        cols = min(3, len(series))
        rows = math.ceil(len(series) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
        for ax, name in zip(axes.flat, series, strict=False):
            _panel(ax, name, [m for m in group if m.series == name], _x_name(op), colours)
        for ax in list(axes.flat)[len(series):]:
            ax.set_visible(False)
        fig.suptitle(f"{op} {mode}" + (f" — {device}" if device else ""), fontsize=12)
        fig.tight_layout()
        path = out_dir / _file_name(op, mode)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
