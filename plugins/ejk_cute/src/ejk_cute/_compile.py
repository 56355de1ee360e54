"""CUTLASS's JAX bridge, imported lazily: availability, ``cutlass_call``, and lowering for CUDA on any host.

Nothing here imports CUTLASS at import time. :func:`import_cutlass` is the one place that does;
the DSL reads ``CUTE_DSL_ARCH`` when it is first imported, so a CPU host that compiles kernels
ahead of time (the CI's compile tests) must set ``CUTE_DSL_ARCH=sm_90a`` before that.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = [
    "ARCH_ENV",
    "CUSTOM_CALL_TARGET",
    "DISTRIBUTION",
    "cutlass_call",
    "cutlass_reason",
    "export_for_cuda",
    "import_cutlass",
    "kernel_calls",
    "version",
]

#: The pip distribution that provides ``cutlass`` (the CuTe DSL and its JAX bridge).
DISTRIBUTION = "nvidia-cutlass-dsl"
#: The extra of ejk-cute that installs it.
EXTRA = "ejk-cute[cutlass]"
#: Environment variable naming the target architecture when there is no GPU to ask (e.g. ``sm_90a``).
ARCH_ENV = "CUTE_DSL_ARCH"
#: The prefix of the custom-call target ``cutlass_call`` lowers to (the kernel binary rides in its config).
CUSTOM_CALL_TARGET = "CuteDSLRT_NvJaxCutlassCall"


def cutlass_reason() -> str | None:
    """Why CUTLASS's CuTe DSL cannot be imported here (not installed), else ``None``. Imports nothing."""
    if importlib.util.find_spec("cutlass") is None:
        return f"needs {DISTRIBUTION} (pip install '{EXTRA}')"
    return None


def version() -> str | None:
    """The installed ``nvidia-cutlass-dsl`` version, or ``None``."""
    from ejk.plugin import installed_version

    return installed_version(DISTRIBUTION)


def import_cutlass() -> ModuleType:
    """Import ``cutlass`` (with ``cutlass.cute`` and ``cutlass.jax``).

    Raises:
        ImportError: nvidia-cutlass-dsl is not installed (the message says what to install).
    """
    reason = cutlass_reason()
    if reason is not None:
        raise ImportError(f"ejk-cute {reason}")
    cutlass = importlib.import_module("cutlass")
    importlib.import_module("cutlass.cute")
    importlib.import_module("cutlass.jax")
    return cutlass


def cutlass_call(launch: Callable[..., Any], *, outputs: Any, input_spec: Any = None, output_spec: Any = None,
                 **constexprs: Any) -> Callable[..., Any]:
    """``cutlass.jax.cutlass_call(launch, ...)``: a JAX-traceable callable running the ``@cute.jit`` ``launch``.

    Args:
        launch: ``launch(stream, *inputs, *outputs, **constexprs)``.
        outputs: ``jax.ShapeDtypeStruct`` (or a tuple of them) of the outputs.
        input_spec: ``cutlass.jax.TensorSpec`` per input (``None``: row-major, natural modes).
        output_spec: Same, per output.
        **constexprs: Compile-time arguments of ``launch`` (hashable; they key the compile cache).
    """
    import_cutlass()
    from cutlass.jax import cutlass_call as call

    return call(launch, output_shape_dtype=outputs, input_spec=input_spec, output_spec=output_spec,  # type: ignore[no-any-return]
                **constexprs)


def export_for_cuda(fn: Callable[..., Any], *args: Any) -> Any:
    """``jax.export`` of ``jax.jit(fn)`` for CUDA: lowers every ``cutlass_call`` and compiles its kernel.

    Works on a CPU host (set ``CUTE_DSL_ARCH=sm_90a`` before CUTLASS is imported): this is how the
    tests compile every config without a GPU. DSL errors surface here.

    Args:
        fn: A function of JAX arrays.
        *args: ``jax.ShapeDtypeStruct`` per argument.

    Returns:
        The ``jax.export.Exported``; :func:`kernel_calls` counts the kernels in it.
    """
    import jax

    import_cutlass()
    from cutlass.jax import get_export_disabled_safety_checks

    exporter = jax.export.export(jax.jit(fn), platforms=["cuda"],
                                 disabled_checks=get_export_disabled_safety_checks())
    return exporter(*args)


def kernel_calls(exported: Any) -> Sequence[str]:
    """The CuTe custom calls of an exported module (one per launched kernel), by target name."""
    text = exported.mlir_module()
    return re.findall(rf"custom_call @({CUSTOM_CALL_TARGET}\w*)", text)
