"""Training: AdamW (optax) on packed synthetic documents, on one device or a mesh.

    python examples/llm/train.py --preset tiny --steps 20
    python examples/llm/train.py --preset tiny --steps 20 --backend plain
    XLA_FLAGS=--xla_force_host_platform_device_count=4 python examples/llm/train.py --preset tiny --mesh data=4
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ejk_llm import sharding
from ejk_llm.backends import BACKENDS, Backend
from ejk_llm.config import PRESETS, ModelConfig, Preset, RunConfig, get_preset
from ejk_llm.data import Batch, SyntheticCorpus
from ejk_llm.model import Params, init_params, train_loss

__all__ = ["Trainer", "device_batch", "main", "optimizer"]


def optimizer(run: RunConfig, steps: int) -> optax.GradientTransformation:
    """AdamW with linear warm-up and cosine decay, global-norm clipping."""
    schedule = optax.warmup_cosine_decay_schedule(0.0, run.lr, max(run.warmup, 1), max(steps, run.warmup + 1),
                                                  end_value=run.lr * 0.1)
    return optax.chain(optax.clip_by_global_norm(run.grad_clip),
                       optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=run.weight_decay))


def device_batch(batch: Batch, mesh: jax.sharding.Mesh | None = None) -> dict[str, jax.Array]:
    """A host batch on the devices, its rows split over the mesh's axes."""
    return {f.name: jax.device_put(np.asarray(getattr(batch, f.name)),
                                   sharding.field_sharding(mesh, per_token=f.name != "cu_seqlens"))
            for f in dataclasses.fields(batch)}


@dataclasses.dataclass
class Trainer:
    """Parameters, optimizer state and a jitted step for one preset, backend and mesh."""

    model: ModelConfig
    run: RunConfig
    backend: Backend
    mesh: jax.sharding.Mesh | None = None
    steps: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        sizes = {} if self.mesh is None else dict(self.mesh.shape)
        row_split = int(np.prod([n for a, n in sizes.items() if a != "seq"]))
        if self.run.batch % row_split:
            raise ValueError(f"--batch ({self.run.batch} rows) must be a multiple of the {row_split} devices the mesh "
                             f"splits rows over (e.g. --batch {row_split * self.run.batch})")
        if self.run.seq_len % sizes.get("seq", 1):
            raise ValueError(f"seq_len ({self.run.seq_len}) must be a multiple of the mesh's seq axis "
                             f"({sizes['seq']})")
        self.opt = optimizer(self.run, self.steps)
        with self._mesh():
            shapes = jax.eval_shape(functools.partial(init_params, self.model), jax.random.key(self.seed))
            self.param_sharding = sharding.param_shardings(shapes, self.mesh)
            init = jax.jit(functools.partial(init_params, self.model), out_shardings=self.param_sharding)
            self.params: Params = init(jax.random.key(self.seed))
            self.opt_state = jax.jit(self.opt.init)(self.params)
        self.corpus = SyntheticCorpus(self.model.vocab, self.run.min_doc, self.run.max_doc, seed=self.seed)
        self._step = jax.jit(self._train_step, donate_argnums=(0, 1))
        self._loss = jax.jit(functools.partial(train_loss, self.model, self.backend))

    def _mesh(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext() if self.mesh is None else jax.set_mesh(self.mesh)

    def _train_step(self, params: Params, opt_state: Any, batch: dict[str, jax.Array]) -> tuple[
            Params, Any, dict[str, jax.Array]]:
        (_, metrics), grads = jax.value_and_grad(
            functools.partial(train_loss, self.model, self.backend), has_aux=True)(params, batch)
        updates, opt_state = self.opt.update(grads, opt_state, params)
        metrics = {**metrics, "grad_norm": jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))}
        return optax.apply_updates(params, updates), opt_state, metrics

    def batches(self) -> Iterator[dict[str, jax.Array]]:
        while True:
            yield device_batch(self.corpus.batch(self.run.batch, self.run.seq_len, self.run.max_docs), self.mesh)

    def loss(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The loss of the current parameters on ``batch`` (no update)."""
        with self._mesh():
            return self._loss(self.params, batch)  # type: ignore[no-any-return]

    def step(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """One optimizer step; returns the step's metrics (``ce`` before the update, ``aux``, ``grad_norm``)."""
        with self._mesh():
            self.params, self.opt_state, metrics = self._step(self.params, self.opt_state, batch)
        out: dict[str, jax.Array] = metrics
        return out


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--backend", default="ejk", choices=BACKENDS)
    parser.add_argument("--mesh", default="",
                        help="mesh axes, e.g. data=4, fsdp=2,expert=2 or fsdp=2,seq=2 (default: one device)")
    parser.add_argument("--dtype", default=None, help="compute dtype override (float32, bfloat16)")
    parser.add_argument("--seed", type=int, default=0)


def preset_from_args(args: argparse.Namespace, **overrides: Any) -> Preset:
    if args.dtype:
        overrides["dtype"] = args.dtype
    return get_preset(args.preset, **overrides)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=None, help="rows per step (default: the preset's)")
    parser.add_argument("--log-every", type=int, default=1)
    args = parser.parse_args(argv)
    preset = preset_from_args(args, **({"batch": args.batch} if args.batch else {}))
    mesh = sharding.make_mesh(sharding.parse_mesh(args.mesh))
    total, active = preset.model.param_count()
    print(f"preset {args.preset}: {total / 1e6:.1f}M parameters ({active / 1e6:.1f}M active), "
          f"{preset.run.batch} x {preset.run.seq_len} tokens per step, backend {args.backend}, "
          f"mesh {dict(mesh.shape) if mesh else 'none'}, devices {jax.devices()[0].device_kind} x {jax.device_count()}")
    trainer = Trainer(preset.model, preset.run, Backend(args.backend), mesh, steps=args.steps, seed=args.seed)
    tokens = preset.run.batch * preset.run.seq_len
    batches = trainer.batches()
    start = time.perf_counter()
    for step in range(args.steps):
        metrics = trainer.step(next(batches))  # dispatched: the next batch is made while this step runs
        if step == 0 or step % args.log_every == 0 or step == args.steps - 1:
            metrics = jax.device_get(metrics)
        if step == 0:
            first, start = time.perf_counter() - start, time.perf_counter()
        if step % args.log_every == 0 or step == args.steps - 1:
            speed = (f"{tokens * step / (time.perf_counter() - start):,.0f} tok/s" if step
                     else f"first step {first:.1f} s (compilation)")
            aux = f"  aux {float(metrics['aux']):.3f}" if preset.model.moe else ""
            print(f"step {step:4d}  loss {float(metrics['ce']):.4f}{aux}  grad-norm {float(metrics['grad_norm']):.3f}"
                  f"  {speed}", flush=True)

if __name__ == "__main__":
    main()
