"""Shared machinery of the public operations: implementation choices and the op kernel.

An operation's config is an :class:`ImplChoice` — *which* registered implementation
(platform, backend, implementation name) and *its* config — so one autotuning run compares
implementations (XLA chunked vs cuDNN vs Pallas vs Triton vs CuTe), not just block sizes.
Every implementation declares which calls it can run (its capability gate); every tier of
the selection chain skips implementations that refuse a call, and keeps their reasons.
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import jax

from ejk._contract import Extension, fit_call, gate_reason, takes
from ejk._epoch import bump
from ejk._pairing import paired_backward, pairing_candidates
from ejk._versions import installed_version
from ejk.config.packs import pack_rankings
from ejk.config.selection import ConfigSelectorChain
from ejk.config.serialization import from_jsonable, to_jsonable
from ejk.errors import KernelContractError, KernelNotFoundError
from ejk.execution.executor import Executor
from ejk.execution.kernel import Invocation, Kernel, abstract_args, tracked_state
from ejk.ops._eager import eager_key, remember, run_eager
from ejk.ops._training import pairing_order, training_choice, training_rankings
from ejk.parallel._vma import varying_like
from ejk.registry import (
    Backend,
    KernelRegistry,
    KernelSpec,
    default_backend,
    default_order,
    kernel_registry,
    normalize_backend,
    normalize_platform,
    platform_name,
)

if TYPE_CHECKING:
    from ejk.ops._definition import OpDefinition

__all__ = [
    "Candidate",
    "ImplChoice",
    "OpKernel",
    "get_default_executor",
    "set_default_executor",
    "use_executor",
]


def _backend_name(backend: str) -> str:
    return str(normalize_backend(backend))


def _optional_name(name: str | None) -> str | None:
    return None if name is None else str(name).strip().lower()


@attrs.frozen(kw_only=True)
class ImplChoice:
    """The config of a public operation: an implementation and its own config.

    Attributes:
        platform: Platform of the implementation, e.g. ``"xla"``.
        backend: Backend it was registered for (``"any"`` for portable ones).
        implementation: The implementation's name, e.g. ``"chunked"`` or ``"cudnn"``
            (``None``: the highest-priority one of that platform and backend, resolved once
            when the choice is made).
        cfg: The implementation's config (``None``: its defaults).
        backward: Another implementation whose backward pass consumes this one's residuals
            (both must declare the same :attr:`ejk.VJP.residuals`); ``None``: its own.
        plugin: The plugin (entry-point name) that must have registered the implementation
            (``None``: whichever did; a label belongs to one plugin). A choice naming another
            plugin than the label's owner is not registered.
        training: What runs instead when the call is differentiated (its forward and its backward);
            ``None``: this choice. The heuristics tier sets it where a pack's ``"fwd+bwd"`` ranking
            prefers another implementation or pairing than the forward's winner.
    """

    platform: str = attrs.field(converter=platform_name)
    backend: str = attrs.field(converter=_backend_name)
    implementation: str | None = attrs.field(default=None, converter=_optional_name)
    cfg: Any = None
    backward: ImplChoice | None = None
    plugin: str | None = attrs.field(default=None, converter=_optional_name)
    training: ImplChoice | None = None

    @classmethod
    def from_label(cls, label: str, cfg: Any = None) -> ImplChoice:
        """The choice a label names: ``platform/backend[:name]``, optionally prefixed by its plugin,
        ``plugin:platform/backend[:name]`` (e.g. ``ejk-example:xla/any:split_k`` or ``xla/gpu:cudnn``).

        Raises:
            ValueError: when ``label`` has no ``platform/backend`` part.
        """
        head, slash, tail = str(label).strip().partition("/")
        plugin, _, platform = head.rpartition(":")
        backend, _, name = tail.partition(":")
        if not slash or not platform or not backend:
            raise ValueError(f"implementation label {label!r} must read [plugin:]platform/backend[:name], "
                             "e.g. 'xla/any:chunked'")
        return cls(platform=platform, backend=backend, implementation=name or None, cfg=cfg, plugin=plugin or None)

    def __str__(self) -> str:
        name = "" if self.implementation in (None, self.platform) else f":{self.implementation}"
        owner = "" if self.plugin is None else f"{self.plugin}:"
        text = f"{owner}{self.platform}/{self.backend}{name} {self.cfg!r}"
        text = text if self.backward is None else f"{text} + backward {self.backward}"
        return text if self.training is None else f"{text}; differentiated: {self.training}"


@attrs.frozen(kw_only=True)
class Candidate:
    """One registered implementation as seen by one call: usable, or why not.

    Attributes:
        spec: The implementation.
        reason: ``None`` when it can run the call; otherwise why it cannot (unavailable
            platform and its fix, other backend, or its capability gate's reason).
        requested: ``False`` when a forced ``platform=`` excludes it.
    """

    spec: KernelSpec
    reason: str | None = None
    requested: bool = True

    @property
    def usable(self) -> bool:
        return self.requested and self.reason is None


def _describe_call(call: Mapping[str, Any]) -> str:
    parts = []
    for name, value in call.items():
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            parts.append(f"{name}={'x'.join(map(str, value.shape)) or 'scalar'}:{jax.numpy.dtype(value.dtype).name}")
        elif value is not None:
            parts.append(f"{name}={value!r}")
    return ", ".join(parts)


class OpKernel(Kernel[ImplChoice, Any]):
    """The kernel behind a public operation: dispatches to registered implementations.

    Subclasses set ``op_id`` (the algorithm name), ``array_names`` (the implementation's
    array arguments, in order) and ``positional`` (how many of them are positional in the
    implementation's signature; the rest are passed by keyword).
    """

    array_names: tuple[str, ...] = ()
    positional: int = 0
    #: The op's definition, set by :func:`~ejk.ops.define_op` on the kernel and its class (so another
    #: instance, bound to another registry, knows it too; ``None`` for a kernel no op declares).
    definition: OpDefinition | None = None
    #: The op this one is a variant of (``None``: none): its implementations that :meth:`derive`
    #: turns into this op's count as this op's own, unless one registered for this op shadows them.
    variant_of: str | None = None
    #: Arguments added to the op after implementations were written against it (arrays of
    #: ``array_names`` or static arguments): passed only to implementations whose signature names
    #: them; one that does not is refused calls where the value is not the extension's legacy one.
    extensions: tuple[Extension, ...] = ()

    def __init__(self, registry: KernelRegistry | None = None) -> None:
        self.registry = registry if registry is not None else kernel_registry
        self._derived: tuple[tuple[int, int], list[KernelSpec]] | None = None
        self._outputs: dict[Any, Any] = {}

    @property
    def registry(self) -> KernelRegistry:
        """Where the implementations are; another one changes :meth:`selection_state` (and bumps ejk's epoch)."""
        return self._registry

    @registry.setter
    def registry(self, registry: KernelRegistry) -> None:
        self._registry = registry
        bump()

    def normalize(self, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Validate the public function's arguments (without ``platform`` / ``cfg``) and return
        the implementations' ``(arrays, static keyword arguments)``; arrays may be abstract
        (``jax.ShapeDtypeStruct``), as :func:`ejk.explain` passes them."""
        raise NotImplementedError(f"{type(self).__name__}.normalize is not implemented")

    # -- the implementations' view of a call ------------------------------------------------------

    def _host(self) -> Any:
        from ejk.plugins import get_plugin_host

        return get_plugin_host()

    def call_view(self, inv: Invocation[ImplChoice]) -> dict[str, Any]:
        """The keyword view of a call every implementation callback receives: abstract arrays by
        name, then the static arguments (without ``platform``)."""
        view = dict(zip(self.array_names, inv.abstract_args, strict=True))
        view.update((k, v) for k, v in inv.kwargs.items() if k != "platform")
        return view

    def ranking_view(self, call: Mapping[str, Any]) -> dict[str, Any]:
        """``call`` (a :meth:`call_view`) with every extension argument it leaves out at its legacy value: what a
        pack ranking's shape class reads (``"activation": null`` holds for a call without one)."""
        return {**{e.name: e.legacy for e in self.extensions if e.name not in call}, **call}

    # -- the implementations, registered and derived ---------------------------------------------

    def derive(self, spec: KernelSpec) -> KernelSpec | None:
        """For a variant (:attr:`variant_of`): this op's implementation made of ``spec``, an
        implementation of the op it varies, or ``None`` when ``spec`` cannot provide it."""
        return None

    def implementations(self) -> list[KernelSpec]:
        """Every implementation of this op, highest priority first: those registered for it and, for a
        variant, those derived from the implementations of the op it varies (a registered one of
        the same platform, backend and name shadows a derived one)."""
        own = self.registry.list_implementations(self.op_id)
        if self.variant_of is None:
            return own
        key = (id(self.registry), self.registry.version)
        if self._derived is None or self._derived[0] != key:  # derived once per registry state
            self._derived = (key, [d for s in self.registry.list_implementations(self.variant_of)
                                   if (d := self.derive(s)) is not None])
        taken = {(s.platform, s.backend, s.name) for s in own}
        found = own + [d for d in self._derived[1] if (d.platform, d.backend, d.name) not in taken]
        return sorted(found, key=default_order)  # stable: registered ones first among equals

    def paired_backward(self, spec: KernelSpec, call: Mapping[str, Any], device: str | None = None) -> KernelSpec:
        """The implementation whose backward runs on forward-only ``spec``'s residuals for ``call``: on
        ``device``, the pairing its packs' ``"fwd+bwd"`` rankings put first, else the registry's order."""
        candidates = self.implementations()
        if device is not None:
            rankings = training_rankings(self, device, call)
            if rankings:
                candidates = pairing_order(rankings, spec, candidates)
        return paired_backward(self.registry, spec, call, candidates)

    def _gate(self, spec: KernelSpec, call: Mapping[str, Any]) -> str | None:
        # its own gate, then the extension arguments it does not take; a broken gate refuses, never takes the op down
        return gate_reason(spec, call, self.extensions)

    def _fit(self, fn: Any, call: Mapping[str, Any]) -> dict[str, Any]:
        """``call`` for a callback (gate, heuristic, config space, rank) that may predate an extension."""
        return fit_call(fn, call, self.op_id, self.extensions)

    def candidates(self, inv: Invocation[ImplChoice]) -> list[Candidate]:
        """Every registered implementation of this op, each with why it cannot run ``inv`` (if so).

        One entry per (platform, backend, name): the registry refuses a second plugin's registration
        of a label, and a variant's own registration replaces the derived one of its label.
        """
        platform = str(inv.kwargs.get("platform", "auto"))
        backend = default_backend()
        call = self.call_view(inv)
        found: list[Candidate] = []
        for spec in self.implementations():
            requested = platform == "auto" or spec.platform == platform
            reason: str | None = None
            if spec.backend not in (Backend.ANY, backend):
                reason = f"targets {spec.backend}, but JAX's default backend is {backend}"
            elif platform == "auto" and not (availability := self.registry.spec_available(spec))[0]:
                reason = f"platform {spec.platform} is unavailable: {availability[1]}"
            elif requested:  # a forced platform skips the availability check; its gate still decides
                reason = self._gate(spec, call)
            found.append(Candidate(spec=spec, reason=reason, requested=requested))
        return found

    def usable_specs(self, inv: Invocation[ImplChoice]) -> list[KernelSpec]:
        """Implementations that can run ``inv``, highest priority first.

        Raises:
            KernelNotFoundError: when no implementation of the requested platform is registered.
            ValueError: when implementations exist but every one refuses the call; the message
                names each reason and, for a forced platform, the implementations that can.
        """
        found = self.candidates(inv)
        usable = [c.spec for c in found if c.usable]
        if usable:
            return usable
        platform = str(inv.kwargs.get("platform", "auto"))
        requested = [c for c in found if c.requested and c.spec.backend in (Backend.ANY, default_backend())]
        if not requested:  # nothing registered for this platform here: the registry's full diagnosis
            self.registry.get_spec(self.op_id, platform=platform, backend=default_backend())
            raise KernelNotFoundError(f"no implementation of {self.op_id!r} for platform={platform}")
        reasons = "; ".join(f"{c.spec.label}: {c.reason}" for c in requested)
        call = self.call_view(inv)  # a forced platform left the others ungated: gate them to say which can
        can = [c.spec.label for c in found if not c.requested and c.reason is None and self._gate(c.spec, call) is None]
        hint = (f" Implementations that can: {', '.join(can)} (use platform='auto' or one of their platforms)."
                if can else "")
        raise ValueError(
            f"{self.op_id}: no implementation for platform={platform} can run this call "
            f"({_describe_call(call)}): {reasons}.{hint}"
        )

    def _tie_break(self, spec: KernelSpec, call: Mapping[str, Any]) -> int:
        """Its order inside its tier: its ``rank`` callback's answer, else its priority."""
        if spec.rank is None:
            return spec.priority
        try:
            return int(spec.rank(**self._fit(spec.rank, call)))
        except Exception as exc:
            warnings.warn(f"{self.op_id} {spec.label}: rank raised {type(exc).__name__}: {exc}; "
                          "using its priority", RuntimeWarning, stacklevel=4)
            return spec.priority

    def ranking(self, specs: Sequence[KernelSpec], inv: Invocation[ImplChoice]) -> list[tuple[KernelSpec, str]]:
        """``specs`` in the heuristics tier's order, best first, each with why it stands there.

        The rankings of config packs that apply to the call on its device come first (each orders
        what the earlier ones leave tied); then the tier; then ``rank`` or ``priority``.
        """
        call = self.call_view(inv)
        rankings = pack_rankings(self._host(), self.op_id, inv.device, self.ranking_view(call))
        ties = {spec: self._tie_break(spec, call) for spec in specs}

        def key(spec: KernelSpec) -> tuple[int, ...]:
            return (*(r.position(spec.label) for r in rankings), -spec.tier, -ties[spec])

        def why(spec: KernelSpec) -> str:
            by = next((r for r in rankings if spec.label in r.order), None)
            if by is not None:
                return f"ranked by {by.describe()}"
            return f"tier {spec.tier}, {'rank' if spec.rank is not None else 'priority'} {ties[spec]}"

        return [(spec, why(spec)) for spec in sorted(specs, key=key)]  # stable: ties keep the registry's order

    # -- configs per implementation ---------------------------------------------------------------

    def _typed(self, spec: KernelSpec, configs: Sequence[Any], source: str) -> list[Any]:
        if spec.cfg_type is None:
            return list(configs)
        kept = [cfg for cfg in configs if cfg is None or isinstance(cfg, spec.cfg_type)]
        if len(kept) != len(configs):
            wrong = sorted({type(cfg).__name__ for cfg in configs if cfg not in kept})
            warnings.warn(f"{self.op_id} {spec.label}: {source} returned {', '.join(wrong)} where "
                          f"{spec.cfg_type.__name__} is expected; ignored", RuntimeWarning, stacklevel=3)
        return kept

    def config_space_of(self, spec: KernelSpec, inv: Invocation[ImplChoice]) -> list[Any]:
        """Autotuning configs of one implementation: its own space plus what plugins' hooks add."""
        space: list[Any] = []
        if spec.config_space is not None:
            call = self._fit(spec.config_space, self.call_view(inv))
            space.extend(self._typed(spec, list(spec.config_space(**call)), "config_space"))
        space.extend(self._host().config_space(self.op_id, str(spec.platform), inv, implementation=spec.name,
                                               cfg_type=spec.cfg_type))
        return space

    def heuristic_of(self, spec: KernelSpec, inv: Invocation[ImplChoice]) -> Any:
        """One implementation's config chosen without measuring (``None``: its defaults)."""
        if spec.heuristic is not None:
            found = self._typed(spec, [spec.heuristic(**self._fit(spec.heuristic, self.call_view(inv)))], "heuristic")
            if found:
                return found[0]
        return self._host().heuristic_config(self.op_id, str(spec.platform), inv, implementation=spec.name,
                                             cfg_type=spec.cfg_type)

    @staticmethod
    def _choice(spec: KernelSpec, cfg: Any) -> ImplChoice:
        return ImplChoice(platform=spec.platform, backend=spec.backend, implementation=spec.name, cfg=cfg)

    # -- resolving choices -------------------------------------------------------------------------

    def spec_for(self, choice: ImplChoice) -> KernelSpec:
        """The implementation a choice names (highest priority for that name; of ``choice.plugin``
        when it names one).

        Raises:
            KernelNotFoundError: when none is registered, or the one registered is another plugin's.
        """
        try:
            spec = self.registry.get_spec(self.op_id, platform=choice.platform, backend=choice.backend,
                                          name=choice.implementation)
        except KernelNotFoundError:
            if self.variant_of is None:
                raise
            for spec in self.implementations():  # a derived one
                if (spec.platform == choice.platform and spec.backend == choice.backend
                        and choice.implementation in (None, spec.name)):
                    break
            else:
                raise
        owner = spec.plugin.name if spec.plugin is not None else None
        if choice.plugin is not None and owner != choice.plugin:
            raise KernelNotFoundError(f"{self.op_id}: {spec.label} is registered by plugin {owner or '<none>'}, "
                                      f"not by plugin {choice.plugin} (the ImplChoice's plugin=)")
        return spec

    def override_problem(self, choice: Any) -> str | None:
        """What an ``ejk_choose_config`` override of this op must be, when ``choice`` is not that
        (``None``: accepted): an :class:`ImplChoice` naming a registered implementation, with a config
        of its type. The plugin host refuses an override with a problem."""
        expected = f"None or an ejk.ops.ImplChoice naming an implementation of {self.op_id}"
        if not isinstance(choice, ImplChoice):
            return expected
        try:
            spec = self.spec_for(choice)
        except Exception:
            return expected + f" (none is registered for {choice.platform}/{choice.backend})"
        if choice.cfg is not None and spec.cfg_type is not None and not isinstance(choice.cfg, spec.cfg_type):
            return f"an ImplChoice whose cfg is None or a {spec.cfg_type.__name__} (for {spec.label})"
        return None

    def complete_cfg(self, inv: Invocation[ImplChoice], cfg: ImplChoice) -> ImplChoice:
        """``cfg`` with its implementation's heuristic config for ``inv`` where it names none (and its
        ``backward``'s likewise), so the forward and the backward of an ``ImplChoice(platform,
        backend, implementation)`` run the config that implementation would pick for the call."""
        if not isinstance(cfg, ImplChoice):
            return cfg
        backward = None if cfg.backward is None else self.complete_cfg(inv, cfg.backward)
        training = None if cfg.training is None else self.complete_cfg(inv, cfg.training)
        filled = cfg.cfg
        try:
            spec = self.spec_for(cfg)
        except KernelNotFoundError:
            return cfg  # running it says what is missing
        if filled is None:
            filled = self.heuristic_of(spec, inv)
        if backward is None and spec.vjp is not None and spec.vjp.paired:
            backward = self._paired_choice(spec, inv)
        if filled is cfg.cfg and backward is cfg.backward and training is cfg.training:
            return cfg
        return attrs.evolve(cfg, cfg=filled, backward=backward, training=training)

    def _paired_choice(self, spec: KernelSpec, inv: Invocation[ImplChoice]) -> ImplChoice | None:
        """The backward a forward-only ``spec`` pairs with for ``inv``, with that implementation's heuristic
        config (``None`` when none pairs: differentiating then raises, naming why)."""
        try:
            other = self.paired_backward(spec, self.call_view(inv), inv.device)
        except NotImplementedError:
            return None
        return self._choice(other, self.heuristic_of(other, inv))

    def resolve(self, choice: ImplChoice) -> ImplChoice:
        """``choice`` with its implementation (and its backward's) named explicitly."""
        backward = None if choice.backward is None else self.resolve(choice.backward)
        training = None if choice.training is None else self.resolve(choice.training)
        if choice.implementation is not None and backward is choice.backward and training is choice.training:
            return choice
        spec = self.spec_for(choice)
        return attrs.evolve(choice, implementation=spec.name, backward=backward, training=training)

    def choice_for(self, cfg: Any, platform: str) -> ImplChoice:
        """Turn a user's ``cfg=`` (an :class:`ImplChoice` or an implementation config) into a choice.

        A config class several implementations share names the highest-priority one whose platform
        is available here (with ``platform="auto"``; else the first of the forced platform).

        Raises:
            ValueError: when the config's type belongs to no registered implementation.
        """
        if isinstance(cfg, ImplChoice):
            return self.resolve(cfg)
        backend = default_backend()
        specs = [s for s in self.implementations()
                 if s.backend in (Backend.ANY, backend) and (platform == "auto" or s.platform == platform)]
        matching = [s for s in specs if s.cfg_type is not None and isinstance(cfg, s.cfg_type)]
        if matching:  # a config class two implementations share: the first that can run here
            usable = [s for s in matching if platform != "auto" or self.registry.spec_available(s)[0]]
            return self._choice((usable or matching)[0], cfg)
        if not specs:
            self.registry.get_spec(self.op_id, platform=platform, backend=backend)  # raises the diagnosis
        names = ", ".join(f"{s.label} ({s.cfg_type.__name__ if s.cfg_type else 'no config class'})" for s in specs)
        raise ValueError(
            f"{self.op_id}: cfg of type {type(cfg).__name__} matches no available implementation ({names}); "
            "pass the config class of the implementation you want, or an ejk.ops.ImplChoice naming it"
        )

    def unusable_reason(self, inv: Invocation[ImplChoice], cfg: ImplChoice) -> str | None:
        """Why ``cfg`` cannot run ``inv`` here (``None`` when it can)."""
        if not isinstance(cfg, ImplChoice):
            return f"{type(cfg).__name__} is not an ejk.ops.ImplChoice"
        platform = str(inv.kwargs.get("platform", "auto"))
        if platform != "auto" and cfg.platform != platform:
            return f"it names platform {cfg.platform}, but platform={platform} was requested"
        try:
            spec = self.spec_for(cfg)
        except KernelNotFoundError as exc:
            return str(exc) if cfg.plugin is not None else (f"{cfg.platform}/{cfg.backend}:{cfg.implementation} "
                                                            "is not registered")
        if spec.cfg_type is not None and cfg.cfg is not None and not isinstance(cfg.cfg, spec.cfg_type):
            return (f"{spec.label} takes {spec.cfg_type.__name__}, not {type(cfg.cfg).__name__}")
        if spec.backend not in (Backend.ANY, default_backend()):
            return f"{spec.label} targets {spec.backend}, but JAX's default backend is {default_backend()}"
        if platform == "auto":
            available, why = self.registry.spec_available(spec)
            if not available:
                return f"platform {spec.platform} is unavailable: {why}"
        reason = self._gate(spec, self.call_view(inv))
        if reason is not None:
            return f"{spec.label}: {reason}"
        if cfg.backward is not None and (reason := self._backward_reason(spec, cfg.backward, inv)) is not None:
            return reason
        if cfg.training is not None and (reason := self.unusable_reason(inv, cfg.training)) is not None:
            return f"differentiated: {reason}"
        return None

    def _backward_reason(self, spec: KernelSpec, backward: ImplChoice, inv: Invocation[ImplChoice]) -> str | None:
        try:
            other = self.spec_for(backward)
        except KernelNotFoundError:
            return f"backward {backward.platform}/{backward.backend}:{backward.implementation} is not registered"
        if spec.vjp is None or other.vjp is None:
            missing = spec.label if spec.vjp is None else other.label
            return f"{missing} has no forward/backward pair to combine"
        if other.vjp.paired:
            return f"backward {other.label} has no backward of its own (it is {other.vjp.describe_backward()})"
        if spec.vjp.residuals != other.vjp.residuals:
            return (f"backward {other.label} consumes residuals {other.vjp.residuals!r}, but {spec.label} "
                    f"saves {spec.vjp.residuals!r}")
        reason = self._gate(other, self.call_view(inv))
        return None if reason is None else f"backward {other.label}: {reason}"

    def prune_reason(self, inv: Invocation[ImplChoice], cfg: ImplChoice) -> str | None:
        """A candidate whose implementation cannot run the call is never compiled."""
        return self.unusable_reason(inv, cfg)

    @tracked_state
    def selection_state(self) -> Any:
        """The registry's version: registering or removing implementations ends reuse."""
        return (id(self.registry), self.registry.version)

    def cfg_label(self, cfg: ImplChoice) -> str:
        """The label of the implementation a choice names, e.g. ``xla/any:chunked`` (groups tuning
        results; names what ran in events and recordings). A choice without an implementation
        name is resolved to the one it runs."""
        if cfg.implementation is None:
            try:
                return self.spec_for(cfg).label
            except KernelNotFoundError:
                pass
        return f"{cfg.platform}/{cfg.backend}" + ("" if cfg.implementation in (None, cfg.platform)
                                                  else f":{cfg.implementation}")

    # -- Kernel interface --------------------------------------------------------------------------

    def _split(self, arrays: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        named = dict(zip(self.array_names[self.positional:], arrays[self.positional:], strict=True))
        return arrays[: self.positional], named

    def _arguments(self, fn: Any, spec: KernelSpec, arrays: tuple[Any, ...] | None,
                   static: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``fn``'s positional arrays and keyword arguments (``arrays=None``: a backward's, static only),
        every extension argument it does not name left out (the gate refused calls where such an
        argument is not its legacy value).

        Raises:
            ValueError: when such an argument is not its legacy value (a forced ``cfg`` that skipped the gate).
        """
        pos, named = ((), {}) if arrays is None else self._split(arrays)
        keywords = {**named, **static}
        for extension in self.extensions:
            if (extension.name in keywords and not takes(fn, extension.name)
                    and not extension.is_legacy(keywords.pop(extension.name))):
                raise ValueError(f"{self.op_id} {spec.label}: {extension.refusal(self.op_id)}")
        return pos, keywords

    def _untaken_arrays(self, spec: KernelSpec) -> tuple[int, ...]:
        """Indices of the extension arrays ``spec``'s VJP forward does not take: its backward returns no
        cotangent for them."""
        assert spec.vjp is not None
        names = {e.name for e in self.extensions}
        return tuple(i for i, name in enumerate(self.array_names) if name in names and not takes(spec.vjp.fwd, name))

    def expected_output(self, arrays: tuple[Any, ...], static: Mapping[str, Any]) -> Any:
        """The abstract output the op declares for a call (see :meth:`OpDefinition.output_fn`), or
        ``None`` when it declares none or cannot tell for this call; computed once per call signature."""
        definition = self.definition
        if definition is None or definition.name != self.op_id:
            return None
        abstract = tuple(abstract_args(arrays))
        try:
            key: Any = (tuple(None if a is None else (a.shape, str(a.dtype)) for a in abstract),
                        tuple(sorted(static.items())))
            hash(key)
        except (TypeError, AttributeError):
            key = None
        if key is not None and key in self._outputs:
            return self._outputs[key]
        output = definition.output_fn()
        try:
            expected = None if output is None else output(*abstract, **static)
        except Exception:  # the reference cannot trace this call: nothing to check against
            expected = None
        if key is not None:
            if len(self._outputs) > 256:
                self._outputs.clear()
            self._outputs[key] = expected
        return expected

    def check_output(self, spec: KernelSpec, out: Any, arrays: tuple[Any, ...], static: Mapping[str, Any]) -> Any:
        """``out``, once its shapes and dtypes match the op's declared output for the call (a check
        made while tracing: free under ``jit``).

        Raises:
            KernelContractError: naming the implementation, its plugin, what it returned and what
                the op declares.
        """
        expected = self.expected_output(arrays, static)
        if expected is None:
            return out
        got = jax.tree.map(lambda x: _abstract(x), out)
        if _shapes_differ(got, expected):
            raise KernelContractError(
                f"{self.op_id} {spec.label} of plugin {spec.plugin or '<none>'} returned {_describe_tree(got)}, but "
                f"the op's output for this call ({_describe_call(self._call(arrays, static))}) is "
                f"{_describe_tree(expected)}. The implementation is refused: report it to its plugin's "
                "maintainers, or choose another with platform= or cfg=."
            )
        return out

    def _call(self, arrays: tuple[Any, ...], static: Mapping[str, Any]) -> dict[str, Any]:
        return {**dict(zip(self.array_names, abstract_args(arrays), strict=True)), **static}

    def run(self, *arrays: Any, cfg: ImplChoice, platform: str = "auto", **static: Any) -> Any:
        spec = self.spec_for(cfg)
        pos, keywords = self._arguments(spec.implementation, spec, arrays, static)
        out = varying_like(spec.implementation(*pos, **keywords, cfg=cfg.cfg), *arrays)
        return self.check_output(spec, out, arrays, static)

    def uses_custom_vjp(self, cfg: ImplChoice) -> bool:
        return cfg.training is not None or self.spec_for(cfg).vjp is not None

    def fwd(self, *arrays: Any, cfg: ImplChoice, platform: str = "auto", **static: Any) -> tuple[Any, Any]:
        training = cfg.training
        if training is not None:  # differentiated: the training choice's forward (and then its backward)
            if self.uses_custom_vjp(training):
                return self.fwd(*arrays, cfg=training, platform=platform, **static)
            return jax.vjp(lambda *xs: self.run(*xs, cfg=training, **static), *arrays)
        spec = self.spec_for(cfg)
        assert spec.vjp is not None
        pos, keywords = self._arguments(spec.vjp.fwd, spec, arrays, static)
        out, residuals = spec.vjp.fwd(*pos, **keywords, cfg=cfg.cfg)
        # Under shard_map a custom call's output may not carry the mesh axes its inputs vary along (a
        # Mosaic GPU kernel's does not); the cotangent will: type it as the inputs, for every implementation.
        out = varying_like(out, *arrays)
        self.check_output(spec, out, arrays, static)
        if spec.vjp.paired and cfg.backward is None:  # which other implementation's backward, for this call
            residuals = (residuals, _PairedWith(self.paired_backward(spec, self._call(arrays, static))))
        return out, residuals

    def bwd(self, residuals: Any, cotangent: Any, *, cfg: ImplChoice, platform: str = "auto",
            **static: Any) -> tuple[Any, ...]:
        if cfg.training is not None:
            if self.uses_custom_vjp(cfg.training):
                return self.bwd(residuals, cotangent, cfg=cfg.training, platform=platform, **static)
            return tuple(residuals(cotangent))  # the pullback of jax.vjp (an implementation without a VJP)
        if cfg.backward is not None:
            spec, backward_cfg = self.spec_for(cfg.backward), cfg.backward.cfg
        elif isinstance(residuals, tuple) and len(residuals) == 2 and isinstance(residuals[1], _PairedWith):
            # a forward-only implementation's: the paired one's backward, with its heuristic config
            residuals, spec, backward_cfg = residuals[0], residuals[1].spec, None
        else:
            spec, backward_cfg = self.spec_for(cfg), cfg.cfg
        assert spec.vjp is not None and spec.vjp.bwd is not None
        _, keywords = self._arguments(spec.vjp.bwd, spec, None, static)
        grads = tuple(spec.vjp.bwd(residuals, cotangent, cfg=backward_cfg, **keywords))
        untaken = self._untaken_arrays(spec)
        if untaken and len(grads) == len(self.array_names) - len(untaken):  # none for the arrays it does not take
            filled = list(grads)
            for index in untaken:
                filled.insert(index, None)
            grads = tuple(filled)
        if len(grads) != len(self.array_names):
            taken = tuple(n for i, n in enumerate(self.array_names) if i not in untaken)
            raise ValueError(f"{self.op_id} {spec.label}: backward returned {len(grads)} "
                             f"cotangents; it must return one per array argument it takes {taken}")
        return grads

    def residual_backward(self, arrays: tuple[Any, ...], static: Mapping[str, Any], cfg: ImplChoice,
                          residuals_tag: str, platform: str = "auto") -> Callable[[Any, Any], tuple[Any, ...]] | None:
        """The backward the call's choice ``cfg`` runs, as ``f(residuals, cotangent)`` that takes residuals in
        the ``residuals_tag`` format made elsewhere (e.g. from a merged result: no forward is re-run); ``None``
        where that backward takes no such residuals (a ``jax.vjp`` pullback, another residual format)."""
        choice = cfg
        while choice.training is not None:  # differentiated calls run the training choice
            if not self.uses_custom_vjp(choice.training):
                return None
            choice = choice.training
        spec = self.spec_for(choice.backward if choice.backward is not None else choice)
        if spec.vjp is None:
            return None
        paired = None
        if choice.backward is None and spec.vjp.paired:  # a forward-only one: the backward it pairs with
            paired = _PairedWith(self.paired_backward(spec, self._call(arrays, static)))
            spec = paired.spec
        if spec.vjp is None or spec.vjp.bwd is None or spec.vjp.residuals != residuals_tag:
            return None

        def backward(residuals: Any, cotangent: Any) -> tuple[Any, ...]:
            given = residuals if paired is None else (residuals, paired)
            return self.bwd(given, cotangent, cfg=choice, platform=platform, **static)

        return backward

    def heuristic_cfg(self, inv: Invocation[ImplChoice]) -> ImplChoice:
        """The best-ranked usable implementation for this call with its heuristic config."""
        ranked = [spec for spec, _ in self.ranking(self.usable_specs(inv), inv)]
        choice = self._choice(ranked[0], self.heuristic_of(ranked[0], inv))
        training = training_choice(self, inv, ranked)
        return choice if training is None else attrs.evolve(choice, training=training)

    def candidate_cfgs(self, inv: Invocation[ImplChoice]) -> Sequence[ImplChoice]:
        """Every usable implementation's configs; the heuristic choice comes first."""
        choices: list[ImplChoice] = [self.heuristic_cfg(inv)]
        for spec in self.usable_specs(inv):
            space = self.config_space_of(spec, inv) or [self.heuristic_of(spec, inv)]
            for cfg in space:
                choice = self._choice(spec, cfg)
                if choice not in choices:
                    choices.append(choice)
        return choices

    def cfg_to_json(self, cfg: ImplChoice) -> Any:
        try:
            owner = self.spec_for(cfg).plugin
        except KernelNotFoundError:
            owner = None
        data = {"platform": cfg.platform, "backend": cfg.backend, "implementation": cfg.implementation,
                "plugin": owner.name if owner is not None else None,
                "cfg": None if cfg.cfg is None else to_jsonable(cfg.cfg),
                "device_facts": self._platform_facts(cfg.platform)}
        if cfg.backward is not None:
            data["backward"] = self.cfg_to_json(cfg.backward)
        if cfg.training is not None:
            data["training"] = self.cfg_to_json(cfg.training)
        return data

    def cfg_from_json(self, data: Any) -> ImplChoice:
        """Rebuild a persisted choice; raises (the entry is then stale) when its implementation is
        gone, its config no longer fits, or its platform's device facts changed."""
        if "implementation" not in data:
            raise ValueError("written before implementations had names")
        choice = ImplChoice(platform=data["platform"], backend=data["backend"], implementation=data["implementation"])
        spec = self.spec_for(choice)
        owner = spec.plugin.name if spec.plugin is not None else None
        if data.get("plugin", owner) != owner:
            raise ValueError(f"{spec.label} was plugin {data['plugin']}'s when tuned, it is now {owner}'s")
        recorded = data.get("device_facts") or {}
        current = self._platform_facts(spec.platform)
        if recorded != current:
            raise ValueError(f"device facts of platform {spec.platform} changed: {recorded} -> {current}")
        cfg = None if data.get("cfg") is None else from_jsonable(data["cfg"], cfg_type=spec.cfg_type)
        backward = None if data.get("backward") is None else self.cfg_from_json(data["backward"])
        training = None if data.get("training") is None else self.cfg_from_json(data["training"])
        return attrs.evolve(choice, cfg=cfg, backward=backward, training=training)

    def _platform_facts(self, platform: str) -> dict[str, str]:
        return dict(self._host().platform_device_facts(jax.devices()[0], platform))

    def cfg_versions(self, cfg: ImplChoice) -> Mapping[str, str]:
        """The versions of every distribution ``cfg`` runs (and its platforms' toolkits): its forward's,
        its named backward's, else, for a forward-only implementation, every one it may pair with."""
        versions: dict[str, str] = dict(self.cfg_versions(cfg.training)) if cfg.training is not None else {}
        specs = [self.spec_for(choice) for choice in (cfg, cfg.backward) if choice is not None]
        if cfg.backward is None and specs[0].vjp is not None and specs[0].vjp.paired:
            specs += pairing_candidates(self.registry, specs[0], self.implementations())
        for spec in specs:
            dist = spec.plugin.distribution if spec.plugin else None
            if dist and (version := installed_version(dist)):
                versions[dist] = version
            status = self._host().platform_statuses().get(spec.platform)
            if status is not None:
                versions.update(dict(status.versions))
        return versions

    def describe_cfg(self, cfg: ImplChoice) -> str:
        return str(cfg)


def _abstract(x: Any) -> Any:
    return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype) if hasattr(x, "shape") and hasattr(x, "dtype") else x


def _shapes_differ(got: Any, expected: Any) -> bool:
    got_leaves, got_tree = jax.tree.flatten(got)
    want_leaves, want_tree = jax.tree.flatten(jax.tree.map(_abstract, expected))
    if str(got_tree) != str(want_tree):
        return True
    return any(not (hasattr(g, "shape") and tuple(g.shape) == tuple(w.shape)
                    and jax.numpy.dtype(g.dtype) == jax.numpy.dtype(w.dtype))
               for g, w in zip(got_leaves, want_leaves, strict=True) if hasattr(w, "shape"))


def _describe_tree(tree: Any) -> str:
    def one(x: Any) -> str:
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            return f"{jax.numpy.dtype(x.dtype).name}[{','.join(map(str, x.shape))}]"
        return repr(x)

    leaves = jax.tree.leaves(tree, is_leaf=lambda x: hasattr(x, "shape"))
    if len(leaves) == 1 and not isinstance(tree, tuple | list):
        return one(leaves[0])
    return f"({', '.join(one(x) for x in leaves)})"


@jax.tree_util.register_static
@attrs.frozen
class _PairedWith:
    """The implementation whose backward runs on a forward-only one's residuals (carried with them,
    as a pytree without leaves, from :meth:`OpKernel.fwd` to :meth:`OpKernel.bwd`)."""

    spec: KernelSpec


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


def decide_op(kernel: OpKernel, arrays: tuple[Any, ...], static: dict[str, Any], platform: Any,
              cfg: Any) -> tuple[ImplChoice, str]:
    """``(choice, platform)``: what the default Executor runs for the call :func:`run_op` would make (its
    config completed as the run completes it), and the resolved platform; nothing runs."""
    plat = resolve_platform(platform)
    override = None if cfg is None else kernel.choice_for(cfg, plat)
    executor = get_default_executor()
    chosen = executor.choose_config(kernel, *arrays, cfg=override, platform=plat, **static)
    inv = executor.invocation(kernel, arrays, {**static, "platform": plat}, override)
    return kernel.complete_cfg(inv, chosen), plat


def run_op(kernel: OpKernel, arrays: tuple[Any, ...], static: dict[str, Any], platform: Any, cfg: Any) -> Any:
    """Run a public operation through the default Executor (an identical eager call: see :mod:`ejk.ops._eager`)."""
    key = eager_key(kernel, arrays, static, platform, cfg)
    done, out = run_eager(key, arrays, get_default_executor)
    if done:
        return out
    plat = resolve_platform(platform)
    choice = None if cfg is None else kernel.choice_for(cfg, plat)

    def call(*given: Any, **override: Any) -> Any:
        return get_default_executor()(kernel, *given, cfg=choice, platform=plat, **{**static, **override})

    from ejk.ops._sharded import run_sharded  # sharded inputs: one call per shard (shapes per shard)

    rule = None if kernel.definition is None else kernel.definition.shard_rule_fn()
    split, out = run_sharded(rule, arrays, call, static)
    if split:
        return out
    out = call(*arrays)
    executor = get_default_executor()
    remember(key, executor, executor.fast_entry(kernel, *arrays, cfg=choice, platform=plat, **static), arrays)
    return out
