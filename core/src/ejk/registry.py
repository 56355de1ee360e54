"""Kernel registry: which implementations exist for which (algorithm, platform, backend).

Plugins register implementations through the ``ejk_register_kernels`` hook (or the
:meth:`KernelRegistry.register` decorator); the Executor and the public operations look
them up here. The process-wide :data:`kernel_registry` loads the installed plugins lazily,
once, on its first query — never at ``import ejk``.
"""

from __future__ import annotations

import contextvars
import enum
import inspect
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar

import attrs

from ejk.errors import DuplicateKernelError, KernelNotFoundError

__all__ = [
    "VJP",
    "Backend",
    "KernelRegistry",
    "KernelSpec",
    "Platform",
    "kernel_registry",
]

F = TypeVar("F", bound=Callable[..., Any])


class Platform(enum.StrEnum):
    """Frameworks kernels are written in. Third-party plugins may use other lowercase names."""

    TRITON = "triton"
    PALLAS = "pallas"
    CUDA = "cuda"
    CUTE = "cute"
    XLA = "xla"


class Backend(enum.StrEnum):
    """Hardware a kernel targets. ``ANY`` matches every backend query."""

    GPU = "gpu"
    TPU = "tpu"
    CPU = "cpu"
    ANY = "any"


PlatformLike = Platform | str
BackendLike = Backend | Literal["gpu", "tpu", "cpu", "any"] | str

#: What to install when no plugin registered an algorithm at all: the portable platform, which
#: runs on every backend. Which distribution provides any other platform is not listed here: the
#: plugin host answers from entry points and the ``ejk_platform_distributions`` hook.
PORTABLE_DISTRIBUTION = "ejk-xla"


@attrs.frozen(kw_only=True)
class PluginRef:
    """Who registered a kernel: the plugin (entry-point) name and its distribution version."""

    name: str
    distribution: str | None = None
    version: str | None = None

    def __str__(self) -> str:
        dist = self.distribution or self.name
        return f"{self.name} ({dist} {self.version})" if self.version else self.name


#: The one lock of plugin loading, shared by every registry's lazy load and by the plugin host
#: (``ejk.plugins``). Loading runs the loader (which takes the host) and the host registers
#: kernels into the registry; with two locks two threads could take them in opposite orders
#: and deadlock on their first call. Each registry's own ``_lock`` only guards its dict and
#: is never held while other code runs, so it always comes last.
LOAD_LOCK = threading.RLock()

_current_plugin: contextvars.ContextVar[PluginRef | None] = contextvars.ContextVar(
    "ejk_current_plugin", default=None
)


@attrs.frozen(kw_only=True)
class VJP:
    """A forward/backward pair from which the Executor builds an implementation's custom VJP.

    Attributes:
        fwd: ``fwd(*arrays, **static, cfg=cfg) -> (out, residuals)``, called like the implementation.
        bwd: ``bwd(residuals, cotangent, *, cfg, **static) -> tuple`` with one cotangent per array
            argument of the op, in the op's layout (``None`` for a non-differentiable one).
            ``None`` (omitted): a forward-only implementation whose backward is *paired* — the
            core runs the best other implementation of the op that declares the same
            ``residuals`` and accepts the call, and its capability gate refuses calls for
            which none does (see :attr:`paired`).
        residuals: Names the residual format. The backward of any implementation with the same
            ``residuals`` tag may be paired with this forward (see :class:`ejk.ops.ImplChoice`).
        fix: For a paired backward: what to install (or do) when no backward pairs with a call,
            ending the error and the gate's reason (default: a generic hint naming the tag).
        extra_cotangents: Outputs that variants of the op add (e.g. ``"lse"``, which
            ``flash_attention_lse`` adds to ``flash_attention``) whose cotangents ``bwd`` also
            takes, as keyword arguments ``d_<name>`` (absent, or ``None``, when there is none). The
            variant's backward then is this one: the implementation provides the variant for free.
    """

    fwd: Callable[..., Any]
    bwd: Callable[..., Any] | None = None
    residuals: str = attrs.field(validator=attrs.validators.min_len(1))
    fix: str | None = attrs.field(default=None)
    extra_cotangents: tuple[str, ...] = attrs.field(default=())

    @extra_cotangents.validator
    def _extra_cotangents_need_a_backward(self, attribute: Any, value: tuple[str, ...]) -> None:
        if value and self.bwd is None:
            raise ValueError("VJP(extra_cotangents=...) names cotangents its bwd takes: pass bwd too")
        if not isinstance(value, tuple) or not all(isinstance(name, str) and name.isidentifier() for name in value):
            raise ValueError(f"VJP(extra_cotangents={value!r}) must be a tuple of output names such as ('lse',)")

    @fix.validator
    def _fix_only_when_paired(self, attribute: Any, value: str | None) -> None:
        if value is not None and self.bwd is not None:
            raise ValueError("VJP(fix=...) is for a forward-only VJP (bwd omitted): its own bwd never needs one")

    @property
    def paired(self) -> bool:
        """Whether the backward is another implementation's, found by :attr:`residuals` (``bwd`` is ``None``)."""
        return self.bwd is None

    def describe_backward(self) -> str:
        """``own`` or ``paired by residuals '<tag>'`` (for listings)."""
        return f"paired by residuals {self.residuals!r}" if self.paired else "own"


@attrs.frozen(kw_only=True)
class KernelSpec:
    """One registered implementation (immutable, hashable).

    Everything the core needs to know about an implementation is here: how to run it, how to
    differentiate it, which configs it takes and which calls it can run.

    Attributes:
        algorithm: Canonical lower-case algorithm name, e.g. ``"flash_attention"``.
        platform: Framework the kernel is written in (a :class:`Platform` or a plugin's own name).
        backend: Hardware it targets; ``Backend.ANY`` matches every backend.
        name: Short implementation name, unique per (algorithm, platform, backend) and plugin,
            e.g. ``"chunked"`` or ``"cudnn"`` (default: the platform name).
        implementation: The forward callable, ``impl(*arrays, **static, cfg=...)``.
        priority: Higher wins when several implementations match a lookup.
        plugin: The plugin that registered it (``None`` when registered outside any plugin).
        cfg_type: The implementation's config class: cached and explicit configs must be instances.
        config_space: ``config_space(**call) -> [cfg, ...]``: autotuning candidates for one call.
        heuristic: ``heuristic(**call) -> cfg``: a config chosen without measuring.
        capability: ``capability(**call) -> str | None``: why the implementation cannot run a call
            (``"soft cap not supported"``), or ``None`` when it can.
        rank: ``rank(**call) -> int``: preference in the heuristics tier for one call (default:
            ``priority``); lets a plugin prefer an implementation by device and shape class.
        vjp: Optional forward/backward pair; without one, JAX differentiates the forward. With a
            paired one (``bwd`` omitted), ``capability`` is the plugin's gate wrapped so that it
            also refuses calls for which no other implementation's backward pairs.

    ``call`` is the implementation's own keyword view of an invocation: array arguments as
    ``jax.ShapeDtypeStruct`` (or ``None``) and static arguments as values, without ``cfg``.
    """

    algorithm: str
    platform: str
    backend: Backend
    name: str
    implementation: Callable[..., Any] = attrs.field(eq=False)
    priority: int = 0
    plugin: PluginRef | None = None
    cfg_type: type | None = attrs.field(default=None, eq=False)
    config_space: Callable[..., Sequence[Any]] | None = attrs.field(default=None, eq=False)
    heuristic: Callable[..., Any] | None = attrs.field(default=None, eq=False)
    capability: Callable[..., str | None] | None = attrs.field(default=None, eq=False)
    rank: Callable[..., int] | None = attrs.field(default=None, eq=False)
    vjp: VJP | None = attrs.field(default=None, eq=False)

    @property
    def label(self) -> str:
        """``platform/backend:name`` (without ``:name`` when the name is the platform's), e.g.
        ``xla/gpu:cudnn`` — how errors, events and the CLI name this implementation."""
        base = f"{self.platform}/{self.backend}"
        return base if self.name == self.platform else f"{base}:{self.name}"


def capability_reason(spec: KernelSpec, call: Mapping[str, Any]) -> str | None:
    """``spec``'s capability gate on ``call``: its reason, ``None`` when it accepts (or has no gate).
    A gate that raises refuses, with the exception as its reason: it never takes the op down."""
    if spec.capability is None:
        return None
    try:
        reason = spec.capability(**call)
    except Exception as exc:
        return f"capability check raised {type(exc).__name__}: {exc}"
    return None if reason is None else str(reason)


def _implementation_name(name: str) -> str:
    text = str(name).strip().lower()
    if not text or not text.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"implementation name {name!r} is not valid; use a short name such as 'chunked'")
    return text


def normalize_platform(platform: PlatformLike) -> str:
    """Lower-case a platform name, returning the enum member when it is a known one."""
    name = str(platform).strip().lower()
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"platform {platform!r} is not a valid platform name; use e.g. 'xla' or 'triton'")
    try:
        return Platform(name)
    except ValueError:
        return name


def platform_name(platform: PlatformLike) -> str:
    """:func:`normalize_platform` as a plain string (attrs converter for config fields)."""
    return str(normalize_platform(platform))


def normalize_backend(backend: BackendLike) -> Backend:
    """Turn a backend name (case-insensitive; ``cuda``/``rocm`` mean ``gpu``) into a :class:`Backend`."""
    name = str(backend).strip().lower()
    if name in ("cuda", "rocm"):
        name = "gpu"
    try:
        return Backend(name)
    except ValueError:
        valid = ", ".join(b.value for b in Backend)
        raise ValueError(f"backend {backend!r} is not known; use one of: {valid}") from None


def default_backend() -> Backend:
    """The backend of JAX's default device, as a :class:`Backend`."""
    import jax

    return normalize_backend(jax.default_backend())


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class KernelRegistry:
    """Registry of kernel implementations with priority-aware, fallback-aware lookup.

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
        self._version = 0

    @property
    def version(self) -> int:
        """A counter that changes whenever implementations are added or removed (the Executor
        reuses a decision only while it is unchanged)."""
        return self._version

    def set_loader(self, loader: Callable[[KernelRegistry], None], *, clear: bool = False) -> None:
        """Run ``loader`` on the next query (again, after a reset); ``clear`` first removes every
        implementation."""
        with self._lock:
            if clear:
                self._registry.clear()
            self._loader = loader
            self._loaded = False
            self._version += 1

    def touch(self) -> None:
        """Note a change made to the registry from outside its methods (e.g. emptied on reset)."""
        with self._lock:
            self._version += 1

    # -- loading ---------------------------------------------------------------------------

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        with LOAD_LOCK:  # not self._lock: see LOAD_LOCK
            if self._loaded or self._loading:  # re-entrant query from a plugin: serve what is there
                return
            self._loading = True
            try:
                assert self._loader is not None
                self._loader(self)
            finally:
                self._loading = False
                self._loaded = True

    def set_diagnostics(
        self,
        availability: Callable[[str, str | None], tuple[bool, str | None]] | None,
        explain: Callable[[], list[str]] | None,
        distribution_of: Callable[[str], str | None] | None = None,
    ) -> None:
        """Install the callbacks (from the plugin loader) that say whether a platform is usable —
        ``availability(platform, plugin name or None)`` —, describe skipped plugins and name the
        distribution providing a platform (``None``: unknown) in :class:`KernelNotFoundError` messages."""
        self._availability = availability
        self._explain = explain
        self._distribution_of = distribution_of

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
        name: str | None = None,
        cfg_type: type | None = None,
        config_space: Callable[..., Sequence[Any]] | None = None,
        heuristic: Callable[..., Any] | None = None,
        capability: Callable[..., str | None] | None = None,
        rank: Callable[..., int] | None = None,
        vjp: VJP | None = None,
    ) -> Callable[[F], F]:
        """Decorator registering an implementation; returns the function unchanged.

        The keyword arguments are the :class:`KernelSpec` fields of the same names.

        Raises:
            DuplicateKernelError: if the same plugin already registered this
                (algorithm, platform, backend, name).
        """
        algo = algorithm.strip().lower()
        if not algo:
            raise ValueError("algorithm must be a non-empty name such as 'flash_attention'")
        plat = normalize_platform(platform)
        back = normalize_backend(backend)
        impl_name = _implementation_name(plat if name is None else name)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be an int, got {priority!r}")
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
            self._add(spec)
            return fn

        return decorator

    def _add(self, spec: KernelSpec) -> None:
        with self._lock:
            specs = self._registry.setdefault(spec.algorithm, [])
            owner = spec.plugin.name if spec.plugin else None
            for existing in specs:
                same_owner = (existing.plugin.name if existing.plugin else None) == owner
                same_impl = (existing.platform, existing.backend, existing.name) == (spec.platform, spec.backend,
                                                                                     spec.name)
                if same_owner and same_impl:
                    raise DuplicateKernelError(
                        f"{spec.algorithm} {spec.label} is registered twice by plugin "
                        f"{owner or '<none>'}: first {_qualname(existing.implementation)}, then "
                        f"{_qualname(spec.implementation)}. Register each (algorithm, platform, "
                        f"backend, name) once per plugin; give a second implementation its own name=."
                    )
            specs.append(spec)
            specs.sort(key=lambda s: -s.priority)  # stable: equal priorities keep registration order
            self._version += 1

    def unregister_plugin(self, name: str) -> int:
        """Remove every implementation registered by plugin ``name``; returns how many."""
        removed = 0
        with self._lock:
            for algo in list(self._registry):
                keep = [s for s in self._registry[algo] if not (s.plugin and s.plugin.name == name)]
                removed += len(self._registry[algo]) - len(keep)
                if keep:
                    self._registry[algo] = keep
                else:
                    del self._registry[algo]
            self._version += 1
        return removed

    # -- lookup ----------------------------------------------------------------------------

    def list_algorithms(self) -> list[str]:
        """Sorted lower-case names of every registered algorithm."""
        self._ensure_loaded()
        return sorted(self._registry)

    def list_implementations(self, algorithm: str) -> list[KernelSpec]:
        """Every implementation of ``algorithm``, highest priority first (a copy; empty if unknown)."""
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
        """The highest-priority :class:`KernelSpec` matching the query.

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
        """Check that every implementation of an algorithm has the same signature.

        Compares each implementation with the highest-priority one, parameter by parameter:
        name, kind, default and annotation (the ``cfg`` parameter's annotation is
        platform-specific and not compared, and an unannotated parameter matches any
        annotation). Each mismatch emits a ``UserWarning`` naming the plugin of the
        implementation that differs.

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
        reference = specs[0]
        ref_params = list(_signature(reference.implementation).parameters.values())
        if verbose:
            for spec in specs:
                print(f"{spec.algorithm} {spec.label} {_qualname(spec.implementation)}"
                      f"{inspect.signature(spec.implementation)}")
        ok = True
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
