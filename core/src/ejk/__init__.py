"""ejk: a kernel framework for JAX.

A registry of kernel implementations contributed by plugins (XLA, Pallas, Triton, CuTe,
third parties), a config selection chain with caches and autotuning, an Executor that
runs kernels with correct gradients, and public operations on top::

    import ejk
    out = ejk.flash_attention(q, k, v, causal=True)
    y = ejk.run("rms_norm", x, weight, eps=1e-6)   # any registered algorithm, op or not

``import ejk`` loads no plugin: the installed plugins are loaded on first use. The public
operations (and :mod:`ejk.ops`) are imported on first access: every defined operation
(:func:`ejk.ops.define_op`) is ``ejk.<name>``, the built-in ones and, once its plugin is loaded,
one a plugin defines (asking for an unknown name loads the plugins).
"""

from __future__ import annotations

import importlib
import importlib.util
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
from ejk.invocations import get_implementations, get_invocations, record_invocation
from ejk.plugins import PlatformStatus, get_plugin_host
from ejk.registry import VJP, Backend, KernelRegistry, KernelSpec, Platform, Tier, kernel_registry

if TYPE_CHECKING:
    from ejk.ops import (
        ImplChoice,
        explain,
        flash_attention,
        flash_attention_lse,
        flash_attention_varlen,
        gated_delta_rule,
        gated_delta_rule_step,
        get_default_executor,
        gla,
        gla_step,
        grouped_matmul,
        linear_cross_entropy,
        matmul,
        mla_paged_attention,
        ragged_paged_attention,
        rms_norm,
        run,
        set_default_executor,
        ssd,
        ssd_step,
        use_executor,
    )
    from ejk.parallel import ring_attention

__version__ = installed_version("ejk-core") or "0+unknown"

#: The dispatch API of :mod:`ejk.ops` that ``ejk`` serves too (imported on first access, like the ops).
_FROM_OPS = {"ImplChoice", "explain", "gated_delta_rule_step", "get_default_executor", "gla_step", "run",
             "set_default_executor", "ssd_step", "use_executor"}

#: Static typing sees the operations through the imports above; ``__all__`` lists them for tools. At run
#: time ``ejk.<op>`` is read from the op definitions (a test keeps both lists equal to the built-in ops).
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
    "Tier",
    "TuneResult",
    "VJP",
    "__version__",
    "autotune",
    "device_fingerprint",
    "explain",
    "flash_attention",
    "flash_attention_lse",
    "flash_attention_varlen",
    "gated_delta_rule",
    "gated_delta_rule_step",
    "get_default_executor",
    "get_implementations",
    "get_invocations",
    "get_plugin_host",
    "gla",
    "gla_step",
    "grouped_matmul",
    "hookimpl",
    "kernel_registry",
    "linear_cross_entropy",
    "matmul",
    "mla_paged_attention",
    "overlay_cache",
    "ragged_paged_attention",
    "record_invocation",
    "ring_attention",
    "rms_norm",
    "run",
    "set_default_executor",
    "ssd",
    "ssd_step",
    "use_executor",
]


def __getattr__(name: str) -> Any:
    if name in _FROM_OPS or name == "ring_attention":
        value = getattr(importlib.import_module("ejk.parallel" if name == "ring_attention" else "ejk.ops"), name)
        globals()[name] = value
        return value
    if not name.startswith("_") and name.isidentifier():  # an operation: built in, or defined by a plugin
        ops = importlib.import_module("ejk.ops")
        definition = ops.OPS.get(name)
        if definition is None and importlib.util.find_spec(f"{__name__}.{name}") is None:
            # Not a submodule (``from ejk import cli`` asks here first): plugins define their ops
            # when they load, so load them (once) and look again.
            from ejk.registry import kernel_registry

            kernel_registry.list_algorithms()
            definition = ops.OPS.get(name)
        if definition is not None:
            if name in ops.__all__:  # a built-in op: it never changes, keep it
                globals()[name] = definition.function
            return definition.function
    raise AttributeError(f"module 'ejk' has no attribute {name!r}")
