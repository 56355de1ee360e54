"""``flash_attention`` in ``ejk bench``: its cases, presets, ``--shapes`` syntax and work.

FLOPs (a multiply-add is 2): ``2·B·Hq·Sq·Sk·(D + Dv)`` forward (``4·B·Hq·Sq·Sk·D`` when ``Dv = D``),
halved when causal (the usual convention, the exact count is ``(S+1)/2S`` of the full one); with a
causal sliding window of ``w`` keys each row sees at most ``w + 1`` keys, so ``Sk`` becomes
``min(Sk, w + 1)`` (not halved); forward + backward is 3.5x the forward (2 matmuls forward, 5
backward). Sinks add no FLOPs: cases with and without them measure their overhead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import attrs
import jax

from ejk.ops._workload import TFLOPS, Case, OpBench, Workload, dims, fixed_kwargs, int_options, normal

__all__ = ["BENCH", "AttentionCase", "AttentionWorkload"]


@attrs.frozen(kw_only=True)
class AttentionCase(Case):
    """``flash_attention`` on ``q, k [batch, seq, heads / kv_heads, dim]`` and ``v [batch, seq, kv_heads, dv]``
    (``dv`` None: ``dim``)."""

    op: ClassVar[str] = "flash_attention"
    x_name: ClassVar[str] = "sequence length"
    batch: int
    seq: int
    heads: int
    dim: int
    kv_heads: int = attrs.field()
    causal: bool = False
    dv: int | None = None
    #: Left sliding window (causal cases; ``None``: none).
    window: int | None = None
    #: Attention sinks (one per query head; their gradient is taken with q, k, v).
    sinks: bool = False

    @kv_heads.default
    def _all_heads(self) -> int:
        return self.heads

    @property
    def v_dim(self) -> int:
        return self.dim if self.dv is None else self.dv

    @property
    def _dims(self) -> str:
        return f"{self.dim}/{self.v_dim}" if self.v_dim != self.dim else f"{self.dim}"

    @property
    def _extras(self) -> str:
        return (f" w{self.window}" if self.window is not None else "") + (" sinks" if self.sinks else "")

    @property
    def label(self) -> str:
        gqa = f" kv={self.kv_heads}" if self.kv_heads != self.heads else ""
        return (f"[{self.batch},{self.seq},{self.heads},{self._dims}]{gqa} {'causal' if self.causal else 'full'}"
                f"{self._extras}")

    @property
    def series(self) -> str:
        gqa = f" GQA {self.heads // self.kv_heads}:1" if self.kv_heads != self.heads else ""
        return f"D={self._dims} H={self.heads}{gqa} {'causal' if self.causal else 'full'}{self._extras}"

    @property
    def x(self) -> int:
        return self.seq


@attrs.frozen(kw_only=True)
class AttentionWorkload(Workload):
    case: AttentionCase
    diff: tuple[int, ...] = attrs.field()

    @diff.default
    def _differentiated(self) -> tuple[int, ...]:
        return (0, 1, 2, 3) if self.case.sinks else (0, 1, 2)

    def inputs(self, seed: int = 0) -> tuple[Any, ...]:
        c = self.case
        kq, kk, kv, ks = jax.random.split(jax.random.key(seed), 4)
        qkv = (normal(kq, (c.batch, c.seq, c.heads, c.dim), self.dtype),
               normal(kk, (c.batch, c.seq, c.kv_heads, c.dim), self.dtype),
               normal(kv, (c.batch, c.seq, c.kv_heads, c.v_dim), self.dtype))
        return (*qkv, normal(ks, (c.heads,), jax.numpy.float32)) if c.sinks else qkv

    def kwargs(self) -> dict[str, Any]:
        window = {} if self.case.window is None else {"sliding_window": (self.case.window, 0)}
        return {"causal": self.case.causal, **window}

    def split_inputs(self, inputs: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(q, k, v)`` positional; the sinks, when the case has them, by keyword."""
        if not self.case.sinks:
            return tuple(inputs), fixed_kwargs(self)
        q, k, v, sinks = inputs
        return (q, k, v), {**fixed_kwargs(self), "sinks": sinks}

    def out_shape(self) -> tuple[int, ...]:
        c = self.case
        return (c.batch, c.seq, c.heads, c.v_dim)

    def work(self, mode: str) -> tuple[float, str]:
        c = self.case
        keys = min(c.seq, c.window + 1) if c.window is not None and c.causal else c.seq
        halved = c.causal and c.window is None
        flops = 2.0 * c.batch * c.heads * c.seq * keys * (c.dim + c.v_dim) / (2 if halved else 1)
        return flops * (3.5 if mode == "fwd+bwd" else 1.0), TFLOPS


_TOKENS = 16384  # the sweep keeps batch x seq constant, so each point does similar work


def _presets() -> tuple[AttentionCase, ...]:
    # [4,4096,16,128] and [2,8192,16,128] (the plugin issues' shapes) are points of the sweep.
    seqs = {False: (1024, 4096, 8192, 16384), True: (1024, 2048, 4096, 8192, 16384)}
    sweep = tuple(AttentionCase(batch=_TOKENS // s, seq=s, heads=16, dim=128, causal=c)
                  for c in (False, True) for s in seqs[c])
    d64 = tuple(AttentionCase(batch=4, seq=4096, heads=32, dim=64, causal=c) for c in (False, True))
    d256 = tuple(AttentionCase(batch=4, seq=4096, heads=16, dim=256, causal=c) for c in (False, True))
    gqa = (AttentionCase(batch=4, seq=4096, heads=16, kv_heads=4, dim=128, causal=True),
           AttentionCase(batch=4, seq=4096, heads=32, kv_heads=8, dim=128, causal=True))
    # DeepSeek-V3 / R1 prefill and training (MLA, not absorbed): q/k 192 = 128 + 64 rotary, v 128.
    mla = tuple(AttentionCase(batch=_TOKENS // s, seq=s, heads=16, dim=192, dv=128, causal=True) for s in (4096, 8192))
    # Sinks (issue 29): gpt-oss's sliding-window layers ([4,4096,64,64], window 128) with and without sinks,
    # and [4,4096,16,128] causal with sinks (the sweep holds it without), to report their overhead.
    window = tuple(AttentionCase(batch=4, seq=4096, heads=64, dim=64, causal=True, window=128, sinks=s)
                   for s in (False, True))
    sinks = (*window, AttentionCase(batch=4, seq=4096, heads=16, dim=128, causal=True, sinks=True))
    return sweep + d64 + d256 + gqa + mla + sinks


def _parse(text: str, options: dict[str, str], spec: str) -> AttentionCase:
    """``attention:BxSxHxD[:causal][,kv=Hkv][,dv=Dv][,window=W][,sinks]`` (a window needs ``causal``)."""
    b, s, h, d = dims(text, 4, "BxSxHxD, e.g. 4x4096x16x128")
    causal = "causal" in options
    sinks = "sinks" in options
    options.pop("causal", None)
    options.pop("sinks", None)
    opts = int_options(options, ("kv", "dv", "window"), spec)
    if h % opts.get("kv", h):
        raise ValueError(f"--shapes {spec!r}: kv={opts['kv']} must divide the {h} query heads")
    if "window" in opts and not causal:
        raise ValueError(f"--shapes {spec!r}: window= needs causal (a left window of causal attention)")
    return AttentionCase(batch=b, seq=s, heads=h, dim=d, kv_heads=opts.get("kv", h), causal=causal,
                         dv=opts.get("dv"), window=opts.get("window"), sinks=sinks)


BENCH = OpBench(
    case=AttentionCase, workload=AttentionWorkload, preset="attention", parse=_parse, presets=_presets(),
    quick=(AttentionCase(batch=1, seq=64, heads=2, dim=32, causal=True),
           AttentionCase(batch=1, seq=128, heads=2, dim=32, causal=True)),
)
