"""ejk: a kernel framework for JAX.

A registry of kernel implementations contributed by plugins (XLA, Pallas, Triton, CuTe,
third parties), a config selection chain with caches and autotuning, an Executor that
runs kernels with correct gradients, and public operations on top::

    import ejk
    out = ejk.flash_attention(q, k, v, causal=True)

``import ejk`` loads no plugin: the installed plugins are loaded on first use. The public
operations (and :mod:`ejk.ops`) are imported on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ejk._versions import installed_version
from ejk.config.cache import ConfigCache, overlay_cache
from ejk.config.persistent import PersistentCache, StaleCacheWarning
from ejk.config.selection import ConfigSelectorChain, SelectionEvent
from ejk.config.tuning import AutotunePolicy, TuneResult, autotune
from ejk.errors import (
    ConfigSelectionError,
    DuplicateKernelError,
    EjkError,
    FrozenConfigMissError,
    KernelNotFoundError,
    PluginError,
)
from ejk.execution.device import device_fingerprint
from ejk.execution.executor import ConfigChooser, Executor
from ejk.execution.kernel import Invocation, Kernel
from ejk.hookspecs import hookimpl
from ejk.invocations import get_invocations, record_invocation
from ejk.plugins import PlatformStatus, get_plugin_host
from ejk.registry import VJP, Backend, KernelRegistry, KernelSpec, Platform, kernel_registry

if TYPE_CHECKING:
    from ejk.ops import (
        ImplChoice,
        explain,
        flash_attention,
        flash_attention_lse,
        get_default_executor,
        grouped_matmul,
        matmul,
        ragged_paged_attention,
        set_default_executor,
        use_executor,
    )
    from ejk.parallel import ring_attention

__version__ = installed_version("ejk-core") or "0+unknown"

_LAZY_OPS = {
    "ImplChoice",
    "explain",
    "flash_attention",
    "flash_attention_lse",
    "get_default_executor",
    "grouped_matmul",
    "matmul",
    "ragged_paged_attention",
    "set_default_executor",
    "use_executor",
}

__all__ = [
    "AutotunePolicy",
    "Backend",
    "ConfigCache",
    "ConfigChooser",
    "ConfigSelectionError",
    "ConfigSelectorChain",
    "DuplicateKernelError",
    "EjkError",
    "Executor",
    "FrozenConfigMissError",
    "ImplChoice",
    "Invocation",
    "Kernel",
    "KernelNotFoundError",
    "KernelRegistry",
    "KernelSpec",
    "PersistentCache",
    "Platform",
    "PlatformStatus",
    "PluginError",
    "SelectionEvent",
    "StaleCacheWarning",
    "TuneResult",
    "VJP",
    "__version__",
    "autotune",
    "device_fingerprint",
    "explain",
    "flash_attention",
    "flash_attention_lse",
    "get_default_executor",
    "get_invocations",
    "get_plugin_host",
    "grouped_matmul",
    "hookimpl",
    "kernel_registry",
    "matmul",
    "overlay_cache",
    "ragged_paged_attention",
    "record_invocation",
    "ring_attention",
    "set_default_executor",
    "use_executor",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY_OPS or name == "ring_attention":
        value = getattr(importlib.import_module("ejk.parallel" if name == "ring_attention" else "ejk.ops"), name)
        globals()[name] = value
        return value
    if not name.startswith("_"):  # an operation a plugin defined with ejk.ops.define_op
        definition = importlib.import_module("ejk.ops").OPS.get(name)
        if definition is not None:
            return definition.function
    raise AttributeError(f"module 'ejk' has no attribute {name!r}")
