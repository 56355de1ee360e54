"""Where the Pallas kernels can run here: an NVIDIA GPU (Triton lowering), or interpret mode on the CPU.

``EJK_PALLAS_INTERPRET=1`` asks for Pallas's interpret mode: the same kernel sources run on the
CPU through ``pallas_call(..., interpret=True)`` (slowly, for tests and debugging) and the
kernels are registered for the ``cpu`` backend too, so ``platform="pallas"`` works on a CPU-only
machine. ``platform="auto"`` never picks the interpreted kernels: the platform still reports
itself unavailable without an NVIDIA GPU. Nothing here imports Pallas.
"""

from __future__ import annotations

from ejk.plugin import InterpreterSwitch, PlatformStatus, devices, installed_version

__all__ = ["INTERPRET_ENV", "backends", "interpret_mode", "nvidia_gpu", "platform_status", "use_interpreter"]

#: Environment variable that selects Pallas's interpret mode (test / debug mode, CPU).
INTERPRET_ENV = "EJK_PALLAS_INTERPRET"
_SWITCH = InterpreterSwitch(INTERPRET_ENV)
#: ``(True, device kind)`` on an NVIDIA GPU, else ``(False, why)`` (ejk's device fact).
nvidia_gpu = devices.nvidia_gpu


def interpret_mode() -> bool:
    """``True`` when ``EJK_PALLAS_INTERPRET`` asks for Pallas's interpret mode."""
    return _SWITCH.requested()


def backends() -> tuple[str, ...]:
    """Backends to register the GPU kernels for: ``gpu``, plus ``cpu`` in interpret mode."""
    return ("gpu", "cpu") if interpret_mode() else ("gpu",)


def use_interpreter() -> bool:
    """Whether a kernel launched now runs interpreted: interpret mode asked for and no NVIDIA GPU here."""
    return interpret_mode() and not nvidia_gpu()[0]


def platform_status() -> PlatformStatus:
    """The ``pallas`` platform's :class:`~ejk.plugin.PlatformStatus`: available only where a kernel can run compiled.

    Available on an NVIDIA GPU (``triton_lowered``) and on a TPU (``mosaic_tpu``, untested on
    hardware, in the UNTESTED tier so ``platform="auto"`` prefers ejk-xla); on the CPU it says why
    not and how to use interpret mode.
    """

    versions = {dist: v for dist in ("jax", "jaxlib") if (v := installed_version(dist))}
    on_gpu, why = nvidia_gpu()
    if on_gpu:
        return PlatformStatus(platform="pallas", available=True, versions=versions)
    import jax

    if jax.default_backend() == "tpu":  # flash_attention: mosaic_tpu (untested on hardware)
        return PlatformStatus(platform="pallas", available=True, versions=versions)
    fix = "run on a machine with an NVIDIA GPU (or a TPU)"
    if interpret_mode():
        fix += f" ({INTERPRET_ENV}=1 is set: platform='pallas' runs the kernels in Pallas's interpret mode)"
    else:
        fix += (f"; to check the kernels' numerics on the CPU, set {INTERPRET_ENV}=1 and pass platform='pallas' "
                "(Pallas's interpret mode: slow, for tests)")
    return PlatformStatus(platform="pallas", available=False, versions=versions,
                          reason=f"no NVIDIA GPU or TPU ({why})", fix=fix)
