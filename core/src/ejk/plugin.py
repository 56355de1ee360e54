"""Everything a plugin needs from ejk, in one module.

A plugin distribution (see ``docs/PLUGIN_AUTHORS.md``) imports ``ejk.plugin`` for what it builds
kernels with, ``ejk.ops`` for the op machinery (``define_op``, ``OpKernel``) and ``ejk.testing``
in its tests; it never imports a private ``ejk`` module. The names here live elsewhere in ejk
and are re-exported unchanged:

- hooks and registration: :data:`hookimpl`, :class:`RegisterKernels` (the callback of
  ``ejk_register_kernels``), :class:`VJP`, :class:`Platform`, :class:`Backend`, :class:`Tier`,
  :class:`KernelSpec`, the arguments of ``ejk_choose_config`` (:class:`Invocation`, :class:`Kernel`);
- the platform's status: :class:`PlatformStatus`, :func:`probe_platform` (a status from what is
  installed), :func:`installed_version` (a distribution's version, for ``PlatformStatus.versions``);
- config classes: the attrs validators :func:`int_in`, :func:`multiple_of`, :func:`one_of`,
  :func:`one_of_str`, :data:`positive_int`, :func:`power_of_two`;
- tiles: :func:`cdiv`, :func:`fit_block`, :func:`next_pow2`, :func:`padded_dim`,
  :func:`persistent_ctas`, :func:`snake_owner`;
- the device: :mod:`devices <ejk.devices>` (NVIDIA GPU?, compute capability, SM count, shared
  memory per block) and :class:`InterpreterSwitch` (``EJK_<PLUGIN>_INTERPRET``-style switches);
- custom VJPs: :func:`operand_vjp` (a matmul-like VJP whose residuals are its operands, tagged
  :data:`MATMUL_RESIDUALS` / :data:`GROUPED_MATMUL_RESIDUALS`) and its halves :func:`saving_operands`
  and :func:`operand_cotangents`, the flash-attention residual format :data:`FLASH_RESIDUALS` /
  :data:`FLASH_LSE_RESIDUALS` with :func:`without_residuals`, the gated output of
  ``grouped_matmul(..., activation=...)`` (:func:`gated_output`, :func:`gated_cotangent`, and
  :func:`gated_gradients`, which turns a plain product's gradients into a gated call's), :func:`with_natural_lse`,
  :func:`natural_lse`, :data:`LSE2_INDEX`, the attention-sink helpers :func:`fold_sinks`,
  :func:`sinks_backward` and :func:`sinks_cotangent`, the linear cross-entropy and RMSNorm residual
  formats :data:`LINEAR_CROSS_ENTROPY_RESIDUALS` and :data:`RMS_NORM_RESIDUALS`, and the ``shard_map``
  helpers :func:`cotangent_like` and :func:`varying_like`;
- packed sequences: :func:`varlen_row_ranges` (the key interval each packed query row of
  ``flash_attention_varlen`` sees) and :func:`sanitize_offsets` (how offsets are read).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from ejk import devices
from ejk._operand_vjp import (
    GROUPED_MATMUL_RESIDUALS,
    MATMUL_RESIDUALS,
    operand_cotangents,
    operand_vjp,
    saving_operands,
)
from ejk._versions import installed_version
from ejk.config.validators import int_in, multiple_of, one_of, one_of_str, positive_int, power_of_two
from ejk.execution.kernel import Invocation, Kernel
from ejk.hookspecs import hookimpl
from ejk.interpreter import InterpreterSwitch
from ejk.ops import (
    FLASH_LSE_RESIDUALS,
    FLASH_RESIDUALS,
    GLA_RESIDUALS,
    GROUPED_MATMUL_ACTIVATIONS,
    LINEAR_CROSS_ENTROPY_RESIDUALS,
    LSE2_INDEX,
    RMS_NORM_RESIDUALS,
    SSD_RESIDUALS,
    fold_sinks,
    gated_cotangent,
    gated_gradients,
    gated_output,
    natural_lse,
    sanitize_offsets,
    sinks_backward,
    sinks_cotangent,
    varlen_row_ranges,
    with_natural_lse,
    without_residuals,
)
from ejk.parallel import cotangent_like, varying_like
from ejk.plugins import PlatformStatus, probe_platform
from ejk.registry import VJP, Backend, BackendLike, KernelSpec, Platform, PlatformLike, Tier
from ejk.tiling import cdiv, fit_block, next_pow2, padded_dim, persistent_ctas, snake_owner

__all__ = [
    "FLASH_LSE_RESIDUALS",
    "FLASH_RESIDUALS",
    "GLA_RESIDUALS",
    "GROUPED_MATMUL_ACTIVATIONS",
    "GROUPED_MATMUL_RESIDUALS",
    "LINEAR_CROSS_ENTROPY_RESIDUALS",
    "LSE2_INDEX",
    "MATMUL_RESIDUALS",
    "RMS_NORM_RESIDUALS",
    "SSD_RESIDUALS",
    "VJP",
    "Backend",
    "InterpreterSwitch",
    "Invocation",
    "Kernel",
    "KernelSpec",
    "Platform",
    "PlatformStatus",
    "RegisterKernels",
    "Tier",
    "cdiv",
    "cotangent_like",
    "devices",
    "fit_block",
    "fold_sinks",
    "gated_cotangent",
    "gated_gradients",
    "gated_output",
    "hookimpl",
    "installed_version",
    "int_in",
    "multiple_of",
    "natural_lse",
    "next_pow2",
    "one_of",
    "one_of_str",
    "operand_cotangents",
    "operand_vjp",
    "padded_dim",
    "persistent_ctas",
    "positive_int",
    "power_of_two",
    "probe_platform",
    "sanitize_offsets",
    "saving_operands",
    "sinks_backward",
    "sinks_cotangent",
    "snake_owner",
    "varlen_row_ranges",
    "varying_like",
    "with_natural_lse",
    "without_residuals",
]

F = TypeVar("F", bound=Callable[..., Any])


class RegisterKernels(Protocol):
    """The ``register`` callback of the ``ejk_register_kernels`` hook: :meth:`ejk.KernelRegistry.register`
    bound to the plugin being loaded. It returns a decorator that registers the implementation it
    decorates (returned unchanged) as that plugin's; the arguments are :class:`KernelSpec`'s fields."""

    def __call__(
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
    ) -> Callable[[F], F]: ...
