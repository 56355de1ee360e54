"""A training step on four (fake CPU) devices matches the same step on one: data parallel + FSDP for the
dense model, FSDP + experts over a mesh axis (ejk's sharded grouped_matmul) for the MoE."""

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


@pytest.mark.parametrize(("preset", "mesh"), [("tiny", "data=2,fsdp=2"), ("tiny-moe", "fsdp=2,expert=2")])
def test_sharded_steps_match_one_device(preset: str, mesh: str) -> None:
    assert jax.device_count() >= 4, "conftest.py sets XLA_FLAGS=--xla_force_host_platform_device_count=4"
    p = get_preset(preset)
    run = dataclasses.replace(p.run, batch=4)
    one = Trainer(p.model, run, Backend("ejk"), steps=4)
    four = Trainer(p.model, run, Backend("ejk"), sharding.make_mesh(sharding.parse_mesh(mesh)), steps=4)
    w_in = four.params["layers"][0]["w_in"]
    assert w_in.sharding.spec == (PartitionSpec(None, "fsdp") if preset == "tiny"
                                  else PartitionSpec("expert", None, "fsdp"))
    for _, batch in zip(range(2), one.batches(), strict=False):
        sharded_batch = {k: jax.device_put(v, sharding.batch_sharding(four.mesh)) for k, v in batch.items()}
        m1, m4 = one.step(batch), four.step(sharded_batch)
        np.testing.assert_allclose(float(m4["ce"]), float(m1["ce"]), rtol=1e-5)
        np.testing.assert_allclose(float(m4["grad_norm"]), float(m1["grad_norm"]), rtol=1e-4)
    for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(four.params), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)


def test_parse_mesh_errors() -> None:
    assert sharding.parse_mesh("fsdp=2, expert=2") == {"fsdp": 2, "expert": 2}
    for bad in ("model=2", "data=0", "data", "data=2,data=2"):
        with pytest.raises(ValueError, match="--mesh"):
            sharding.parse_mesh(bad)
    with pytest.raises(ValueError, match="xla_force_host_platform_device_count"):
        sharding.make_mesh({"data": 64})
