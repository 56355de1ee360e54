"""``ejk doctor``'s and :func:`ejk.testing.check_plugin`'s probe of the implementations and hooks.

``ejk_config_packs`` is asked once; then, on each sample call of each defined op
(:meth:`ejk.ops.OpDefinition.sample_calls`), ``ejk_choose_config`` and every implementation's
``ejk_config_space`` hooks, and every implementation's own gate, heuristic, config space and abstract
output (its run under ``jax.eval_shape`` with its heuristic config, checked against the op's declared
output). What is wrong lands in the plugin's :attr:`ejk.plugins.PluginInfo.hook_errors`, naming the
implementation, instead of passing as "all good".
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["implementation_problems", "probe_hooks"]


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def _wrong_configs(spec: Any, configs: list[Any]) -> list[str]:
    if spec.cfg_type is None:
        return []
    return sorted({type(c).__name__ for c in configs if c is not None and not isinstance(c, spec.cfg_type)})


def implementation_problems(kernel: Any, spec: Any, inv: Any, arrays: tuple[Any, ...],
                            static: Mapping[str, Any]) -> Iterator[str]:
    """What is wrong with one implementation on one call: a gate that raises or answers neither
    ``None`` nor a reason, a heuristic or config space that raises or gives configs of another class,
    or (where it can run here) an abstract output other than the op's declared one."""
    import jax

    from ejk._contract import extension_refusal
    from ejk.ops import ImplChoice
    from ejk.registry import Backend, default_backend

    call = kernel.call_view(inv)
    where = f"{spec.algorithm} {spec.label} on the sample call {_shapes(call)}"
    if extension_refusal(spec, call, extensions=kernel.extensions) is not None:
        return  # an extension argument it does not take: the core refuses the call, nothing more to ask
    if spec.capability is not None:
        try:
            reason = spec.capability(**kernel._fit(spec.capability, call))
        except Exception as exc:
            yield f"{where}: its capability gate raised {_describe(exc)}"
            return
        if reason is not None and not isinstance(reason, str):
            yield f"{where}: its capability gate returned {type(reason).__name__}, not None or a reason (str)"
            return
        if reason is not None:
            return  # it refuses the call: nothing more to ask
    cfg = None
    for what, callback in (("heuristic", spec.heuristic), ("config_space", spec.config_space)):
        if callback is None:
            continue
        try:
            answer = callback(**kernel._fit(callback, call))
            configs = [answer] if what == "heuristic" else list(answer)
        except Exception as exc:
            yield f"{where}: its {what} raised {_describe(exc)}"
            continue
        if wrong := _wrong_configs(spec, configs):
            yield (f"{where}: its {what} returned {', '.join(wrong)} where {spec.cfg_type.__name__} is expected")
        elif what == "heuristic":
            cfg = answer
    if spec.backend not in (Backend.ANY, default_backend()) or not kernel.registry.spec_available(spec)[0]:
        return  # it cannot run here: its output cannot be traced
    choice = ImplChoice(platform=spec.platform, backend=spec.backend, implementation=spec.name, cfg=cfg)
    try:
        jax.eval_shape(lambda *given: kernel.run(*given, cfg=choice, **static), *arrays)
    except Exception as exc:
        yield f"{where}: tracing it failed: {_describe(exc)}"


def _shapes(call: Mapping[str, Any]) -> str:
    parts = [f"{name}={'x'.join(map(str, value.shape))}:{value.dtype}" for name, value in call.items()
             if hasattr(value, "shape") and hasattr(value, "dtype")]
    return f"({', '.join(parts)})"


def probe_hooks(host: Any, plugin: str | None = None) -> None:
    """Call ``ejk_config_packs`` and, on each sample call of each defined op with implementations in
    ``host``'s registry, ``ejk_choose_config``, every implementation's ``ejk_config_space`` hooks and
    :func:`implementation_problems` (for the implementations of ``plugin`` only, when named); wrong
    answers land in the plugins' ``hook_errors`` (their warnings are silenced)."""
    from ejk.ops import OPS
    from ejk.ops._base import get_default_executor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        host.call("ejk_config_packs")
        executor = get_default_executor()
        for definition in list(OPS.values()):
            kernel = copy.copy(definition.kernel)
            kernel.registry = host.registry
            specs = kernel.implementations()
            if not specs:
                continue
            for args, kwargs in definition.sample_calls():
                arrays, static = kernel.normalize(*args, **kwargs)
                inv = executor.invocation(kernel, arrays, {**static, "platform": "auto"})
                host.choose_config(inv, kernel)
                for spec in specs:
                    host.config_space(spec.algorithm, str(spec.platform), inv, implementation=spec.name,
                                      cfg_type=spec.cfg_type)
                    if plugin is not None and (spec.plugin is None or spec.plugin.name != plugin):
                        continue
                    for problem in implementation_problems(kernel, spec, inv, arrays, static):
                        host.report_implementation(spec, problem)
