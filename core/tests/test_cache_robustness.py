"""Hostile cache directories (issue 14): reading changes nothing, only our files are touched,
broken entries are stale, import is all-or-nothing, op ids map to safe file names."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from ejk import cli
from ejk.config.persistent import (
    FILE_FORMAT,
    PersistentCache,
    StaleCacheWarning,
    cache_file_name,
    op_id_of_file_name,
    read_cache_file,
)

DEV, OP = "cpu|cpu", "op@1"


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _ours(directory: Path, name: str = "matmul") -> Path:
    cache: PersistentCache[Any] = PersistentCache(name, directory / f"{name}.json")
    cache.put(DEV, OP, "k", {"block": 8})
    return directory / f"{name}.json"


def _entries_file(entries: Any) -> str:
    return json.dumps({"format": FILE_FORMAT, "schema": 1, "opname": "x", "entries": entries})


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    """A directory holding one ejk cache, a copy of it, a user's JSON, garbage and broken entries."""
    directory = tmp_path / "d"
    directory.mkdir()
    ours = _ours(directory)
    (directory / "matmul (copy).json").write_bytes(ours.read_bytes())
    (directory / "notes.json").write_text('{"todo": ["buy milk"]}')
    (directory / "list.json").write_text("[1, 2, 3]")
    (directory / "garbage.json").write_text("{not json")
    (directory / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    versions = {"versions": {"": "x"}}
    (directory / "broken.json").write_text(_entries_file({DEV: {OP: {
        "huge-schema": {"cfg": 1, "schema": 1e400},
        "bad-versions": {"cfg": 2, "schema": 1, "provenance": versions},
        "no-cfg": {},
        "not-an-object": 3,
    }}, "bad-device": 5}))
    for lock in directory.glob("*.lock"):
        lock.unlink()
    return directory


@pytest.mark.parametrize("command", [["ls"], ["ls", "--json"], ["show"], ["show", "--json"], ["export", "-"]])
def test_reading_commands_never_move_or_write(hostile: Path, command: list[str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    before = _snapshot(hostile)
    assert cli.main(["cache", *command[:1], "--dir", str(hostile), *command[1:]]) == 0
    assert _snapshot(hostile) == before
    err = capsys.readouterr().err
    assert "notes.json is not an ejk config cache" in err and "garbage.json is corrupt" in err


def test_ls_counts_our_files_and_notes_the_others(hostile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["cache", "ls", "--dir", str(hostile), "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["matmul"]["entries"] == 1 and "note" not in listing["matmul"]
    assert listing["matmul (copy)"]["entries"] == 1
    assert listing["notes"]["entries"] == 0 and "not an ejk config cache" in listing["notes"]["note"]
    assert listing["broken"]["entries"] == 4 and "bad-device" in listing["broken"]["note"]


def test_show_marks_broken_entries_stale(hostile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["cache", "show", "--dir", str(hostile), "--json", "--op", "broken"]) == 0
    rows = {r["call_key"]: r["stale"] for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"huge-schema", "bad-versions", "no-cfg", "not-an-object"}
    assert all(reason for reason in rows.values())


def test_clear_touches_only_our_files(hostile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _snapshot(hostile)
    assert cli.main(["cache", "clear", "--dir", str(hostile), "-y"]) == 0
    after = _snapshot(hostile)
    for name in ("notes.json", "list.json", "garbage.json", "deep.json"):
        assert after[name] == before[name]
    assert not [n for n in after if ".corrupt-" in n]
    for name in ("matmul.json", "matmul (copy).json", "broken.json"):
        assert read_cache_file(str(hostile / name)).entries == {}
    assert "not cleared" in capsys.readouterr().err


def test_clear_that_cannot_remove_exits_non_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _ours(tmp_path)
    lock = Path(str(path) + ".lock")
    lock.unlink(missing_ok=True)
    lock.symlink_to(tmp_path / "missing-dir" / "x.lock")  # a symlinked lock: cannot be taken
    assert cli.main(["cache", "clear", "--dir", str(tmp_path), "-y"]) == 1
    assert "could not clear" in capsys.readouterr().err
    assert len(read_cache_file(str(path)).entries) == 1


def test_broken_entries_are_stale_with_a_warning_and_the_op_keeps_working(hostile: Path) -> None:
    cache: PersistentCache[Any] = PersistentCache("broken", hostile / "broken.json")
    with pytest.warns(RuntimeWarning, match="do not load"), pytest.warns(StaleCacheWarning):
        assert cache.get(DEV, OP, "huge-schema") is None
    for key in ("bad-versions", "no-cfg", "not-an-object"):
        with pytest.warns(StaleCacheWarning, match="stale"):
            assert cache.get(DEV, OP, key) is None
    cache.put(DEV, OP, "huge-schema", {"block": 4})  # re-tuned: it is our file, so it is rewritten
    assert cache.get(DEV, OP, "huge-schema") == {"block": 4}


def test_deeply_nested_json_is_ignored_not_a_crash(hostile: Path) -> None:
    cache: PersistentCache[Any] = PersistentCache("deep", hostile / "deep.json")
    with pytest.warns(RuntimeWarning, match="nested too deeply"):
        assert cache.get(DEV, OP, "k") is None
    assert (hostile / "deep.json").exists()


# -- import ------------------------------------------------------------------------------------------


def _export(tmp_path: Path, ops: dict[str, Any]) -> Path:
    path = tmp_path / "export.json"
    path.write_text(json.dumps({"format": "ejk-cache-export", "schema": 1, "ops": ops}))
    return path


def _item(key: str, **extra: Any) -> dict[str, Any]:
    return {"device": DEV, "op_id": OP, "call_key": key, "cfg": {"b": 1}, "schema": 1,
            "provenance": {"versions": {}}, **extra}


@pytest.mark.parametrize("bad", [
    {"schema": 1e400}, {"schema": "1"}, {"provenance": {"versions": {"": "x"}}}, {"provenance": []},
    {"device": 3}, {"call_key": ""},
])
def test_import_validates_everything_before_writing(tmp_path: Path, bad: dict[str, Any],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "cache"
    exported = _export(tmp_path, {"aaa": [_item("good")], "zzz": [_item("good"), _item("bad", **bad)]})
    assert cli.main(["cache", "import", "--dir", str(target), str(exported)]) == 2
    assert "nothing was written" in capsys.readouterr().out
    assert not target.exists() or list(target.iterdir()) == []


def test_import_never_overwrites_a_file_that_is_not_ours(tmp_path: Path) -> None:
    target = tmp_path / "cache"
    target.mkdir()
    (target / "notes.json").write_text('{"mine": true}')
    exported = _export(tmp_path, {"fine": [_item("a")], "notes": [_item("b")]})
    assert cli.main(["cache", "import", "--dir", str(target), str(exported)]) == 2
    assert sorted(p.name for p in target.iterdir()) == ["notes.json"]


def test_import_maps_op_names_to_safe_files(tmp_path: Path) -> None:
    target = tmp_path / "cache"
    exported = _export(tmp_path, {"../escape": [_item("a")], "team/x": [_item("b")]})
    assert cli.main(["cache", "import", "--dir", str(target), str(exported)]) == 0
    assert sorted(p.name for p in target.iterdir() if p.suffix == ".json") == ["%2E%2E%2Fescape.json",
                                                                                "team%2Fx.json"]
    assert not (tmp_path / "escape.json").exists()


# -- op ids as file names ----------------------------------------------------------------------------


@pytest.mark.parametrize(("op_id", "file_name"), [
    ("flash_attention", "flash_attention.json"), ("team/x", "team%2Fx.json"), ("../x", "%2E%2E%2Fx.json"),
    ("notes.json", "notes%2Ejson.json"), ("a b%", "a%20b%25.json"), ("ü", "%C3%BC.json"),
])
def test_op_ids_map_to_safe_reversible_file_names(op_id: str, file_name: str) -> None:
    assert cache_file_name(op_id) == file_name
    assert op_id_of_file_name(file_name) == op_id


@pytest.mark.parametrize("op_id", ["", "x" * 300, "\ud800"])
def test_op_ids_that_cannot_be_encoded_are_refused(op_id: str) -> None:
    with pytest.raises(ValueError, match="op id"):
        PersistentCache(op_id)


@pytest.mark.parametrize("op_id", ["team/x", "../x", "notes.json"])
def test_cache_files_stay_in_the_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, op_id: str) -> None:
    directory = tmp_path / "work" / "cache"
    directory.mkdir(parents=True)
    monkeypatch.setenv("EJK_CACHE_DIR", str(directory))
    monkeypatch.chdir(directory)
    (directory / "notes.json").write_text('{"mine": true}')
    cache: PersistentCache[Any] = PersistentCache(op_id)
    cache.put(DEV, OP, "k", {"b": 1})
    assert os.path.dirname(cache.path) == str(directory)
    assert (directory / "notes.json").read_text() == '{"mine": true}'
    assert sorted(p.name for p in tmp_path.rglob("*.json")) == sorted(["notes.json", cache_file_name(op_id)])
    assert PersistentCache(op_id).get(DEV, OP, "k") == {"b": 1}
