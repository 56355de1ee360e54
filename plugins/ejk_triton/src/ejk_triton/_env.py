"""Where Triton kernels can run here: an NVIDIA GPU through jax-triton, or the Triton interpreter.

``EJK_TRITON_INTERPRET=1`` asks for the interpreter: the same ``@triton.jit`` sources run on
the CPU (slowly, for tests and debugging), bridged into JAX with ``jax.pure_callback``. Triton
reads ``TRITON_INTERPRET`` when it is first imported, so :func:`import_triton` sets it from
``EJK_TRITON_INTERPRET`` just before ejk-triton imports triton (nothing is set at import of
this package). One process cannot mix interpreted and compiled Triton kernels; with the
variable set every ejk-triton kernel of the process is interpreted. The interpreted mode is
never chosen by ``platform="auto"``: the platform still reports itself unavailable without
an NVIDIA GPU, but ``platform="triton"`` runs through the interpreter.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

from ejk.plugin import InterpreterSwitch, PlatformStatus, devices, installed_version

__all__ = ["INTERPRET_ENV", "backends", "import_triton", "interpret_mode", "interpreting_on_cpu", "nvidia_gpu",
           "platform_status"]

#: Environment variable that selects the Triton interpreter (test / debug mode, CPU).
INTERPRET_ENV = "EJK_TRITON_INTERPRET"
_SWITCH = InterpreterSwitch(INTERPRET_ENV)
#: ``(True, device kind)`` on an NVIDIA GPU, else ``(False, why)`` (ejk's device fact).
nvidia_gpu = devices.nvidia_gpu


def interpret_mode() -> bool:
    """``True`` when ``EJK_TRITON_INTERPRET`` asks for the Triton interpreter."""
    return _SWITCH.requested()


def interpreting_on_cpu() -> bool:
    """The kernels will run through the interpreter: it is asked for and there is no NVIDIA GPU (on a GPU
    they run compiled whatever the variable says), so configs take the interpreter's small tiles."""
    return interpret_mode() and not nvidia_gpu()[0]


def backends() -> tuple[str, ...]:
    """Backends to register the kernels for: ``gpu``, plus ``cpu`` in the interpreter mode.

    The ``cpu`` registration lets ``platform="triton"`` run interpreted on a CPU-only machine;
    ``platform="auto"`` still skips it because the platform reports itself unavailable there.
    """
    return ("gpu", "cpu") if interpret_mode() else ("gpu",)


def import_triton() -> ModuleType:
    """Import triton, in interpreter mode when ``EJK_TRITON_INTERPRET`` asks for it.

    Raises:
        RuntimeError: interpreter mode is asked for but triton was already imported without
            ``TRITON_INTERPRET=1`` (set the variable before the process imports triton).
    """
    if interpret_mode():
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                f"{INTERPRET_ENV}=1 but triton was imported before ejk-triton could set TRITON_INTERPRET=1; "
                f"set {INTERPRET_ENV}=1 (or TRITON_INTERPRET=1) in the environment before the process starts"
            )
        os.environ["TRITON_INTERPRET"] = "1"
    return importlib.import_module("triton")


def _versions() -> dict[str, str]:

    return {dist: v for dist in ("triton", "jax-triton") if (v := installed_version(dist))}


def platform_status() -> PlatformStatus:
    """The ``triton`` platform's :class:`~ejk.plugin.PlatformStatus` on this machine (imports no toolkit)."""

    versions = _versions()
    on_gpu, why = nvidia_gpu()
    if not on_gpu:
        fix = "run on a machine with an NVIDIA GPU"
        if interpret_mode():
            fix += f" ({INTERPRET_ENV}=1 is set: platform='triton' runs the kernels through the Triton interpreter)"
        else:
            fix += f"; to check the kernels' numerics on the CPU, set {INTERPRET_ENV}=1 and pass platform='triton'"
        return PlatformStatus(platform="triton", available=False, reason=f"no CUDA GPU ({why})", fix=fix,
                              versions=versions)
    missing = [dist for module, dist in (("triton", "triton"), ("jax_triton", "jax-triton"))
               if importlib.util.find_spec(module) is None]
    if missing:
        return PlatformStatus(platform="triton", available=False, reason=f"{', '.join(missing)} not installed",
                              fix=f"pip install {' '.join(missing)}", versions=versions)
    return PlatformStatus(platform="triton", available=True, versions=versions)
