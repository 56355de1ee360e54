"""The Executor's fast path: identical eager calls skip selection, and every change that could
alter a decision (cache puts and clears, overlays, persistent entries, plugin hooks, the
environment) ends the reuse — in every thread."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejk import ConfigSelectorChain, Executor, Invocation, Kernel, SelectionEvent
from ejk.config.cache import overlay_cache
from ejk.config.persistent import PersistentCache
from ejk.errors import FrozenConfigMissError
from ejk.hookspecs import hookimpl
from ejk.invocations import clear_invocations, get_invocations
from ejk.plugins import PluginHost
from ejk.registry import KernelRegistry


@attrs.frozen
class Cfg:
    scale: float = 2.0


class Scale(Kernel[Cfg, jax.Array]):
    """out = x * cfg.scale: the output says which config ran."""

    op_id = "fast_scale"
    cfg_type = Cfg

    def run(self, x: jax.Array, *, cfg: Cfg, bias: float = 0.0) -> jax.Array:  # type: ignore[override]
        return x * cfg.scale + bias

    def heuristic_cfg(self, inv: Invocation[Cfg]) -> Cfg:
        return Cfg()


class CountingChain(ConfigSelectorChain[Cfg]):
    """Counts how often the chain really selects (the fast path does not)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.selections = 0
        self._count_lock = threading.Lock()

    def _select(self, inv: Invocation[Cfg], kernel: Kernel[Cfg, Any]) -> Any:
        with self._count_lock:
            self.selections += 1
        return super()._select(inv, kernel)


X = jnp.arange(4.0, dtype=jnp.float32)


def scale_of(out: jax.Array) -> float:
    return float(out[1])


def make(tmp_path: Path | None = None, **kwargs: Any) -> tuple[CountingChain, Executor[Cfg, jax.Array], Scale]:
    if tmp_path is None:
        chain = CountingChain(persist=False, plugin_host=False, **kwargs)
    else:
        chain = CountingChain(persistent_dir=tmp_path, plugin_host=False, **kwargs)
    return chain, Executor(chain), Scale()


def key_of(ex: Executor[Cfg, jax.Array], kernel: Scale, x: jax.Array = X, **kwargs: Any) -> tuple[str, str, str]:
    return ex.invocation(kernel, (x,), kwargs).cache_key


def test_identical_calls_select_once_and_report_every_call() -> None:
    events: list[SelectionEvent] = []
    chain, ex, kernel = make(on_event=events.append)
    for _ in range(5):
        assert scale_of(ex(kernel, X)) == 2.0
    assert chain.selections == 1
    assert [e.tier for e in events] == ["heuristic"] * 5  # reuses are reported as the decision
    ex(kernel, X, bias=1.0)  # another static argument, another shape: selected once each
    ex(kernel, X, bias=1.0)
    ex(kernel, jnp.ones((3,)))
    ex(kernel, jnp.ones((3,)))
    assert chain.selections == 3
    ex(kernel, X, bias=1)  # 1 and 1.0 key differently (as the call key does)
    ex(kernel, X, bias=True)
    assert chain.selections == 5


def test_a_chooser_without_choose_reusable_is_asked_every_call() -> None:
    class Plain:
        calls = 0

        def choose(self, inv: Invocation[Cfg], kernel: Kernel[Cfg, Any]) -> Cfg:
            Plain.calls += 1
            return Cfg(3.0)

    ex: Executor[Cfg, jax.Array] = Executor(Plain())
    for _ in range(3):
        assert scale_of(ex(Scale(), X)) == 3.0
    assert Plain.calls == 3


def test_memory_put_and_clear_end_the_reuse() -> None:
    chain, ex, kernel = make()
    assert scale_of(ex(kernel, X)) == 2.0
    chain.cache.put(*key_of(ex, kernel), Cfg(5.0))
    assert scale_of(ex(kernel, X)) == 5.0
    assert scale_of(ex(kernel, X)) == 5.0
    assert chain.selections == 2
    chain.clear_memory()
    assert scale_of(ex(kernel, X)) == 2.0
    chain.cache.clear()
    assert scale_of(ex(kernel, X)) == 2.0
    assert chain.selections == 4
    chain.cache = type(chain.cache)()  # a replaced cache object is seen too
    chain.cache.put(*key_of(ex, kernel), Cfg(6.0))
    assert scale_of(ex(kernel, X)) == 6.0


def test_entering_and_leaving_overlays() -> None:
    _chain, ex, kernel = make()
    key = key_of(ex, kernel)
    assert scale_of(ex(kernel, X)) == 2.0
    with overlay_cache({key: Cfg(7.0)}):
        assert scale_of(ex(kernel, X)) == 7.0
        assert scale_of(ex(kernel, X)) == 7.0
        with overlay_cache({key: Cfg(8.0)}):
            assert scale_of(ex(kernel, X)) == 8.0
        assert scale_of(ex(kernel, X)) == 7.0
        with overlay_cache({("other", "op@1", "k"): Cfg(9.0)}):  # an unrelated overlay: same answer
            assert scale_of(ex(kernel, X)) == 7.0
    assert scale_of(ex(kernel, X)) == 2.0
    assert scale_of(ex(kernel, X)) == 2.0


def test_a_new_persistent_entry_is_seen(tmp_path: Path) -> None:
    chain, ex, kernel = make(tmp_path)
    assert scale_of(ex(kernel, X)) == 2.0
    assert scale_of(ex(kernel, X)) == 2.0
    assert chain.selections == 1
    # Written by another PersistentCache object on the same file (as another process would).
    other = PersistentCache(kernel.op_id, tmp_path / "fast_scale.json", cfg_type=Cfg)
    other.put(*key_of(ex, kernel), Cfg(9.0), source="import")
    assert scale_of(ex(kernel, X)) == 9.0
    assert scale_of(ex(kernel, X)) == 9.0


def test_a_persistent_entry_put_through_the_chain_is_seen(tmp_path: Path) -> None:
    chain, ex, kernel = make(tmp_path)
    assert scale_of(ex(kernel, X)) == 2.0
    persistent = chain.persistent_cache(kernel)
    assert persistent is not None
    persistent.put(*key_of(ex, kernel), Cfg(4.0))
    assert scale_of(ex(kernel, X)) == 4.0


def test_the_autotune_policy_variable_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    _chain, ex, kernel = make()
    assert scale_of(ex(kernel, X)) == 2.0
    monkeypatch.setenv("EJK_AUTOTUNE", "frozen")
    with pytest.raises(FrozenConfigMissError):
        ex(kernel, X)
    monkeypatch.delenv("EJK_AUTOTUNE")
    assert scale_of(ex(kernel, X)) == 2.0


def test_explicit_cfg_is_reused_reported_and_validated() -> None:
    class Picky(Scale):
        def unusable_reason(self, inv: Invocation[Cfg], cfg: Cfg) -> str | None:
            return "negative scale" if cfg.scale < 0 else None

    events: list[SelectionEvent] = []
    chain, ex, _ = make(on_event=events.append)
    kernel = Picky()
    for _ in range(3):
        assert scale_of(ex(kernel, X, cfg=Cfg(3.0))) == 3.0
    assert chain.selections == 1
    assert [e.tier for e in events] == ["override"] * 3
    assert scale_of(ex(kernel, X)) == 2.0  # without cfg=: the chain's own decision
    for _ in range(2):
        with pytest.raises(ValueError, match="negative scale"):
            ex(kernel, X, cfg=Cfg(-1.0))
    assert scale_of(ex(kernel, X, cfg=Cfg(-0.0))) == 0.0
    assert scale_of(ex(kernel, X, cfg=Cfg(0.0))) == 0.0


def test_a_plugin_hook_registered_later_is_asked() -> None:
    class Policy:
        @hookimpl
        def ejk_choose_config(self, invocation: Invocation[Any], kernel: Kernel[Any, Any]) -> Any:
            return Cfg(11.0)

    host = PluginHost(KernelRegistry(), load_entry_points=False)
    chain = CountingChain(persist=False, plugin_host=host)
    ex: Executor[Cfg, jax.Array] = Executor(chain)
    kernel = Scale()
    assert scale_of(ex(kernel, X)) == 2.0
    assert scale_of(ex(kernel, X)) == 2.0
    plugin = Policy()
    host.register_plugin(plugin, "policy")
    assert scale_of(ex(kernel, X)) == 11.0
    assert scale_of(ex(kernel, X)) == 11.0
    assert chain.selections == 3  # a hook's answer may change at any call: never reused
    host.pm.unregister(plugin)
    assert scale_of(ex(kernel, X)) == 2.0
    assert scale_of(ex(kernel, X)) == 2.0
    assert chain.selections == 3  # the state is again the first decision's: it holds again


def test_stamp_mode_changes_rebind(monkeypatch: pytest.MonkeyPatch) -> None:
    _chain, ex, kernel = make()
    stamps: list[str | None] = []
    build = ex._build

    def spy(kernel: Any, cfg: Any, kwargs: Any, stamp: str | None) -> Any:
        stamps.append(stamp)
        return build(kernel, cfg, kwargs, stamp)

    monkeypatch.setattr(ex, "_build", spy)
    ex(kernel, X)
    ex(kernel, X)
    monkeypatch.setenv("EJKERNEL_OPS_STAMP", "none")
    ex(kernel, X)
    ex(kernel, X)
    monkeypatch.setenv("EJKERNEL_OPS_STAMP", "json")
    ex(kernel, X)
    monkeypatch.setenv("EJKERNEL_OPS_STAMP", "bogus")
    with pytest.raises(ValueError, match="EJKERNEL_OPS_STAMP"):
        ex(kernel, X)
    assert len(stamps) == 3
    assert stamps[0] is not None and stamps[0].startswith("ejk_ops#fast_scale#")
    assert stamps[1] is None
    assert stamps[2] is not None and stamps[2].startswith('ejk_ops#{"call_key"')


def test_recording_on_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    chain, ex, kernel = make()
    ex(kernel, X)
    ex(kernel, X)
    assert get_invocations(ex.device_fingerprint()) == {}
    monkeypatch.setenv("EJKERNEL_OPS_RECORD", "1")
    ex(kernel, X)
    recorded = get_invocations(ex.device_fingerprint())
    assert list(recorded["fast_scale@1"]) == [key_of(ex, kernel)[2]]
    clear_invocations()
    ex(kernel, X)
    assert list(get_invocations(ex.device_fingerprint())["fast_scale@1"]) == [key_of(ex, kernel)[2]]
    assert chain.selections == 1  # recording needs no new selection


def test_replacing_the_chooser_or_kernel_ends_the_reuse() -> None:
    _chain, ex, kernel = make()
    assert scale_of(ex(kernel, X)) == 2.0
    ex.chooser = CountingChain(persist=False, plugin_host=False)
    ex.chooser.cache.put(*key_of(ex, kernel), Cfg(3.0))
    assert scale_of(ex(kernel, X)) == 3.0
    other = Scale()  # same class and op: selected for itself
    assert scale_of(ex(other, X)) == 3.0


def test_pytree_and_scalar_arguments_take_the_full_path() -> None:
    class Sum(Scale):
        op_id = "fast_sum"

        def run(self, xs: Any, *, cfg: Cfg, bias: float = 0.0) -> jax.Array:  # type: ignore[override]
            out: jax.Array = (xs[0] + xs[1]) * cfg.scale
            return out

    chain, ex, _ = make()
    kernel = Sum()
    for _ in range(2):
        np.testing.assert_allclose(ex(kernel, (X, X)), 4 * X)
    assert chain.selections == 2


def test_under_jit_the_overlay_of_the_trace_is_used() -> None:
    _chain, ex, kernel = make()
    key = key_of(ex, kernel)
    assert scale_of(ex(kernel, X)) == 2.0
    with overlay_cache({key: Cfg(5.0)}):
        assert scale_of(jax.jit(lambda x: ex(kernel, x))(X)) == 5.0
    assert scale_of(jax.jit(lambda x: ex(kernel, x) * 1)(X)) == 2.0


def test_threads_with_their_own_overlays() -> None:
    chain, ex, kernel = make()
    key = key_of(ex, kernel)
    ex(kernel, X)
    errors: list[str] = []
    barrier = threading.Barrier(8)

    def work(i: int) -> None:
        expected = 2.0 if i % 2 == 0 else 10.0 + i
        barrier.wait()
        for _ in range(30):
            if i % 2 == 0:
                got = scale_of(ex(kernel, X))
            else:
                with overlay_cache({key: Cfg(10.0 + i)}):
                    got = scale_of(ex(kernel, X))
            if got != expected:
                errors.append(f"thread {i}: {got} != {expected}")
        if i == 0:
            chain.cache.put(*key, Cfg(2.0))  # a put while others run: still their own answers

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_a_put_in_another_thread_is_seen() -> None:
    chain, ex, kernel = make()
    key = key_of(ex, kernel)
    assert scale_of(ex(kernel, X)) == 2.0
    thread = threading.Thread(target=chain.cache.put, args=(*key, Cfg(12.0)))
    thread.start()
    thread.join(30)
    assert scale_of(ex(kernel, X)) == 12.0


def test_a_shared_jit_function_retraces_per_overlay() -> None:
    """Issue 14: an overlay active while a shared jitted function is traced does not leak into
    calls without it (nor into another thread's): overlays are part of jax.jit's cache key."""
    _chain, ex, kernel = make()
    key = key_of(ex, kernel)
    traces = 0

    def body(x: jax.Array) -> jax.Array:
        nonlocal traces
        traces += 1
        return ex(kernel, x)

    f = jax.jit(body)
    with overlay_cache({key: Cfg(5.0)}):
        assert scale_of(f(X)) == 5.0
    assert scale_of(f(X)) == 2.0
    with overlay_cache({key: Cfg(5.0)}):  # equal contents: the first trace is reused
        assert scale_of(f(X)) == 5.0
    assert traces == 2
    results: list[float] = []
    ready, traced = threading.Event(), threading.Event()

    def with_overlay() -> None:
        with overlay_cache({key: Cfg(7.0)}):
            results.append(scale_of(f(X)))
            traced.set()
            ready.wait(30)

    thread = threading.Thread(target=with_overlay)
    thread.start()
    assert traced.wait(60)
    assert scale_of(f(X)) == 2.0  # while the other thread's overlay is still active
    ready.set()
    thread.join(60)
    assert results == [7.0]
    assert scale_of(f(X)) == 2.0


def test_overlays_with_unhashable_configs_still_key_the_trace() -> None:
    _chain, ex, kernel = make()
    key = key_of(ex, kernel)

    @attrs.define(eq=True)
    class Mutable:  # eq without hash: unhashable
        scale: float = 3.0

    f = jax.jit(lambda x: ex(kernel, x))
    with overlay_cache({key: Mutable()}):
        assert scale_of(f(X)) == 3.0
    assert scale_of(f(X)) == 2.0


def test_a_change_of_the_kernels_selection_state_is_seen() -> None:
    class Gated(Scale):
        refuse = False
        state = 0

        def selection_state(self) -> Any:
            return self.state

        def unusable_reason(self, inv: Invocation[Cfg], cfg: Cfg) -> str | None:
            return "refused" if self.refuse and cfg.scale == 5.0 else None

    chain, ex, _ = make()
    kernel = Gated()
    chain.cache.put(*key_of(ex, kernel), Cfg(5.0))
    assert scale_of(ex(kernel, X)) == 5.0
    assert scale_of(ex(kernel, X, cfg=Cfg(5.0))) == 5.0
    kernel.refuse, kernel.state = True, 1  # e.g. an implementation unregistered
    assert scale_of(ex(kernel, X)) == 2.0  # the memory entry is no longer usable
    with pytest.raises(ValueError, match="refused"):
        ex(kernel, X, cfg=Cfg(5.0))


def test_public_op_decisions_follow_the_registry() -> None:
    from ejk.ops import get_op

    MATMUL = get_op("matmul").kernel
    before = MATMUL.selection_state()
    MATMUL.registry.touch()
    assert MATMUL.selection_state() != before


def test_a_chain_subclass_overriding_choose_is_asked_every_call() -> None:
    class Custom(ConfigSelectorChain[Cfg]):
        calls = 0

        def choose(self, inv: Invocation[Cfg], kernel: Kernel[Cfg, Any]) -> Cfg:
            Custom.calls += 1
            return Cfg(4.0)

    ex: Executor[Cfg, jax.Array] = Executor(Custom(persist=False, plugin_host=False))
    for _ in range(3):
        assert scale_of(ex(Scale(), X)) == 4.0
    assert Custom.calls == 3
