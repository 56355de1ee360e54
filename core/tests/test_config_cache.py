"""ConfigCache (thread-safe) and overlay_cache (nested, context-local)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from ejk import ConfigCache, overlay_cache
from ejk.config.cache import overlay_lookup

KEY = ("cpu|cpu", "op@1", "k1")


def test_get_put_keys_clear_size() -> None:
    cache: ConfigCache[dict[str, int]] = ConfigCache()
    assert cache.get(*KEY) is None
    assert cache.size() == 0 and len(cache) == 0
    cache.put(*KEY, {"block": 64})
    cache.put("cpu|cpu", "op@1", "k2", {"block": 128})
    cache.put("gpu|h100", "op@1", "k1", {"block": 256})
    assert cache.get(*KEY) == {"block": 64}
    assert cache.get("gpu|h100", "op@1", "k1") == {"block": 256}
    assert cache.get("cpu|cpu", "op@2", "k1") is None
    assert sorted(cache.keys()) == sorted([KEY, ("cpu|cpu", "op@1", "k2"), ("gpu|h100", "op@1", "k1")])
    assert cache.size() == 3
    cache.put(*KEY, {"block": 32})  # replaces
    assert cache.get(*KEY) == {"block": 32}
    assert cache.size() == 3
    assert dict(cache.items())[KEY] == {"block": 32}
    keys = cache.keys()
    keys.clear()
    assert cache.size() == 3  # keys() is a snapshot
    cache.clear()
    assert cache.size() == 0
    assert cache.get(*KEY) is None


def test_many_threads_hammering_put_and_get() -> None:
    cache: ConfigCache[tuple[int, int]] = ConfigCache()
    n_threads, per_thread = 8, 400
    barrier = threading.Barrier(n_threads)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            barrier.wait()
            for i in range(per_thread):
                cache.put("dev", f"op{i % 7}", f"{t}-{i}", (t, i))
                assert cache.get("dev", f"op{i % 7}", f"{t}-{i}") == (t, i)
                cache.get("dev", "op0", f"{(t + 1) % n_threads}-{i}")  # read what others write
                if i % 50 == 0:
                    cache.keys()
                    cache.size()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert cache.size() == n_threads * per_thread
    for t in range(n_threads):
        for i in range(per_thread):
            assert cache.get("dev", f"op{i % 7}", f"{t}-{i}") == (t, i)


def test_overlay_shadows_cache_and_exit_restores() -> None:
    cache: ConfigCache[str] = ConfigCache()
    cache.put(*KEY, "stored")
    with overlay_cache({KEY: "overlay"}) as ov:
        assert isinstance(ov, overlay_cache)
        assert cache.get(*KEY) == "overlay"
        assert cache.get_own(*KEY) == "stored"
        assert overlay_lookup(*KEY) == (True, "overlay")
    assert cache.get(*KEY) == "stored"
    assert overlay_lookup(*KEY) == (False, None)


def test_overlays_nest_innermost_wins() -> None:
    other = ("cpu|cpu", "op@1", "k2")
    cache: ConfigCache[str] = ConfigCache()
    with overlay_cache({KEY: "outer", other: "outer-other"}):
        with overlay_cache({KEY: "inner"}):
            assert cache.get(*KEY) == "inner"
            assert cache.get(*other) == "outer-other"  # not shadowed by the inner overlay
            with overlay_cache({KEY: "innermost"}):
                assert cache.get(*KEY) == "innermost"
            assert cache.get(*KEY) == "inner"
        assert cache.get(*KEY) == "outer"
    assert cache.get(*KEY) is None
    assert cache.get(*other) is None


def test_overlay_exit_restores_after_an_exception() -> None:
    cache: ConfigCache[str] = ConfigCache()
    with pytest.raises(RuntimeError), overlay_cache({KEY: "overlay"}):
        assert cache.get(*KEY) == "overlay"
        raise RuntimeError("boom")
    assert cache.get(*KEY) is None


def test_overlays_exited_out_of_order_leave_none_active() -> None:
    from ejk.config.cache import active_overlays

    outer, inner = overlay_cache({KEY: "outer"}), overlay_cache({KEY: "inner"})
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # e.g. two ExitStacks unwound in the wrong order
    assert overlay_lookup(*KEY) == (True, "inner")  # the inner block is still open
    inner.__exit__(None, None, None)
    assert overlay_lookup(*KEY) == (False, None) and active_overlays() == ()


def test_an_overlay_entered_twice_is_left_twice() -> None:
    overlay = overlay_cache({KEY: "again"})
    with overlay:
        with overlay_cache({KEY: "between"}), overlay:
            assert overlay_lookup(*KEY) == (True, "again")
        assert overlay_lookup(*KEY) == (True, "again")
    assert overlay_lookup(*KEY) == (False, None)


def test_overlay_is_not_copied_from_its_source_mapping() -> None:
    mapping = {KEY: "a"}
    with overlay_cache(mapping):
        mapping[KEY] = "b"
        assert overlay_lookup(*KEY) == (True, "a")


def test_overlay_can_store_falsy_configs() -> None:
    with overlay_cache({KEY: 0}):
        assert overlay_lookup(*KEY) == (True, 0)


@pytest.mark.parametrize("bad", [("a", "b"), ("a", "b", 3), "abc", ("a", "b", "c", "d")])
def test_overlay_rejects_malformed_keys(bad: Any) -> None:
    with pytest.raises(ValueError, match="string triples"):
        overlay_cache({bad: 1})


def test_overlay_is_invisible_to_other_threads() -> None:
    cache: ConfigCache[str] = ConfigCache()
    cache.put(*KEY, "shared")
    entered = threading.Barrier(2)
    checked = threading.Barrier(2)
    seen: dict[str, Any] = {}

    def with_overlay() -> None:
        with overlay_cache({KEY: "mine"}):
            entered.wait(timeout=10)
            checked.wait(timeout=10)
            seen["owner"] = cache.get(*KEY)

    def without_overlay() -> None:
        entered.wait(timeout=10)
        seen["other"] = cache.get(*KEY)
        seen["other_lookup"] = overlay_lookup(*KEY)
        checked.wait(timeout=10)

    threads = [threading.Thread(target=with_overlay), threading.Thread(target=without_overlay)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {"owner": "mine", "other": "shared", "other_lookup": (False, None)}


def test_overlay_in_main_thread_is_invisible_to_a_worker_thread() -> None:
    cache: ConfigCache[str] = ConfigCache()
    seen: list[Any] = []
    with overlay_cache({KEY: "main"}):
        worker = threading.Thread(target=lambda: seen.append(cache.get(*KEY)))
        worker.start()
        worker.join()
        assert cache.get(*KEY) == "main"
    assert seen == [None]


def test_overlay_is_isolated_between_asyncio_tasks() -> None:
    cache: ConfigCache[str] = ConfigCache()

    async def main() -> dict[str, Any]:
        entered = asyncio.Event()
        checked = asyncio.Event()
        seen: dict[str, Any] = {}

        async def with_overlay() -> None:
            with overlay_cache({KEY: "task-a"}):
                entered.set()
                await checked.wait()
                seen["a"] = cache.get(*KEY)

        async def without_overlay() -> None:
            await entered.wait()
            seen["b"] = cache.get(*KEY)
            checked.set()

        await asyncio.gather(with_overlay(), without_overlay())
        seen["after"] = cache.get(*KEY)
        return seen

    assert asyncio.run(main()) == {"a": "task-a", "b": None, "after": None}
