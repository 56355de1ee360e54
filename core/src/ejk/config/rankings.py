"""Rankings: which implementation of an op wins per device and shape class, as data in config packs.

A pack's ``rankings`` section maps an op name to a list of rankings, each a measured order of
implementation labels for the calls it covers::

    "rankings": {
      "flash_attention": [
        {"device": "gpu|NVIDIA_H100*",
         "when": {"q.dtype": ["bfloat16", "float16"], "q.shape[3]": [64, 128]},
         "order": ["xla/gpu:cudnn", "pallas/gpu:mosaic", "cute/gpu:fa3", "triton/gpu:flash"],
         "source": "benchmarks/results/pallas_mosaic_attention_h100.md"}
      ]
    }

- ``device``: an :func:`fnmatch.fnmatchcase` pattern over the device fingerprint
  (:func:`ejk.device_fingerprint`, e.g. ``gpu|NVIDIA_H100_80GB_HBM3|cc=9.0``).
- ``when`` (optional): the shape class, every condition must hold. A key names an argument of
  the op's call (an array such as ``q`` or a static argument such as ``causal``), optionally with
  ``.dtype``, ``.ndim``, ``.size`` (elements) or ``.shape[i]`` (``i`` may be negative), or the ratio of two sizes,
  ``"q.shape[0]/kv_lens.shape[0]"`` (queries per sequence: a class that shapes alone cannot name; a
  range only, unknown when the divisor is 0). A value is a JSON scalar (equal),
  a list of scalars (one of them) or ``{"min": x, "max": y}`` (an inclusive range; either bound
  may be left out). ``null`` matches an absent array or a ``None`` argument.
- ``order``: implementation labels (``platform/backend:name``, as ``ejk kernels`` prints them),
  best first. Labels of implementations that are not installed are skipped.
- ``source`` (optional): where the measurement behind the order is recorded.
- ``mode`` (optional): ``"fwd"`` (the order of forward calls), ``"fwd+bwd"`` (the order when the call
  is differentiated: forward plus backward) or absent (both). A ``"fwd+bwd"`` order may name a
  pairing, ``"<forward label>+<backward label>"``: that forward with the other implementation's
  backward (both must declare the same residuals).

In the heuristics tier every ranking that applies to a call orders the usable implementations it
names before those it does not; a later ranking (of the same pack or a later one) orders only what
the earlier ones leave tied, and :class:`ejk.Tier` then ``priority`` decide the rest.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

__all__ = ["MODES", "Condition", "Ranking", "RankingError", "normalize_label", "parse_rankings"]

Scalar = None | bool | int | float | str

_KEY = re.compile(r"^(?P<argument>[A-Za-z_]\w*)(?:\.(?:(?P<attribute>dtype|ndim|size)|shape\[(?P<axis>-?\d+)\]))?$")
_LABEL = re.compile(r"^(?P<platform>[a-z0-9_-]+)/(?P<backend>gpu|tpu|cpu|any)(?::(?P<name>[a-z0-9_-]+))?$")
_ENTRY_KEYS = frozenset({"device", "when", "order", "source", "mode"})
#: What a ranking orders: forward calls, or differentiated calls (forward plus backward).
MODES = ("fwd", "fwd+bwd")


class RankingError(ValueError):
    """A ranking that cannot be used: what is wrong and how to write it instead."""


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def _same(value: Any, wanted: Scalar) -> bool:
    if isinstance(wanted, bool) or isinstance(value, bool):  # True is not 1 in a shape class
        return isinstance(value, bool) and isinstance(wanted, bool) and value == wanted
    return bool(value == wanted)


@attrs.frozen(kw_only=True)
class Condition:
    """One condition of a shape class: ``key`` (as written) holds one of ``values`` or lies in the range."""

    key: str
    argument: str
    attribute: str | None = None
    axis: int | None = None
    values: tuple[Scalar, ...] | None = None
    low: float | None = None
    high: float | None = None
    divisor: Condition | None = None

    @classmethod
    def _parse_ratio(cls, key: str, value: Any) -> Condition:
        """``"A/B"``: two sizes (``.shape[i]``, ``.ndim`` or a numeric static argument) whose ratio lies in a range."""
        terms = key.split("/")
        if len(terms) != 2:
            raise RankingError(f"when key {key!r}: a ratio is two terms, 'a.shape[i]/b.shape[j]'")
        if not isinstance(value, dict):
            raise RankingError(f"when[{key!r}]: a ratio takes a {{'min', 'max'}} range, not {value!r}")
        numerator, denominator = (cls.parse(term.strip(), value) for term in terms)
        if any(part.attribute == "dtype" or part.divisor is not None for part in (numerator, denominator)):
            raise RankingError(f"when key {key!r}: a ratio divides sizes (.shape[i], .ndim, .size or a number), "
                               "not dtypes")
        return attrs.evolve(numerator, key=key, divisor=attrs.evolve(denominator, low=None, high=None))

    @classmethod
    def parse(cls, key: Any, value: Any) -> Condition:
        """Raises :class:`RankingError` naming what is malformed."""
        if isinstance(key, str) and "/" in key:
            return cls._parse_ratio(key, value)
        found = _KEY.match(key) if isinstance(key, str) else None
        if found is None:
            raise RankingError(f"when key {key!r} is not an argument name, optionally with .dtype, .ndim, "
                               ".size or .shape[i] (e.g. 'q.shape[3]'), or a ratio of two sizes (e.g. "
                               "'q.shape[0]/kv_lens.shape[0]')")
        axis = found["axis"]
        where = dict(key=key, argument=found["argument"], attribute="shape" if axis is not None else found["attribute"],
                     axis=None if axis is None else int(axis))
        if isinstance(value, dict):
            bounds = {k: v for k, v in value.items() if k in ("min", "max")}
            if set(value) - {"min", "max"} or not bounds or not all(
                    isinstance(v, int | float) and not isinstance(v, bool) for v in bounds.values()):
                raise RankingError(f"when[{key!r}]: a range is {{'min': number, 'max': number}} (either may be "
                                   f"left out), not {value!r}")
            low, high = bounds.get("min"), bounds.get("max")
            if low is not None and high is not None and low > high:
                raise RankingError(f"when[{key!r}]: min {low} is above max {high}")
            return cls(**where, low=low, high=high)
        values = value if isinstance(value, list) else [value]
        if not values or not all(_is_scalar(v) for v in values):
            raise RankingError(f"when[{key!r}]: a value is a JSON scalar, a non-empty list of scalars or a "
                               f"{{'min', 'max'}} range, not {value!r}")
        return cls(**where, values=tuple(values))

    def value(self, call: Mapping[str, Any]) -> tuple[bool, Any]:
        """``(known, value)`` of the key in ``call``; ``known`` is ``False`` for a missing axis or a ratio
        over 0 (raises :class:`RankingError` for an argument the call does not have)."""
        if self.divisor is not None:
            known, top = attrs.evolve(self, divisor=None).value(call)
            known_below, below = self.divisor.value(call)
            numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (top, below))
            if not (known and known_below and numbers) or below == 0:
                return False, None
            return True, top / below
        if self.argument not in call:
            raise RankingError(f"when key {self.key!r}: the op has no argument {self.argument!r} "
                               f"(its arguments: {', '.join(call)})")
        value = call[self.argument]
        if self.attribute is None or value is None:
            return True, value
        if not (hasattr(value, "shape") and hasattr(value, "dtype")):
            raise RankingError(f"when key {self.key!r}: argument {self.argument!r} is not an array")
        if self.attribute == "dtype":
            return True, np.dtype(value.dtype).name
        shape = tuple(value.shape)
        if self.attribute == "ndim":
            return True, len(shape)
        if self.attribute == "size":
            return True, math.prod(shape)
        assert self.axis is not None
        if not -len(shape) <= self.axis < len(shape):
            return False, None
        return True, shape[self.axis]

    def holds(self, call: Mapping[str, Any]) -> bool:
        """Whether the call is in this condition's class (raises :class:`RankingError` for an unknown argument)."""
        known, value = self.value(call)
        if not known:
            return False
        if self.values is not None:
            return any(_same(value, wanted) for wanted in self.values)
        if not isinstance(value, int | float) or isinstance(value, bool):
            return False
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def __str__(self) -> str:
        if self.values is not None:
            shown = "|".join("null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
                             for v in self.values)
            return f"{self.key}={shown}"
        low = "" if self.low is None else f"{self.low:g}"
        high = "" if self.high is None else f"{self.high:g}"
        return f"{self.key} in [{low}, {high}]"


def normalize_label(label: Any) -> str:
    """A label as :attr:`ejk.KernelSpec.label` writes it (``xla/any:xla`` is ``xla/any``).

    Raises:
        RankingError: for text that is not ``platform/backend[:name]``.
    """
    found = _LABEL.match(label.strip().lower()) if isinstance(label, str) else None
    if found is None:
        raise RankingError(f"order label {label!r} is not 'platform/backend:name' (e.g. 'triton/gpu:flash')")
    base = f"{found['platform']}/{found['backend']}"
    return base if found["name"] in (None, found["platform"]) else f"{base}:{found['name']}"


@attrs.frozen(kw_only=True)
class Ranking:
    """One measured order of implementations for a device pattern and a shape class.

    Attributes:
        op: The op name (``flash_attention``).
        device: Pattern over the device fingerprint.
        when: The shape class: every condition must hold.
        order: Implementation labels, best first.
        source: Where the measurement is recorded (``None``: not said).
        pack: The pack file it comes from.
        index: Its position in the pack's list for ``op``.
    """

    op: str
    device: str
    when: tuple[Condition, ...] = ()
    order: tuple[str, ...]
    source: str | None = None
    pack: str
    index: int = 0
    mode: str | None = None

    def orders(self, mode: str) -> bool:
        """Whether this ranking orders calls of ``mode`` (``"fwd"`` or ``"fwd+bwd"``; one without a mode
        orders both)."""
        return self.mode is None or self.mode == mode

    def applies(self, device: str, call: Mapping[str, Any]) -> bool:
        """Whether this ranking covers ``call`` on ``device`` (raises :class:`RankingError` when a
        condition names an argument the op does not have)."""
        return fnmatch.fnmatchcase(device, self.device) and all(c.holds(call) for c in self.when)

    def position(self, label: str) -> int:
        """Where ``label`` stands (0 is first); ``len(order)`` (after every named one) when not named."""
        try:
            return self.order.index(label)
        except ValueError:
            return len(self.order)

    def describe(self) -> str:
        """``pack <path> for device <pattern>`` plus the shape class, e.g. for ``ejk explain``."""
        text = f"pack {self.pack} for device {self.device}"
        if self.mode is not None:
            text += f" ({self.mode})"
        if self.when:
            text += f" when {', '.join(map(str, self.when))}"
        return text + (f" (measured: {self.source})" if self.source else "")


def _ranking(op: str, index: int, item: Any, pack: str) -> Ranking:
    if not isinstance(item, dict):
        raise RankingError(f"needs an object with device and order, not {type(item).__name__}")
    unknown = sorted(set(item) - _ENTRY_KEYS)
    if unknown:
        raise RankingError(f"unknown key(s) {', '.join(map(repr, unknown))}; a ranking has "
                           f"{', '.join(sorted(_ENTRY_KEYS))}")
    device = item.get("device")
    if not isinstance(device, str) or not device.strip():
        raise RankingError("device needs a device-fingerprint pattern such as 'gpu|NVIDIA_H100*'")
    when = item.get("when", {})
    if not isinstance(when, dict):
        raise RankingError(f"when needs an object of conditions, not {type(when).__name__}")
    order = item.get("order")
    if not isinstance(order, list) or not order:
        raise RankingError("order needs a non-empty list of implementation labels, best first")
    mode = item.get("mode")
    if mode is not None and mode not in MODES:
        raise RankingError(f"mode needs one of {', '.join(map(repr, MODES))} (absent: both), not {mode!r}")
    labels = tuple(_order_label(label, mode) for label in order)
    if len(set(labels)) != len(labels):
        raise RankingError(f"order names an implementation twice: {list(labels)}")
    source = item.get("source")
    if source is not None and not isinstance(source, str):
        raise RankingError(f"source needs a string (where the measurement is recorded), not {source!r}")
    return Ranking(op=op, device=device.strip(), when=tuple(Condition.parse(k, v) for k, v in when.items()),
                   order=labels, source=source, pack=pack, index=index, mode=mode)


def _order_label(label: Any, mode: str | None) -> str:
    """An order's label, normalised; a ``"fwd+bwd"`` ranking's may pair two (``forward+backward``)."""
    if isinstance(label, str) and "+" in label:
        if mode != "fwd+bwd":
            raise RankingError(f"order label {label!r} pairs a forward with a backward: only a ranking with "
                               "mode 'fwd+bwd' may name pairings")
        forward, _, backward = label.partition("+")
        return f"{normalize_label(forward)}+{normalize_label(backward)}"
    return normalize_label(label)


def parse_rankings(section: Any, pack: str) -> tuple[dict[str, tuple[Ranking, ...]], list[str]]:
    """The rankings of a pack's ``rankings`` section by op, and the problems of the entries that
    were left out (a malformed ranking is ignored; the pack's other rankings are kept)."""
    if not isinstance(section, dict):
        return {}, [f"rankings needs an object of op name -> list of rankings, not {type(section).__name__}"]
    found: dict[str, tuple[Ranking, ...]] = {}
    problems: list[str] = []
    for op, items in section.items():
        if not isinstance(items, list):
            problems.append(f"rankings[{op!r}] needs a list of rankings, not {type(items).__name__}")
            continue
        kept = []
        for index, item in enumerate(items):
            try:
                kept.append(_ranking(str(op).strip().lower(), index, item, pack))
            except RankingError as exc:
                problems.append(f"rankings[{op!r}][{index}] is ignored: {exc}")
        if kept:
            found[str(op).strip().lower()] = tuple(kept)
    return found, problems
