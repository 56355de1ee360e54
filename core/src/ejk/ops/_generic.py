"""``ejk.run``: run any registered algorithm, including one that has no public op in ``ejk``.

A third-party plugin may register an algorithm ejk knows nothing about (``register("rms_norm",
...)``). ``ejk.run("rms_norm", x, weight, eps=1e-6)`` runs it like a public op: through the
registry (every implementation's capability gate and platform status, ``platform=``), the default
Executor and the whole selection chain (``cfg=``, ``ejk_choose_config``, overlays, the memory and
persistent caches, autotuning, heuristics), with gradients and ``jax.jit``. When a plugin also
declared the algorithm as an op (:func:`ejk.ops.define_op`), ``ejk.run`` calls that op's public
function, so its validation applies.

Without an op definition there is no validator: positional arguments are the implementation's
arrays (in order; ``None`` allowed) and keyword arguments its static arguments (hashable values).
The implementations' callbacks (``config_space``, ``heuristic``, ``capability``, ``rank``) receive
the arrays by the names of the highest-priority implementation's positional parameters.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

from ejk.errors import KernelNotFoundError
from ejk.ops._base import OpKernel, run_op
from ejk.ops._check_common import as_array
from ejk.registry import KernelRegistry

__all__ = ["AlgorithmKernel", "algorithm_kernel", "run"]

_kernels: dict[tuple[int, str, int], AlgorithmKernel] = {}
_lock = threading.Lock()


class AlgorithmKernel(OpKernel):
    """The kernel of a registered algorithm without an op definition (see :func:`run`).

    Args:
        algorithm: The registered algorithm name.
        arity: How many array arguments a call passes (all positional).
        registry: Where its implementations are (the global registry by default).
    """

    version = "1"

    def __init__(self, algorithm: str, arity: int, registry: KernelRegistry | None = None) -> None:
        super().__init__(registry)
        self.op_id = algorithm
        self.positional = arity
        self.array_names = self._names(arity)

    def _names(self, arity: int) -> tuple[str, ...]:
        specs = self.registry.list_implementations(self.op_id)
        names: list[str] = []
        if specs:
            try:
                params = list(inspect.signature(specs[0].implementation).parameters.values())
            except (TypeError, ValueError):  # a builtin without a signature
                params = []
            names = [p.name for p in params
                     if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "cfg"][:arity]
        taken = set(names)
        extra = (f"x{i}" for i in range(arity * 2 + 1))
        while len(names) < arity:
            name = next(n for n in extra if n not in taken)
            names.append(name)
            taken.add(name)
        return tuple(names)

    def normalize(self, *arrays: Any, **static: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if len(arrays) != self.positional:
            raise ValueError(f"{self.op_id}: got {len(arrays)} array arguments, this kernel takes {self.positional}")
        converted = tuple(None if x is None else as_array(self.op_id, name, x)
                          for name, x in zip(self.array_names, arrays, strict=True))
        for name, x in zip(self.array_names, converted, strict=True):
            if x is not None and not (hasattr(x, "shape") and hasattr(x, "dtype")):
                raise ValueError(f"{self.op_id}: positional argument {name} is {type(x).__name__} {x!r:.60}, "
                                 "but positional arguments are the arrays; pass other values by keyword")
        return converted, static


def algorithm_kernel(algorithm: str, arity: int, registry: KernelRegistry | None = None) -> AlgorithmKernel:
    """The (cached) kernel of ``algorithm`` called with ``arity`` arrays.

    Raises:
        KernelNotFoundError: when no plugin registered ``algorithm`` (naming those registered).
    """
    from ejk import registry as registries

    registry = registry if registry is not None else registries.kernel_registry
    name = algorithm.strip().lower()
    if not registry.list_implementations(name):
        registry.get_spec(name)  # raises the registry's diagnosis: what is registered, what to install
        raise KernelNotFoundError(f"no implementation of {name!r} is registered")
    key = (id(registry), name, arity)
    with _lock:
        kernel = _kernels.get(key)
        if kernel is None or kernel.registry is not registry:
            kernel = _kernels[key] = AlgorithmKernel(name, arity, registry)
        return kernel


def run(algorithm: str, *arrays: Any, platform: str = "auto", cfg: Any = None, **static: Any) -> Any:
    """Run a registered algorithm through the registry and the default Executor.

    Args:
        algorithm: The algorithm's registered name, e.g. ``"rms_norm"``.
        *arrays: Its array arguments, in the implementations' order (``None`` allowed). For an
            algorithm with an op definition, the op's positional arguments.
        platform: ``"auto"`` (the selection chain decides) or a platform name, as for the ops.
        cfg: An :class:`ejk.ImplChoice` or a config of one implementation's config class; it
            always wins.
        **static: The implementations' static keyword arguments (hashable: ints, floats, strings,
            tuples, dtypes) — or, for an op, its keyword arguments.

    Returns:
        What the chosen implementation returns.

    Raises:
        KernelNotFoundError: when nothing registered ``algorithm`` or nothing can run here.
        ValueError: when no implementation can run the call (each one's reason is named).
    """
    from ejk.ops._definition import OPS

    definition = OPS.get(algorithm)
    if definition is None:
        from ejk.plugins import get_plugin_host

        get_plugin_host()  # a plugin may define the op when it loads
        definition = OPS.get(algorithm)
    if definition is not None:
        return definition.function(*arrays, platform=platform, cfg=cfg, **static)
    kernel = algorithm_kernel(algorithm, len(arrays))
    arrays, static = kernel.normalize(*arrays, **static)
    return run_op(kernel, arrays, static, platform, cfg)
