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
