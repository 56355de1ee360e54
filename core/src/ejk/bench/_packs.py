"""A config pack's rankings from ``ejk bench`` measurements (``ejk bench --write-pack``).

Per op and mode (``fwd``, ``fwd+bwd``), the cases are grouped into shape classes by a few keys of
their call (for attention the dtype, the head dim and ``causal``; see :data:`DEFAULT_KEYS`). In each
class every implementation line (``ejk <label>``; in ``fwd+bwd`` also the pairings ``ejk <fwd> + bwd
<bwd>``, written ``<fwd>+<bwd>``) scores the geometric mean, over the class's cases, of its time over
the fastest implementation's time in that case. The order is by the number of cases a line ran
(more first), then by that score (lower first). Baselines, ``ejk auto`` and tuned lines are left out:
the order ranks what ``platform="auto"`` chooses among.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax

from ejk.bench._runner import Measurement
from ejk.config.packs import PACK_FORMAT
from ejk.config.rankings import Condition, normalize_label

__all__ = ["DEFAULT_KEYS", "default_device_pattern", "rankings_pack"]

#: The shape-class keys of each op (others: the dtype of its first array).
DEFAULT_KEYS: dict[str, tuple[str, ...]] = {
    "flash_attention": ("q.dtype", "q.shape[3]", "causal"),
    "flash_attention_lse": ("q.dtype", "q.shape[3]", "causal"),
    "ragged_paged_attention": ("q.dtype",),
    "matmul": ("a.dtype",),
    "grouped_matmul": ("lhs.dtype",),
}
_PAIR = " + bwd "


def default_device_pattern(environment: dict[str, Any]) -> str:
    """The device pattern of a bench run's ``environment``: ``backend|Device_Kind*`` (as fingerprints read)."""
    backend = str(environment.get("backend") or "*")
    kind = str(environment.get("device_kind") or "*").replace(" ", "_")
    return f"{backend}|{kind}*"


def _label(m: Measurement) -> str | None:
    """The order label of an implementation line, or ``None`` for other lines (baselines, auto, tuned)."""
    if m.kind != "ejk" or not m.name.startswith("ejk "):
        return None
    name = m.name[len("ejk "):]
    try:
        if _PAIR in name:
            forward, _, backward = name.partition(_PAIR)
            return f"{normalize_label(forward)}+{normalize_label(backward)}"
        return normalize_label(name)
    except ValueError:
        return None


def _call(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: jax.ShapeDtypeStruct(tuple(v["shape"]), v["dtype"]) if isinstance(v, dict) else v
            for k, v in summary.items()}


def _class_of(m: Measurement, keys: Sequence[str]) -> tuple[Any, ...] | None:
    if m.call is None:
        return None
    call = _call(m.call)
    values = []
    for key in keys:
        condition = Condition.parse(key, 0)
        try:
            known, value = condition.value(call)
        except ValueError:
            return None
        if not known:
            return None
        values.append(value)
    return tuple(values)


def rankings_pack(measurements: Sequence[Measurement], *, device: str, source: str,
                  keys: dict[str, Sequence[str]] | None = None, name: str | None = None) -> dict[str, Any]:
    """A pack (JSON object) of the rankings ``measurements`` support, one per op, mode and shape class.

    Args:
        measurements: An ``ejk bench`` run's (``bench.json``).
        device: The device-fingerprint pattern the rankings apply to (see :func:`default_device_pattern`).
        source: Where the measurements are recorded (each ranking's ``source``).
        keys: Shape-class keys by op (default :data:`DEFAULT_KEYS`; an op not named: its first array's dtype).
        name: The pack's name.
    """
    chosen = {**DEFAULT_KEYS, **(keys or {})}
    # (op, mode, class) -> case -> label -> seconds
    times: dict[tuple[str, str, tuple[Any, ...]], dict[str, dict[str, float]]] = {}
    class_keys: dict[str, tuple[str, ...]] = {}
    for m in measurements:
        label = _label(m)
        if label is None or m.status != "ok" or m.median_s is None or m.call is None:
            continue
        op_keys = class_keys.setdefault(m.op, tuple(chosen.get(m.op) or (f"{next(iter(m.call))}.dtype",)))
        found = _class_of(m, op_keys)
        if found is None:
            continue
        cases = times.setdefault((m.op, m.mode, found), {})
        cases.setdefault(m.case, {})[label] = min(m.median_s, cases.get(m.case, {}).get(label, math.inf))
    rankings: dict[str, list[dict[str, Any]]] = {}
    for (op, mode, values), cases in sorted(times.items(), key=lambda item: repr(item[0])):
        logs: dict[str, list[float]] = {}
        for by_label in cases.values():
            best = min(by_label.values())
            for label, seconds in by_label.items():
                logs.setdefault(label, []).append(math.log(seconds / best))
        order = sorted(logs, key=lambda label: (-len(logs[label]), sum(logs[label]) / len(logs[label]), label))
        if mode == "fwd":
            order = [label for label in order if "+" not in label]
        when = {key: value for key, value in zip(class_keys[op], values, strict=True)}
        rankings.setdefault(op, []).append({
            "device": device, "mode": mode, "when": when, "order": order,
            "source": f"{source} ({len(cases)} case(s): {', '.join(sorted(cases))})"})
    return {"format": PACK_FORMAT, "schema": 1, "name": name or f"rankings measured by ejk bench on {device}",
            "rankings": rankings}
