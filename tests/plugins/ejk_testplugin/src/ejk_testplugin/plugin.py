"""The working ``testplugin`` entry point: a kernel on the third-party platform ``testplat``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

import ejk

PLATFORM = "testplat"


@attrs.frozen(kw_only=True)
class ScaleConfig:
    factor: int = 2


def scale(x: Any, *, cfg: ScaleConfig | None = None) -> Any:
    return x * (cfg or ScaleConfig()).factor


@ejk.hookimpl
def ejk_register_kernels(register: Callable[..., Callable[[Any], Any]]) -> None:
    register("testplugin_scale", PLATFORM, ejk.Backend.ANY, priority=5, cfg_type=ScaleConfig)(scale)


@ejk.hookimpl
def ejk_config_space(algorithm: str, platform: str) -> list[ScaleConfig] | None:
    if algorithm != "testplugin_scale" or platform != PLATFORM:
        return None
    return [ScaleConfig(factor=f) for f in (1, 2, 3)]


@ejk.hookimpl
def ejk_heuristic_config(algorithm: str, platform: str) -> ScaleConfig | None:
    return ScaleConfig(factor=3) if (algorithm, platform) == ("testplugin_scale", PLATFORM) else None


@ejk.hookimpl
def ejk_platform_status() -> ejk.PlatformStatus:
    return ejk.PlatformStatus(platform=PLATFORM, available=True, versions={"ejk-testplugin": "0.3.1"})


@ejk.hookimpl
def ejk_device_fingerprint(device: Any) -> dict[str, str]:
    return {"testplugin": "seen"}
