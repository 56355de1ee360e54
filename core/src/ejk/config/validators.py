"""attrs validators for implementations' config classes.

Each rejects ``bool`` (an ``int`` subclass) and raises ``ValueError`` naming the config class,
the field, the value and what it needs, e.g. ``FlashAttentionConfig.block_m is 48 but needs a
power of two >= 16`` (``attrs.validators.in_`` / ``ge`` / ``instance_of(int)`` accept ``True``
for ``1`` and name neither the class nor the fix, hence these)::

    @attrs.frozen(kw_only=True)
    class MyConfig:
        block: int = attrs.field(default=128, validator=power_of_two(16))
        warps: int = attrs.field(default=4, validator=one_of(1, 2, 4, 8))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

__all__ = ["int_in", "multiple_of", "one_of", "one_of_str", "positive_int", "power_of_two"]

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validator(ok: Callable[[Any], bool], needs: str) -> Validator:
    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not ok(value):
            raise ValueError(f"{type(instance).__name__}.{attribute.name} is {value!r} but needs {needs}")

    return check


def power_of_two(minimum: int = 1) -> Validator:
    """An int that is a power of two, at least ``minimum``."""
    return _validator(lambda v: _is_int(v) and v >= minimum and not v & (v - 1), f"a power of two >= {minimum}")


def multiple_of(step: int) -> Validator:
    """A positive int that is a multiple of ``step``."""
    return _validator(lambda v: _is_int(v) and v >= step and v % step == 0, f"a multiple of {step}")


def one_of(*values: int) -> Validator:
    """One of ``values``."""
    return _validator(lambda v: _is_int(v) and v in values, f"one of {', '.join(map(str, values))}")


def one_of_str(*values: str) -> Validator:
    """One of the strings ``values``."""
    return _validator(lambda v: isinstance(v, str) and v in values, f"one of {', '.join(map(repr, values))}")


def int_in(low: int, high: int) -> Validator:
    """An int in ``[low, high]``."""
    return _validator(lambda v: _is_int(v) and low <= v <= high, f"an int in [{low}, {high}]")


#: A positive int.
positive_int: Validator = _validator(lambda v: _is_int(v) and v >= 1, "a positive int")
