"""The ``ejk`` hook specifications. Plugins implement them with ``@ejk.hookimpl``.

Every hook is called in isolation per plugin: an exception in one plugin's hook is reported
(``ejk plugins``) and the other plugins' answers are still used. Hook implementations may
accept any subset of the documented arguments, as in pluggy.

Plugins are called in this order: hooks marked ``@ejk.hookimpl(tryfirst=True)``, then unmarked
ones, then ``trylast=True``; alphabetically by plugin (entry-point) name within each group. For
the first-result hooks (``ejk_choose_config``, ``ejk_heuristic_config``) the first valid answer
wins. ``EJK_TRACE_HOOKS=1`` logs every call. The authors' guide is docs/PLUGIN_AUTHORS.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ejk.execution.kernel import Invocation, Kernel
    from ejk.plugins import PlatformStatus

__all__ = ["hookimpl", "hookspec"]

hookspec = pluggy.HookspecMarker("ejk")
hookimpl = pluggy.HookimplMarker("ejk")


@hookspec
def ejk_register_kernels(register: Callable[..., Callable[[Any], Any]]) -> None:
    """Register this plugin's kernel implementations.

    Called once per plugin when the registry is first queried. ``register`` has the
    signature of :meth:`ejk.KernelRegistry.register` (``register(algorithm, platform,
    backend, priority=0, *, tier=ejk.Tier.FAST, cfg_type=None, ...)``) and returns a decorator;
    every implementation registered through it records this plugin as its owner.
    """


@hookspec
def ejk_config_space(
    algorithm: str, platform: str, implementation: str, invocation: Invocation[Any]
) -> Sequence[Any] | None:
    """Extra autotuning candidates for one implementation of ``algorithm``.

    An implementation's own candidates come with its registration (``config_space=``); this hook
    lets any plugin (a team's tuning plugin, say) add more. It is asked once per implementation
    (``platform`` and ``implementation`` name it); return ``None`` for the others. Candidates that
    are not instances of the implementation's config class are ignored with a warning. The
    lists of all plugins are concatenated. ``invocation.args`` holds abstract
    ``jax.ShapeDtypeStruct`` leaves (never concrete data).
    """


@hookspec
def ejk_heuristic_config(
    algorithm: str, platform: str, implementation: str, invocation: Invocation[Any]
) -> Any | None:
    """A default config for one implementation of ``algorithm``, without measuring.

    Used when the implementation was registered without ``heuristic=``. Return ``None`` for
    implementations you do not serve; the first result (in the documented plugin order) of the
    implementation's config class is used. Heuristic configs are never persisted as tuned.
    """


@hookspec(firstresult=True)
def ejk_choose_config(invocation: Invocation[Any], kernel: Kernel[Any, Any]) -> Any | None:
    """Override config choice (first result wins).

    Called for every invocation without an explicit ``cfg=``, before the caches and the
    autotuner. Return a config to use it (it is neither cached nor persisted), or ``None``
    to let the normal selection chain decide. For the public operations the config is an
    :class:`ejk.ops.ImplChoice`.
    """


@hookspec
def ejk_platform_status() -> PlatformStatus | Sequence[PlatformStatus] | None:
    """Report whether the platform(s) this plugin serves can run here, and why not.

    Required of every plugin (``ejk.testing.check_plugin`` checks it). Called once after
    loading. The status governs this plugin's own implementations on that platform (another
    plugin's implementations on the same platform follow their own plugin's status); an
    unavailable implementation stays listed (``ejk plugins``, ``ejk kernels``) but
    ``platform="auto"`` never picks it.
    """


@hookspec
def ejk_device_fingerprint(device: Any) -> dict[str, str] | None:
    """Extra facts about ``device`` (a ``jax.Device``) that distinguish cached configs.

    For example SM count or driver version. The dicts of all plugins are merged into the
    device fingerprint that keys every config cache.
    """


@hookspec
def ejk_platform_distributions() -> Mapping[str, str] | None:
    """Distributions that provide platforms this plugin knows of: ``{platform: distribution}``.

    Used for the "what to install" hint of :class:`ejk.KernelNotFoundError` (``pip install
    ejk-triton``). A plugin need not list its own platforms: the distribution of the entry point
    that reports a platform (or is named after it) is used first. Answers of several plugins are
    merged, the first plugin's winning.
    """


@hookspec
def ejk_config_packs() -> Sequence[str | os.PathLike[str]] | None:
    """Config packs this plugin ships: paths of ``ejk-config-pack`` JSON files (``ejk cache export --pack``).

    A pack holds tuned configs for named devices (keyed by device fingerprint, like the
    persistent cache) and measured rankings of implementations per device and shape class
    (docs/RANKINGS.md); typically a data file inside the plugin's distribution, found with
    ``importlib.resources``. Tuned configs are consulted after the user's persistent cache and
    before autotuning; rankings order the heuristics tier (before ejk-core's own). ``ejk.explain``
    and ``ejk cache show --packs`` name the pack. A pack that cannot be read, or a malformed
    ranking, is reported against this plugin and ignored.
    """
