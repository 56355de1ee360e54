"""What a differentiated call runs (issue 30): an ImplChoice without a config runs its implementation's
heuristic config in the forward and the backward, a forward-only one's paired backward too; a pack's
``"fwd+bwd"`` ranking picks the implementation or pairing of differentiated calls apart from the forward's."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
import ejk.plugins
from ejk.config.rankings import parse_rankings
from ejk.ops import ImplChoice, OpKernel
from ejk.plugins import PlatformStatus

X = jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(3, 4)
TAG = "square:x"


class Square(OpKernel):
    """``square(x)``: implementations differ only in what their backward adds (which ran shows in the gradient)."""

    op_id = "square"
    version = "1"
    array_names = ("x",)
    positional = 1

    def normalize(self, x: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (x,), {}


def square(x: jax.Array, *, cfg: Any = None) -> jax.Array:
    return x * x


def square_fwd(x: jax.Array, *, cfg: Any = None) -> tuple[jax.Array, Any]:
    return x * x, (x,)


def backward_adding(offset: float, seen: list[Any] | None = None) -> Callable[..., tuple[jax.Array]]:
    """A correct backward plus ``offset`` (and ``cfg``: the config it ran with, recorded in ``seen``)."""

    def bwd(residuals: Any, g: jax.Array, *, cfg: Any = None) -> tuple[jax.Array]:
        if seen is not None:
            seen.append(cfg)
        (x,) = residuals
        return (2 * x * g + offset + (cfg or 0),)

    return bwd


def _install(registrations: Callable[[Any], None], packs: list[Path] | None = None) -> Square:
    class Plugin:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            registrations(register)

        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform="xla", available=True)

        @ejk.hookimpl
        def ejk_config_packs(self) -> list[Path]:
            return packs or []

    host = ejk.plugins.get_plugin_host()  # the private, empty host of conftest
    host.register_plugin(Plugin(), "trainer")
    return Square(host.registry)


def _pack(path: Path, *rankings: dict[str, Any]) -> Path:
    entries = [{"device": "*", **r} for r in rankings]
    path.write_text(json.dumps({"format": "ejk-config-pack", "schema": 1, "rankings": {"square": entries}}))
    return path


def _executor(events: list[Any] | None = None) -> ejk.Executor[Any, Any]:
    chain: ejk.ConfigSelectorChain[Any] = ejk.ConfigSelectorChain(
        policy=ejk.AutotunePolicy(mode="heuristics"), persist=False,
        on_event=(events if events is not None else []).append)
    return ejk.Executor(chain)


def _grad(kernel: Square, cfg: Any = None, run: ejk.Executor[Any, Any] | None = None) -> np.ndarray:
    run = run or _executor()
    return np.asarray(jax.grad(lambda x: run(kernel, x, cfg=cfg, platform="auto").sum())(X))


def _register(reg: Any, name: str, *, offset: float = 0.0, priority: int = 0, paired: bool = False,
              vjp: bool = True, heuristic: int | None = None, seen: list[Any] | None = None) -> None:
    rule = None
    if vjp:
        rule = (ejk.VJP(fwd=square_fwd, residuals=TAG) if paired
                else ejk.VJP(fwd=square_fwd, bwd=backward_adding(offset, seen), residuals=TAG))
    reg("square", "xla", "any", name=name, priority=priority, vjp=rule, cfg_type=int,
        heuristic=None if heuristic is None else (lambda **call: heuristic))(square)


# -- ImplChoice without a config: the heuristic config, forward and backward --------------------------------


def test_a_forward_only_choice_pairs_with_a_backward_running_its_heuristic_config() -> None:
    seen: list[Any] = []
    kernel = _install(lambda reg: (_register(reg, "fo", paired=True, priority=5),
                                   _register(reg, "full", offset=100.0, heuristic=7, seen=seen)))
    got = _grad(kernel, ImplChoice(platform="xla", backend="any", implementation="fo"))
    assert seen == [7]  # the partner's heuristic config, not None (its defaults)
    np.testing.assert_allclose(got, 2 * X + 107.0, rtol=1e-6)
    assert _grad(kernel) == pytest.approx(got)  # what platform="auto" runs: the same pairing, the same config


def test_an_impl_choice_runs_what_auto_would_for_that_implementation() -> None:
    seen: list[Any] = []
    kernel = _install(lambda reg: _register(reg, "full", offset=1.0, heuristic=3, seen=seen))
    forced = _grad(kernel, ImplChoice(platform="xla", backend="any", implementation="full"))
    auto = _grad(kernel)
    assert seen == [3, 3]
    np.testing.assert_allclose(forced, auto)


# -- "fwd+bwd" rankings -----------------------------------------------------------------------------------


def test_a_training_ranking_picks_what_differentiated_calls_run(tmp_path: Path) -> None:
    pack = _pack(tmp_path / "p.json", {"mode": "fwd", "order": ["xla/any:a", "xla/any:b"]},
                 {"mode": "fwd+bwd", "order": ["xla/any:b", "xla/any:a"]})
    kernel = _install(lambda reg: (_register(reg, "a", offset=10.0), _register(reg, "b", offset=20.0)), [pack])
    events: list[Any] = []
    run = _executor(events)
    np.testing.assert_allclose(run(kernel, X, platform="auto"), X * X)
    chosen = events[-1].cfg
    assert chosen.implementation == "a" and chosen.training.implementation == "b"
    np.testing.assert_allclose(_grad(kernel, run=run), 2 * X + 20.0, rtol=1e-6)
    # the same under jit and vmap
    jitted = jax.jit(jax.vmap(jax.grad(lambda x: run(kernel, x, platform="auto").sum())))(X[None])
    np.testing.assert_allclose(jitted[0], 2 * X + 20.0, rtol=1e-6)
    assert "differentiated: xla/any:b" in str(chosen)


def test_a_training_ranking_names_a_pairing(tmp_path: Path) -> None:
    pack = _pack(tmp_path / "p.json", {"mode": "fwd+bwd", "order": ["xla/any:a+xla/any:c", "xla/any:a"]})
    kernel = _install(lambda reg: (_register(reg, "a", offset=10.0, priority=5), _register(reg, "c", offset=30.0)),
                      [pack])
    events: list[Any] = []
    got = _grad(kernel, run=_executor(events))
    training = events[-1].cfg.training
    assert (training.implementation, training.backward.implementation) == ("a", "c")
    np.testing.assert_allclose(got, 2 * X + 30.0, rtol=1e-6)


def test_a_forward_only_implementation_pairs_as_the_training_ranking_says(tmp_path: Path) -> None:
    pack = _pack(tmp_path / "p.json", {"mode": "fwd+bwd", "order": ["xla/any:fo+xla/any:slow"]})
    kernel = _install(lambda reg: (_register(reg, "fo", paired=True, priority=9),
                                   _register(reg, "fast", offset=1.0, priority=5),
                                   _register(reg, "slow", offset=2.0, priority=1)), [pack])
    np.testing.assert_allclose(_grad(kernel), 2 * X + 2.0, rtol=1e-6)  # not the registry's first ("fast")
    np.testing.assert_allclose(_grad(kernel, ImplChoice(platform="xla", backend="any", implementation="fo")),
                               2 * X + 2.0, rtol=1e-6)


def test_a_training_choice_without_a_vjp_differentiates_through_jax(tmp_path: Path) -> None:
    pack = _pack(tmp_path / "p.json", {"mode": "fwd+bwd", "order": ["xla/any:plain"]})
    kernel = _install(lambda reg: (_register(reg, "a", offset=10.0, priority=5), _register(reg, "plain", vjp=False)),
                      [pack])
    np.testing.assert_allclose(_grad(kernel), 2 * X, rtol=1e-6)
    np.testing.assert_allclose(_executor()(kernel, X, platform="auto"), X * X)


def test_without_a_training_ranking_nothing_changes(tmp_path: Path) -> None:
    pack = _pack(tmp_path / "p.json", {"order": ["xla/any:b", "xla/any:a"]})  # no mode: both
    kernel = _install(lambda reg: (_register(reg, "a", offset=10.0, priority=5), _register(reg, "b", offset=20.0)),
                      [pack])
    events: list[Any] = []
    np.testing.assert_allclose(_grad(kernel, run=_executor(events)), 2 * X + 20.0, rtol=1e-6)
    assert events[-1].cfg.training is None


def test_ranking_modes_are_validated() -> None:
    found, problems = parse_rankings({"square": [
        {"device": "*", "mode": "train", "order": ["xla/any:a"]},
        {"device": "*", "order": ["xla/any:a+xla/any:b"]},
        {"device": "*", "mode": "fwd+bwd", "order": ["xla/any:a+xla/any:b", "xla/any"]},
    ]}, "p.json")
    assert "mode needs one of 'fwd', 'fwd+bwd'" in problems[0]
    assert "only a ranking with mode 'fwd+bwd' may name pairings" in problems[1]
    (kept,) = found["square"]
    assert kept.order == ("xla/any:a+xla/any:b", "xla/any") and kept.orders("fwd+bwd") and not kept.orders("fwd")
    found, problems = parse_rankings({"square": [{"device": "*", "mode": "fwd+bwd", "order": ["a+b"]}]}, "p")
    assert not found and "is not 'platform/backend:name'" in problems[0]
