"""The same parameters give the same loss and gradients on ejk's kernels and on plain JAX, and both learn."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejk_llm.backends import Backend
from ejk_llm.config import ModelConfig, Preset, get_preset
from ejk_llm.data import SyntheticCorpus
from ejk_llm.model import init_params, train_loss
from ejk_llm.train import Trainer, device_batch


def _batch(preset_name: str, **overrides: object) -> tuple[Preset, dict[str, jax.Array]]:
    preset = get_preset(preset_name, **overrides)
    run = preset.run
    corpus = SyntheticCorpus(preset.model.vocab, run.min_doc, run.max_doc, seed=3)
    return preset, device_batch(corpus.batch(run.batch, run.seq_len, run.max_docs))


def test_same_loss_and_gradients_float32_moe() -> None:
    """Dense attention layers and the MoE (routing, grouped matmuls, unsorting) agree value and gradient."""
    preset, batch = _batch("tiny-moe")
    params = init_params(preset.model, jax.random.key(0))
    results = {}
    for backend in ("ejk", "plain"):
        loss = functools.partial(_loss, preset.model, Backend(backend), batch=batch)
        results[backend] = jax.jit(jax.value_and_grad(loss))(params)
    (loss_e, grads_e), (loss_p, grads_p) = results["ejk"], results["plain"]
    assert abs(float(loss_e) - float(loss_p)) < 1e-5, (loss_e, loss_p)
    assert float(loss_e) == pytest.approx(np.log(preset.model.vocab), rel=0.2)  # an untrained model's loss
    for path, ge in jax.tree_util.tree_leaves_with_path(grads_e):
        gp = _leaf(grads_p, path)
        scale = float(jnp.max(jnp.abs(gp))) + 1e-6
        err = float(jnp.max(jnp.abs(ge - gp)))
        assert err <= 1e-4 * scale + 1e-7, (jax.tree_util.keystr(path), err, scale)


def test_same_loss_bfloat16() -> None:
    preset, batch = _batch("tiny", dtype="bfloat16")
    params = init_params(preset.model, jax.random.key(1))
    losses = [float(jax.jit(functools.partial(_loss, preset.model, Backend(n), batch=batch))(params))
              for n in ("ejk", "plain")]
    assert losses[0] == pytest.approx(losses[1], rel=1e-2), losses  # bf16 activations: ~3 significant digits


def test_both_backends_learn_the_same_curve() -> None:
    """The dense model's first 8 steps (AdamW, float32): the same losses on both backends, and falling."""
    preset = get_preset("tiny")
    curves = {}
    for backend in ("ejk", "plain"):
        trainer = Trainer(preset.model, dataclasses.replace(preset.run, batch=2), Backend(backend), steps=8)
        batches = trainer.batches()
        curves[backend] = [float(trainer.step(next(batches))["ce"]) for _ in range(8)]
    np.testing.assert_allclose(curves["ejk"], curves["plain"], rtol=2e-4)
    assert curves["ejk"][-1] < curves["ejk"][0] - 0.5, curves["ejk"]


def _loss(cfg: ModelConfig, backend: Backend, params: dict[str, Any], batch: dict[str, jax.Array]) -> jax.Array:
    return train_loss(cfg, backend, params, batch)[0]


def _leaf(tree: object, path: tuple[object, ...]) -> jax.Array:
    for key in path:
        tree = tree[getattr(key, "key", getattr(key, "idx", None))]  # type: ignore[index]
    return tree  # type: ignore[return-value]
