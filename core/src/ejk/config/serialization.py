"""Configs to JSON values and back: attrs classes, dataclasses, pydantic v2 models, or a
``dumper`` / ``loader`` pair of the caller's own."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

import attrs

__all__ = ["from_jsonable", "to_jsonable"]


def to_jsonable(cfg: Any, dumper: Callable[[Any], Any] | None = None) -> Any:
    """Serialise a config: ``dumper``, attrs class, dataclass, pydantic v2 model, or raw JSON.

    Raises:
        TypeError: when the result is not JSON-serialisable (pass a ``dumper``).
    """
    if dumper is not None:
        data = dumper(cfg)
    elif attrs.has(type(cfg)):
        data = attrs.asdict(cfg, recurse=True)
    elif dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        data = dataclasses.asdict(cfg)
    elif hasattr(cfg, "model_dump") and callable(cfg.model_dump):
        data = cfg.model_dump(mode="json")
    else:
        data = cfg
    try:
        json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"config {cfg!r} of type {type(cfg).__name__} is not JSON-serialisable ({exc}); "
            "use an attrs class, a dataclass or a pydantic model, or pass dumper=/loader="
        ) from None
    return data


def from_jsonable(data: Any, loader: Callable[[Any], Any] | None = None, cfg_type: type | None = None) -> Any:
    """Rebuild a config with ``loader`` or ``cfg_type`` (attrs / dataclass / pydantic); else raw."""
    if loader is not None:
        return loader(data)
    if cfg_type is None:
        return data
    if hasattr(cfg_type, "model_validate"):
        return cfg_type.model_validate(data)
    if isinstance(data, Mapping) and (attrs.has(cfg_type) or dataclasses.is_dataclass(cfg_type)):
        return cfg_type(**{key: _as_tuples(value) for key, value in data.items()})
    return cfg_type(data)


def _as_tuples(value: Any) -> Any:
    """JSON has no tuples: arrays come back as tuples, as immutable (hashable) configs hold them."""
    if isinstance(value, list):
        return tuple(_as_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _as_tuples(v) for k, v in value.items()}
    return value
