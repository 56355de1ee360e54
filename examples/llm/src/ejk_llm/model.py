"""The decoder: parameters as a plain pytree, and the forward pass over any token layout.

``decoder`` runs the layers over tokens of any leading shape (``[B, T]`` in training, one packed
``[T]`` stream in serving); how a layer attends is a function the caller passes (``Attend``), so
training (packed documents), paged serving and the dense-cache loop share every other line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ejk_llm import sharding
from ejk_llm.backends import Backend
from ejk_llm.config import ModelConfig

__all__ = ["Attend", "Params", "decoder", "inference_params", "init_params", "lm_head", "rope", "train_loss"]

Params = dict[str, Any]
#: ``attend(layer, q, k, v, sinks, state) -> (out, state)``: ``q [..., Hq, D]``, ``k, v [..., Hkv, D]``
#: with the rotary embedding applied; ``state`` is whatever the caller threads through (a KV cache).
Attend = Callable[[int, jax.Array, jax.Array, jax.Array, "jax.Array | None", Any], tuple[jax.Array, Any]]

ROUTER_AUX_WEIGHT = 0.01


def init_params(cfg: ModelConfig, key: jax.Array) -> Params:
    """float32 parameters: scaled normal weights, unit norms, zero sinks."""
    d, hq, hkv, hd = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    keys = iter(jax.random.split(key, 2 + 8 * cfg.n_layers))

    def normal(shape: tuple[int, ...], fan_in: int) -> jax.Array:
        w: jax.Array = jax.random.normal(next(keys), shape, jnp.float32) * fan_in ** -0.5
        return w

    layers = []
    for _ in range(cfg.n_layers):
        layer: Params = {
            "attn_norm": jnp.ones((d,), jnp.float32),
            "wq": normal((d, hq, hd), d),
            "wk": normal((d, hkv, hd), d),
            "wv": normal((d, hkv, hd), d),
            "wo": normal((hq, hd, d), hq * hd) / (2 * cfg.n_layers) ** 0.5,
            "mlp_norm": jnp.ones((d,), jnp.float32),
        }
        if cfg.qk_norm:
            layer["q_norm"] = jnp.ones((hd,), jnp.float32)
            layer["k_norm"] = jnp.ones((hd,), jnp.float32)
        if cfg.sinks:
            layer["sinks"] = jnp.zeros((hq,), jnp.float32)
        down_scale = (2 * cfg.n_layers) ** -0.5
        if cfg.moe:
            e = cfg.n_experts
            layer["router"] = normal((d, e), d)
            layer["w_in"] = normal((e, d, 2 * cfg.d_ff), d)  # gate and up projections side by side
            layer["w_out"] = normal((e, cfg.d_ff, d), cfg.d_ff) * down_scale
        else:
            layer["w_in"] = normal((d, 2 * cfg.d_ff), d)
            layer["w_out"] = normal((cfg.d_ff, d), cfg.d_ff) * down_scale
        layers.append(layer)
    return {
        "embed": jax.random.normal(next(keys), (cfg.vocab, d), jnp.float32),
        "layers": layers,
        "final_norm": jnp.ones((d,), jnp.float32),
        "lm_head": normal((d, cfg.vocab), d),
    }


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding of ``x [..., H, D]`` at integer ``positions [...]`` (half-split pairs, as Llama / Qwen)."""
    half = x.shape[-1] // 2
    freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = positions.astype(jnp.float32)[..., None, None] * freq
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def inference_params(cfg: ModelConfig, params: Params) -> Params:
    """``params`` for serving: every matrix cast to the compute dtype once (a step then reads half the bytes of
    float32 master weights and casts nothing); vectors (norm scales, sinks) stay as they are."""
    cast: Params = jax.tree.map(lambda w: w.astype(cfg.compute_dtype) if w.ndim >= 2 else w, params)
    return cast


def _use(w: jax.Array, dtype: Any, keep_experts: bool = False) -> jax.Array:
    """A weight as a layer uses it: cast to the compute dtype, then gathered from its FSDP shards."""
    return sharding.gather(w.astype(dtype), keep_experts=keep_experts)


def _attention_block(cfg: ModelConfig, backend: Backend, p: Params, layer: int, x: jax.Array,
                     positions: jax.Array, attend: Attend, state: Any) -> tuple[jax.Array, Any]:
    dt = cfg.compute_dtype
    h = backend.rms_norm(x, _use(p["attn_norm"], dt), cfg.norm_eps)
    q = jnp.einsum("...d,dhk->...hk", h, _use(p["wq"], dt))
    k = jnp.einsum("...d,dhk->...hk", h, _use(p["wk"], dt))
    v = jnp.einsum("...d,dhk->...hk", h, _use(p["wv"], dt))
    if cfg.qk_norm:  # Qwen3: RMSNorm over each head's dims
        q = backend.rms_norm(q, _use(p["q_norm"], dt), cfg.norm_eps)
        k = backend.rms_norm(k, _use(p["k_norm"], dt), cfg.norm_eps)
    q, k = rope(q, positions, cfg.rope_theta), rope(k, positions, cfg.rope_theta)
    sinks = _use(p["sinks"], jnp.float32) if "sinks" in p else None
    o, state = attend(layer, q, k, v, sinks, state)
    return x + jnp.einsum("...hk,hkd->...d", o, _use(p["wo"], dt)), state


def _swiglu(y: jax.Array) -> jax.Array:
    gate, up = jnp.split(y, 2, axis=-1)
    return jax.nn.silu(gate) * up


def _dense_mlp(cfg: ModelConfig, p: Params, h: jax.Array) -> jax.Array:
    dt = cfg.compute_dtype
    return jnp.einsum("...f,fd->...d", _swiglu(jnp.einsum("...d,df->...f", h, _use(p["w_in"], dt))),
                      _use(p["w_out"], dt))


def _route(cfg: ModelConfig, router: jax.Array, h: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Top-k routing of ``h [N, D]``: expert ids ``[N, k]``, weights ``[N, k]`` (renormalised over the
    top k, float32) and the statistics of the load-balancing loss, ``[2, E]``: each expert's share of the
    assignments and its mean router probability (means over the tokens, so devices with as many tokens
    each combine theirs by a mean)."""
    logits = jnp.einsum("nd,de->ne", h, router, preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    weights, experts = jax.lax.top_k(probs, cfg.top_k)
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    load = jnp.mean(jax.nn.one_hot(experts, cfg.n_experts, dtype=jnp.float32).sum(1), axis=0) / cfg.top_k
    return experts, weights, jnp.stack([load, jnp.mean(probs, axis=0)])


def _balance_loss(cfg: ModelConfig, stats: jax.Array) -> jax.Array:
    """Switch Transformer's load-balancing loss, ``E · Σ_e load_e · prob_e`` (1 when balanced)."""
    return cfg.n_experts * jnp.sum(stats[0] * stats[1])


def _experts(cfg: ModelConfig, backend: Backend, h: jax.Array, experts: jax.Array, weights: jax.Array,
             w_in: jax.Array, w_out: jax.Array) -> jax.Array:
    """Tokens ``h [N, D]`` through their ``k`` experts: sort the ``N·k`` (token, expert) pairs by expert,
    two grouped matmuls over the groups, unsort and mix by the routing weights."""
    n, k = experts.shape
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    group_sizes = jnp.bincount(flat, length=cfg.n_experts).astype(jnp.int32)
    xs = h[order // k]
    ys = backend.grouped_matmul(_swiglu(backend.grouped_matmul(xs, w_in, group_sizes)), w_out, group_sizes)
    y = jnp.zeros_like(ys).at[order].set(ys, unique_indices=True).reshape(n, k, -1)
    return jnp.einsum("nkd,nk->nd", y, weights.astype(y.dtype))


def _moe_mlp(cfg: ModelConfig, backend: Backend, p: Params, h: jax.Array) -> tuple[jax.Array, jax.Array]:
    dt = cfg.compute_dtype
    lead, d = h.shape[:-1], h.shape[-1]
    router = _use(p["router"], dt)
    batched = h.ndim == 3  # [B, T, D] in training; one packed [T, D] stream (replicated) in serving
    if sharding.expert_axis() is not None and backend.is_ejk:
        # Expert parallelism: every device routes every token (the batch is gathered), and ejk's sharded
        # grouped_matmul runs each device's experts on their rows and sums the outputs over the axis.
        flat = sharding.gather(h).reshape(-1, d)
        experts, weights, stats = _route(cfg, router, flat)
        y = _experts(cfg, backend, flat, experts, weights, _use(p["w_in"], dt, keep_experts=True),
                     _use(p["w_out"], dt, keep_experts=True))
        spec = sharding.token_spec() if batched else jax.sharding.PartitionSpec()
        return jax.sharding.reshard(y.reshape(*lead, d), spec), _balance_loss(cfg, stats)

    def local(h: jax.Array, router: jax.Array, w_in: jax.Array, w_out: jax.Array) -> tuple[jax.Array, jax.Array]:
        flat = h.reshape(-1, d)
        experts, weights, stats = _route(cfg, router, flat)
        y = _experts(cfg, backend, flat, experts, weights, w_in, w_out).reshape(h.shape)
        return y, stats[None, None]  # [1, 1, 2, E]: one per device, split like the tokens

    # Each device routes its own tokens with every expert's weights (FSDP: gathered like any weight); the
    # balance loss is taken over the whole batch's statistics, as on one device.
    run = sharding.per_device(local, "trrr") if batched else local
    y, stats = run(h, router, _use(p["w_in"], dt), _use(p["w_out"], dt))
    return y, _balance_loss(cfg, jnp.mean(stats, axis=(0, 1)))


def decoder(cfg: ModelConfig, backend: Backend, params: Params, tokens: jax.Array, positions: jax.Array,
            attend: Attend, state: Any = None) -> tuple[jax.Array, Any, jax.Array]:
    """The final-normed hidden states ``[..., D]`` of ``tokens [...]``, the threaded ``state`` and the
    mean router load-balancing loss (0 for a dense model)."""
    dt = cfg.compute_dtype
    x = sharding.take_rows(_use(params["embed"], dt), tokens)
    aux = jnp.zeros((), jnp.float32)

    def layer_fn(i: int, p: Params, x: jax.Array, state: Any) -> tuple[jax.Array, Any, jax.Array]:
        x, state = _attention_block(cfg, backend, p, i, x, positions, attend, state)
        h = backend.rms_norm(x, _use(p["mlp_norm"], dt), cfg.norm_eps)
        if cfg.moe:
            y, layer_aux = _moe_mlp(cfg, backend, p, h)
        else:
            y, layer_aux = _dense_mlp(cfg, p, h), jnp.zeros((), jnp.float32)
        return x + y, state, layer_aux

    for i, p in enumerate(params["layers"]):
        fn = jax.checkpoint(layer_fn, static_argnums=(0,)) if cfg.remat else layer_fn
        x, state, layer_aux = fn(i, p, x, state)
        aux = aux + layer_aux / cfg.n_layers
    return backend.rms_norm(x, _use(params["final_norm"], dt), cfg.norm_eps), state, aux


def lm_head(cfg: ModelConfig, params: Params) -> jax.Array:
    return _use(params["lm_head"], cfg.compute_dtype)


def train_loss(cfg: ModelConfig, backend: Backend, params: Params, batch: dict[str, jax.Array]) -> tuple[
        jax.Array, dict[str, jax.Array]]:
    """Next-token loss (+ the router's load-balancing term) of a packed batch (``data.Batch``'s fields)."""
    positions, segments, cu = batch["positions"], batch["segments"], batch["cu_seqlens"]

    def attend(layer: int, q: jax.Array, k: jax.Array, v: jax.Array, sinks: jax.Array | None,
               state: Any) -> tuple[jax.Array, Any]:
        return backend.packed_attention(q, k, v, segments, cu, cfg.window(layer), sinks), state

    h, _, aux = decoder(cfg, backend, params, batch["tokens"], positions, attend)
    ce = backend.loss(h.reshape(-1, h.shape[-1]), lm_head(cfg, params), batch["labels"].reshape(-1))
    total = ce + ROUTER_AUX_WEIGHT * aux if cfg.moe else ce
    return total, {"ce": ce, "aux": aux}
