"""Implementation callables built from a VJP forward."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["without_residuals"]


def without_residuals(
    forward_with_residuals: Callable[..., tuple[Any, Any]], name: str = "forward"
) -> Callable[..., Any]:
    """The implementation callable of a VJP forward: its outputs, the residuals dropped.

    It has the forward's parameters (without its return annotation), so the registry's signature
    checks and ``ejk kernels`` see the op's arguments; ``name`` is its ``__name__``.
    """

    @functools.wraps(forward_with_residuals)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return forward_with_residuals(*args, **kwargs)[0]

    try:
        signature = inspect.signature(forward_with_residuals, eval_str=True)
    except Exception:  # a name only imported under TYPE_CHECKING: as written
        signature = inspect.signature(forward_with_residuals)
    forward.__signature__ = signature.replace(return_annotation=inspect.Signature.empty)  # type: ignore[attr-defined]
    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = f"The outputs of :func:`{forward_with_residuals.__name__}` (no residuals kept)."
    return forward
