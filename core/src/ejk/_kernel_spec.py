"""What a registered implementation is: its platform, backend, VJP and :class:`KernelSpec`.

The vocabulary of :mod:`ejk.registry` (which re-exports every public name here), kept apart so that
the code pairing forward-only implementations with a backward (:mod:`ejk._pairing`) sits below the
registry that uses it.
"""

from __future__ import annotations

import enum
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs

__all__ = [
    "PORTABLE_DISTRIBUTION",
    "VJP",
    "Backend",
    "BackendLike",
    "KernelSpec",
    "Platform",
    "PlatformLike",
    "PluginRef",
    "Tier",
    "capability_reason",
    "default_backend",
    "default_order",
    "normalize_backend",
    "normalize_platform",
    "normalize_tier",
    "platform_name",
]


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


class Tier(enum.IntEnum):
    """What an implementation is, as a coarse default order of the heuristics tier (higher first).

    Where a ranking pack covers the device and the call (see :mod:`ejk.config.rankings`), its
    measured order decides first; the tier decides among what it leaves tied, and ``priority`` (or
    a ``rank`` callback) among implementations of one tier.
    """

    #: Not validated on the hardware it targets: the heuristics tier takes it last (``platform=``, ``cfg=`` and
    #: autotuning reach it).
    UNTESTED = 0
    #: Runs on every backend without a hand-written kernel (e.g. ejk-xla's chunked attention): the fallback.
    PORTABLE = 1
    #: A kernel written for speed on its hardware (Triton, Pallas, CuTe); the default of a registration.
    FAST = 2
    #: The vendor library or compiler-native kernel (XLA's dot, i.e. cuBLAS on NVIDIA GPUs; cuDNN attention):
    #: the baseline a FAST kernel must be measured to beat before a ranking puts it first.
    VENDOR = 3

    def __str__(self) -> str:
        return self.name.lower()


def normalize_tier(tier: Tier | str) -> Tier:
    """A :class:`Tier` from a member or its (case-insensitive) name."""
    if isinstance(tier, Tier):
        return tier
    if isinstance(tier, str) and tier.strip().upper() in Tier.__members__:
        return Tier[tier.strip().upper()]
    valid = ", ".join(str(t) for t in Tier)
    raise ValueError(f"tier {tier!r} is not known; use ejk.Tier.<NAME> or one of: {valid}")


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
        tier: What the implementation is (:class:`Tier`): the coarse default order.
        priority: The tie-break inside a tier: higher first among implementations of one tier.
        plugin: The plugin that registered it (``None`` when registered outside any plugin).
        cfg_type: The implementation's config class: cached and explicit configs must be instances.
        config_space: ``config_space(**call) -> [cfg, ...]``: autotuning candidates for one call.
        heuristic: ``heuristic(**call) -> cfg``: a config chosen without measuring.
        capability: ``capability(**call) -> str | None``: why the implementation cannot run a call
            (``"soft cap not supported"``), or ``None`` when it can.
        rank: ``rank(**call) -> int``: the tie-break inside its tier for one call in the heuristics
            tier (default: ``priority``). Measured orders by device and shape class belong in a
            ranking pack (:mod:`ejk.config.rankings`), which decides before tiers.
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
    tier: Tier = Tier.FAST
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


def default_order(spec: KernelSpec) -> tuple[int, int]:
    """Sort key of the order without ranking data: higher tier first, then higher priority."""
    return -spec.tier, -spec.priority


def capability_reason(spec: KernelSpec, call: Mapping[str, Any]) -> str | None:
    """``spec``'s capability gate on ``call``: its reason, ``None`` when it accepts (or has no gate).
    A gate that raises refuses, with the exception as its reason: it never takes the op down, and
    the first time it raises a ``RuntimeWarning`` names the implementation, its plugin and the error."""
    if spec.capability is None:
        return None
    try:
        reason = spec.capability(**call)
    except Exception as exc:
        _warn_broken_gate(spec, exc)
        return f"capability check raised {type(exc).__name__}: {exc}"
    return None if reason is None else str(reason)


#: ``id(spec) -> weakref(spec)`` of the implementations whose raising gate was already reported.
_warned_gates: dict[int, weakref.ref[KernelSpec]] = {}


def _warn_broken_gate(spec: KernelSpec, exc: Exception) -> None:
    """Warn once per registered implementation (while it lives) that its capability gate raised."""
    key = id(spec)
    known = _warned_gates.get(key)
    if known is not None and known() is spec:
        return
    _warned_gates[key] = weakref.ref(spec, lambda _: _warned_gates.pop(key, None))
    owner = f"plugin {spec.plugin.name}" if spec.plugin else "no plugin"
    warnings.warn(
        f"the capability gate of {spec.algorithm} {spec.label} ({owner}) raised {type(exc).__name__}: {exc}; "
        "the implementation is treated as refusing such calls (ejk.explain shows each reason). Fix the gate to "
        "return a reason string instead of raising; this is reported once per implementation.",
        RuntimeWarning, stacklevel=3)


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
