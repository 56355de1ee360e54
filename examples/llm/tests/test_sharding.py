"""Training steps on eight (fake CPU) devices match the same steps on one: data parallel, FSDP and experts
over a mesh axis together."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from ejk_llm import sharding
from ejk_llm.backends import Backend
from ejk_llm.config import get_preset
from ejk_llm.train import Trainer


def test_sharded_steps_match_one_device() -> None:
    """Every axis at once on 8 CPU devices: rows over all three, dense weights and experts' k dim over
    ``fsdp``, experts over ``expert`` (ejk's sharded grouped_matmul), attention per device."""
    assert jax.device_count() >= 8, "conftest.py sets XLA_FLAGS=--xla_force_host_platform_device_count=8"
    p = get_preset("tiny-moe")
    run = dataclasses.replace(p.run, batch=8)
    one = Trainer(p.model, run, Backend("ejk"), steps=4)
    mesh = sharding.make_mesh(sharding.parse_mesh("data=2,fsdp=2,expert=2"))
    eight = Trainer(p.model, run, Backend("ejk"), mesh, steps=4)
    layer = eight.params["layers"][0]
    assert layer["w_in"].sharding.spec == PartitionSpec("expert", None, "fsdp")  # [E, D, 2F]
    assert layer["wq"].sharding.spec == PartitionSpec("fsdp", None, None)  # [D, H, hd]
    assert layer["sinks"].sharding.spec in (PartitionSpec(), PartitionSpec(None))  # small: whole
    for _, batch in zip(range(2), one.batches(), strict=False):
        sharded_batch = {k: jax.device_put(v, sharding.batch_sharding(mesh)) for k, v in batch.items()}
        assert sharded_batch["tokens"].sharding.spec == PartitionSpec(("data", "fsdp", "expert"))
        m1, m8 = one.step(batch), eight.step(sharded_batch)
        np.testing.assert_allclose(float(m8["ce"]), float(m1["ce"]), rtol=1e-5)
        np.testing.assert_allclose(float(m8["aux"]), float(m1["aux"]), rtol=1e-5)
        np.testing.assert_allclose(float(m8["grad_norm"]), float(m1["grad_norm"]), rtol=1e-4)
    for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(eight.params), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)


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
    with pytest.raises(ValueError, match=r"--batch \(6 rows\) must be a multiple of the mesh's 4 devices"):
        Trainer(p.model, dataclasses.replace(p.run, batch=6), Backend("ejk"), mesh)
