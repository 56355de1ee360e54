"""The ``triton`` entry point: registers the Triton implementations, their config spaces and heuristics.

Imports neither triton nor jax-triton: kernels import them when they are first launched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ejk
from ejk_triton import _env, _flash_attention

_MODULES = {"flash_attention": _flash_attention}
_IMPLEMENTATIONS = {
    "flash_attention": (_flash_attention.flash_attention, _flash_attention.FlashAttentionConfig),
}
#: Above ejk-xla's portable kernels (priority 0): on an NVIDIA GPU the Triton kernels are the faster path.
PRIORITY = 10


@ejk.hookimpl
def ejk_register_kernels(register: Callable[..., Callable[[Any], Any]]) -> None:
    for algorithm, (implementation, cfg_type) in _IMPLEMENTATIONS.items():
        for backend in _env.backends():
            register(algorithm, ejk.Platform.TRITON, backend, priority=PRIORITY, cfg_type=cfg_type)(implementation)


@ejk.hookimpl
def ejk_config_space(algorithm: str, platform: str, invocation: ejk.Invocation[Any]) -> Sequence[Any] | None:
    if platform != ejk.Platform.TRITON or algorithm not in _MODULES:
        return None
    return list(_MODULES[algorithm].config_space(*invocation.abstract_args))


@ejk.hookimpl
def ejk_heuristic_config(algorithm: str, platform: str, invocation: ejk.Invocation[Any]) -> Any | None:
    if platform != ejk.Platform.TRITON or algorithm not in _MODULES:
        return None
    return _MODULES[algorithm].heuristic_config(*invocation.abstract_args)


@ejk.hookimpl
def ejk_platform_status() -> ejk.PlatformStatus:
    return _env.platform_status()  # type: ignore[no-any-return]


@ejk.hookimpl
def ejk_device_fingerprint(device: Any) -> dict[str, str] | None:
    capability = getattr(device, "compute_capability", None)
    return {"cc": str(capability)} if capability else None
