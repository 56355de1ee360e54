"""Config packs: shipped by a plugin's hook, consulted after the persistent cache, reported, exported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import pytest

import ejk
import ejk.plugins
from ejk import AutotunePolicy, ConfigSelectorChain, Executor, Invocation, Kernel, KernelRegistry, SelectionEvent
from ejk.cli import main
from ejk.config.packs import PACK_FORMAT, read_pack
from ejk.plugins import PluginHost


@attrs.frozen(kw_only=True)
class Cfg:
    block: int = 8


class Scale(Kernel[Cfg, jax.Array]):
    op_id = "scale"
    version = "1"
    cfg_type = Cfg

    def run(self, x: jax.Array, *, cfg: Cfg) -> jax.Array:
        return x * cfg.block

    def heuristic_cfg(self, inv: Invocation[Cfg]) -> Cfg:
        return Cfg(block=1)

    def candidate_cfgs(self, inv: Invocation[Cfg]) -> tuple[Cfg, ...]:
        return (Cfg(block=1), Cfg(block=2))


X = jnp.ones((4,), jnp.float32)


def _chain(directory: Path, host: Any, events: list[SelectionEvent]) -> ConfigSelectorChain[Cfg]:
    return ConfigSelectorChain(policy=AutotunePolicy(autotune=False), on_event=events.append, plugin_host=host,
                               persistent_dir=directory)


def _invocation(kernel: Scale) -> Invocation[Cfg]:
    return Executor(ConfigSelectorChain(plugin_host=False)).invocation(kernel, (X,), {}, None)


def _shipping(path: Path) -> PluginHost:
    class Shipper:
        @ejk.hookimpl
        def ejk_config_packs(self) -> list[Path]:
            return [path]

    host = PluginHost(KernelRegistry(), load_entry_points=False)
    host.register_plugin(Shipper(), "shipper")
    return host


def _tuned_cache(directory: Path, kernel: Scale, inv: Invocation[Cfg], cfg: Cfg) -> None:
    chain = _chain(directory, False, [])
    cache = chain.persistent_cache(kernel)
    assert cache is not None
    cache.put(*inv.cache_key, cfg, source="autotune", versions={})


def test_pack_sits_between_persistent_cache_and_autotuning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kernel = Scale()
    inv = _invocation(kernel)
    tuned = tmp_path / "tuned"
    _tuned_cache(tuned, kernel, inv, Cfg(block=64))
    pack = tmp_path / "h200.json"
    assert main(["cache", "export", "--pack", "--dir", str(tuned), str(pack)]) == 0
    assert "wrote a config pack of 1 entries" in capsys.readouterr().out
    payload = json.loads(pack.read_text())
    assert payload["format"] == PACK_FORMAT and list(payload["ops"]) == ["scale"]
    assert list(read_pack(str(pack))) == [inv.cache_key]

    # A user without a tuned cache gets the pack's config, reported as coming from the pack.
    host, events = _shipping(pack), []
    empty = tmp_path / "user"
    chain = _chain(empty, host, events)
    assert chain.choose(inv, kernel) == Cfg(block=64)
    assert [e.tier for e in events] == ["pack"] and str(pack) in events[0].detail
    peeked = _chain(empty, host, []).peek(inv, kernel)
    assert peeked.tier == "pack" and str(pack) in peeked.detail
    # The user's own persistent entry wins over the pack.
    _tuned_cache(empty, kernel, inv, Cfg(block=3))
    events.clear()
    assert _chain(empty, host, events).choose(inv, kernel) == Cfg(block=3)
    assert [e.tier for e in events] == ["persistent"]
    # Without the pack the chain falls back to the heuristic (autotuning off).
    assert _chain(tmp_path / "other", False, []).choose(inv, kernel) == Cfg(block=1)


def test_cache_show_lists_pack_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    kernel = Scale()
    inv = _invocation(kernel)
    _tuned_cache(tmp_path / "tuned", kernel, inv, Cfg(block=16))
    pack = tmp_path / "pack.json"
    assert main(["cache", "export", "--pack", "--dir", str(tmp_path / "tuned"), str(pack)]) == 0
    monkeypatch.setattr(ejk.plugins, "_host", _shipping(pack))
    capsys.readouterr()
    assert main(["cache", "show", "--json", "--packs", "--dir", str(tmp_path / "empty")]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["op_id"], r["cfg"], r["source"]) for r in rows] == [("scale@1", {"block": 16}, f"pack {pack}")]


def test_unreadable_pack_is_ignored_with_a_warning(tmp_path: Path) -> None:
    kernel = Scale()
    inv = _invocation(kernel)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"format": "something else"}))
    with pytest.warns(RuntimeWarning, match="is unreadable"):
        assert _chain(tmp_path / "c", _shipping(broken), []).choose(inv, kernel) == Cfg(block=1)


def _nested(path: Path, depth: int = 10**5) -> Path:
    path.write_text('{"format": "ejk-config-pack", "ops": ' + "[" * depth + "]" * depth + "}")
    return path


def test_a_pack_nested_too_deeply_is_reported_against_its_plugin_and_ignored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    kernel = Scale()
    inv = _invocation(kernel)
    host = _shipping(_nested(tmp_path / "deep.json"))
    with pytest.warns(RuntimeWarning, match="nested too deeply"):
        assert _chain(tmp_path / "c", host, []).choose(inv, kernel) == Cfg(block=1)  # a miss: the heuristic
    assert _chain(tmp_path / "c", host, []).peek(inv, kernel).tier == "heuristic"  # explain's path
    (error,) = host.plugins["shipper"].hook_errors
    assert "ejk_config_packs" in error and "deep.json" in error and "nested too deeply" in error
    monkeypatch.setattr(ejk.plugins, "_host", host)
    capsys.readouterr()
    assert main(["cache", "show", "--json", "--packs", "--dir", str(tmp_path / "empty")]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_a_pack_path_with_a_nul_byte_is_reported_against_its_plugin_and_ignored(tmp_path: Path) -> None:
    kernel = Scale()
    inv = _invocation(kernel)
    host = _shipping(Path(f"{tmp_path}/bad\x00pack.json"))
    with pytest.warns(RuntimeWarning, match="cannot be opened"):
        assert _chain(tmp_path / "c", host, []).choose(inv, kernel) == Cfg(block=1)
    (error,) = host.plugins["shipper"].hook_errors
    assert "null byte" in error
