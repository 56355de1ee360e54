"""The ``xla`` entry point: registers the XLA implementations, their config spaces and heuristics."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ejk
from ejk_xla import _flash_attention, _grouped_matmul, _matmul, _paged_attention

_MODULES = {
    "flash_attention": _flash_attention,
    "matmul": _matmul,
    "grouped_matmul": _grouped_matmul,
    "ragged_paged_attention": _paged_attention,
}
_IMPLEMENTATIONS = {
    "flash_attention": (_flash_attention.flash_attention, _flash_attention.FlashAttentionConfig),
    "matmul": (_matmul.matmul, _matmul.MatmulConfig),
    "grouped_matmul": (_grouped_matmul.grouped_matmul, _grouped_matmul.GroupedMatmulConfig),
    "ragged_paged_attention": (_paged_attention.ragged_paged_attention, _paged_attention.PagedAttentionConfig),
}


@ejk.hookimpl
def ejk_register_kernels(register: Callable[..., Callable[[Any], Any]]) -> None:
    for algorithm, (implementation, cfg_type) in _IMPLEMENTATIONS.items():
        register(algorithm, ejk.Platform.XLA, ejk.Backend.ANY, priority=0, cfg_type=cfg_type)(implementation)


@ejk.hookimpl
def ejk_config_space(algorithm: str, platform: str, invocation: ejk.Invocation[Any]) -> Sequence[Any] | None:
    if platform != ejk.Platform.XLA or algorithm not in _MODULES:
        return None
    return _MODULES[algorithm].config_space(*invocation.abstract_args)  # type: ignore[no-any-return]


@ejk.hookimpl
def ejk_heuristic_config(algorithm: str, platform: str, invocation: ejk.Invocation[Any]) -> Any | None:
    if platform != ejk.Platform.XLA or algorithm not in _MODULES:
        return None
    return _MODULES[algorithm].heuristic_config(*invocation.abstract_args)


@ejk.hookimpl
def ejk_platform_status() -> ejk.PlatformStatus:
    import jax

    return ejk.PlatformStatus(platform="xla", available=True, versions={"jax": jax.__version__})
