"""The eager fast path of the public ops confirms a remembered decision once, then reuses it while ejk's
epoch and the context (Executor, overlays, ``EJK_AUTOTUNE``) are unchanged: every kind of change that
may alter the decision is seen at the next call."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
import ejk.plugins
from ejk.config.persistent import RECHECK_S, PersistentCache
from ejk.errors import FrozenConfigMissError
from ejk.ops import ImplChoice, get_default_executor, set_default_executor
from ejk.ops._matmul._op import MATMUL
from ejk.plugins import PlatformStatus, PluginHost
from ejk.registry import KernelRegistry

A = jnp.ones((4, 8), jnp.float32)
B = jnp.ones((8, 4), jnp.float32)
FIRST, SECOND = 8.0, 108.0  # what each fake implementation returns for A @ B
SECOND_CHOICE = ImplChoice(platform="fake", backend="any", implementation="second")


def _plugin(name: str, offset: float, calls: list[str], priority: int = 0) -> object:
    def impl(a: jax.Array, b: jax.Array, *, precision: Any, preferred_element_type: Any, cfg: Any = None) -> Any:
        calls.append(name)
        return (jnp.matmul(a, b) + offset).astype(preferred_element_type)

    class Plugin:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            register("matmul", "fake", "any", name=name, priority=priority)(impl)

        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform="fake", available=True)

    return Plugin()


def _install(host: PluginHost, name: str, offset: float, traced: list[str], priority: int = 0) -> None:
    host.register_plugin(_plugin(name, offset, traced, priority), f"plugin-{name}")


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The global host with "first" (the heuristic's pick) and "second" (a lower priority) registered."""
    host = ejk.plugins.get_plugin_host()
    monkeypatch.setattr(MATMUL, "registry", host.registry)
    set_default_executor(None)
    found: list[str] = []
    _install(host, "first", 0.0, found)
    _install(host, "second", 100.0, found, priority=-50)
    yield found
    set_default_executor(None)


def _settle() -> float:
    """Call until the decision is confirmed and stamped; the result's value."""
    for _ in range(3):
        out = ejk.matmul(A, B)
    return float(np.asarray(out)[0, 0])


def _cache_key() -> tuple[str, str, str]:
    """The config cache key of ``ejk.matmul(A, B)``."""
    events: list[ejk.SelectionEvent] = []
    chooser = get_default_executor().chooser
    chooser.on_event = events.append  # type: ignore[attr-defined]
    ejk.matmul(A, B)
    chooser.on_event = None  # type: ignore[attr-defined]
    return events[-1].device, events[-1].op_id, events[-1].call_key


def _value() -> float:
    return float(np.asarray(ejk.matmul(A, B))[0, 0])


def test_a_settled_call_is_neither_validated_nor_decided_again(traced: list[str],
                                                              matmul_validations: list[int]) -> None:
    assert _settle() == FIRST
    for _ in range(5):
        assert _value() == FIRST
    assert len(matmul_validations) == 1 and traced == ["first"]


def test_a_registry_change_is_seen(traced: list[str], matmul_validations: list[int]) -> None:
    _settle()
    ejk.plugins.get_plugin_host().register_plugin(_plugin("third", 0.0, []), "plugin-third")  # a new kernel
    _value()
    assert len(matmul_validations) == 2  # decided again (the registry's version changed), then settled again
    _settle()
    MATMUL.registry.touch()
    _settle()
    assert len(matmul_validations) == 3


def test_a_kernel_given_another_registry_decides_again(traced: list[str], matmul_validations: list[int],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    host = PluginHost(KernelRegistry(), load_entry_points=False)
    _install(host, "first", 0.0, traced)
    _settle()
    monkeypatch.setattr(MATMUL, "registry", MATMUL.registry)  # the same one: confirmed again, still holds
    assert _value() == FIRST and len(matmul_validations) == 1
    monkeypatch.setattr(MATMUL, "registry", host.registry)
    assert _value() == FIRST and len(matmul_validations) == 2


def test_an_overlay_is_seen_and_left(traced: list[str], matmul_validations: list[int]) -> None:
    key = _cache_key()
    assert _settle() == FIRST
    with ejk.overlay_cache({key: SECOND_CHOICE}):
        assert _value() == SECOND
        assert _value() == SECOND
    assert _value() == FIRST
    assert _settle() == FIRST


def test_a_memory_cache_put_is_seen(traced: list[str]) -> None:
    key = _cache_key()
    assert _settle() == FIRST
    cache = get_default_executor().chooser.cache  # type: ignore[attr-defined]
    cache.put(*key, SECOND_CHOICE)
    assert _value() == SECOND
    assert _settle() == SECOND
    cache.clear()
    assert _value() == FIRST


def test_another_default_executor_or_chooser_decides_for_itself(traced: list[str],
                                                                matmul_validations: list[int]) -> None:
    key = _cache_key()
    other: ejk.ConfigSelectorChain[Any] = ejk.ConfigSelectorChain(persist=False)
    other.cache.put(*key, SECOND_CHOICE)
    scoped = ejk.Executor(other)
    _settle()
    with ejk.use_executor(scoped):  # this context's Executor
        assert _value() == SECOND
    assert _value() == FIRST  # decided again: one entry per call
    set_default_executor(ejk.Executor(ejk.ConfigSelectorChain(persist=False)))
    assert _settle() == FIRST and len(matmul_validations) == 4
    get_default_executor().chooser = other
    assert _value() == SECOND


def test_a_choose_hook_registered_later_is_asked_every_call(traced: list[str]) -> None:
    asked: list[int] = []

    class Policy:
        @ejk.hookimpl
        def ejk_choose_config(self, invocation: Any, kernel: Any) -> Any:
            asked.append(1)
            return SECOND_CHOICE

    assert _settle() == FIRST
    host = ejk.plugins.get_plugin_host()
    policy = Policy()
    host.register_plugin(policy, "policy")
    assert [_value() for _ in range(3)] == [SECOND] * 3
    assert len(asked) == 3
    host.pm.unregister(policy)  # through pluggy directly: seen too
    assert _settle() == FIRST


def test_the_autotune_variable_is_read_every_call(traced: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert _settle() == FIRST  # decided on a miss (heuristics)
    monkeypatch.setenv("EJK_AUTOTUNE", "frozen")
    with pytest.raises(FrozenConfigMissError):
        ejk.matmul(A, B)
    monkeypatch.delenv("EJK_AUTOTUNE")
    assert _settle() == FIRST


def test_a_persistent_entry_of_another_process_is_seen_within_the_recheck_time(traced: list[str],
                                                                              tmp_path: Path) -> None:
    key = _cache_key()
    written = PersistentCache(MATMUL.op_id, tmp_path / "other.json", loader=MATMUL.cfg_from_json,
                              dumper=MATMUL.cfg_to_json)
    written.put(*key, SECOND_CHOICE)
    assert _settle() == FIRST
    persistent = get_default_executor().chooser.persistent_cache(MATMUL)  # type: ignore[attr-defined]
    os.makedirs(os.path.dirname(persistent.path), exist_ok=True)
    os.replace(written.path, persistent.path)  # as another process writes it: nothing of ejk's runs here
    time.sleep(2 * RECHECK_S)
    assert _value() == SECOND


def test_a_persistent_entry_of_this_process_is_seen_at_once(traced: list[str]) -> None:
    key = _cache_key()
    assert _settle() == FIRST
    persistent = get_default_executor().chooser.persistent_cache(MATMUL)  # type: ignore[attr-defined]
    persistent.put(*key, SECOND_CHOICE)
    assert _value() == SECOND


def test_reuses_are_reported_to_a_listener_set_later(traced: list[str], caplog: pytest.LogCaptureFixture) -> None:
    _settle()
    events: list[ejk.SelectionEvent] = []
    get_default_executor().chooser.on_event = events.append  # type: ignore[attr-defined]
    for _ in range(3):
        ejk.matmul(A, B)
    assert len(events) == 3
    get_default_executor().chooser.on_event = None  # type: ignore[attr-defined]
    _settle()
    with caplog.at_level(logging.DEBUG, logger="ejk.selection"):
        for _ in range(3):
            ejk.matmul(A, B)
    assert sum("(reused)" in r.getMessage() for r in caplog.records) == 3


def test_threads_with_and_without_an_overlay(traced: list[str]) -> None:
    key = _cache_key()
    _settle()
    errors: list[str] = []
    barrier = threading.Barrier(4)

    def work(i: int) -> None:
        barrier.wait()
        for _ in range(20):
            if i % 2:
                with ejk.overlay_cache({key: SECOND_CHOICE}):
                    got, expected = _value(), SECOND
            else:
                got, expected = _value(), FIRST
            if got != expected:
                errors.append(f"thread {i}: {got} != {expected}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and errors == []


def test_dtype_enum_and_type_arguments_take_the_fast_path(traced: list[str], matmul_validations: list[int]) -> None:
    for _ in range(3):
        ejk.matmul(A, B, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)
    for _ in range(3):
        ejk.matmul(A, B, preferred_element_type=np.dtype("float32"))
    assert len(matmul_validations) == 2
    out = ejk.matmul(A, B, preferred_element_type=jnp.bfloat16)  # another value: another call
    assert out.dtype == jnp.bfloat16 and len(matmul_validations) == 3
