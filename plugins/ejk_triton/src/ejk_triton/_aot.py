"""Compiling the Triton kernels for an NVIDIA target ahead of time, on any machine.

Triton lowers to PTX and assembles a cubin with the ``ptxas`` its wheel ships, so no GPU is
needed: CI uses this to check that the kernels compile for sm_90 with the configs the GPU will
run, and the shared memory each kernel needs (which decides whether a config can launch).
Needs compiled Triton: the process must not run with ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import math
import re
from typing import Any

import attrs
import jax
import jax.numpy as jnp

from ejk.plugin import fit_block as _fit
from ejk_triton import _env, _grouped_matmul, _matmul
from ejk_triton._flash_attention import FlashAttentionConfig, _constexprs, _dbias_layout, heuristic_config

__all__ = ["compile_flash_attention", "compile_gla_backward", "compile_grouped_matmul", "compile_linear_recurrence",
           "compile_matmul", "compile_mla_paged_attention", "compile_ragged_paged_attention", "compile_rms_norm"]

_TRITON_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "int32": "i32"}


def _ptr(dtype: Any) -> str:
    return "*" + _TRITON_DTYPES[jnp.dtype(dtype).name]


def _compile(fn: Any, pointers: list[str], consts: dict[str, Any], num_warps: int, num_stages: int,
             arch: int) -> dict[str, int]:
    kernel = _compile_kernel(fn, pointers, consts, num_warps, num_stages, arch)
    return {"shared": int(kernel.metadata.shared), "num_warps": num_warps, "num_stages": num_stages}


def _registers(kernel: Any) -> dict[str, int]:
    """``{"registers", "spilled"}`` of a compiled kernel: registers per thread and bytes of local memory
    per thread (spills), read from its cubin by the ``cuobjdump`` Triton ships."""
    import subprocess
    import tempfile

    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", cubin.name], check=True,
                               capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    if found is None:
        raise RuntimeError(f"cuobjdump reported no resource usage: {usage[-500:]}")
    return {"registers": int(found.group(1)), "spilled": int(found.group(2))}


def _compile_kernel(fn: Any, pointers: list[str], consts: dict[str, Any], num_warps: int, num_stages: int,
                    arch: int) -> Any:
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature: dict[str, str] = {fn.arg_names[i]: p for i, p in enumerate(pointers)}
    signature.update({name: "constexpr" for name in consts})
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(pointers))}
    source = ASTSource(fn, signature=signature, constexprs=consts, attrs=attrs)
    return triton_compile(source, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def compile_flash_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    cfg: FlashAttentionConfig | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    sliding_window: tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    segment_ids: bool = False,
    bias: Any = None,
    sinks: bool = False,
    precision: str = "highest",
    arch: int = 90,
) -> dict[str, dict[str, int]]:
    """Compile the four kernels one call would launch, for compute capability ``arch``.

    Args:
        q, k, v: Abstract arrays (``jax.ShapeDtypeStruct``) as for :func:`ejk_triton._flash_attention.forward`.
        cfg: Tiles (``None``: :func:`heuristic_config` for a GPU).
        causal, softmax_scale, sliding_window, logits_soft_cap: As for :func:`ejk_triton._flash_attention.forward`.
        segment_ids: Whether the call has segment ids.
        bias: Abstract bias or ``None``.
        sinks: Whether the call has attention sinks.
        precision: Of float32 dots (``"highest"``: IEEE).
        arch: Compute capability as an int (90 for sm_90).

    Returns:
        Per kernel (``forward``, ``preprocess``, ``dkdv``, ``dq``): its shared memory in bytes,
        warps and stages.

    Raises:
        RuntimeError: in the interpreter mode (nothing is compiled there).
    """
    _compiled_mode()
    from ejk_triton import _attention_kernels as kernels

    cfg = cfg if cfg is not None else heuristic_config(q, k, v, causal=causal)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(int(q.shape[3]))
    consts = _constexprs(q, k, v, bias, segment_ids, causal=causal, softmax_scale=scale,
                         sliding_window=sliding_window, logits_soft_cap=logits_soft_cap, precision=precision)
    q_len, kv_len = int(q.shape[1]), int(k.shape[1])
    seg = _ptr(jnp.int32) if segment_ids else _ptr(q.dtype)
    inputs = [_ptr(q.dtype), _ptr(k.dtype), _ptr(v.dtype), seg, seg, _ptr(bias.dtype if bias is not None else q.dtype)]
    f32 = _ptr(jnp.float32)
    backward_inputs = [*inputs, _ptr(q.dtype), f32, f32]
    pre_m = _fit(64, q_len)
    return {
        "forward": _compile(kernels.flash_fwd_kernel, [*inputs, f32 if sinks else _ptr(q.dtype), _ptr(q.dtype), f32],
                            dict(consts, BLOCK_M=_fit(cfg.block_m, q_len), BLOCK_N=_fit(cfg.block_n, kv_len),
                                 HAS_SINKS=bool(sinks)),
                            cfg.num_warps, cfg.num_stages, arch),
        "preprocess": _compile(kernels.flash_bwd_preprocess_kernel, [_ptr(q.dtype), _ptr(q.dtype), f32],
                               dict(SQ=q_len, HQ=consts["HQ"], DV=consts["DV"], HEAD_DIM_V=consts["HEAD_DIM_V"],
                                    BLOCK_M=pre_m), 4, 1, arch),
        "dkdv": _compile(kernels.flash_bwd_dkdv_kernel, [*backward_inputs, _ptr(k.dtype), _ptr(v.dtype)],
                         dict(consts, BLOCK_M=_fit(cfg.bwd_block_m, q_len), BLOCK_N=_fit(cfg.bwd_block_n, kv_len)),
                         cfg.bwd_num_warps, cfg.bwd_num_stages, arch),
        "dq": _compile(kernels.flash_bwd_dq_kernel, [*backward_inputs, _ptr(q.dtype), f32],
                       dict(consts, BLOCK_M=_fit(cfg.bwd_block_n, q_len), BLOCK_N=_fit(cfg.bwd_block_m, kv_len),
                            **_dbias_layout(q, bias)[1]),
                       cfg.bwd_num_warps, cfg.bwd_num_stages, arch),
    }


def _compile_launch(fn: Any, pointers: list[str], args: dict[str, Any], arch: int) -> dict[str, int]:
    """Compile ``fn`` with the constexprs of a ``launch`` argument dict (grid and outputs dropped)."""
    consts = {k: v for k, v in args.items() if k not in ("grid", "out_shapes", "num_warps", "num_stages")}
    return _compile(fn, pointers, consts, args["num_warps"], args["num_stages"], arch)


def _compiled_mode() -> None:
    if _env.interpret_mode():
        raise RuntimeError(f"{_env.INTERPRET_ENV}=1: the kernels are interpreted, not compiled, in this process")
    _env.import_triton()


def compile_matmul(m: int, n: int, k: int, dtype: Any = jnp.bfloat16, *, cfg: _matmul.MatmulConfig | None = None,
                   precision: Any = "highest", arch: int = 90) -> dict[str, dict[str, int]]:
    """Compile the matmul kernel as ``[m, k] @ [k, n]`` and its two gradients launch it, for ``arch``.

    Returns:
        Per launch (``forward``, ``d_a`` with ``b`` read transposed, ``d_b`` with ``a`` read
        transposed): shared memory in bytes, warps and stages.
    """
    _compiled_mode()
    from ejk_triton import _matmul_kernels as kernels

    a, b = jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((k, n), dtype)
    cfg = cfg if cfg is not None else _matmul.heuristic_config(a, b)
    common = dict(batch=1, red=1, dtype=dtype, out_dtype=dtype, precision=precision)
    unsplit = attrs.evolve(cfg, split_k=1)  # the gradients never split
    launches = {
        "forward": _matmul.kernel_args(m=m, n=n, k=k, a=(0, 0, k, 1), b=(0, 0, n, 1), cfg=cfg, **common),
        "d_a": _matmul.kernel_args(m=m, n=k, k=n, a=(0, 0, n, 1), b=(0, 0, 1, n), cfg=unsplit, **common),
        "d_b": _matmul.kernel_args(m=k, n=n, k=m, a=(0, 0, 1, k), b=(0, 0, n, 1), cfg=unsplit, **common),
    }
    return {name: _compile_launch(kernels.matmul_kernel, [_ptr(dtype)] * 2 + [_ptr(args["out_shapes"][0].dtype)],
                                  args, arch)
            for name, args in launches.items()}


def compile_grouped_matmul(m: int, k: int, n: int, groups: int, dtype: Any = jnp.bfloat16, *,
                           cfg: _grouped_matmul.GroupedMatmulConfig | None = None, precision: Any = "highest",
                           activation: str | None = None, arch: int = 90) -> dict[str, dict[str, int]]:
    """Compile the grouped matmul kernels for ``[m, k] x [groups, k, n]`` and its gradients, for ``arch``
    (``activation``: the forward with that gated epilogue, out ``[m, n / 2]``).

    Returns:
        Per launch (``forward``, ``d_lhs`` with ``rhs`` read transposed, ``d_rhs``): shared
        memory in bytes, warps and stages.
    """
    _compiled_mode()
    from ejk_triton import _grouped_kernels as kernels

    lhs, rhs = jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((groups, k, n), dtype)
    cfg = cfg if cfg is not None else _grouped_matmul.heuristic_config(lhs, rhs, None, activation=activation)
    ptrs = [_ptr(dtype), _ptr(dtype), _ptr(jnp.int32), _ptr(dtype)]
    common = dict(groups=groups, dtype=dtype, out_dtype=dtype, precision=precision, cfg=cfg)
    return {
        "forward": _compile_launch(kernels.grouped_matmul_kernel, ptrs, _grouped_matmul.product_args(
            m=m, n=n, k=k, transpose_w=False, gated=activation is not None, **common), arch),
        "d_lhs": _compile_launch(kernels.grouped_matmul_kernel, ptrs, _grouped_matmul.product_args(
            m=m, n=k, k=n, transpose_w=True, **common), arch),
        "d_rhs": _compile_launch(kernels.grouped_outer_kernel, ptrs, _grouped_matmul.outer_args(
            m=m, n=n, k=k, **common), arch),
    }


def compile_ragged_paged_attention(
    q: Any,
    k_pages: Any,
    v_pages: Any,
    page_indices: Any,
    *,
    cfg: Any = None,
    sliding_window: tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    sinks: bool = False,
    arch: int = 90,
) -> dict[str, int]:
    """Compile the ragged paged attention kernel one call would launch, for compute capability ``arch``.

    Args:
        q, k_pages, v_pages, page_indices: Abstract arrays as for
            :func:`ejk_triton._paged_attention.ragged_paged_attention`.
        cfg: Its config (``None``: :func:`ejk_triton._paged_attention.heuristic_config` for a GPU).
        sliding_window, logits_soft_cap: As for the op.
        sinks: Whether the call has attention sinks.
        arch: Compute capability as an int (90 for sm_90).

    Returns:
        Its shared memory in bytes, warps and stages.

    Raises:
        RuntimeError: in the interpreter mode (nothing is compiled there).
    """
    _compiled_mode()
    from ejk_triton import _paged_attention as pa
    from ejk_triton import _paged_kernels

    cfg = cfg if cfg is not None else pa.heuristic_config(q, k_pages, v_pages, None, page_indices, None, None)
    consts = pa._kernel_args(q, k_pages, v_pages, page_indices, scale=1.0 / math.sqrt(int(q.shape[2])),
                             left=None if sliding_window is None else sliding_window[0], cap=logits_soft_cap,
                             cfg=cfg)
    i32, f32 = _ptr(jnp.int32), _ptr(jnp.float32)
    pointers = [_ptr(q.dtype), _ptr(k_pages.dtype), _ptr(v_pages.dtype), i32, i32, i32, i32,
                f32 if sinks else _ptr(q.dtype), _ptr(q.dtype), f32, f32, f32, i32]
    return _compile(_paged_kernels.paged_attention_kernel, pointers, dict(consts, HAS_SINKS=bool(sinks)),
                    cfg.num_warps, cfg.num_stages, arch)



def compile_mla_paged_attention(q: Any, kv_pages: Any, page_indices: Any, *, v_head_dim: int, cfg: Any = None,
                                causal: bool = True, arch: int = 90) -> dict[str, int]:
    """Compile the latent paged attention kernel one call would launch, for compute capability ``arch``.

    Args:
        q, kv_pages, page_indices: Abstract arrays as for :func:`ejk_triton._mla_attention.mla_paged_attention`.
        v_head_dim: Value dims.
        cfg: Its config (``None``: :func:`ejk_triton._mla_attention.heuristic_config` for a GPU).
        causal: As for the op.
        arch: Compute capability as an int (90 for sm_90).

    Returns:
        Its shared memory in bytes, warps and stages.

    Raises:
        RuntimeError: in the interpreter mode (nothing is compiled there).
    """
    _compiled_mode()
    from ejk_triton import _mla_attention as mla
    from ejk_triton import _mla_kernels

    cfg = cfg if cfg is not None else mla.heuristic_config(q, kv_pages, None, page_indices, v_head_dim=v_head_dim)
    consts = mla.kernel_args(q, kv_pages, page_indices, v_head_dim=v_head_dim,
                             scale=1.0 / math.sqrt(int(q.shape[3])), causal=causal, cfg=cfg)
    i32, f32 = _ptr(jnp.int32), _ptr(jnp.float32)
    pointers = [_ptr(q.dtype), _ptr(kv_pages.dtype), i32, i32, _ptr(q.dtype), f32, f32, f32]
    return _compile(_mla_kernels.mla_kernel, pointers, consts, cfg.num_warps, cfg.num_stages, arch)

def compile_linear_recurrence(k: int, v: int, dtype: Any = jnp.bfloat16, *, scalar_gate: bool = False,
                              heads: int = 32, qk_heads: int | None = None, cfg: Any = None, varlen: bool = True,
                              arch: int = 90) -> dict[str, int]:
    """Compile the ``gla`` (per-channel gates) or ``ssd`` (``scalar_gate``) forward kernels (states,
    ``gla``'s intra-chunk weights, output) for a state ``[k, v]`` and ``dtype`` inputs, for compute capability
    ``arch``.

    Returns:
        The largest shared memory of them in bytes, warps and stages.

    Raises:
        RuntimeError: in the interpreter mode (nothing is compiled there).
    """
    _compiled_mode()
    from ejk.plugin import next_pow2
    from ejk_triton import _dots, _linear_kernels
    from ejk_triton._linear_attention import LinearAttentionConfig

    cfg = cfg if cfg is not None else LinearAttentionConfig()
    block_k = next_pow2(max(k, 16))
    x, f32, i32 = _ptr(dtype), _ptr(jnp.float32), _ptr(jnp.int32)
    common = dict(T=4096, H=heads, HQK=qk_heads or heads, K=k, V=v, BT=cfg.chunk,
                  BV=min(cfg.state_block_v, next_pow2(max(v, 16))), SCALAR_GATE=scalar_gate, VARLEN=varlen,
                  PREC=_dots.dot_precision(dtype, "high"))
    # ssd's: v = dt·x formed in the kernels, the D skip connection added by the output kernel
    states = _compile(_linear_kernels.linear_states_fwd, [x, x, f32, f32, i32, f32, x, f32],
                      dict(common, BK=min(cfg.state_block_k, block_k), HAS_H0=True, ROW_SCALE=scalar_gate),
                      cfg.state_warps, cfg.state_stages, arch)
    output = _compile(_linear_kernels.linear_output_fwd, [x, x, x, f32, x, f32, i32, i32, f32, f32, x],
                      dict(common, BV=min(cfg.output_block_v, next_pow2(max(v, 16))), BK=block_k, SCALE=k ** -0.5,
                           ROW_SCALE=scalar_gate, HAS_SKIP=scalar_gate), cfg.num_warps, cfg.num_stages, arch)
    if not scalar_gate:
        intra = _compile(_linear_kernels.gla_intra_fwd, [x, x, f32, i32, i32, f32],
                         dict(T=4096, H=heads, HQK=qk_heads or heads, K=k, BT=cfg.chunk, BC=min(16, cfg.chunk),
                              BK=block_k, VARLEN=varlen, PREC=common["PREC"]), cfg.intra_warps, cfg.num_stages, arch)
        output = dict(output, shared=max(output["shared"], intra["shared"]))
    return dict(output, shared=max(states["shared"], output["shared"]))


def compile_gla_backward(k: int, v: int, dtype: Any = jnp.bfloat16, *, heads: int = 32, qk_heads: int | None = None,
                         cfg: Any = None, varlen: bool = True, scalar_gate: bool = False,
                         arch: int = 90) -> dict[str, int]:
    """Compile the recurrence's backward kernels at the backward's chunk for a state ``[k, v]`` and ``dtype``
    inputs, for ``arch``: ``gla``'s (the reverse state cotangents, the state terms and ``dA``, the intra-chunk
    terms, ``dv``) or, with ``scalar_gate``, ``ssd``'s (float32 states; the reverse state cotangents, ``dq`` /
    ``dk`` / ``dg`` with ``v = dt·x`` formed in the kernel, ``dx`` with the ``D`` skip connection; ``qk_heads``
    groups of ``B`` / ``C``).

    Returns:
        The largest shared memory of them in bytes, warps and stages.
    """
    _compiled_mode()
    from ejk.plugin import next_pow2
    from ejk_triton import _dots, _linear_kernels
    from ejk_triton._linear_attention import LinearAttentionConfig

    cfg = cfg if cfg is not None else LinearAttentionConfig()
    block_k = next_pow2(max(k, 16))
    state_k = min(cfg.block_k, block_k)
    x, f32, i32 = _ptr(dtype), _ptr(jnp.float32), _ptr(jnp.int32)
    common = dict(T=4096, H=heads, K=k, V=v, BT=cfg.backward_chunk, BV=min(cfg.block_v, next_pow2(max(v, 16))),
                  SCALE=k ** -0.5, VARLEN=varlen, PREC=_dots.dot_precision(dtype, "high"))
    intra = dict(T=4096, H=heads, K=k, BT=cfg.backward_chunk, BC=min(16, cfg.backward_chunk), VARLEN=varlen,
                 PREC=common["PREC"])
    hqk = qk_heads or heads
    state = f32 if scalar_gate else x
    built = [_compile(_linear_kernels.linear_dstates_bwd, [x, f32, x, f32, i32, state, f32],
                      dict(common, HQK=hqk, BK=state_k, SCALAR_GATE=scalar_gate), cfg.num_warps, cfg.num_stages,
                      arch)]
    if scalar_gate:
        built += [
            _compile(_linear_kernels.scalar_dqk_bwd, [x, x, x, f32, x, f32, f32, i32, i32, f32, f32, f32, f32],
                     dict(common, HQK=hqk, BK=state_k, ROW_SCALE=True), cfg.num_warps, cfg.num_stages, arch),
            _compile(_linear_kernels.scalar_dx_bwd, [x, x, x, f32, x, f32, i32, i32, f32, f32, x, f32, f32],
                     dict(common, HQK=hqk, BK=block_k, HAS_SKIP=True), cfg.num_warps, cfg.num_stages, arch),
        ]
    else:
        built += [
            _compile(_linear_kernels.gla_inter_bwd, [x, x, x, f32, x, x, x, i32, i32, f32, f32, f32],
                     dict(common, BK=state_k), cfg.num_warps, cfg.num_stages, arch),
            _compile(_linear_kernels.gla_intra_bwd, [x, x, f32, f32, i32, i32, f32, f32, f32, f32],
                     dict(intra, BK=state_k), cfg.num_warps, cfg.num_stages, arch),
            _compile(_linear_kernels.gla_dv_bwd, [x, f32, x, x, f32, i32, i32, f32],
                     dict(common, BK=block_k), cfg.num_warps, cfg.num_stages, arch),
        ]
    return dict(built[-1], shared=max(b["shared"] for b in built))


def compile_rms_norm(rows: int, d: int, dtype: Any = jnp.bfloat16, *, residual: bool = False, cfg: Any = None,
                     arch: int = 90) -> dict[str, dict[str, int]]:
    """Compile the RMSNorm kernels for ``rows`` rows of width ``d`` (``x``, ``scale`` and ``dx`` in ``dtype``).

    Args:
        rows, d: The problem (``x`` flattened to ``[rows, d]``).
        dtype: Of ``x`` and ``scale``.
        residual: The kernels of calls with ``residual=`` (the sum in, its cotangent back).
        cfg: An ``RmsNormConfig`` (``None``: the heuristic's).
        arch: Compute capability as an int (90 for sm_90).

    Returns:
        Per kernel (``forward``, ``backward``): shared memory in bytes, warps, stages, registers per
        thread and the bytes per thread spilled to local memory (a bandwidth-bound kernel must spill none).

    Raises:
        RuntimeError: in the interpreter mode (nothing is compiled there).
    """
    _compiled_mode()
    from ejk_triton import _norm_kernels, _rms_norm

    x = jax.ShapeDtypeStruct((rows, d), dtype)
    cfg = cfg if cfg is not None else _rms_norm.heuristic_config(x, x, x if residual else None)
    xp, f32 = _ptr(dtype), _ptr(jnp.float32)
    extra = [xp] if residual else []
    launches = {
        "forward": (_norm_kernels.forward_residual_kernel if residual else _norm_kernels.forward_kernel,
                    [xp, *extra, xp, xp, f32, *extra], _rms_norm.forward_args(rows, d, 1e-6, cfg)),
        "backward": (_norm_kernels.backward_residual_kernel if residual else _norm_kernels.backward_kernel,
                     [xp, xp, f32, xp, *extra, xp, f32], _rms_norm.backward_args(rows, d, cfg)),
    }
    result = {}
    for name, (fn, pointers, args) in launches.items():
        consts = {k: v for k, v in args.items() if k not in ("num_warps", "num_stages")}
        kernel = _compile_kernel(fn, pointers, consts, args["num_warps"], args["num_stages"], arch)
        result[name] = {"shared": int(kernel.metadata.shared), "num_warps": args["num_warps"],
                        "num_stages": args["num_stages"], **_registers(kernel)}
    return result
