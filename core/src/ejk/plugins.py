"""Plugin loading and isolated hook calls.

Plugins are modules (or objects) with ``@ejk.hookimpl`` functions, published through the
``ejk`` entry-point group. Loading is isolated: a plugin that fails to import, has a bad
hook signature, or raises in a hook is reported — name, distribution, error and fix — and
every other plugin still loads. ``EJK_PLUGINS`` (allow-list) and ``EJK_DISABLE_PLUGINS``
(block-list) select which entry points are loaded.

Isolation covers every ``BaseException`` a plugin raises while it is imported or its hooks
run (``sys.exit()`` in a plugin module, ``GeneratorExit``, custom ``BaseException``
subclasses), except ``KeyboardInterrupt``. A ``KeyboardInterrupt`` raised by plugin code
cannot be told apart from the user pressing Ctrl-C (Python delivers both the same way), so
it is reported against the plugin (status ``failed`` or a hook error) and then re-raised:
the user's interrupt still stops the process. A plugin must not raise it on purpose. An
interrupted first load of the installed plugins is undone, so the next call loads them again.

Every hook result is type-checked (``ejk_platform_status``: a :class:`PlatformStatus` or a
sequence of them; ``ejk_device_fingerprint``: a mapping of str names to str values;
``ejk_config_space``: a sequence of configs of a class registered for that platform;
``ejk_heuristic_config`` likewise; ``ejk_choose_config`` for the public ops: an
``ImplChoice`` of a registered implementation), and must have a working ``repr`` and ``str``.
A wrong type is reported against the plugin and hook (:attr:`PluginInfo.hook_errors`, ``ejk
plugins``, ``ejk doctor``) and ignored.

Order of the hook calls (what decides a first-result hook such as ``ejk_choose_config``): the
implementations marked ``@ejk.hookimpl(tryfirst=True)`` come first, then the unmarked ones, then
those marked ``trylast=True``; within each group, plugins are called in alphabetical order of
their (entry-point) names. :meth:`PluginHost.hook_order` lists it. With ``EJK_TRACE_HOOKS=1``
(:meth:`PluginHost.trace_hooks`) every call goes through pluggy, one implementation at a time, so
pluggy's hook-call monitoring logs it; otherwise implementations are called directly (no overhead).

Availability is per plugin: a platform status a plugin reports governs the implementations that
plugin registered on that platform (a plugin can mark its own ``xla`` implementations unavailable
while ejk-xla's stay available); implementations of a platform their plugin reports nothing
about follow the platform's status as reported by any plugin (available when one says so).
"""

from __future__ import annotations

import importlib.metadata
import os
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import pluggy

from ejk import _hooktrace, environment, hookspecs
from ejk._epoch import bump
from ejk.registry import (
    LOAD_LOCK,
    KernelRegistry,
    KernelSpec,
    PluginRef,
    _current_plugin,
    kernel_registry,
    platform_name,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "probe_platform",
    "PlatformStatus",
    "PluginHost",
    "PluginInfo",
    "get_plugin_host",
    "reset_plugin_host",
]

ENTRY_POINT_GROUP = "ejk"


def _freeze_versions(value: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in (value or {}).items()))


@attrs.frozen(kw_only=True)
class PlatformStatus:
    """Whether a platform can run here (returned by ``ejk_platform_status``).

    Attributes:
        platform: Platform name, e.g. ``"triton"``.
        available: ``True`` when its kernels can run on this machine.
        reason: Why not, when unavailable.
        fix: What to do about it (e.g. ``pip install triton``).
        versions: Toolkit versions found, e.g. ``{"triton": "3.6.0"}``.
    """

    platform: str = attrs.field(converter=platform_name)
    available: bool
    reason: str | None = None
    fix: str | None = None
    versions: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_freeze_versions)


@attrs.define
class PluginInfo:
    """What the loader knows about one plugin (shown by ``ejk plugins``)."""

    name: str
    distribution: str | None = None
    version: str | None = None
    status: str = "loaded"  # loaded | failed | disabled
    error: str | None = None
    fix: str | None = None
    platforms: list[PlatformStatus] = attrs.Factory(list)
    hook_errors: list[str] = attrs.Factory(list)

    @property
    def ref(self) -> PluginRef:
        return PluginRef(name=self.name, distribution=self.distribution, version=self.version)


def probe_platform(
    platform: str,
    *,
    requires: Mapping[str, str] | None = None,
    backends: Iterable[str] = ("gpu", "tpu", "cpu"),
    fix: str | None = None,
) -> PlatformStatus:
    """Status of a platform from what is installed, without importing the toolkits.

    Args:
        platform: Platform name.
        requires: ``{import name: distribution name}`` that must be importable, e.g.
            ``{"triton": "triton", "jax_triton": "jax-triton"}``.
        backends: JAX backends the platform runs on (``jax.default_backend()`` must be one;
            ``"any"`` runs on every backend).
        fix: What to do when it is unavailable (default: ``pip install`` what is missing, or
            the backends it needs).
    """
    import importlib.util

    from ejk._versions import installed_version

    requires = dict(requires or {})
    versions = {dist: v for dist in requires.values() if (v := installed_version(dist))}
    missing = [dist for module, dist in requires.items() if importlib.util.find_spec(module) is None]
    if missing:
        return PlatformStatus(platform=platform, available=False, versions=versions,
                              reason=f"{', '.join(missing)} not installed",
                              fix=fix or f"pip install {' '.join(missing)}")
    import jax

    backend = jax.default_backend()
    backend = "gpu" if backend in ("cuda", "rocm") else backend
    allowed = tuple(str(b).strip().lower() for b in backends)
    allowed = tuple("gpu" if b in ("cuda", "rocm") else b for b in allowed)
    if "any" not in allowed and backend not in allowed:
        return PlatformStatus(platform=platform, available=False, versions=versions,
                              reason=f"runs on {'/'.join(allowed)}, but JAX's default backend is {backend}",
                              fix=fix or f"run on a machine with a {' or '.join(b.upper() for b in allowed)}")
    return PlatformStatus(platform=platform, available=True, versions=versions)


def _reraise_interrupt(exc: BaseException) -> None:
    """Re-raise a ``KeyboardInterrupt`` (after the caller reported it); isolate everything else."""
    if isinstance(exc, KeyboardInterrupt):
        raise exc


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


class _PluginManager(pluggy.PluginManager):
    """pluggy's manager, bumping ejk's epoch on every plugin registered, through :class:`PluginHost` or
    directly: its ``ejk_choose_config`` hook ends the reuse of decisions (one unregistered ends none)."""

    def register(self, plugin: Any, name: str | None = None) -> str | None:
        registered = super().register(plugin, name)
        bump()
        return registered


class PluginHost:
    """A pluggy plugin manager plus the report of what loaded, bound to one registry.

    Args:
        registry: Registry that ``ejk_register_kernels`` fills.
        load_entry_points: Discover and load the ``ejk`` entry points now.
    """

    def __init__(self, registry: KernelRegistry | None = None, *, load_entry_points: bool = True) -> None:
        self.registry = registry if registry is not None else KernelRegistry()
        self.pm: pluggy.PluginManager = _PluginManager(ENTRY_POINT_GROUP)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self._device_facts: dict[Any, dict[str, str]] = {}
        self._platform_facts: dict[tuple[Any, str], dict[str, str]] = {}
        self._callers: dict[tuple[str, int], pluggy.HookCaller] = {}
        self._order: dict[str, tuple[list[pluggy.HookImpl], list[pluggy.HookImpl]]] = {}
        self._stop_tracing: Callable[[], None] | None = None
        self.registry.set_diagnostics(self._availability, self._explain, self.distribution_of, self._refused)
        if environment.trace_hooks():
            self.trace_hooks(True)
        if load_entry_points:
            self.load_entry_points()

    # -- loading ---------------------------------------------------------------------------

    def load_entry_points(self, entry_points: Iterable[importlib.metadata.EntryPoint] | None = None) -> None:
        """Load every ``ejk`` entry point (or the given ones), isolating failures."""
        eps = entry_points if entry_points is not None else importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        allow = environment.name_list(environment.EJK_PLUGINS)
        block = environment.name_list(environment.EJK_DISABLE_PLUGINS) or frozenset()
        for ep in sorted(eps, key=lambda e: e.name):
            dist = getattr(ep, "dist", None)
            info = PluginInfo(
                name=ep.name.lower(),
                distribution=dist.name if dist is not None else None,
                version=dist.version if dist is not None else None,
            )
            if info.name in self.plugins:
                other = self.plugins[info.name]
                info.status, info.error = "failed", (
                    f"entry-point name {info.name!r} is already used by {other.distribution or other.name}"
                )
                info.fix = f"uninstall one of {info.distribution} and {other.distribution}"
                self.plugins[f"{info.name}@{info.distribution}"] = info
                continue
            self.plugins[info.name] = info
            if info.name in block or (allow is not None and info.name not in allow):
                info.status = "disabled"
                info.error = (
                    f"disabled by {environment.EJK_DISABLE_PLUGINS}" if info.name in block
                    else f"not in {environment.EJK_PLUGINS}"
                )
                continue
            token = _current_plugin.set(info.ref)
            try:
                module = ep.load()
            except BaseException as exc:  # SystemExit & co. too: see the module docstring
                self._fail(info, f"import of {ep.value} failed: {_describe(exc)}",
                           f"reinstall {info.distribution or info.name} and its dependencies, "
                           f"or skip it with {environment.EJK_DISABLE_PLUGINS}={info.name}")
                _reraise_interrupt(exc)
                continue
            finally:
                _current_plugin.reset(token)
            self._activate(module, info)

    def register_plugin(self, plugin: object, name: str, *, distribution: str | None = None,
                        version: str | None = None) -> PluginInfo:
        """Register an in-process plugin object (a module or an instance with hookimpls)."""
        info = PluginInfo(name=name.lower(), distribution=distribution, version=version)
        if info.name in self.plugins:
            raise ValueError(f"a plugin named {info.name!r} is already registered; choose another name")
        self.plugins[info.name] = info
        self._activate(plugin, info)
        return info

    def trace_hooks(self, enable: bool = True) -> None:
        """Log every hook call (plugin, arguments, result, time) to the ``ejk.hooks`` logger, as
        ``EJK_TRACE_HOOKS=1`` does from the start; ``enable=False`` stops it."""
        if enable and self._stop_tracing is None:
            self._stop_tracing = _hooktrace.install(self.pm)
        elif not enable and self._stop_tracing is not None:
            self._stop_tracing()
            self._stop_tracing = None

    def _activate(self, plugin: object, info: PluginInfo) -> None:
        self._forget_callers()
        try:
            self.pm.register(plugin, name=info.name)
        except Exception as exc:
            self._fail(info, f"invalid hooks: {_describe(exc)}",
                       "fix the hook implementation to match ejk.hookspecs (names and arguments)")
            return
        unknown = sorted(caller.name for caller in self.pm.get_hookcallers(plugin) or ()
                         if caller.spec is None and not all(i.optionalhook for i in caller.get_hookimpls()
                                                            if i.plugin is plugin))
        if unknown:  # a misspelt hook would otherwise be silently never called
            self.pm.unregister(plugin)
            self._forget_callers()
            known = ", ".join(name for name in sorted(vars(hookspecs)) if name.startswith("ejk_"))
            self._fail(info, f"unknown hook(s) {', '.join(unknown)}",
                       f"rename them to hooks of ejk.hookspecs ({known}), or mark hooks of a newer ejk "
                       "with @ejk.hookimpl(optionalhook=True)")
            return
        token = _current_plugin.set(info.ref)
        try:
            self._caller("ejk_register_kernels", plugin)(register=self.registry.register)
        except BaseException as exc:
            removed = self.registry.unregister_plugin(info.name)
            self.pm.unregister(plugin)
            self._forget_callers()
            self._fail(info, f"ejk_register_kernels raised {_describe(exc)} "
                             f"({removed} partial registration(s) rolled back)",
                       f"report it to the maintainers of {info.distribution or info.name}, "
                       f"or skip it with {environment.EJK_DISABLE_PLUGINS}={info.name}")
            _reraise_interrupt(exc)
            return
        finally:
            _current_plugin.reset(token)
        for status in self._call_one(plugin, info, "ejk_platform_status", {}) or ():
            info.platforms.extend([status] if isinstance(status, PlatformStatus) else list(status))

    def _reject(self, info: PluginInfo, hook_name: str, result: Any, expected: str) -> None:
        """Record (once) and warn that a hook returned the wrong kind of value; it is ignored."""
        try:
            shown = repr(result)
        except BaseException as exc:
            _reraise_interrupt(exc)
            shown = "<repr raised>"
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        message = f"{hook_name} returned {type(result).__name__} {shown} but must return {expected}"
        if message not in info.hook_errors:
            info.hook_errors.append(message)
            warnings.warn(f"ejk plugin {info.name!r}: {message}; its answer is ignored",
                          RuntimeWarning, stacklevel=4)

    def _refused(self, spec: KernelSpec, message: str) -> None:
        """A registration of ``spec`` was refused (its label is another plugin's, or its signature
        cannot take the op's call): reported against its plugin, which otherwise keeps loading."""
        self.report_implementation(spec, f"ejk_register_kernels: {message}")

    def report_implementation(self, spec: KernelSpec, problem: str) -> None:
        """Report (once, with a warning) a problem of one implementation against the plugin that
        registered it (:attr:`PluginInfo.hook_errors`: ``ejk plugins`` and ``ejk doctor`` list it)."""
        name = spec.plugin.name if spec.plugin is not None else "?"
        info = self.plugins.get(name)
        if info is None:
            info = self.plugins[name] = PluginInfo(name=name, status="unknown")
        if problem not in info.hook_errors:
            info.hook_errors.append(problem)
            warnings.warn(f"ejk plugin {name!r}: {problem}", RuntimeWarning, stacklevel=3)

    def _fail(self, info: PluginInfo, error: str, fix: str) -> None:
        info.status, info.error, info.fix = "failed", error, fix
        warnings.warn(f"ejk plugin {info.name!r} ({info.distribution or 'no distribution'}) was skipped: "
                      f"{error}. Fix: {fix}", RuntimeWarning, stacklevel=3)

    # -- isolated hook calls -----------------------------------------------------------------

    def _forget_callers(self) -> None:
        """Plugins changed: per-plugin callers (they exclude the plugins known when made) and the
        call order are rebuilt on their next use."""
        self._callers.clear()
        self._order.clear()

    def _caller(self, hook_name: str, plugin: object) -> pluggy.HookCaller:
        """A pluggy caller of ``hook_name`` that reaches ``plugin`` alone (so pluggy's monitoring,
        ``EJK_TRACE_HOOKS``, sees every call while each plugin stays isolated)."""
        key = (hook_name, id(plugin))
        caller = self._callers.get(key)
        if caller is None:
            others = [p for p in self.pm.get_plugins() if p is not plugin]
            caller = self._callers[key] = self.pm.subset_hook_caller(hook_name, remove_plugins=others)
        return caller

    def hook_order(self, hook_name: str) -> list[str]:
        """The plugins implementing ``hook_name``, in the order they are called (see the module
        docstring: ``tryfirst``, unmarked, ``trylast``; alphabetical within each)."""
        return [self.pm.get_name(impl.plugin) or "?" for impl in self._ordered(hook_name)]

    def _ordered(self, hook_name: str) -> list[pluggy.HookImpl]:
        impls = getattr(self.pm.hook, hook_name).get_hookimpls()
        known = self._order.get(hook_name)
        if known is not None and known[0] == impls:  # same implementations (also after pm.unregister)
            return known[1]

        def key(impl: pluggy.HookImpl) -> tuple[int, str]:
            group = 0 if impl.tryfirst else 2 if impl.trylast else 1
            return group, self.pm.get_name(impl.plugin) or ""

        order = sorted((i for i in impls if not (i.hookwrapper or i.wrapper)), key=key)
        self._order[hook_name] = (impls, order)
        return order

    def _call_one(self, plugin: object, info: PluginInfo, hook_name: str, kwargs: dict[str, Any]) -> list[Any]:
        impls = [i for i in self._ordered(hook_name) if i.plugin is plugin]
        results = [r for r in (self._invoke(i, info, hook_name, kwargs) for i in impls) if r is not None]
        return [r for r in results if self._valid(info, hook_name, r)]

    def _valid(self, info: PluginInfo, hook_name: str, result: Any, check: _Check | None = None) -> bool:
        """Whether a hook's (non-``None``) result has the documented type; reports it when not."""
        check = check or _CHECKS.get(hook_name)
        try:
            expected = check(result) if check is not None else None
            if expected is None:
                repr(result), str(result)  # every message naming the result needs them
        except BaseException as exc:  # a result that breaks its check, or cannot be shown
            expected = f"a value whose type check, repr and str do not raise ({_describe(exc)})"
            _reraise_interrupt(exc)
        if expected is not None:
            self._reject(info, hook_name, result, expected)
        return expected is None

    def _invoke(self, impl: pluggy.HookImpl, info: PluginInfo, hook_name: str, kwargs: dict[str, Any]) -> Any:
        try:
            if self._stop_tracing is None:  # the direct call; traced calls go through pluggy's monitoring
                return impl.function(**{name: kwargs[name] for name in impl.argnames})
            caller = self._caller(hook_name, impl.plugin)
            result = caller(**kwargs)
            if caller.spec is not None and caller.spec.opts.get("firstresult"):
                return result
            return result[0] if result else None
        except BaseException as exc:
            message = f"{hook_name} raised {_describe(exc)}"
            if message not in info.hook_errors:
                info.hook_errors.append(message)
                warnings.warn(f"ejk plugin {info.name!r}: {message}; its answer is ignored",
                              RuntimeWarning, stacklevel=3)
            _reraise_interrupt(exc)
            return None

    def call(self, hook_name: str, *, firstresult: bool = False, check: _Check | None = None, **kwargs: Any) -> Any:
        """Call a hook plugin by plugin in :meth:`hook_order`, isolating exceptions and bad results.

        A result of the wrong type (see ``check``, by default the hook's documented type) is
        reported against that plugin and hook in :attr:`PluginInfo.hook_errors` and ignored.

        Args:
            hook_name: An ``ejk_*`` hook.
            firstresult: Return the first valid non-``None`` result instead of the list.
            check: ``check(result)`` → ``None`` when valid, else what was expected.
            **kwargs: The hook's arguments.

        Returns the list of valid non-``None`` results, or the first one when ``firstresult``.
        """
        results = []
        for impl in self._ordered(hook_name):
            name = self.pm.get_name(impl.plugin) or "?"
            info = self.plugins.get(name) or PluginInfo(name=name)
            result = self._invoke(impl, info, hook_name, kwargs)
            if result is None or not self._valid(info, hook_name, result, check):
                continue
            if firstresult:
                return result
            results.append(result)
        return None if firstresult else results

    def _cfg_check(self, algorithm: str, platform: str, implementation: str | None,
                   cfg_type: type | None) -> _Check:
        """Check that a config is a ``cfg_type`` (default: a config class registered for that
        implementation, or for any implementation of ``platform`` when it is not named)."""
        if cfg_type is not None:
            types: tuple[type, ...] = (cfg_type,)
        else:
            try:
                types = tuple({s.cfg_type for s in self.registry.list_implementations(algorithm)
                               if s.platform == platform_name(platform) and s.cfg_type is not None
                               and implementation in (None, s.name)})
            except Exception:  # an unknown platform name: nothing to check against
                types = ()
        where = f"{platform}" + (f":{implementation}" if implementation else "")

        def check(cfg: Any) -> str | None:
            if not types or isinstance(cfg, types):
                return None
            return f"a config of {algorithm} on {where}: {' or '.join(t.__name__ for t in types)}"

        return check

    def config_space(self, algorithm: str, platform: str, invocation: Any, implementation: str | None = None,
                     cfg_type: type | None = None) -> list[Any]:
        """All plugins' ``ejk_config_space`` candidates for an implementation of ``algorithm`` (of
        the right config type; others are reported against their plugin and ignored)."""
        check = self._cfg_check(algorithm, platform, implementation, cfg_type)
        space: list[Any] = []
        for name, result in self._named_results("ejk_config_space", algorithm=algorithm, platform=platform,
                                                implementation=implementation or platform, invocation=invocation):
            info = self.plugins.get(name) or PluginInfo(name=name)
            space.extend(cfg for cfg in result if self._valid(info, "ejk_config_space", cfg, check))
        return space

    def _named_results(self, hook_name: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """``(plugin name, valid result)`` pairs of a non-firstresult hook."""
        pairs = []
        for impl in self._ordered(hook_name):
            name = self.pm.get_name(impl.plugin) or "?"
            info = self.plugins.get(name) or PluginInfo(name=name)
            result = self._invoke(impl, info, hook_name, kwargs)
            if result is not None and self._valid(info, hook_name, result):
                pairs.append((name, result))
        return pairs

    def heuristic_config(self, algorithm: str, platform: str, invocation: Any, implementation: str | None = None,
                         cfg_type: type | None = None) -> Any | None:
        """The first plugin's ``ejk_heuristic_config`` of the right type for an implementation."""
        return self.call("ejk_heuristic_config", firstresult=True,
                         check=self._cfg_check(algorithm, platform, implementation, cfg_type),
                         algorithm=algorithm, platform=platform, implementation=implementation or platform,
                         invocation=invocation)

    def choose_config(self, invocation: Any, kernel: Any) -> Any | None:
        """The first plugin's config override, refused when the kernel's ``override_problem(cfg)``
        (see :class:`ejk.Kernel`) names a problem: for the public ops it must be an ``ImplChoice``
        naming a registered implementation, with a config of that implementation's type."""
        check: _Check | None = getattr(kernel, "override_problem", None)
        return self.call("ejk_choose_config", firstresult=True, check=check, invocation=invocation, kernel=kernel)

    def device_facts(self, device: Any) -> dict[str, str]:
        """Merged ``ejk_device_fingerprint`` facts for ``device`` (computed once per device)."""
        if device not in self._device_facts:
            facts: dict[str, str] = {}
            for result in reversed(self.call("ejk_device_fingerprint", device=device)):
                facts.update({str(k): str(v) for k, v in result.items()})
            self._device_facts[device] = facts
        return self._device_facts[device]

    def platform_device_facts(self, device: Any, platform: str) -> dict[str, str]:
        """The ``ejk_device_fingerprint`` facts of the plugins that serve ``platform``.

        Cached configs of an implementation are keyed by its own platform's facts, so a plugin
        adding a fact for its platform leaves every other platform's entries valid.
        """
        key = (device, str(platform))
        if key not in self._platform_facts:
            facts: dict[str, str] = {}
            for name, result in reversed(self._named_results("ejk_device_fingerprint", device=device)):
                info = self.plugins.get(name)
                if info is not None and any(status.platform == platform for status in info.platforms):
                    facts.update({str(k): str(v) for k, v in result.items()})
            self._platform_facts[key] = facts
        return self._platform_facts[key]

    # -- reporting ------------------------------------------------------------------------

    def platform_statuses(self) -> dict[str, PlatformStatus]:
        """The last reported status of every platform, keyed by name."""
        statuses: dict[str, PlatformStatus] = {}
        for info in self.plugins.values():
            for status in info.platforms:
                if status.platform not in statuses or status.available:
                    statuses[status.platform] = status
        return statuses

    def plugin_status(self, plugin: str, platform: str) -> PlatformStatus | None:
        """The status ``plugin`` itself reported for ``platform`` (``None`` when it reported none)."""
        info = self.plugins.get(plugin)
        found = [s for s in info.platforms if s.platform == str(platform)] if info is not None else []
        return found[-1] if found else None

    def _availability(self, platform: str, plugin: str | None = None) -> tuple[bool, str | None]:
        status = self.plugin_status(plugin, platform) if plugin is not None else None
        if status is None:
            status = self.platform_statuses().get(str(platform))
        if status is None:
            return True, None
        if status.fix and not status.available:  # say what to install, not only what is missing
            return False, f"{status.reason or 'unavailable'}. Fix: {status.fix}"
        return status.available, status.reason

    def distribution_of(self, platform: str) -> str | None:
        """The distribution that provides ``platform``, for "what to install" hints: that of the
        plugin reporting it, else of the plugin named after it (disabled and failed plugins
        included: from their entry points), else what ``ejk_platform_distributions`` says."""
        platform = str(platform)
        infos = list(self.plugins.values())
        for info in infos:
            if info.distribution and any(status.platform == platform for status in info.platforms):
                return info.distribution
        for info in infos:
            if info.distribution and info.name == platform:
                return info.distribution
        for answer in self.call("ejk_platform_distributions"):
            if answer.get(platform):
                return str(answer[platform])
        return None

    def _explain(self) -> list[str]:
        lines = []
        for info in self.plugins.values():
            if info.status != "loaded":
                lines.append(f"Plugin {info.name} ({info.distribution or 'no distribution'}) was {info.status}: "
                             f"{info.error}" + (f" Fix: {info.fix}" if info.fix else ""))
        if not self.plugins:
            lines.append("No ejk plugin is installed.")
        return lines


# -- hook result checks: each returns None when the result is valid, else what was expected ---------

_Check = Callable[[Any], "str | None"]


def _check_platform_status(result: Any) -> str | None:
    if isinstance(result, PlatformStatus):
        return None
    if isinstance(result, Sequence) and not isinstance(result, str | bytes) and all(
        isinstance(s, PlatformStatus) for s in result
    ):
        return None
    return "an ejk.PlatformStatus or a sequence of them"


def _check_device_fingerprint(result: Any) -> str | None:
    scalars = (str, int, float, bool)
    if isinstance(result, Mapping) and all(  # str(): a str subclass may break it, facts are str(k): str(v)
        isinstance(k, str) and str(k) and isinstance(v, scalars) and isinstance(str(v), str)
        for k, v in result.items()
    ):
        return None
    return "a dict of str names to str values, e.g. {'sm_count': '132'}"


def _check_platform_distributions(result: Any) -> str | None:
    if isinstance(result, Mapping) and all(isinstance(k, str) and isinstance(v, str) and v
                                           for k, v in result.items()):
        return None
    return "a dict of platform names to distribution names, e.g. {'triton': 'ejk-triton'}"


def _check_config_space(result: Any) -> str | None:
    if isinstance(result, Sequence) and not isinstance(result, str | bytes):
        return None
    return "a list of configs (or None)"


def _check_config_packs(result: Any) -> str | None:
    if isinstance(result, Sequence) and not isinstance(result, str | bytes) and all(
        isinstance(path, str | os.PathLike) for path in result
    ):
        return None
    return "a list of pack file paths (str or os.PathLike)"


_CHECKS: dict[str, _Check] = {
    "ejk_platform_status": _check_platform_status,
    "ejk_device_fingerprint": _check_device_fingerprint,
    "ejk_config_space": _check_config_space,
    "ejk_platform_distributions": _check_platform_distributions,
    "ejk_config_packs": _check_config_packs,
}


_host: PluginHost | None = None
_ready_host: PluginHost | None = None  # _host once its entry points are loaded
_host_lock = LOAD_LOCK  # one lock with the registry's lazy load: no lock-order deadlock


def get_plugin_host(registry: KernelRegistry | None = None) -> PluginHost:
    """The process-wide :class:`PluginHost`, created (and entry points loaded) on first use."""
    global _host, _ready_host
    ready = _ready_host
    if ready is not None and ready is _host and registry is None:  # loaded: no lock on every eager call
        return ready
    with _host_lock:
        if _host is None:
            host = _host = PluginHost(registry if registry is not None else kernel_registry,
                                      load_entry_points=False)  # set first: plugins may ask for it
            try:
                host.load_entry_points()
            except BaseException:  # a Ctrl-C while loading: undo it all, so the next call loads again
                _host = None
                for name in host.plugins:
                    host.registry.unregister_plugin(name)
                raise
        _ready_host = _host
        return _host


def reset_plugin_host() -> None:
    """Forget the process-wide host and empty the global registry (for tests and reloading)."""
    global _host, _ready_host
    with _host_lock:
        _host = _ready_host = None
        kernel_registry.set_loader(_load_installed_plugins, clear=True)


def _load_installed_plugins(registry: KernelRegistry) -> None:
    get_plugin_host(registry=registry)


kernel_registry.set_loader(_load_installed_plugins)  # the registry knows no plugin code: it is given the loader


