"""The eager fast path of the public ops (issue 31): an identical eager call skips validation and
dispatch and runs the jitted function of the earlier call, while every decision behind it holds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
import ejk.plugins
from ejk.ops import get_default_executor, set_default_executor
from ejk.ops._matmul._op import MATMUL
from ejk.plugins import PlatformStatus

A = jnp.ones((4, 8), jnp.float32)
B = jnp.ones((8, 4), jnp.float32)


def _matmul_adding(offset: float, traced: list[str], name: str) -> Any:
    def impl(a: jax.Array, b: jax.Array, *, precision: Any, preferred_element_type: Any, cfg: Any = None) -> Any:
        traced.append(name)
        return (jnp.matmul(a, b) + offset).astype(preferred_element_type)

    return impl


def _install(name: str, offset: float, traced: list[str], priority: int = 0) -> None:
    class Plugin:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            register("matmul", "fake", "any", name=name, priority=priority)(_matmul_adding(offset, traced, name))

        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform="fake", available=True)

    ejk.plugins.get_plugin_host().register_plugin(Plugin(), f"plugin-{name}")


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    monkeypatch.setattr(MATMUL, "registry", ejk.plugins.get_plugin_host().registry)
    set_default_executor(None)  # a fresh default Executor for each test
    found: list[str] = []
    _install("first", 0.0, found)
    yield found
    set_default_executor(None)


def test_an_identical_call_skips_validation_and_dispatch(traced: list[str], matmul_validations: list[int]) -> None:
    for _ in range(4):
        np.testing.assert_allclose(ejk.matmul(A, B), 8.0)
    assert traced == ["first"] and len(matmul_validations) == 1
    np.testing.assert_allclose(ejk.matmul(A, B, platform="fake"), 8.0)  # another call signature: validated
    assert len(matmul_validations) == 2
    ejk.matmul(A[:2], B)  # other shapes: validated, traced again
    assert len(matmul_validations) == 3 and traced == ["first"] * 3  # (platform="fake" binds its own function)
    with pytest.raises(ValueError, match="matmul"):  # a bad call is validated every time
        ejk.matmul(A, A)
    with pytest.raises(ValueError, match="matmul"):
        ejk.matmul(A, A)


def test_a_new_decision_ends_the_reuse(traced: list[str]) -> None:
    np.testing.assert_allclose(ejk.matmul(A, B), 8.0)
    _install("second", 100.0, traced, priority=50)
    get_default_executor().chooser.clear_memory()  # the remembered decision goes: decided again
    np.testing.assert_allclose(ejk.matmul(A, B), 108.0)
    np.testing.assert_allclose(ejk.matmul(A, B), 108.0)
    assert traced == ["first", "second"]


def test_another_executor_decides_for_itself(traced: list[str], matmul_validations: list[int]) -> None:
    ejk.matmul(A, B)
    ejk.matmul(A, B)
    events: list[Any] = []
    executor = ejk.Executor(ejk.ConfigSelectorChain(policy=ejk.AutotunePolicy(mode="heuristics"), persist=False,
                                                    on_event=events.append))
    with ejk.use_executor(executor):
        ejk.matmul(A, B)
    assert len(events) == 1 and len(matmul_validations) == 2
    ejk.matmul(A, B)  # back to the default Executor: its decision is looked up again (one entry per call)
    ejk.matmul(A, B)
    assert len(matmul_validations) == 3 and traced == ["first", "first"]


def test_recorded_calls_are_all_recorded(traced: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    ejk.matmul(A, B)
    ejk.matmul(A, B)
    monkeypatch.setenv("EJKERNEL_OPS_RECORD", "1")
    from ejk.invocations import get_invocations

    for _ in range(3):
        ejk.matmul(A, B)
    assert sum(len(calls) for calls in get_invocations().values()) == 1  # recorded (one call signature)


def test_traced_and_host_inputs_take_the_full_path(traced: list[str], matmul_validations: list[int]) -> None:
    jitted = jax.jit(lambda a, b: ejk.matmul(a, b))
    jitted(A, B)
    jitted(A + 1, B)
    np.testing.assert_allclose(ejk.matmul(np.ones((4, 8), np.float32), np.ones((8, 4), np.float32)), 8.0)
    np.testing.assert_allclose(ejk.matmul(np.ones((4, 8), np.float32), np.ones((8, 4), np.float32)), 8.0)
    assert len(matmul_validations) == 3  # one trace, two host calls (converted: never keyed by their values)


def test_jax_settings_that_validation_reads_key_the_call(traced: list[str], matmul_validations: list[int]) -> None:
    ejk.matmul(A, B, precision=None)
    with jax.default_matmul_precision("highest"):  # precision=None reads it: validated again
        ejk.matmul(A, B, precision=None)
    ejk.matmul(A, B, precision=None)
    assert len(matmul_validations) == 2


def test_a_first_call_under_jit_leaves_the_fast_path_working(traced: list[str], matmul_validations: list[int],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from ejk.ops import _eager

    monkeypatch.setattr(_eager, "_ArrayImpl", None)  # as in a fresh process whose first op call is traced
    jax.jit(lambda a, b: ejk.matmul(a, b))(A, B)
    for _ in range(3):
        ejk.matmul(A, B)
    assert len(matmul_validations) == 2
