"""Kernel registry: which implementations exist for which (algorithm, platform, backend).

Plugins register implementations through the ``ejk_register_kernels`` hook (or the
:meth:`KernelRegistry.register` decorator); the Executor and the public operations look
them up here. The process-wide :data:`kernel_registry` loads the installed plugins lazily,
once, on its first query — never at ``import ejk``.
"""

from __future__ import annotations

import contextvars
import inspect
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal, TypeVar

import attrs

from ejk import _contract
from ejk._epoch import bump
from ejk._kernel_spec import (
    PORTABLE_DISTRIBUTION,
    VJP,
    Backend,
    BackendLike,
    KernelSpec,
    Platform,
    PlatformLike,
    PluginRef,
    Tier,
    capability_reason,
    default_backend,
    default_order,
    normalize_backend,
    normalize_platform,
    normalize_tier,
    platform_name,
)
from ejk.errors import DuplicateKernelError, KernelContractError, KernelNotFoundError

# The names of ejk._kernel_spec are re-exported: this module is where users and plugins find them.
__all__ = [
    "LOAD_LOCK",
    "PORTABLE_DISTRIBUTION",
    "VJP",
    "Backend",
    "BackendLike",
    "KernelRegistry",
    "KernelSpec",
    "Platform",
    "PlatformLike",
    "PluginRef",
    "Tier",
    "capability_reason",
    "default_backend",
    "default_order",
    "kernel_registry",
    "normalize_backend",
    "normalize_platform",
    "platform_name",
]

F = TypeVar("F", bound=Callable[..., Any])


#: The one lock of plugin loading, shared by every registry's lazy load and by the plugin host
#: (``ejk.plugins``). Loading runs the loader (which takes the host) and the host registers
#: kernels into the registry; with two locks two threads could take them in opposite orders
#: and deadlock on their first call. Each registry's own ``_lock`` only guards its dict and
#: is never held while other code runs, so it always comes last.
LOAD_LOCK = threading.RLock()

_current_plugin: contextvars.ContextVar[PluginRef | None] = contextvars.ContextVar(
    "ejk_current_plugin", default=None
)


def _algorithm_name(algorithm: str) -> str:
    """The canonical (stripped, lower-case) algorithm name; it also names cache files, so it must
    be a plain name: no path separator, control character (NUL included) or ``.``/``..``."""
    if not isinstance(algorithm, str):
        raise TypeError(f"algorithm must be a string such as 'flash_attention', got {type(algorithm).__name__}")
    algo = algorithm.strip().lower()
    if not algo or algo in (".", "..") or any(ch in "/\\" or not ch.isprintable() for ch in algo):
        raise ValueError(f"algorithm {algorithm!r} is not a valid name: use a non-empty name without path "
                         "separators or control characters, such as 'flash_attention'")
    return algo


def _implementation_name(name: str) -> str:
    text = str(name).strip().lower()
    if not text or not text.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"implementation name {name!r} is not valid; use a short name such as 'chunked'")
    return text


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class KernelRegistry:
    """Registry of kernel implementations with tier- and priority-aware, fallback-aware lookup.

    Args:
        loader: Called once, on the first query, to fill the registry (the global
            registry loads the installed plugins this way).
    """

    def __init__(self, loader: Callable[[KernelRegistry], None] | None = None) -> None:
        self._registry: dict[str, list[KernelSpec]] = {}
        self._lock = threading.RLock()
        self._loader = loader
        self._loaded = loader is None
        self._loading = False
        self._availability: Callable[[str, str | None], tuple[bool, str | None]] | None = None
        self._explain: Callable[[], list[str]] | None = None
        self._distribution_of: Callable[[str], str | None] | None = None
        self._refused: Callable[[KernelSpec, str], None] | None = None
        self._unchecked: list[KernelSpec] = []  # registered before their op declared its contract
        self._contracts_seen = -1
        self._version = 0

    @property
    def version(self) -> int:
        """A counter that changes whenever implementations are added or removed (the Executor
        reuses a decision only while it is unchanged)."""
        return self._version

    def _changed(self) -> None:
        """Count a change of the implementations (made, under the lock): reused decisions are checked again."""
        self._version += 1
        bump()

    def set_loader(self, loader: Callable[[KernelRegistry], None], *, clear: bool = False) -> None:
        """Run ``loader`` on the next query (again, after a reset); ``clear`` first removes every
        implementation."""
        with self._lock:
            if clear:
                self._registry.clear()
            self._loader = loader
            self._loaded = False
            self._changed()

    def touch(self) -> None:
        """Note a change made to the registry from outside its methods (e.g. emptied on reset)."""
        with self._lock:
            self._changed()

    # -- loading ---------------------------------------------------------------------------

    def _ensure_loaded(self) -> None:
        if self._unchecked and self._contracts_seen != _contract.generation():
            self._check_unchecked()
        if self._loaded:
            return
        with LOAD_LOCK:  # not self._lock: see LOAD_LOCK
            if self._loaded or self._loading:  # re-entrant query from a plugin: serve what is there
                return
            self._loading = True
            try:
                assert self._loader is not None
                self._loader(self)
                self._loaded = True  # not when interrupted (Ctrl-C): the next query loads again
            finally:
                self._loading = False
        if self._unchecked:  # a plugin may have defined the op after registering for it
            self._check_unchecked()

    def set_diagnostics(
        self,
        availability: Callable[[str, str | None], tuple[bool, str | None]] | None,
        explain: Callable[[], list[str]] | None,
        distribution_of: Callable[[str], str | None] | None = None,
        refused: Callable[[KernelSpec, str], None] | None = None,
    ) -> None:
        """Install the callbacks (from the plugin loader) that say whether a platform is usable —
        ``availability(platform, plugin name or None)`` —, describe skipped plugins, name the
        distribution providing a platform (``None``: unknown) in :class:`KernelNotFoundError` messages
        and report a plugin's refused registration — ``refused(spec, why)``; without it, or for a
        registration outside any plugin, a refused registration raises."""
        self._availability = availability
        self._explain = explain
        self._distribution_of = distribution_of
        self._refused = refused

    def platform_available(self, platform: PlatformLike) -> tuple[bool, str | None]:
        """``(available, reason)`` for a platform, as reported by its plugin's status hook."""
        self._ensure_loaded()
        if self._availability is None:
            return True, None
        return self._availability(normalize_platform(platform), None)

    def spec_available(self, spec: KernelSpec) -> tuple[bool, str | None]:
        """``(available, reason)`` for one implementation: the status its own plugin reported for
        its platform, else the platform's (so a plugin can mark its own implementations unavailable
        while another plugin serves the same platform)."""
        self._ensure_loaded()
        if self._availability is None:
            return True, None
        return self._availability(spec.platform, spec.plugin.name if spec.plugin else None)

    # -- registration ----------------------------------------------------------------------

    def register(
        self,
        algorithm: str,
        platform: PlatformLike,
        backend: BackendLike,
        priority: int = 0,
        *,
        tier: Tier | str = Tier.FAST,
        name: str | None = None,
        cfg_type: type | None = None,
        config_space: Callable[..., Sequence[Any]] | None = None,
        heuristic: Callable[..., Any] | None = None,
        capability: Callable[..., str | None] | None = None,
        rank: Callable[..., int] | None = None,
        vjp: VJP | None = None,
    ) -> Callable[[F], F]:
        """Decorator registering an implementation; returns the function unchanged.

        The keyword arguments are the :class:`KernelSpec` fields of the same names: ``tier`` says
        what the implementation is, ``priority`` breaks ties inside its tier.

        A registration is refused — reported against its plugin (:meth:`set_diagnostics`), or
        raised when made outside any plugin — when another plugin already registered the same
        (algorithm, platform, backend, name) (the first keeps it: no plugin takes over another's
        label), or when the op's declared contract (see :mod:`ejk._contract`) says the function
        (or its VJP) cannot take the op's call; an op defined after the registration checks it then.

        Raises:
            DuplicateKernelError: if the same plugin already registered this
                (algorithm, platform, backend, name), or (outside a plugin) another one did.
            KernelContractError: (outside a plugin) when the signature cannot take the op's call.
        """
        algo = _algorithm_name(algorithm)
        plat = normalize_platform(platform)
        back = normalize_backend(backend)
        impl_name = _implementation_name(plat if name is None else name)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be an int, got {priority!r}")
        spec_tier = normalize_tier(tier)
        for field, value in (("config_space", config_space), ("heuristic", heuristic),
                             ("capability", capability), ("rank", rank)):
            if value is not None and not callable(value):
                raise TypeError(f"register({algo!r}, ...): {field} must be callable, got {value!r}")
        if vjp is not None and not isinstance(vjp, VJP):
            raise TypeError(f"register({algo!r}, ...): vjp must be an ejk.VJP, got {type(vjp).__name__}")

        def decorator(fn: F) -> F:
            if not callable(fn):
                raise TypeError(f"register({algo!r}, ...) must decorate a callable, got {fn!r}")
            spec = KernelSpec(
                algorithm=algo,
                platform=plat,
                backend=back,
                name=impl_name,
                implementation=fn,
                tier=spec_tier,
                priority=priority,
                plugin=_current_plugin.get(),
                cfg_type=cfg_type,
                config_space=config_space,
                heuristic=heuristic,
                capability=capability,
                rank=rank,
                vjp=vjp,
            )
            if vjp is not None and vjp.paired:  # refuse calls no backward pairs with (see ejk._pairing)
                from ejk._pairing import paired_capability

                spec = attrs.evolve(spec, capability=paired_capability(self, spec))
            contract = _contract.contract_of(algo)
            if contract is not None and (problems := contract.problems(fn, vjp)):
                self._refuse(spec, _contract_message(spec, problems), KernelContractError)
                return fn
            if self._add(spec) and contract is None:
                with self._lock:
                    self._unchecked.append(spec)
            return fn

        return decorator

    def _refuse(self, spec: KernelSpec, message: str, error: type[Exception]) -> None:
        """Report a refused registration against its plugin, or raise ``error`` outside a plugin."""
        if spec.plugin is None or self._refused is None:
            raise error(message)
        self._refused(spec, message)

    def _add(self, spec: KernelSpec) -> bool:
        """Add ``spec`` unless its label is taken (``False``: refused)."""
        with self._lock:
            specs = self._registry.setdefault(spec.algorithm, [])
            owner = spec.plugin.name if spec.plugin else None
            existing = next((s for s in specs if (s.platform, s.backend, s.name)
                             == (spec.platform, spec.backend, spec.name)), None)
            if existing is not None:
                holder = existing.plugin.name if existing.plugin else None
                if holder != owner:
                    message = (
                        f"{spec.algorithm} {spec.label} of plugin {owner or '<none>'} "
                        f"({_qualname(spec.implementation)}) is refused: plugin {holder or '<none>'} already "
                        f"registered {spec.label} ({_qualname(existing.implementation)}). A label belongs to "
                        f"the plugin that registered it first: give this implementation its own name= "
                        f"(e.g. name='{owner or 'mine'}_{spec.name}') or its own platform."
                    )
                else:
                    message = (
                        f"{spec.algorithm} {spec.label} is registered twice by plugin "
                        f"{owner or '<none>'}: first {_qualname(existing.implementation)}, then "
                        f"{_qualname(spec.implementation)}. Register each (algorithm, platform, "
                        f"backend, name) once per plugin; give a second implementation its own name=."
                    )
        if existing is not None:
            if holder == owner:
                raise DuplicateKernelError(message)
            self._refuse(spec, message, DuplicateKernelError)
            return False
        with self._lock:
            specs.append(spec)
            specs.sort(key=default_order)  # stable: equal tiers and priorities keep registration order
            self._changed()
        return True

    def _check_unchecked(self) -> None:
        """Check the registrations made before their op declared its contract; remove those that
        break it (reported against their plugin, or warned about outside one)."""
        with self._lock:
            self._contracts_seen = _contract.generation()
            waiting = list(self._unchecked)
        refused: list[tuple[KernelSpec, str]] = []
        done: list[KernelSpec] = []
        for spec in waiting:
            contract = _contract.contract_of(spec.algorithm)
            if contract is None:
                continue
            done.append(spec)
            if problems := contract.problems(spec.implementation, spec.vjp):
                refused.append((spec, _contract_message(spec, problems)))
        if not done:
            return
        with self._lock:
            self._unchecked = [s for s in self._unchecked if s not in done]
            for spec, _ in refused:
                specs = self._registry.get(spec.algorithm, [])
                if spec in specs:
                    specs.remove(spec)
            self._changed()
        for spec, message in refused:
            try:
                self._refuse(spec, message, KernelContractError)
            except KernelContractError as exc:  # no plugin to report it against: a query must not fail for it
                warnings.warn(str(exc), RuntimeWarning, stacklevel=3)

    def unregister_plugin(self, name: str) -> int:
        """Remove every implementation registered by plugin ``name``; returns how many."""
        removed = 0
        with self._lock:
            self._unchecked = [s for s in self._unchecked if not (s.plugin and s.plugin.name == name)]
            for algo in list(self._registry):
                keep = [s for s in self._registry[algo] if not (s.plugin and s.plugin.name == name)]
                removed += len(self._registry[algo]) - len(keep)
                if keep:
                    self._registry[algo] = keep
                else:
                    del self._registry[algo]
            self._changed()
        return removed

    # -- lookup ----------------------------------------------------------------------------

    def list_algorithms(self) -> list[str]:
        """Sorted lower-case names of every registered algorithm."""
        self._ensure_loaded()
        return sorted(self._registry)

    def list_implementations(self, algorithm: str) -> list[KernelSpec]:
        """Every implementation of ``algorithm`` in :func:`default_order`, best first (a copy; empty if unknown)."""
        self._ensure_loaded()
        return list(self._registry.get(algorithm.strip().lower(), ()))

    def __iter__(self) -> Iterator[KernelSpec]:
        self._ensure_loaded()
        for algo in sorted(self._registry):
            yield from self._registry[algo]

    def get(
        self,
        algorithm: str,
        platform: PlatformLike | Literal["auto"] | None = None,
        backend: BackendLike | None = None,
    ) -> Callable[..., Any]:
        """The best matching implementation callable (see :meth:`get_spec`)."""
        return self.get_spec(algorithm, platform, backend).implementation

    def get_spec(
        self,
        algorithm: str,
        platform: PlatformLike | Literal["auto"] | None = None,
        backend: BackendLike | None = None,
        name: str | None = None,
    ) -> KernelSpec:
        """The first :class:`KernelSpec` in :func:`default_order` matching the query.

        Matching: ``None`` platform, backend or implementation ``name`` matches anything; ``Backend.ANY``
        implementations match every backend. ``platform="auto"`` means any platform whose
        plugin reports itself available, on ``backend`` or else JAX's default backend.
        When nothing matches, ``platform=xla`` retries with ``Backend.ANY`` and
        ``backend=any`` retries with JAX's default backend — each query is tried once.

        Raises:
            KernelNotFoundError: listing what is registered, skipped plugins and what to install.
        """
        self._ensure_loaded()
        algo = algorithm.strip().lower()
        auto = platform is not None and str(platform).strip().lower() == "auto"
        plat = None if platform is None or auto else normalize_platform(platform)
        back = None if backend is None else normalize_backend(backend)
        if auto and back is None:
            back = default_backend()
        impl_name = None if name is None else _implementation_name(name)

        for query_platform, query_backend in self._attempts(plat, back):
            for spec in self._registry.get(algo, ()):
                if query_platform is not None and spec.platform != query_platform:
                    continue
                if impl_name is not None and spec.name != impl_name:
                    continue
                if query_backend is not None and spec.backend not in (Backend.ANY, query_backend):
                    continue
                if auto and not self.spec_available(spec)[0]:
                    continue
                return spec
        raise KernelNotFoundError(self._not_found_message(algo, plat, back, auto, impl_name))

    @staticmethod
    def _attempts(platform: str | None, backend: Backend | None) -> list[tuple[str | None, Backend | None]]:
        attempts: list[tuple[str | None, Backend | None]] = [(platform, backend)]
        if platform == Platform.XLA and backend not in (None, Backend.ANY):
            attempts.append((platform, Backend.ANY))
        if attempts[-1][1] == Backend.ANY:  # also after the XLA retry: xla/gpu -> xla/any -> xla/<default>
            attempts.append((platform, default_backend()))
        unique: list[tuple[str | None, Backend | None]] = []
        for attempt in attempts:  # a fixed, finite list: no recursion, each query once
            if attempt not in unique:
                unique.append(attempt)
        return unique

    def _not_found_message(self, algo: str, platform: str | None, backend: Backend | None, auto: bool,
                           name: str | None = None) -> str:
        query = f"platform={'auto' if auto else platform!s}, backend={backend!s}"
        if name is not None:
            query += f", implementation={name}"
        lines = [f"No implementation of {algo!r} for {query}."]
        specs = self._registry.get(algo, [])
        if specs:
            registered = ", ".join(
                f"{s.label} (priority {s.priority}, plugin {s.plugin or '<none>'})" for s in specs
            )
            lines.append(f"Registered implementations of {algo!r}: {registered}.")
            if auto:
                for spec in specs:
                    ok, reason = self.spec_available(spec)
                    if ok:
                        continue
                    line = (f"Platform {str(spec.platform)!r} is unavailable: {reason}"
                            if not self.platform_available(spec.platform)[0]
                            else f"{spec.label} of plugin {spec.plugin or '<none>'} is unavailable: {reason}")
                    if line not in lines:
                        lines.append(line)
        else:
            known = ", ".join(sorted(self._registry)) or "none"
            lines.append(f"No plugin registered {algo!r}. Registered algorithms: {known}.")
        if self._explain is not None:
            lines.extend(self._explain())
        wanted = self._distribution_of(str(platform)) if platform and self._distribution_of else None
        if wanted and not any(s.platform == platform for s in specs):
            lines.append(f"To add the {platform} platform: pip install {wanted}")
        elif not specs:
            lines.append(f"The portable default runs everywhere: pip install {PORTABLE_DISTRIBUTION}")
        return "\n".join(lines)

    # -- signature validation ----------------------------------------------------------------

    def validate_signatures(self, algorithm: str | None = None, verbose: bool = False) -> bool:
        """Check the signatures of every implementation of an algorithm.

        An algorithm whose op declares its call contract (every op of :func:`ejk.ops.define_op`)
        checks each implementation against it: can it, its VJP forward and its backward take the
        call the core makes (annotations, defaults and positional names are the implementation's
        own). Another algorithm compares each implementation with the highest-priority one,
        parameter by parameter: name, kind, default and annotation (the ``cfg`` parameter's
        annotation is platform-specific and not compared, and an unannotated parameter matches any
        annotation). Each problem emits a ``UserWarning`` naming the plugin of the implementation.

        Returns:
            ``True`` when the implementations of ``algorithm`` (of every algorithm when it is
            ``None``) agree, else ``False``.

        Raises:
            ValueError: if ``algorithm`` is not registered.
        """
        self._ensure_loaded()
        if algorithm is None:
            results = [self.validate_signatures(algo, verbose=verbose) for algo in self.list_algorithms()]
            return all(results)
        specs = self.list_implementations(algorithm)
        if not specs:
            known = ", ".join(self.list_algorithms()) or "none"
            raise ValueError(f"algorithm {algorithm!r} is not registered; registered: {known}")
        if verbose:
            for spec in specs:
                print(f"{spec.algorithm} {spec.label} {_qualname(spec.implementation)}"
                      f"{inspect.signature(spec.implementation)}")
        contract = _contract.contract_of(specs[0].algorithm)
        ok = True
        if contract is not None:
            for spec in specs:
                for problem in contract.problems(spec.implementation, spec.vjp):
                    ok = False
                    warnings.warn(f"{spec.algorithm}: {spec.label} of plugin {spec.plugin or '<none>'}: {problem}",
                                  UserWarning, stacklevel=2)
            return ok
        reference = specs[0]
        ref_params = list(_signature(reference.implementation).parameters.values())
        for spec in specs[1:]:
            params = list(_signature(spec.implementation).parameters.values())
            for problem in _compare_parameters(ref_params, params):
                ok = False
                warnings.warn(
                    f"{reference.algorithm}: {spec.label} of plugin {spec.plugin or '<none>'} "
                    f"({_qualname(spec.implementation)}) differs from {reference.label} of plugin "
                    f"{reference.plugin or '<none>'} ({_qualname(reference.implementation)}): {problem}",
                    UserWarning,
                    stacklevel=2,
                )
        return ok


def _contract_message(spec: KernelSpec, problems: list[str]) -> str:
    return (f"{spec.algorithm} {spec.label} of plugin {spec.plugin or '<none>'} is refused: "
            f"{'; '.join(problems)}. Fix: give it the op's signature (see docs/KERNEL_CONTRACT.md).")


def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    """``fn``'s signature with string annotations evaluated (as written, when they cannot be)."""
    try:
        return inspect.signature(fn, eval_str=True)
    except Exception:  # a name only imported under TYPE_CHECKING, say
        return inspect.signature(fn)


def _annotation(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return "nothing"
    if isinstance(annotation, type):  # the public name (jax.Array), not the defining module's
        module = annotation.__module__
        name = annotation.__name__.rpartition(".")[2]
        return name if module == "builtins" else f"{module}.{name}"
    return inspect.formatannotation(annotation)


def _compare_parameters(reference: list[inspect.Parameter], other: list[inspect.Parameter]) -> list[str]:
    problems = []
    if len(reference) != len(other):
        problems.append(
            f"{len(other)} parameters instead of {len(reference)} "
            f"({[p.name for p in other]} vs {[p.name for p in reference]})"
        )
    for ref, par in zip(reference, other, strict=False):
        if ref.name != par.name:
            problems.append(f"parameter {par.name!r} where {ref.name!r} is expected")
            continue
        if ref.kind != par.kind:
            problems.append(f"parameter {par.name!r} is {par.kind.description}, expected {ref.kind.description}")
        if ref.default is not par.default and ref.default != par.default:
            problems.append(f"parameter {par.name!r} defaults to {par.default!r}, expected {ref.default!r}")
        unannotated = inspect.Parameter.empty in (ref.annotation, par.annotation)
        if par.name != "cfg" and not unannotated and ref.annotation != par.annotation:
            problems.append(
                f"parameter {par.name!r} is annotated {_annotation(par.annotation)}, "
                f"expected {_annotation(ref.annotation)}"
            )
    return problems


#: The process-wide registry; installed plugins are loaded on its first query (by the loader that
#: :mod:`ejk.plugins` installs when imported, as ``import ejk`` does: this module imports no plugin code).
kernel_registry = KernelRegistry()
