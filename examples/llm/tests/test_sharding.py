"""Training steps on 4 and 8 (fake CPU) devices match the same steps on one: rows split over devices, FSDP,
experts over a mesh axis, and each row's tokens over a ring."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from ejk_llm import sharding
from ejk_llm.backends import Backend
from ejk_llm.config import Preset, get_preset
from ejk_llm.train import Trainer


@pytest.fixture(scope="module")
def one_device() -> tuple[Preset, list[dict[str, jax.Array]], list[dict[str, float]], list[np.ndarray]]:
    """Two AdamW steps of the MoE model on one device: the batches, the metrics and the parameters after."""
    p = get_preset("tiny-moe")
    p = Preset(p.model, dataclasses.replace(p.run, batch=8))
    trainer = Trainer(p.model, p.run, Backend("ejk"), steps=4)
    batches = [b for _, b in zip(range(2), trainer.batches(), strict=False)]
    metrics = [{k: float(v) for k, v in trainer.step(b).items()} for b in batches]
    return p, batches, metrics, [np.asarray(x) for x in jax.tree.leaves(trainer.params)]


@pytest.mark.parametrize("mesh", ["fsdp=2,expert=2,seq=2", "data=2,fsdp=2"])
def test_sharded_steps_match_one_device(mesh: str, one_device: tuple[Any, ...]) -> None:
    """The MoE model, two AdamW steps. ``fsdp=2,expert=2,seq=2`` (8 devices): rows over fsdp and expert,
    each row's tokens over seq (ejk.ring_attention), weights over fsdp, experts over expert (ejk's sharded
    grouped_matmul). ``data=2,fsdp=2``: rows over both, varlen attention and routing per device."""
    assert jax.device_count() >= 8, "conftest.py sets XLA_FLAGS=--xla_force_host_platform_device_count=8"
    p, batches, want, want_params = one_device
    sharded = Trainer(p.model, p.run, Backend("ejk"), sharding.make_mesh(sharding.parse_mesh(mesh)), steps=4)
    layer = sharded.params["layers"][0]
    experts = "expert" if "expert" in mesh else None
    assert layer["w_in"].sharding.spec == PartitionSpec(experts, None, "fsdp")  # [E, D, 2F]
    assert layer["wq"].sharding.spec == PartitionSpec("fsdp", None, None)  # [D, H, hd]
    assert layer["sinks"].sharding.spec in (PartitionSpec(), PartitionSpec(None))  # small: whole
    for batch, m1 in zip(batches, want, strict=True):
        fields = {k: jax.device_put(v, sharding.field_sharding(sharded.mesh, k != "cu_seqlens"))
                  for k, v in batch.items()}
        if "seq" in mesh:
            assert fields["tokens"].sharding.spec == PartitionSpec(("fsdp", "expert"), "seq")
        got = sharded.step(fields)
        for key in ("ce", "aux", "grad_norm"):
            np.testing.assert_allclose(float(got[key]), m1[key], rtol=1e-4, err_msg=key)
    for a, b in zip(want_params, jax.tree.leaves(sharded.params), strict=True):
        np.testing.assert_allclose(np.asarray(b), a, rtol=1e-4, atol=1e-5)


def test_parse_mesh_errors() -> None:
    assert sharding.parse_mesh("fsdp=2, expert=2") == {"fsdp": 2, "expert": 2}
    for bad in ("model=2", "data=0", "data", "data=2,data=2"):
        with pytest.raises(ValueError, match="--mesh"):
            sharding.parse_mesh(bad)
    with pytest.raises(ValueError, match="xla_force_host_platform_device_count"):
        sharding.make_mesh({"data": 64})


def test_batch_must_split_over_the_mesh() -> None:
    p = get_preset("tiny")
    mesh = sharding.make_mesh({"data": 4})
    with pytest.raises(ValueError, match=r"--batch \(6 rows\) must be a multiple of the 4 devices"):
        Trainer(p.model, dataclasses.replace(p.run, batch=6), Backend("ejk"), mesh)
