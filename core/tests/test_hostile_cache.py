"""Hostile op ids, import files and shared directories (issue 28): the persistent cache never
writes outside ``EJK_CACHE_DIR``, one bad entry never costs the good ones, and files written
for others stay readable by them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs
import jax
import pytest

from ejk import ConfigSelectorChain, Invocation, Kernel, KernelRegistry, cli
from ejk.config.persistent import PersistentCache

DEV, OP = "cpu|cpu", "op@1"


@attrs.frozen
class Cfg:
    tile: int = 1


def _kernel_named(op_id: str) -> Kernel[Cfg, Any]:
    class Named(Kernel[Cfg, jax.Array]):
        cfg_type = Cfg

        def run(self, x: jax.Array, *, cfg: Cfg) -> jax.Array:  # type: ignore[override]
            return x

        def heuristic_cfg(self, inv: Invocation[Cfg]) -> Cfg:
            return Cfg()

    Named.op_id = op_id
    return Named()


@pytest.mark.parametrize("op_id", ["{outside}/evil.json", "../evil.json", "a\\..\\evil.json"])
def test_an_op_id_that_looks_like_a_path_stays_in_the_cache_dir(tmp_path: Path, op_id: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    op_id = op_id.format(outside=outside)
    cache = ConfigSelectorChain[Cfg]().persistent_cache(_kernel_named(op_id))
    assert cache is not None
    cache.put(DEV, OP, "k", {"tile": 2})
    assert os.path.dirname(cache.path) == os.environ["EJK_CACHE_DIR"]
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("algorithm", ["/tmp/evil.json", "team/x", "a\\b", "..", "nul\0byte", "tab\there"])
def test_registration_refuses_algorithm_names_that_are_paths(algorithm: str) -> None:
    with pytest.raises(ValueError, match="algorithm"):
        KernelRegistry().register(algorithm, "xla", "any")(lambda x: x)


# -- over-deep entries ------------------------------------------------------------------------------------

def _item(key: str, cfg: Any) -> dict[str, Any]:
    return {"device": DEV, "op_id": OP, "call_key": key, "cfg": cfg, "schema": 1, "provenance": {"versions": {}}}


@pytest.mark.parametrize("field", ["cfg", "provenance"])
def test_import_refuses_an_over_deep_entry(tmp_path: Path, field: str, capsys: pytest.CaptureFixture[str]) -> None:
    deep = _item("deep", {"b": 1})
    deep[field] = {"versions": {}, "nested": "DEEP"} if field == "provenance" else "DEEP"
    exported = tmp_path / "export.json"
    exported.write_text(json.dumps({"format": "ejk-cache-export", "schema": 1,
                                    "ops": {"op": [_item("good", {"b": 1}), deep]}}
                                   ).replace('"DEEP"', "[" * 200 + "1" + "]" * 200))
    target = tmp_path / "cache"
    assert cli.main(["cache", "import", "--dir", str(target), str(exported)]) == 2
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert f"ops['op'][1].{field} is nested more than" in out and "nothing was written" in out
    assert not target.exists() or list(target.iterdir()) == []


def test_a_file_too_deep_to_read_is_never_moved_aside_with_its_good_entries(tmp_path: Path) -> None:
    path = tmp_path / "op.json"
    PersistentCache("op", path).put(DEV, OP, "good", {"b": 1})
    payload = json.loads(path.read_text())
    payload["entries"][DEV][OP]["deep"] = {"cfg": "DEEP", "schema": 1}
    text = json.dumps(payload).replace('"DEEP"', "[" * 100_000 + "]" * 100_000)  # a hand-edited entry
    path.write_text(text)
    cache: PersistentCache[Any] = PersistentCache("op", path)
    with pytest.warns(RuntimeWarning, match="nested too deeply"):
        assert cache.get(DEV, OP, "good") is None
    with pytest.warns(RuntimeWarning, match="left alone"):
        cache.put(DEV, OP, "new", {"b": 2})
    assert cache.get(DEV, OP, "new") == {"b": 2}  # kept in memory
    assert path.read_text() == text and not list(tmp_path.glob("*.corrupt-*"))


# -- shared cache directories --------------------------------------------------------------------------------

@pytest.fixture
def umask_022() -> Any:
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_a_new_cache_file_follows_the_umask(tmp_path: Path, umask_022: None) -> None:
    path = tmp_path / "op.json"
    PersistentCache("op", path).put(DEV, OP, "k", {"b": 1})
    assert path.stat().st_mode & 0o777 == 0o644  # a second user of a shared directory can read it


def test_a_rewrite_keeps_the_files_mode(tmp_path: Path, umask_022: None) -> None:
    path = tmp_path / "op.json"
    PersistentCache("op", path).put(DEV, OP, "k", {"b": 1})
    path.chmod(0o664)  # shared with a group on purpose
    PersistentCache("op", path).put(DEV, OP, "k2", {"b": 2})
    assert path.stat().st_mode & 0o777 == 0o664


def test_a_file_without_read_permission_is_never_moved_aside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "op.json"
    PersistentCache("op", path).put(DEV, OP, "k", {"b": 1})
    before = path.read_bytes()
    real_open = open

    def no_permission(file: Any, *args: Any, **kwargs: Any) -> Any:
        if os.fspath(file) == str(path):
            raise PermissionError(13, "Permission denied", str(path))  # another user's 0600 file
        return real_open(file, *args, **kwargs)

    import ejk.config.cache_file

    monkeypatch.setattr(ejk.config.cache_file, "open", no_permission, raising=False)
    cache: PersistentCache[Any] = PersistentCache("op", path)
    with pytest.warns(RuntimeWarning, match="cannot be read"):
        assert cache.get(DEV, OP, "k") is None
    with pytest.warns(RuntimeWarning, match="left alone"):
        cache.put(DEV, OP, "mine", {"b": 2})
    assert cache.get(DEV, OP, "mine") == {"b": 2}  # kept in memory
    monkeypatch.undo()
    assert path.read_bytes() == before and not list(tmp_path.glob("*.corrupt-*"))


def test_clear_of_an_unreadable_file_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "op.json"
    PersistentCache("op", path).put(DEV, OP, "k", {"b": 1})
    real_open = open

    def no_permission(file: Any, *args: Any, **kwargs: Any) -> Any:
        if os.fspath(file) == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(file, *args, **kwargs)

    import ejk.config.cache_file

    monkeypatch.setattr(ejk.config.cache_file, "open", no_permission, raising=False)
    assert cli.main(["cache", "clear", "--dir", str(tmp_path), "-y"]) == 1
    captured = capsys.readouterr()
    assert "nothing to clear" not in captured.out
    assert "could not clear" in captured.err and "cannot be read" in captured.err


# -- kills mid-write ---------------------------------------------------------------------------------------

_WATCH_TARGET = """
import os, sys
target = os.path.realpath(sys.argv[1])
def hook(event, args):
    if event == "open" and isinstance(args[0], str) and os.path.realpath(args[0]) == target \\
            and args[2] & (os.O_WRONLY | os.O_RDWR):
        print("the target was opened for writing: a kill now leaves it partial", file=sys.stderr)
        os._exit(9)
sys.addaudithook(hook)
from ejk import cli
sys.exit(cli.main(["cache", "export", *sys.argv[3:], "--dir", sys.argv[2], sys.argv[1]]))
"""


@pytest.mark.parametrize("pack", [False, True], ids=["export", "pack"])
def test_export_only_ever_renames_a_whole_file_into_place(tmp_path: Path, pack: bool) -> None:
    import subprocess
    import sys

    directory = tmp_path / "cache"
    PersistentCache("op", directory / "op.json").put(DEV, OP, "k", {"b": 1})
    target = tmp_path / "export.json"
    target.write_text("the previous export")
    done = subprocess.run([sys.executable, "-c", _WATCH_TARGET, str(target), str(directory),
                           *(["--pack"] if pack else [])], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(target.read_text())["ops"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "export.json"]  # no temporary file left


def test_an_interrupted_export_leaves_the_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "cache"
    PersistentCache("op", directory / "op.json").put(DEV, OP, "k", {"b": 1})
    target = tmp_path / "export.json"
    target.write_text("the previous export")

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt  # Ctrl-C once the data is written, before it is on disk

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["cache", "export", "--dir", str(directory), str(target)])
    monkeypatch.undo()
    assert target.read_text() == "the previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "export.json"]


def _leftover(directory: Path, name: str, age_s: float) -> Path:
    """A temporary file as a killed writer leaves it, last modified ``age_s`` ago."""
    import time

    path = directory / name
    path.write_text('{"format": "ejk-config-cache", "entr')
    os.utime(path, (time.time() - age_s, time.time() - age_s))
    return path


def test_clear_removes_temporary_files_left_by_killed_writers(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    PersistentCache("op", tmp_path / "op.json").put(DEV, OP, "k", {"b": 1})
    killed = [_leftover(tmp_path, "op.json.0a1b2c3d.tmp", 3600),
              _leftover(tmp_path, "gone.json.deadbeef.tmp", 3600)]  # its writer never got to write gone.json
    recent = _leftover(tmp_path, "op.json.12345678.tmp", 0)  # maybe a live writer's
    others = [_leftover(tmp_path, name, 3600) for name in ("notes.tmp", "op.json.tmp", "op.json.xyz.tmp")]
    assert cli.main(["cache", "clear", "--dir", str(tmp_path), "-y"]) == 0
    out = capsys.readouterr().out
    assert "2 temporary files" in " ".join(out.split())
    assert not any(p.exists() for p in killed)
    assert recent.exists() and all(p.exists() for p in others)


def test_clear_leaves_a_temporary_file_whose_writer_holds_the_lock(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import filelock

    held = _leftover(tmp_path, "op.json.0a1b2c3d.tmp", 3600)
    with filelock.FileLock(str(tmp_path / "op.json.lock")):  # e.g. a writer stopped mid-write
        code = cli.main(["cache", "clear", "--dir", str(tmp_path), "-y"])
    assert held.exists()
    assert code == 0 and "kept 1 temporary files whose writers are still running" in capsys.readouterr().out


def test_clear_with_op_removes_only_that_ops_temporary_files(tmp_path: Path) -> None:
    mine = _leftover(tmp_path, "op.json.0a1b2c3d.tmp", 3600)
    theirs = _leftover(tmp_path, "other.json.0a1b2c3d.tmp", 3600)
    assert cli.main(["cache", "clear", "--dir", str(tmp_path), "--op", "op", "-y"]) == 0
    assert not mine.exists() and theirs.exists()
