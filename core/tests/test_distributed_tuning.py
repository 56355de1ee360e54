"""Multi-process tuning on localhost: two CPU processes under ``jax.distributed``, one tuning run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

CODE = textwrap.dedent(
    """
    import json, sys
    import attrs, jax, jax.numpy as jnp
    import ejk
    from ejk import AutotunePolicy, ConfigSelectorChain, Executor, Kernel

    port, process, cache = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2, process_id=process)

    @attrs.frozen
    class Cfg:
        reps: int

    class Chain(Kernel):
        op_id, version, cfg_type = "chain", "1", Cfg
        timed = 0

        def run(self, x, *, cfg):
            return jax.lax.fori_loop(0, cfg.reps, lambda i, y: jnp.tanh(y @ x), x)

        def heuristic_cfg(self, inv):
            return Cfg(3)

        def candidate_cfgs(self, inv):
            return (Cfg(40), Cfg(1), Cfg(20))

        def tuning_args(self, inv, seed=0):
            Chain.timed += 1
            return super().tuning_args(inv, seed)

    events = []
    policy = AutotunePolicy(autotune=True, warmup=1, repeats=3, progress=False, check_outputs=False)
    chain = ConfigSelectorChain(policy=policy, on_event=events.append, plugin_host=False, persistent_dir=cache)
    x = jnp.eye(64, dtype=jnp.float32) * 0.5
    out = Executor(chain)(Chain(), x)
    jax.block_until_ready(out)
    print(json.dumps({"tiers": [e.tier for e in events], "cfg": [attrs.asdict(e.cfg) for e in events][-1:],
                      "timed": Chain.timed}))
    jax.distributed.shutdown()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


def test_one_process_tunes_the_others_receive(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EJK_", "EJKERNEL_"))}
    env.update(JAX_PLATFORMS="cpu", EJK_PLUGINS="none")
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, "-c", CODE, port, str(i), str(tmp_path / f"cache{i}")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, out + err
        results.append(json.loads(out.strip().splitlines()[-1]))
    leader, follower = results
    assert leader["timed"] >= 1 and follower["timed"] == 0  # one tuning run, in process 0
    assert follower["tiers"] == ["distributed"]
    assert "autotune" in leader["tiers"] and leader["cfg"] == follower["cfg"]  # the same choice everywhere
    assert json.loads((tmp_path / "cache0" / "chain.json").read_text())["entries"]  # process 0 persisted it
    assert not (tmp_path / "cache1" / "chain.json").exists()
