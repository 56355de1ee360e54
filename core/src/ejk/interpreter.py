"""Interpreter switches: an environment variable that runs a plugin's GPU kernels in its toolkit's
interpreter on a CPU (for tests and debugging), e.g. ``EJK_TRITON_INTERPRET=1``.

A plugin keeps one :class:`InterpreterSwitch` and registers its GPU kernels for
:meth:`~InterpreterSwitch.backends`: with the switch on they are registered for the ``cpu``
backend too, so ``platform="<name>"`` runs them interpreted on a CPU-only machine, while
``platform="auto"`` still skips them (the platform reports itself unavailable without a GPU).
"""

from __future__ import annotations

import os

import attrs

from ejk import devices

__all__ = ["InterpreterSwitch"]

_ON = {"1", "true", "yes", "on"}


@attrs.frozen
class InterpreterSwitch:
    """The environment variable ``variable`` asks for the interpreter when it is ``1``, ``true``,
    ``yes`` or ``on`` (any case); it is read on every call, never at import."""

    variable: str

    def requested(self) -> bool:
        """Whether the variable asks for the interpreter."""
        return os.environ.get(self.variable, "").strip().lower() in _ON

    def active(self) -> bool:
        """Whether a kernel launched now runs interpreted: asked for, and no NVIDIA GPU here (on a GPU the
        kernels run compiled whatever the variable says)."""
        return self.requested() and not devices.nvidia_gpu()[0]

    def backends(self) -> tuple[str, ...]:
        """The backends to register GPU kernels for: ``gpu``, plus ``cpu`` when the interpreter is asked for."""
        return ("gpu", "cpu") if self.requested() else ("gpu",)
