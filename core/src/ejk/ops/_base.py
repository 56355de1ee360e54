"""Shared machinery of the public operations: cross-platform configs and the op kernel.

An operation's config is an :class:`ImplChoice` — *which* registered implementation
(platform, backend) and *its* config — so one autotuning run compares platforms
(XLA vs Pallas vs Triton vs CuTe), not just block sizes.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from ejk._versions import installed_version
from ejk.config.persistent import from_jsonable, to_jsonable
from ejk.config.selection import ConfigSelectorChain
from ejk.execution.executor import Executor
from ejk.execution.kernel import Invocation, Kernel
from ejk.registry import (
    Backend,
    KernelRegistry,
    KernelSpec,
    default_backend,
    kernel_registry,
    normalize_backend,
    normalize_platform,
    platform_name,
)

__all__ = [
    "ImplChoice",
    "OpKernel",
    "get_default_executor",
    "set_default_executor",
    "use_executor",
]


def _backend_name(backend: str) -> str:
    return str(normalize_backend(backend))


@attrs.frozen(kw_only=True)
class ImplChoice:
    """The config of a public operation: an implementation and its own config.

    Attributes:
        platform: Platform of the implementation, e.g. ``"xla"``.
        backend: Backend it was registered for (``"any"`` for portable ones).
        cfg: The implementation's config (``None``: its defaults).
    """

    platform: str = attrs.field(converter=platform_name)
    backend: str = attrs.field(converter=_backend_name)
    cfg: Any = None

    def __str__(self) -> str:
        return f"{self.platform}/{self.backend} {self.cfg!r}"


class OpKernel(Kernel[ImplChoice, Any]):
    """The kernel behind a public operation: dispatches to registered implementations.

    Subclasses set ``op_id`` (the algorithm name), ``array_names`` (the implementation's
    array arguments, in order) and ``positional`` (how many of them are positional in the
    implementation's signature; the rest are passed by keyword).
    """

    array_names: tuple[str, ...] = ()
    positional: int = 0

    def __init__(self, registry: KernelRegistry | None = None) -> None:
        self.registry = registry if registry is not None else kernel_registry

    # -- implementations ------------------------------------------------------------------------

    def _host(self) -> Any:
        from ejk.plugins import get_plugin_host

        return get_plugin_host()

    def spec_for(self, choice: ImplChoice) -> KernelSpec:
        """The registered implementation a choice names (highest priority for that pair)."""
        return self.registry.get_spec(self.op_id, platform=choice.platform, backend=choice.backend)

    def available_specs(self, platform: str) -> list[KernelSpec]:
        """Implementations usable on this machine: best one per platform (or only ``platform``)."""
        backend = default_backend()
        if platform != "auto":
            return [self.registry.get_spec(self.op_id, platform=platform, backend=backend)]
        best: dict[str, KernelSpec] = {}
        for spec in self.registry.list_implementations(self.op_id):
            if spec.backend not in (Backend.ANY, backend) or spec.platform in best:
                continue
            if self.registry.platform_available(spec.platform)[0]:
                best[spec.platform] = spec
        if not best:  # raises KernelNotFoundError with the full diagnosis
            self.registry.get_spec(self.op_id, platform="auto", backend=backend)
        return sorted(best.values(), key=lambda s: -s.priority)

    def choice_for(self, cfg: Any, platform: str) -> ImplChoice:
        """Turn a user's ``cfg=`` (an :class:`ImplChoice` or an implementation config) into a choice."""
        if isinstance(cfg, ImplChoice):
            return cfg
        specs = self.available_specs(platform)
        for spec in specs:
            if spec.cfg_type is not None and isinstance(cfg, spec.cfg_type):
                return ImplChoice(platform=spec.platform, backend=spec.backend, cfg=cfg)
        if platform != "auto":
            return ImplChoice(platform=specs[0].platform, backend=specs[0].backend, cfg=cfg)
        names = ", ".join(f"{s.label} ({s.cfg_type.__name__ if s.cfg_type else 'no config class'})" for s in specs)
        raise ValueError(
            f"{self.op_id}: cfg of type {type(cfg).__name__} matches no available implementation ({names}); "
            "pass platform= to say which implementation it is for, or pass an ejk.ops.ImplChoice"
        )

    # -- Kernel interface --------------------------------------------------------------------------

    def run(self, *arrays: Any, cfg: ImplChoice, platform: str = "auto", **static: Any) -> Any:
        spec = self.spec_for(cfg)
        pos = arrays[: self.positional]
        named = dict(zip(self.array_names[self.positional:], arrays[self.positional:], strict=True))
        return spec.implementation(*pos, **named, **static, cfg=cfg.cfg)

    def heuristic_cfg(self, inv: Invocation[ImplChoice]) -> ImplChoice:
        spec = self.available_specs(inv.kwargs.get("platform", "auto"))[0]
        cfg = self._host().heuristic_config(self.op_id, spec.platform, inv)
        return ImplChoice(platform=spec.platform, backend=spec.backend, cfg=cfg)

    def candidate_cfgs(self, inv: Invocation[ImplChoice]) -> Sequence[ImplChoice]:
        host = self._host()
        choices: list[ImplChoice] = []
        for spec in self.available_specs(inv.kwargs.get("platform", "auto")):
            space = list(host.config_space(self.op_id, spec.platform, inv))
            if not space:
                space = [host.heuristic_config(self.op_id, spec.platform, inv)]
            for cfg in space:
                choice = ImplChoice(platform=spec.platform, backend=spec.backend, cfg=cfg)
                if choice not in choices:
                    choices.append(choice)
        return choices

    def cfg_to_json(self, cfg: ImplChoice) -> Any:
        return {"platform": cfg.platform, "backend": cfg.backend,
                "cfg": None if cfg.cfg is None else to_jsonable(cfg.cfg)}

    def cfg_from_json(self, data: Any) -> ImplChoice:
        choice = ImplChoice(platform=data["platform"], backend=data["backend"])
        spec = self.spec_for(choice)  # raises if the implementation is gone: the entry is then stale
        cfg = None if data.get("cfg") is None else from_jsonable(data["cfg"], cfg_type=spec.cfg_type)
        return attrs.evolve(choice, cfg=cfg)

    def cfg_versions(self, cfg: ImplChoice) -> Mapping[str, str]:
        spec = self.spec_for(cfg)
        versions: dict[str, str] = {}
        dist = spec.plugin.distribution if spec.plugin else None
        if dist and (version := installed_version(dist)):
            versions[dist] = version
        status = self._host().platform_statuses().get(spec.platform)
        if status is not None:
            versions.update(dict(status.versions))
        return versions

    def describe_cfg(self, cfg: ImplChoice) -> str:
        return str(cfg)


_default: Executor[Any, Any] | None = None
_scoped: contextvars.ContextVar[Executor[Any, Any] | None] = contextvars.ContextVar("ejk_executor", default=None)


def get_default_executor() -> Executor[Any, Any]:
    """The Executor the public operations use (the scoped one, else the process default).

    The process default is an :class:`~ejk.Executor` over a :class:`~ejk.ConfigSelectorChain`
    with an in-memory cache, per-op persistent files and the default autotune policy
    (autotuning on a miss only when ``EJK_AUTOTUNE=1``).
    """
    scoped = _scoped.get()
    if scoped is not None:
        return scoped
    global _default
    if _default is None:
        _default = Executor(ConfigSelectorChain())
    return _default


def set_default_executor(executor: Executor[Any, Any] | None) -> None:
    """Replace the process-wide default Executor (``None`` restores a fresh default)."""
    global _default
    _default = executor


@contextlib.contextmanager
def use_executor(executor: Executor[Any, Any]) -> Iterator[Executor[Any, Any]]:
    """Run the public operations in this context (thread / task) through ``executor``."""
    token = _scoped.set(executor)
    try:
        yield executor
    finally:
        _scoped.reset(token)


def resolve_platform(platform: Any) -> str:
    """Validate an op's ``platform=`` argument: ``"auto"`` or a platform name."""
    if platform is None:
        return "auto"
    name = str(platform).strip().lower()
    return "auto" if name == "auto" else str(normalize_platform(name))


def run_op(kernel: OpKernel, arrays: tuple[Any, ...], static: dict[str, Any], platform: Any, cfg: Any) -> Any:
    """Run a public operation through the default Executor."""
    plat = resolve_platform(platform)
    choice = None if cfg is None else kernel.choice_for(cfg, plat)
    return get_default_executor()(kernel, *arrays, cfg=choice, platform=plat, **static)
