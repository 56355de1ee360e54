"""``ejk doctor``'s hook probe: ask every hook that answers per call (``ejk_choose_config``,
``ejk_config_space``) about one small sample call of each built-in op, and ``ejk_config_packs``
once, so a hook returning the wrong type (or raising) is reported against its plugin
(:attr:`ejk.plugins.PluginInfo.hook_errors`) instead of passing as "all good"."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["probe_hooks"]


def _samples() -> dict[str, Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]]:
    """A small sample call (arrays as ``jax.ShapeDtypeStruct``) of each built-in op."""
    import jax
    import jax.numpy as jnp

    def arrays(*shapes: tuple[int, ...], dtype: Any = jnp.bfloat16) -> tuple[Any, ...]:
        return tuple(jax.ShapeDtypeStruct(shape, dtype) for shape in shapes)

    def paged() -> tuple[tuple[Any, ...], dict[str, Any]]:
        from ejk.testing._cases import paged_batch

        return tuple(paged_batch(dtype=jnp.bfloat16)), {}

    def attention() -> tuple[tuple[Any, ...], dict[str, Any]]:
        return arrays((1, 128, 4, 64), (1, 128, 4, 64), (1, 128, 4, 64)), {}

    return {
        "flash_attention": attention,
        "flash_attention_lse": attention,
        "matmul": lambda: (arrays((128, 128), (128, 128)), {}),
        "grouped_matmul": lambda: (arrays((128, 64), (2, 64, 64)) + arrays((2,), dtype=jnp.int32), {}),
        "ragged_paged_attention": paged,
    }


def probe_hooks(host: Any) -> None:
    """Call ``ejk_config_packs`` and, for each built-in op with implementations in ``host``'s
    registry, ``ejk_choose_config`` and every implementation's ``ejk_config_space`` on a sample
    call; wrong answers land in the plugins' ``hook_errors`` (their warnings are silenced)."""
    from ejk.ops import OPS
    from ejk.ops._base import get_default_executor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        host.call("ejk_config_packs")
        executor = get_default_executor()
        for name, sample in _samples().items():
            specs = host.registry.list_implementations(name)
            if name not in OPS or not specs:
                continue
            kernel = copy.copy(OPS[name].kernel)
            kernel.registry = host.registry
            args, kwargs = sample()
            arrays, static = kernel.normalize(*args, **kwargs)
            inv = executor.invocation(kernel, arrays, {**static, "platform": "auto"})
            host.choose_config(inv, kernel)
            for spec in specs:
                host.config_space(name, str(spec.platform), inv, implementation=spec.name, cfg_type=spec.cfg_type)
