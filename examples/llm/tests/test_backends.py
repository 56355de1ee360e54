"""The same parameters give the same loss on ejk's kernels and on plain JAX, step after step, and both learn."""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
import pytest

from ejk_llm.backends import Backend
from ejk_llm.config import ModelConfig, get_preset
from ejk_llm.data import SyntheticCorpus
from ejk_llm.model import init_params, train_loss
from ejk_llm.train import Trainer, device_batch


def test_both_backends_learn_the_same_curve_float32() -> None:
    """The MoE model (every heavy op: RMSNorm, packed attention with sinks and a sliding layer, grouped
    matmuls, the fused loss), 6 AdamW steps on each backend: the same losses, router losses and gradient
    norms at every step, the same parameters after, and a falling loss."""
    preset = get_preset("tiny-moe")
    runs = {}
    for backend in ("ejk", "plain"):
        trainer = Trainer(preset.model, preset.run, Backend(backend), steps=6)
        batches = trainer.batches()
        metrics = [jax.device_get(trainer.step(next(batches))) for _ in range(6)]
        runs[backend] = ({k: np.array([m[k] for m in metrics]) for k in metrics[0]}, trainer.params)
    (ejk_metrics, ejk_params), (plain_metrics, plain_params) = runs["ejk"], runs["plain"]
    assert ejk_metrics["ce"][0] == pytest.approx(np.log(preset.model.vocab), rel=0.2)  # an untrained model
    for key in ("ce", "aux", "grad_norm"):
        np.testing.assert_allclose(ejk_metrics[key], plain_metrics[key], rtol=1e-4, err_msg=key)
    assert ejk_metrics["ce"][-1] < ejk_metrics["ce"][0] - 0.5, ejk_metrics["ce"]
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(ejk_params), jax.tree.leaves(plain_params),
                            strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5,
                                   err_msg=jax.tree_util.keystr(path))


def test_same_loss_bfloat16() -> None:
    """The dense model in bfloat16: the first loss agrees within bfloat16's precision."""
    preset = get_preset("tiny", dtype="bfloat16")
    run = preset.run
    corpus = SyntheticCorpus(preset.model.vocab, run.min_doc, run.max_doc, seed=3)
    batch = device_batch(corpus.batch(run.batch, run.seq_len, run.max_docs))
    params = init_params(preset.model, jax.random.key(1))
    losses = [float(jax.jit(functools.partial(_loss, preset.model, Backend(n), batch=batch))(params))
              for n in ("ejk", "plain")]
    assert losses[0] == pytest.approx(losses[1], rel=1e-2), losses  # bf16 activations: ~3 significant digits


def _loss(cfg: ModelConfig, backend: Backend, params: dict[str, Any], batch: dict[str, jax.Array]) -> jax.Array:
    return train_loss(cfg, backend, params, batch)[0]
