"""Exceptions raised by ejk. Every message names the thing at fault and how to fix it."""

from __future__ import annotations

__all__ = [
    "ConfigSelectionError",
    "DuplicateKernelError",
    "EjkError",
    "FrozenConfigMissError",
    "KernelContractError",
    "KernelNotFoundError",
    "PluginError",
]


class EjkError(Exception):
    """Base class of every ejk error."""


class KernelNotFoundError(EjkError, ValueError):
    """No registered implementation matches an (algorithm, platform, backend) query."""


class DuplicateKernelError(EjkError, ValueError):
    """One (algorithm, platform, backend, name) was registered twice: by the same plugin, or by a
    second plugin (the first registration keeps the label)."""


class KernelContractError(EjkError, ValueError):
    """An implementation breaks its op's contract: a signature that cannot take the op's call, or an
    output whose shape or dtype differs from the op's declared output."""


class ConfigSelectionError(EjkError, RuntimeError):
    """No tier of the config selection chain produced a config."""


class FrozenConfigMissError(ConfigSelectionError):
    """Under the ``frozen`` policy, a call had no explicit, overlaid or cached config."""


class PluginError(EjkError, RuntimeError):
    """A plugin could not be loaded or one of its hooks failed."""
