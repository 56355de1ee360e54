"""What a third-party plugin author meets: hook order, hook tracing, per-plugin availability,
``ejk.run`` for algorithms without an op, what ran (events, recordings), signature checks, the
command line (``python -m ejk``, a closed pipe, ``ejk plugins`` per implementation, ``new-plugin``)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
import ejk.registry
from ejk import Invocation, KernelRegistry, cli
from ejk.execution.device import device_fingerprint
from ejk.plugins import PlatformStatus, PluginHost

INV = Invocation(op_id="op", version="1", args=(), call_key="k", device="cpu|cpu")


def _answer(value: Any, **marks: bool) -> object:
    class Answer:
        @ejk.hookimpl(**marks)
        def ejk_heuristic_config(self, algorithm: str) -> Any:
            return value

    return Answer()


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> PluginHost:
    private: PluginHost = ejk.plugins.get_plugin_host()  # the private, empty host of conftest
    monkeypatch.setattr(ejk.registry, "kernel_registry", private.registry)  # what ejk.run looks in
    return private


# -- order of the hook calls -----------------------------------------------------------------------

def test_first_result_hooks_follow_the_documented_order() -> None:
    host = PluginHost(KernelRegistry(), load_entry_points=False)
    for name in ("zeta", "alpha", "mid"):  # registration order does not matter
        host.register_plugin(_answer(name), name)
    assert host.hook_order("ejk_heuristic_config") == ["alpha", "mid", "zeta"]
    assert host.heuristic_config("op", "xla", INV) == "alpha"
    host.register_plugin(_answer("late", trylast=True), "aaa-last")
    host.register_plugin(_answer("early", tryfirst=True), "zzz-first")
    assert host.hook_order("ejk_heuristic_config") == ["zzz-first", "alpha", "mid", "zeta", "aaa-last"]
    assert host.heuristic_config("op", "xla", INV) == "early"
    assert host.call("ejk_heuristic_config", algorithm="op", platform="xla", implementation="xla",
                     invocation=INV) == ["early", "alpha", "mid", "zeta", "late"]


# -- EJK_TRACE_HOOKS ---------------------------------------------------------------------------------

@pytest.fixture
def hook_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    logger = logging.getLogger("ejk.hooks")
    logger.addHandler(caplog.handler)  # the tracer writes to stderr only when nobody listens
    propagate, logger.propagate = logger.propagate, False  # caplog's handler is on the root logger too
    caplog.set_level(logging.INFO, logger="ejk.hooks")
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)
        logger.propagate = propagate


def test_trace_hooks_logs_every_hook_call(monkeypatch: pytest.MonkeyPatch, hook_log: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("EJK_TRACE_HOOKS", "1")
    host = PluginHost(KernelRegistry(), load_entry_points=False)

    class Failing:
        @ejk.hookimpl
        def ejk_config_space(self, algorithm: str) -> Any:
            raise KeyError("nope")

    host.register_plugin(_answer("h"), "answers")
    with pytest.warns(RuntimeWarning, match="ejk_config_space raised KeyError"):
        host.register_plugin(Failing(), "failing")
        assert host.config_space("op", "xla", INV) == []
    assert host.heuristic_config("op", "xla", INV) == "h"
    lines = [r.getMessage() for r in hook_log.records if r.name == "ejk.hooks"]
    (heuristic,) = [line for line in lines if line.startswith("ejk_heuristic_config")]
    assert heuristic.startswith("ejk_heuristic_config [answers](algorithm='op', platform='xla'")
    assert "invocation=op@1()" in heuristic and "-> 'h' (" in heuristic and heuristic.endswith(" ms)")
    assert any(line.startswith("ejk_config_space [failing]") and "raised KeyError" in line for line in lines)
    host.trace_hooks(False)
    hook_log.clear()
    host.heuristic_config("op", "xla", INV)
    assert not [r for r in hook_log.records if r.name == "ejk.hooks"]


# -- availability is per plugin ------------------------------------------------------------------------

class _Status:
    def __init__(self, name: str, platform: str, available: bool, register: Callable[[Any], None]) -> None:
        self.name, self.platform, self.available, self.register = name, platform, available, register

    @ejk.hookimpl
    def ejk_register_kernels(self, register: Any) -> None:
        self.register(register)

    @ejk.hookimpl
    def ejk_platform_status(self) -> PlatformStatus:
        ok = self.available
        return PlatformStatus(platform=self.platform, available=ok, reason=None if ok else f"{self.name} needs mylib",
                              fix=None if ok else "pip install mylib")


def test_a_plugin_can_mark_its_own_implementations_unavailable(host: PluginHost,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    host.register_plugin(_Status("base", "xla", True, lambda reg: reg("toy_avail", "xla", "any", name="plain")(
        lambda x, *, cfg=None: x + 1)), "base")
    host.register_plugin(_Status("fancy", "xla", False, lambda reg: reg("toy_avail", "xla", "any", priority=9,
                                                                        name="fancy")(lambda x, *, cfg=None: x + 2)),
                         "fancy")
    registry = host.registry
    assert registry.platform_available("xla") == (True, None)  # the platform: any plugin's "available" wins
    fancy, plain = registry.list_implementations("toy_avail")
    assert registry.spec_available(plain) == (True, None)
    assert registry.spec_available(fancy) == (False, "fancy needs mylib. Fix: pip install mylib")
    assert registry.get_spec("toy_avail", platform="auto").name == "plain"
    np.testing.assert_allclose(ejk.run("toy_avail", jnp.zeros(2)), [1.0, 1.0])
    found = ejk.explain("toy_avail", jax.ShapeDtypeStruct((2,), jnp.float32))
    reports = {r.label: r for r in found.implementations}
    assert reports["xla/any:fancy"].status == "unavailable" and "pip install mylib" in (reports["xla/any:fancy"].reason
                                                                                         or "")
    assert cli.main(["plugins", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["fancy"]["implementations"] == [{
        "algorithm": "toy_avail", "implementation": "xla/any:fancy", "priority": 9, "config": None, "gated": False,
        "backward": None, "status": "unavailable", "reason": "platform xla: fancy needs mylib",
        "fix": "pip install mylib"}]
    assert rows["base"]["implementations"][0]["status"] == "available"
    assert cli.main(["kernels", "toy_avail", "--json"]) == 0
    assert {r["name"]: r["available"] for r in json.loads(capsys.readouterr().out)} == {"fancy": False, "plain": True}
    assert cli.main(["plugins"]) == 0
    table = capsys.readouterr().out
    assert "toy_avail xla/any:fancy" in table and "pip install mylib" in table


def test_kernels_and_plugins_agree_on_availability(host: PluginHost, capsys: pytest.CaptureFixture[str]) -> None:
    other_backend = "tpu" if jax.default_backend() != "tpu" else "gpu"

    def register(reg: Any) -> None:
        reg("toy_where", "xla", "any", name="portable")(lambda x, *, cfg=None: x)
        reg("toy_where", "xla", other_backend, name="elsewhere")(lambda x, *, cfg=None: x)

    host.register_plugin(_Status("where", "xla", True, register), "where")
    host.register_plugin(_Status("down", "downplat", False, lambda reg: reg("toy_where", "downplat", "any")(
        lambda x, *, cfg=None: x)), "down")
    assert cli.main(["plugins", "--json"]) == 0
    plugins = {impl["implementation"]: impl for row in json.loads(capsys.readouterr().out)
               for impl in row["implementations"]}
    assert cli.main(["kernels", "toy_where", "--json"]) == 0
    kernels = {r["implementation"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(kernels) == set(plugins) == {"xla/any:portable", f"xla/{other_backend}:elsewhere", "downplat/any"}
    for label, impl in plugins.items():
        assert kernels[label]["available"] == (impl["status"] == "available"), label
        assert kernels[label]["reason"] == impl["reason"], label
    assert not kernels[f"xla/{other_backend}:elsewhere"]["available"]


def test_a_gate_that_raises_warns_once_per_implementation(host: PluginHost) -> None:
    def broken_gate(x: Any) -> str | None:
        raise KeyError("no such shape table")

    def register(reg: Any) -> None:
        reg("toy_gated", "xla", "any", priority=5, name="broken", capability=broken_gate)(lambda x, *, cfg=None: x + 1)
        reg("toy_gated", "xla", "any", name="plain")(lambda x, *, cfg=None: x + 2)

    host.register_plugin(_Status("gated", "xla", True, register), "gated")
    with pytest.warns(RuntimeWarning) as caught:
        np.testing.assert_allclose(ejk.run("toy_gated", jnp.zeros(2)), [2.0, 2.0])  # the gate refuses
        ejk.run("toy_gated", jnp.zeros(3))
        ejk.run("toy_gated", jnp.zeros(4))
    messages = [str(w.message) for w in caught if "capability" in str(w.message)]
    assert len(messages) == 1, messages
    assert "xla/any:broken" in messages[0] and "plugin gated" in messages[0]
    assert "KeyError: 'no such shape table'" in messages[0]


# -- ejk.run: an algorithm without an op ----------------------------------------------------------------

@attrs.frozen(kw_only=True)
class ScaleCfg:
    unroll: int = 1


def _scale(x: jax.Array, y: jax.Array | None, *, factor: float, cfg: ScaleCfg | None = None) -> jax.Array:
    out = x * factor
    return out if y is None else out + y


def _register_scale(reg: Any) -> None:
    reg("toy_scale", "xla", "any", name="mul", cfg_type=ScaleCfg,
        config_space=lambda x, y, **_: [ScaleCfg(unroll=1), ScaleCfg(unroll=2)],
        heuristic=lambda x, y, **_: ScaleCfg(unroll=2),
        capability=lambda x, y, factor, **_: "factor 0 is not supported" if factor == 0 else None)(_scale)


@pytest.fixture
def scale_host(host: PluginHost) -> PluginHost:
    host.register_plugin(_Status("scaler", "xla", True, _register_scale), "scaler")
    return host


def test_run_calls_an_algorithm_without_an_op(scale_host: PluginHost, tmp_path: Path) -> None:
    x, y = jnp.arange(4.0), jnp.ones(4)
    np.testing.assert_allclose(ejk.run("toy_scale", x, None, factor=3.0), 3 * x)
    np.testing.assert_allclose(jax.jit(lambda x, y: ejk.run("toy_scale", x, y, factor=2.0))(x, y), 2 * x + 1)
    np.testing.assert_allclose(jax.grad(lambda x: ejk.run("toy_scale", x, y, factor=2.0).sum())(x), [2.0] * 4)
    events: list[Any] = []
    chain = ejk.ConfigSelectorChain(policy=ejk.AutotunePolicy(autotune=True, repeats=1),
                                    persistent_dir=tmp_path / "cache", on_event=events.append)
    with ejk.use_executor(ejk.Executor(chain)):
        ejk.run("toy_scale", x, y, factor=2.0)
        ejk.run("toy_scale", x, y, factor=2.0, cfg=ScaleCfg(unroll=1))
    assert [(e.tier, e.implementation) for e in events] == [("autotune", "xla/any:mul"), ("override", "xla/any:mul")]
    events.clear()
    again = ejk.ConfigSelectorChain(persistent_dir=tmp_path / "cache", on_event=events.append)
    with ejk.use_executor(ejk.Executor(again)):
        ejk.run("toy_scale", x, y, factor=2.0)
    assert events[0].tier == "persistent"  # the tuned choice was cached under the algorithm's own name
    found = ejk.explain("toy_scale", jax.ShapeDtypeStruct((4,), jnp.float32), None, factor=2.0)
    assert found.chosen is not None and found.chosen.cfg == ScaleCfg(unroll=2)


def test_run_explains_what_is_wrong(scale_host: PluginHost) -> None:
    x = jnp.ones(3)
    with pytest.raises(ValueError, match="factor 0 is not supported"):
        ejk.run("toy_scale", x, None, factor=0.0)
    with pytest.raises(ValueError, match="positional argument y is str"):
        ejk.run("toy_scale", x, "oops", factor=1.0)
    with pytest.raises(ejk.KernelNotFoundError, match=r"No plugin registered 'no_such_algo'.*toy_scale"):
        ejk.run("no_such_algo", x)
    with pytest.raises(ValueError, match="unknown operation 'nope'"):
        ejk.explain("nope", x)


# -- what ran: events and recordings -------------------------------------------------------------------

def test_events_and_recordings_name_the_implementation(scale_host: PluginHost,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EJKERNEL_OPS_RECORD", "1")
    events: list[Any] = []
    with ejk.use_executor(ejk.Executor(ejk.ConfigSelectorChain(on_event=events.append, persist=False))):
        for _ in range(2):  # the second call takes the fast path: recorded and reported all the same
            ejk.run("toy_scale", jnp.ones(2), None, factor=1.0)
    assert [(e.tier, e.implementation) for e in events] == [("heuristic", "xla/any:mul")] * 2
    device = jax.devices()[0]
    for dev in (device, None, device_fingerprint(device), f"{device_fingerprint(device)}|sm=90"):
        recorded = ejk.get_invocations(dev)
        assert list(recorded) == ["toy_scale@1"], dev
    (ran,) = ejk.get_implementations(device)["toy_scale@1"].values()
    assert ran == "xla/any:mul"


# -- doctor: signatures -------------------------------------------------------------------------------------

def test_signature_check_ignores_missing_annotations_and_names_the_plugin(host: PluginHost) -> None:
    def annotated(x: jax.Array, *, factor: float, cfg: Any = None) -> jax.Array:
        return x

    def bare(x, *, factor, cfg=None):  # type: ignore[no-untyped-def]
        return x

    def wrong(x: int, *, factor: float, cfg: Any = None) -> jax.Array:
        return jnp.asarray(x)

    host.register_plugin(_Status("first", "xla", True, lambda reg: reg("sig_op", "xla", "any", priority=5,
                                                                       name="annotated")(annotated)), "first")
    host.register_plugin(_Status("second", "xla", True, lambda reg: reg("sig_op", "xla", "any", name="bare")(bare)),
                         "second")
    assert host.registry.validate_signatures("sig_op")  # unannotated but correct: no problem
    host.register_plugin(_Status("third", "xla", True, lambda reg: reg("sig_op", "xla", "any", name="wrong")(wrong)),
                         "third")
    with pytest.warns(UserWarning, match=r"xla/any:wrong of plugin third .* parameter 'x' is annotated int"):
        assert not host.registry.validate_signatures("sig_op")


# -- command line ----------------------------------------------------------------------------------------

def test_python_dash_m_ejk_runs_the_cli() -> None:
    result = subprocess.run([sys.executable, "-m", "ejk", "kernels", "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert isinstance(json.loads(result.stdout), list)


def _with_closed_stdout(*args: str) -> tuple[int, str]:
    """Run ``python -m ejk ARGS`` whose reader is gone before it writes (like ``| head`` that read enough)."""
    with subprocess.Popen([sys.executable, "-m", "ejk", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        stderr = proc.stderr.read().decode()
        return proc.wait(timeout=120), stderr


def test_a_closed_pipe_ends_quietly() -> None:
    for args in (("kernels", "--json"), ("plugins",)):  # print() and rich tables alike: status 1, no traceback
        status, stderr = _with_closed_stdout(*args)
        assert status == 1 and "Traceback" not in stderr and "BrokenPipeError" not in stderr, (args, stderr)


def test_new_plugin_writes_a_distribution(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ejk import _new_plugin

    assert cli.main(["new-plugin", "Team-Kernels", "--dir", str(tmp_path)]) == 0
    root = tmp_path / "ejk-team-kernels"
    assert f"wrote {root}" in capsys.readouterr().out
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert files == ["README.md", "pyproject.toml", "src/ejk_team_kernels/__init__.py",
                     "src/ejk_team_kernels/_kernel.py", "src/ejk_team_kernels/ops.py",
                     "src/ejk_team_kernels/plugin.py", "src/ejk_team_kernels/py.typed",
                     "src/ejk_team_kernels/reference.py", "src/ejk_team_kernels/testing.py", "tests/test_plugin.py"]
    for path in root.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert "{{" not in text, path
            if path.suffix == ".py":
                compile(text, str(path), "exec")
    pyproject = (root / "pyproject.toml").read_text()
    assert 'team_kernels = "ejk_team_kernels.plugin"' in pyproject
    assert f'"ejk-core{_new_plugin.core_range(ejk.__version__)}"' in pyproject
    assert "def team_kernels_softcap(" in (root / "src/ejk_team_kernels/ops.py").read_text()
    assert cli.main(["new-plugin", "team_kernels", "--dir", str(tmp_path)]) == 2  # exists: never overwritten
    assert "exists and is not empty" in capsys.readouterr().err
    assert cli.main(["new-plugin", "9lives", "--dir", str(tmp_path)]) == 2
    assert "is not valid" in capsys.readouterr().err
    assert _new_plugin.core_range("0.1.0") == ">=0.1,<0.2" and _new_plugin.core_range("1.4.2") == ">=1.4,<2"
    long_root = _new_plugin.write_plugin("team_attention", tmp_path)  # its own ruff settings: 120 columns
    for path in long_root.rglob("*.py"):
        assert max(len(line) for line in path.read_text().splitlines()) <= 120, path


def _new_plugin_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert cli.main(["new-plugin", *args]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.err.startswith("error: ")
    return " ".join(captured.err.split())


def test_new_plugin_refuses_an_over_long_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ejk import _new_plugin

    err = _new_plugin_error(capsys, "k" * 300, "--dir", str(tmp_path))
    assert "plugin name" in err and "too long" in err and f"at most {_new_plugin.MAX_NAME_LENGTH}" in err
    longest = _new_plugin.write_plugin("k" * _new_plugin.MAX_NAME_LENGTH, tmp_path)  # still 120 columns
    for path in longest.rglob("*.py"):
        assert max(len(line) for line in path.read_text().splitlines()) <= 120, path
    assert list(tmp_path.iterdir()) == [longest]


def test_new_plugin_names_what_is_in_the_way(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ejk-mine").write_text("a file where the distribution goes")
    err = _new_plugin_error(capsys, "mine", "--dir", str(tmp_path))
    assert f"{tmp_path / 'ejk-mine'} is a file" in err and "--dir" in err
    a_file = tmp_path / "notes.txt"
    a_file.write_text("")
    err = _new_plugin_error(capsys, "other", "--dir", str(a_file))
    assert f"--dir {a_file} is not a directory" in err
    read_only = tmp_path / "read-only"
    read_only.mkdir(mode=0o555)
    unwritable = read_only if not os.access(read_only, os.W_OK) else Path("/proc")  # root writes all but /proc
    err = _new_plugin_error(capsys, "other", "--dir", str(unwritable))
    assert f"cannot write {unwritable / 'ejk-other'}" in err and "--dir" in err


@pytest.mark.parametrize("name", ["xla", "ejk-pallas", "Triton", "cute", "core", "ejk_core"])
def test_new_plugin_refuses_the_names_of_ejks_own_distributions(name: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    err = _new_plugin_error(capsys, name, "--dir", str(tmp_path))
    distribution = "ejk-" + name.lower().removeprefix("ejk-").removeprefix("ejk_")
    assert f"would write {distribution}" in err and "choose another" in err
    assert list(tmp_path.iterdir()) == []
