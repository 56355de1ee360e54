"""PersistentCache: serialisation round trips, location, concurrency, corruption, staleness."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

from ejk import PersistentCache, StaleCacheWarning
from ejk._versions import installed_version
from ejk.config.persistent import SCHEMA_VERSION

DEV, OP = "cpu|cpu", "op@1"


@attrs.frozen(kw_only=True)
class AttrsCfg:
    block_m: int = 64
    block_n: int = 32
    mode: str = "fast"


@dataclasses.dataclass(frozen=True)
class DataCfg:
    block: int
    num_warps: int = 4


@attrs.frozen(kw_only=True)
class TupleCfg:
    blocks: tuple[int, int] = (64, 32)
    stages: tuple[tuple[int, int], ...] = ((1, 2), (3, 4))


@dataclasses.dataclass(frozen=True)
class TupleData:
    window: tuple[int, int] | None = (128, 0)


try:  # a test-only dependency that a bare GPU host may lack: only its own case skips then
    import pydantic
except ImportError:
    PYDANTIC_CASE = pytest.param(None, {}, id="pydantic", marks=pytest.mark.skip(reason="pydantic is not installed"))
else:

    class PydCfg(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(frozen=True)
        block: int
        split_k: bool = False

    PYDANTIC_CASE = pytest.param(PydCfg(block=16, split_k=True), {"cfg_type": PydCfg}, id="pydantic")


class Custom:
    """Not serialisable on its own: needs loader= and dumper=."""

    def __init__(self, a: int, b: str) -> None:
        self.a, self.b = a, b

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Custom) and (self.a, self.b) == (other.a, other.b)

    __hash__ = None  # type: ignore[assignment]


# -- serialisation round trips --------------------------------------------------------------------


@pytest.mark.parametrize(("cfg", "options"), [
    (AttrsCfg(block_m=128, mode="safe"), {"cfg_type": AttrsCfg}),
    (DataCfg(block=256, num_warps=8), {"cfg_type": DataCfg}),
    PYDANTIC_CASE,
    ({"block": 64, "stages": [1, 2], "name": "x"}, {}),
    (7, {}),
    ("a-string", {}),
    (Custom(3, "z"), {"loader": lambda d: Custom(d[0], d[1]), "dumper": lambda c: [c.a, c.b]}),
    (AttrsCfg(block_n=8), {"loader": lambda d: AttrsCfg(**d)}),
], ids=["attrs", "dataclass", None, "dict", "int", "str", "loader-dumper", "attrs-loader"])
def test_round_trip_through_the_file(tmp_path: Path, cfg: Any, options: dict[str, Any]) -> None:
    path = tmp_path / "op.json"
    writer: PersistentCache[Any] = PersistentCache("op", path, **options)
    writer.put(DEV, OP, "k", cfg)
    assert writer.get(DEV, OP, "k") == cfg
    reader: PersistentCache[Any] = PersistentCache("op", path, **options)
    loaded = reader.get(DEV, OP, "k")
    assert loaded == cfg
    assert type(loaded) is type(cfg)
    raw = json.loads(path.read_text())
    assert raw["format"] == "ejk-config-cache"
    assert raw["entries"][DEV][OP]["k"]["schema"] == SCHEMA_VERSION


@pytest.mark.parametrize("cfg", [TupleCfg(), TupleCfg(blocks=(1, 2), stages=()), TupleData(), TupleData(None)])
def test_tuple_fields_come_back_as_tuples(tmp_path: Path, cfg: Any) -> None:
    PersistentCache("op", tmp_path / "op.json").put(DEV, OP, "k", cfg)
    loaded = PersistentCache("op", tmp_path / "op.json", cfg_type=type(cfg)).get(DEV, OP, "k")
    assert loaded == cfg
    assert hash(loaded) == hash(cfg)  # still usable as a cache / jit key


def test_without_cfg_type_the_raw_json_comes_back(tmp_path: Path) -> None:
    PersistentCache("op", tmp_path / "op.json").put(DEV, OP, "k", AttrsCfg())
    assert PersistentCache("op", tmp_path / "op.json").get(DEV, OP, "k") == {"block_m": 64, "block_n": 32,
                                                                            "mode": "fast"}


def test_non_json_serialisable_config_names_the_fix(tmp_path: Path) -> None:
    cache: PersistentCache[Any] = PersistentCache("op", tmp_path / "op.json")
    for bad in (Custom(1, "a"), {"s": {1, 2}}, float("nan")):
        with pytest.raises(TypeError, match=r"not JSON-serialisable.*dumper=") as excinfo:
            cache.put(DEV, OP, "k", bad)
        assert type(bad).__name__ in str(excinfo.value)
    assert not (tmp_path / "op.json").exists()


def test_entries_carry_provenance(tmp_path: Path) -> None:
    cache: PersistentCache[Any] = PersistentCache("op", tmp_path / "op.json")
    cache.put(DEV, OP, "k", {"b": 1}, source="import", versions={"ejk-core": installed_version("ejk-core") or "?"},
              details={"note": "hello"})
    entry = cache.get_entry(DEV, OP, "k")
    assert entry is not None
    assert entry.source == "import"
    assert entry.schema == SCHEMA_VERSION
    versions = entry.provenance["versions"]
    assert versions["jax"] == installed_version("jax")
    assert versions["jaxlib"] == installed_version("jaxlib")
    assert entry.provenance["note"] == "hello"
    assert "created" in entry.provenance
    assert [(e.device, e.op_id, e.call_key) for e in cache.entries()] == [(DEV, OP, "k")]


def test_two_instances_see_each_others_writes(tmp_path: Path) -> None:
    a: PersistentCache[Any] = PersistentCache("op", tmp_path / "op.json")
    b: PersistentCache[Any] = PersistentCache("op", tmp_path / "op.json")
    a.put(DEV, OP, "k1", 1)
    assert b.get(DEV, OP, "k1") == 1
    b.put(DEV, OP, "k2", 2)  # merges with a's entry, does not overwrite the file
    assert a.get(DEV, OP, "k2") == 2
    assert a.get(DEV, OP, "k1") == 1
    assert PersistentCache("op", tmp_path / "op.json").get(DEV, OP, "k1") == 1


def test_remove_and_clear(tmp_path: Path) -> None:
    cache: PersistentCache[Any] = PersistentCache("op", tmp_path / "op.json")
    cache.put(DEV, OP, "k1", 1)
    cache.put(DEV, OP, "k2", 2)
    assert cache.remove(DEV, OP, "k1") is True
    assert cache.remove(DEV, OP, "k1") is False
    assert cache.get(DEV, OP, "k1") is None
    assert cache.get(DEV, OP, "k2") == 2
    cache.clear()
    assert list(cache.entries()) == []
    assert PersistentCache("op", tmp_path / "op.json").get(DEV, OP, "k2") is None


# -- location -------------------------------------------------------------------------------------


def test_cache_dir_is_honoured_and_not_created_at_construction(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "deep" / "cache"
    monkeypatch.setenv("EJK_CACHE_DIR", str(target))
    cache: PersistentCache[Any] = PersistentCache("flash_attention")
    assert cache.path == str(target / "flash_attention.json")
    assert cache.get(DEV, OP, "k") is None
    assert list(cache.entries()) == []
    assert not target.exists() and not (tmp_path / "deep").exists()
    cache.put(DEV, OP, "k", {"b": 1})
    assert (target / "flash_attention.json").is_file()


def test_cache_dir_is_read_when_needed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache: PersistentCache[Any] = PersistentCache("op")
    monkeypatch.setenv("EJK_CACHE_DIR", str(tmp_path / "later"))
    assert cache.path == str(tmp_path / "later" / "op.json")


def test_cache_dir_default_is_the_user_cache_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    import platformdirs

    monkeypatch.delenv("EJK_CACHE_DIR")
    assert PersistentCache("op").path == os.path.join(platformdirs.user_cache_dir("ejk", appauthor=False), "op.json")


def test_json_path_as_opname_and_bad_names(tmp_path: Path) -> None:
    cache: PersistentCache[Any] = PersistentCache(str(tmp_path / "legacy.json"))
    assert cache.opname == "legacy"
    assert cache.path == str(tmp_path / "legacy.json")
    for bad in ("", "a b", "../x", "a/b c"):
        with pytest.raises(ValueError, match="opname"):
            PersistentCache(bad, tmp_path / "x.json")


# -- concurrency ----------------------------------------------------------------------------------

_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from ejk.config.persistent import PersistentCache

    path, worker, count, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    cache = PersistentCache("shared", path)
    open(f"{go}.ready-{worker}", "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:  # start writing together
        time.sleep(0.002)
    for i in range(count):
        cache.put("dev", "op@1", f"w{worker}-k{i}", {"worker": worker, "i": i})
    print("done", worker)
    """
)


def test_concurrent_processes_lose_no_entry(tmp_path: Path) -> None:
    path = tmp_path / "shared.json"
    go = tmp_path / "go"
    workers, count = 4, 25
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    procs = [subprocess.Popen([sys.executable, "-W", "error", "-c", _WRITER, str(path), str(w), str(count), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for w in range(workers)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("go.ready-*"))) < workers and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.startswith("done")
    cache: PersistentCache[Any] = PersistentCache("shared", path)
    keys = {e.call_key for e in cache.entries()}
    assert keys == {f"w{w}-k{i}" for w in range(workers) for i in range(count)}
    for w in range(workers):
        for i in range(count):
            assert cache.get("dev", "op@1", f"w{w}-k{i}") == {"worker": w, "i": i}
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


# -- corruption -----------------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["{not json", ""])
def test_corrupt_file_is_ignored_on_read_and_moved_aside_by_a_write(tmp_path: Path, content: str) -> None:
    # Issue 14: reading never moves or writes anything (this used to move the file on read).
    path = tmp_path / "op.json"
    path.write_text(content)
    cache: PersistentCache[Any] = PersistentCache("op", path)
    with pytest.warns(RuntimeWarning, match="is corrupt.*ignored"):
        assert cache.get(DEV, OP, "k") is None
    assert path.read_text() == content and not list(tmp_path.glob("op.json.corrupt-*"))
    with pytest.warns(RuntimeWarning, match="is corrupt.*moved to"):
        cache.put(DEV, OP, "k", {"b": 1})  # and the cache still works
    aside = list(tmp_path.glob("op.json.corrupt-*"))
    assert len(aside) == 1
    assert aside[0].read_text() == content  # the corrupt copy is kept for inspection
    assert cache.get(DEV, OP, "k") == {"b": 1}
    assert PersistentCache("op", path).get(DEV, OP, "k") == {"b": 1}


@pytest.mark.parametrize("content", ["[1, 2, 3]", '{"format": "something-else"}', '{"notes": "mine"}'])
def test_json_that_is_not_ours_is_never_touched(tmp_path: Path, content: str) -> None:
    path = tmp_path / "op.json"
    path.write_text(content)
    cache: PersistentCache[Any] = PersistentCache("op", path)
    with pytest.warns(RuntimeWarning, match="is not an ejk config cache.*skipped"):
        assert cache.get(DEV, OP, "k") is None
    with pytest.warns(RuntimeWarning, match="left alone.*in memory"):
        cache.put(DEV, OP, "k", {"b": 1})
    assert cache.get(DEV, OP, "k") == {"b": 1}  # kept in memory
    assert not cache.clear()
    assert path.read_text() == content
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["op.json"]


def test_corrupt_file_is_moved_aside_on_write(tmp_path: Path) -> None:
    path = tmp_path / "op.json"
    path.write_text("\x00\x01garbage")
    cache: PersistentCache[Any] = PersistentCache("op", path)
    with pytest.warns(RuntimeWarning, match="corrupt"):
        cache.put(DEV, OP, "k", 5)
    assert len(list(tmp_path.glob("op.json.corrupt-*"))) == 1
    assert PersistentCache("op", path).get(DEV, OP, "k") == 5


# -- unwritable location --------------------------------------------------------------------------


def _unwritable_path(tmp_path: Path, how: str) -> Path:
    if how == "read-only-dir":
        directory = tmp_path / "ro"
        directory.mkdir()
        directory.chmod(0o500)
        if os.access(directory, os.W_OK):
            directory.chmod(0o700)
            pytest.skip("chmod does not stop this user from writing (root); covered by 'under-a-file'")
        return directory / "op.json"
    blocker = tmp_path / "a-regular-file"
    blocker.write_text("not a directory")
    return blocker / "sub" / "op.json"  # makedirs fails whoever we are


@pytest.mark.parametrize("how", ["read-only-dir", "under-a-file"])
def test_unwritable_location_degrades_to_memory(tmp_path: Path, how: str) -> None:
    path = _unwritable_path(tmp_path, how)
    try:
        cache: PersistentCache[Any] = PersistentCache("op", path, cfg_type=AttrsCfg)
        assert cache.get(DEV, OP, "k") is None
        assert not cache.memory_only
        with pytest.warns(RuntimeWarning, match="cannot write config cache.*EJK_CACHE_DIR"):
            cache.put(DEV, OP, "k", AttrsCfg(block_m=1))
        assert cache.memory_only
        assert cache.get(DEV, OP, "k") == AttrsCfg(block_m=1)
        cache.put(DEV, OP, "k2", AttrsCfg(block_m=2))  # warned once only (warnings are errors here)
        assert cache.get(DEV, OP, "k2") == AttrsCfg(block_m=2)
        assert {e.call_key for e in cache.entries()} == {"k", "k2"}
        assert not os.path.exists(path)
    finally:
        if how == "read-only-dir":
            path.parent.chmod(0o700)


def test_unwritable_default_dir_via_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("EJK_CACHE_DIR", str(blocker / "cache"))
    cache: PersistentCache[Any] = PersistentCache("op")
    with pytest.warns(RuntimeWarning, match="in memory"):
        cache.put(DEV, OP, "k", 1)
    assert cache.get(DEV, OP, "k") == 1


# -- staleness ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("versions", "needle"), [
    ({"jax": "0.0.1"}, "jax 0.0.1 -> "),
    ({"ejk-core": "0.0.0.dev0"}, "ejk-core 0.0.0.dev0 -> "),
    ({"ejk-some-plugin-not-installed": "1.0"}, "ejk-some-plugin-not-installed 1.0 -> not installed"),
])
def test_entries_recorded_under_other_versions_are_stale(tmp_path: Path, versions: dict[str, str],
                                                         needle: str) -> None:
    path = tmp_path / "op.json"
    PersistentCache("op", path).put(DEV, OP, "k", {"b": 1}, versions=versions)
    cache: PersistentCache[Any] = PersistentCache("op", path)
    with pytest.warns(StaleCacheWarning, match="stale"):
        assert cache.get(DEV, OP, "k") is None
    assert cache.get(DEV, OP, "k") is None  # reported once (another warning would be an error here)
    assert cache.get_entry(DEV, OP, "k") is None
    assert len(cache.stale) == 1
    entry, reason = cache.stale[0]
    assert (entry.device, entry.op_id, entry.call_key) == (DEV, OP, "k")
    assert needle in reason
    assert [e.call_key for e in cache.entries()] == ["k"]  # still listed
    cache.put(DEV, OP, "k", {"b": 2})  # re-tuned: overwritten and current
    assert cache.get(DEV, OP, "k") == {"b": 2}


def test_entries_with_another_schema_are_stale(tmp_path: Path) -> None:
    path = tmp_path / "op.json"
    PersistentCache("op", path).put(DEV, OP, "k", {"b": 1})
    PersistentCache("op", path).put(DEV, OP, "fresh", {"b": 3})
    raw = json.loads(path.read_text())
    raw["entries"][DEV][OP]["k"]["schema"] = SCHEMA_VERSION + 1
    path.write_text(json.dumps(raw))
    cache: PersistentCache[Any] = PersistentCache("op", path)
    with pytest.warns(StaleCacheWarning, match=f"schema {SCHEMA_VERSION + 1}"):
        assert cache.get(DEV, OP, "k") is None
    assert cache.get(DEV, OP, "fresh") == {"b": 3}
    assert [e.call_key for e, _ in cache.stale] == ["k"]


def test_a_config_that_no_longer_loads_is_stale(tmp_path: Path) -> None:
    path = tmp_path / "op.json"
    PersistentCache("op", path).put(DEV, OP, "k", {"old_field": 1})
    cache: PersistentCache[Any] = PersistentCache("op", path, cfg_type=AttrsCfg)
    with pytest.warns(StaleCacheWarning, match="cannot be rebuilt"):
        assert cache.get(DEV, OP, "k") is None
    assert len(cache.stale) == 1
