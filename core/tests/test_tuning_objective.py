"""Autotuning objective: forward alone, or forward plus backward (for training)."""

from __future__ import annotations

from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk


@attrs.frozen
class Split:
    """How many chained matmuls the forward and the backward pass do."""

    fwd_work: int
    bwd_work: int


def _burn(x: jax.Array, times: int) -> jax.Array:
    w = jnp.eye(x.shape[-1], dtype=x.dtype) * 0.5
    for _ in range(times):
        x = jnp.tanh(x @ w) * 2.0
    return x


class Lopsided(ejk.Kernel[Split, jax.Array]):
    """y = 3x, with a custom VJP; configs move work between forward and backward."""

    op_id = "lopsided"
    cfg_type = Split

    def run(self, x: jax.Array, *, cfg: Split) -> jax.Array:
        return 3.0 * x + 0.0 * _burn(x, cfg.fwd_work).sum()

    def fwd(self, x: jax.Array, *, cfg: Split) -> tuple[jax.Array, Any]:
        return self.run(x, cfg=cfg), x

    def bwd(self, residuals: Any, g: jax.Array, *, cfg: Split) -> tuple[jax.Array]:
        return (3.0 * g + 0.0 * _burn(residuals, cfg.bwd_work).sum(),)

    def candidate_cfgs(self, inv: Any) -> list[Split]:
        return [Split(fwd_work=1, bwd_work=150), Split(fwd_work=12, bwd_work=1)]


@pytest.mark.parametrize(("objective", "winner"), [("forward", Split(1, 150)), ("forward_backward", Split(12, 1))])
def test_objective_decides_the_winner(objective: str, winner: Split) -> None:
    events: list[ejk.SelectionEvent] = []
    policy = ejk.AutotunePolicy(autotune=True, objective=objective, repeats=3)
    executor = ejk.Executor(ejk.ConfigSelectorChain(policy=policy, on_event=events.append, persist=False,
                                                    plugin_host=False))
    x = jnp.ones((256, 256), jnp.float32)
    grad = jax.grad(lambda x: executor(Lopsided(), x).sum())(x)
    np.testing.assert_allclose(grad, np.full((256, 256), 3.0))
    (event,) = events
    assert event.tier == "autotune" and event.cfg == winner
    assert event.tune is not None and all(t.error is None for t in event.tune.trials)


def test_objective_is_validated_and_recorded(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="objective"):
        ejk.AutotunePolicy(objective="backward")
    policy = ejk.AutotunePolicy(autotune=True, objective="forward_backward", repeats=1)
    chain: ejk.ConfigSelectorChain[Split] = ejk.ConfigSelectorChain(policy=policy, persistent_dir=tmp_path,
                                                                    plugin_host=False)
    ejk.Executor(chain)(Lopsided(), jnp.ones((8, 8)))
    (entry,) = chain.persistent_cache(Lopsided()).entries()  # type: ignore[union-attr]
    assert entry.provenance["objective"] == "forward_backward"
