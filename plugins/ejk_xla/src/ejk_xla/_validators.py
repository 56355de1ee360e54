"""attrs validators shared by the config classes of ejk-xla."""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["positive_int"]


def positive_int(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """Reject anything but a positive ``int`` (``bool`` included), naming the config field."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{type(instance).__name__}.{attribute.name} is {value!r} but needs a positive int")
