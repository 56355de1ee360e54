"""ejk-pallas's tests run its GPU kernels in Pallas's interpret mode on a CPU-only machine.

The nox session sets ``EJK_PALLAS_INTERPRET=1``; so does this file when it is unset and JAX's
backend is the CPU. On a machine with an NVIDIA GPU the kernels run compiled.

Pallas's Mosaic GPU interpret mode runs each simulated thread (every warpgroup of every CTA) as a
host thread that compiles the kernel's per-thread program with XLA and runs it, and it compiles that
same program again in every thread and at every call (jax 0.10: ``thread_map._run_jaxpr``; the
persistent compilation cache refuses programs with host callbacks). Compiling dominated these tests'
time (six compiles per call of a two-CTA attention forward). :func:`_compile_once_per_thread_program`
makes the interpreter compile each program once per test process and run that executable in every
thread and call: what runs is unchanged, so is what the tests check.
"""

from __future__ import annotations

import inspect
import os
import threading
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if "EJK_PALLAS_INTERPRET" not in os.environ:
        import jax

        if jax.default_backend() == "cpu":
            os.environ["EJK_PALLAS_INTERPRET"] = "1"
    if os.environ.get("EJK_PALLAS_INTERPRET") == "1":
        _compile_once_per_thread_program()


def _compile_once_per_thread_program() -> None:
    """Memoize the interpreter's per-thread compile, keyed by the program and its argument types.

    Left alone (the interpreter then runs as shipped) where jax's private function is absent or has
    another signature.
    """
    try:
        from jax._src.pallas.mosaic.interpret import thread_map
    except ImportError:  # pragma: no cover - depends on the jax version
        return
    shipped = getattr(thread_map, "_run_jaxpr", None)
    if shipped is None or getattr(shipped, "ejk_compiles_once", False):
        return
    if list(inspect.signature(shipped).parameters) != ["jaxpr", "consts", "args"]:  # pragma: no cover
        return

    import jax
    import jax.core as jax_core
    import numpy as np

    compiled: dict[Any, list[Any]] = {}
    lock = threading.Lock()

    def evaluate(jaxpr: Any, consts: Any, *args: Any) -> None:
        jax_core.eval_jaxpr(jaxpr, consts, *args)

    def run_jaxpr(jaxpr: Any, consts: Any, *args: Any) -> None:
        # The program object itself is the key (identity; the cache keeps it alive, so its id is never reused).
        key = (jaxpr, tuple((np.shape(x), np.dtype(x.dtype) if hasattr(x, "dtype") else np.result_type(x))
                            for x in jax.tree.leaves((consts, args))))  # never np.result_type(array): deprecated
        with lock:
            entry = compiled.setdefault(key, [threading.Lock(), None])
        with entry[0]:  # the other threads of the call wait for the first one's compile
            if entry[1] is None:
                entry[1] = jax.jit(evaluate, static_argnums=0).trace(jaxpr, consts, *args).lower().compile()
        entry[1](consts, *args)

    run_jaxpr.ejk_compiles_once = True  # type: ignore[attr-defined]
    thread_map._run_jaxpr = run_jaxpr
