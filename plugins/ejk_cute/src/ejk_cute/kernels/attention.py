"""FlashAttention-3-style forward kernel for Hopper (sm_90a), written in the CuTe DSL.

Imports CUTLASS at import time: ``ejk_cute._flash_attention`` imports this module only when it
first traces a call. No ``from __future__ import annotations``: the DSL reads the annotations as types.

Design (a work item is a 128-row query tile of one (batch, q head); one CTA runs each item, or with
``ctas > 0`` a persistent grid of ``ctas`` CTAs walks the items, see below):

- Three warpgroups. Warpgroup 0 is the producer: its first warp issues TMA loads of the two
  64-row Q halves (one barrier) and of the K / V tiles into two multistage pipelines
  (``cutlass.pipeline.PipelineTmaAsync``); it gives registers back (``setmaxnreg``).
- Warpgroups 1 and 2 are consumers; each owns 64 query rows. Per key block:
  ``S = Q Kᵀ`` (wgmma, operands in shared memory), the online softmax in registers (``exp2``
  with the scale pre-multiplied by ``log2(e)``), ``O += P V`` (wgmma, P from registers).
  Within a warpgroup the softmax of block ``n`` overlaps the ``P V`` product of block ``n - 1``
  (its rescale of O waits for that product), and the two warpgroups overlap each other.
- GQA: the kv head is ``q_head // group`` (no repeat in memory). With ``pack = group`` (a divisor
  of 64) the ``group`` query heads of one kv head are packed into the rows of one tile: packed row
  ``r`` is query position ``r // pack`` of head ``kv_head · pack + r % pack``, so each K / V block
  loaded serves every head of the group (the work items are then (row tile, kv head, batch)).
  Causal masks and sliding windows bound the key-block loop by position (fully masked blocks are
  never loaded); only blocks that cross a mask or the end of the keys compute per-element masks.
  Soft cap: ``tanh``.
- Causal / right-bounded masks launch the query tiles last-first: the longest rows start first.
- Persistent (``ctas > 0``): items vary query tiles fastest, then heads, then batches; CTA ``c`` takes
  its ``j``-th item at ``j * ctas + (c or ctas - 1 - c, alternately)`` (``ejk.tiling.snake_owner``).
  The K / V pipelines run on from one item into the next, Q has two stages (the next item's Q lands
  while this one runs) and the consumers release a Q stage once its item's GEMMs are done.
- Epilogue: ``O / rowsum`` in the input dtype, and the base-2 log-sum-exp ``[B, Hq, Sq]``
  float32 (``+inf`` for rows that see no key; their output is zeros).

Tensors arrive through ``cutlass.jax.cutlass_call`` with modes permuted (see ``_flash_attention``):
q / out ``(Sq, D, Hq, B)``, k ``(Sk, D, Hkv, B)``, v ``(D, Sk, Hkv, B)``, lse ``(Sq, Hq, B)``; packed,
q / out ``(pack, Sq, D, Hkv, B)`` and lse ``(pack, Sq, Hkv, B)``, whose first two modes the kernel
groups into one row mode ``(pack, Sq)`` (TMA then moves a 3-D box: ``D`` x ``pack`` heads x positions).
"""

import math
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.tensor_utils as tensor_utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup

_LOG2E = math.log2(math.e)
_WG = 128  # threads per warpgroup
_ROWS_PER_WG = 64  # one wgmma M
_CONSUMER_WGS = 2
TILE_M = _ROWS_PER_WG * _CONSUMER_WGS
_PRODUCER_REGS = 24
_CONSUMER_REGS = 240


class FlashForwardSm90:
    """One compiled variant of the forward kernel (all fields are compile-time constants).

    Args:
        head_dim: D (64 or 128; the same for q, k and v).
        block_kv: Keys per pipeline stage (a multiple of 16, at most 256).
        stages: K / V pipeline depth.
        group: Query heads per kv head.
        pack: Query heads packed into the rows of a tile: ``group`` (a divisor of 64) or 1.
        scale_log2: ``softmax_scale · log2(e)``, or with a soft cap ``cap · log2(e)``.
        cap_scale: ``softmax_scale / cap`` with a soft cap, else ``None``.
        causal: Right bound ``j <= i + Sk - Sq + right``.
        window: ``(left, right)`` or ``None``.
        pingpong: Order the two consumer warpgroups' GEMM issues with named barriers (each issues
            its ``Q Kᵀ`` and ``P V`` while the other runs its softmax), as FlashAttention-3 does.
        ctas: CTAs of a persistent grid (0: one CTA per work item).
        sinks: Attention sinks: ``mSink`` ``(Hq, B)`` float32 logits join each row's denominator (and
            its lse) in the epilogue; without, ``mSink`` is not read.
    """

    def __init__(self, *, head_dim: int, block_kv: int, stages: int, group: int, scale_log2: float,
                 cap_scale: float | None, causal: bool, window: tuple[int, int] | None,
                 pingpong: bool = True, ctas: int = 0, pack: int = 1, sinks: bool = False) -> None:
        if pack not in (1, group) or _ROWS_PER_WG % pack:
            raise ValueError(f"pack must be 1 or the group {group}, a divisor of {_ROWS_PER_WG}; got {pack}")
        self.pack = pack
        self.sinks = sinks
        self.pingpong = pingpong
        self.ctas = ctas
        self.q_stages = 2 if ctas > 0 else 1
        self.head_dim = head_dim
        self.block_kv = block_kv
        self.stages = stages
        self.group = group
        self.scale_log2 = scale_log2
        self.cap_scale = cap_scale
        self.right_bound = causal or window is not None
        self.right = 0 if window is None else int(window[1])
        self.left_bound = window is not None
        self.left = 0 if window is None else int(window[0])

    # ------------------------------------------------------------------------------------------
    # Host side: layouts, TMA descriptors, launch
    # ------------------------------------------------------------------------------------------

    @cute.jit
    def __call__(self, stream: cuda.CUstream, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor,
                 mSink: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor) -> None:
        dtype = mQ.element_type
        d, bn = self.head_dim, self.block_kv
        if cutlass.const_expr(self.pack > 1):  # rows (pack, Sq): packed row r = position r // pack, head r % pack
            mQ, mO, mLSE = self._packed(mQ), self._packed(mO), self._packed(mLSE)
        qk_layout = tensor_utils.LayoutEnum.from_tensor(mK)  # Q's rows are D-contiguous like K's
        q_major = k_major = qk_layout.sm90_mma_major_mode()
        v_major = tensor_utils.LayoutEnum.from_tensor(mV).sm90_mma_major_mode()
        qk_mma = sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, q_major, k_major, cutlass.Float32, (1, 1, 1), (_ROWS_PER_WG, bn))
        pv_mma = sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, cute.nvgpu.OperandMajorMode.K, v_major, cutlass.Float32, (1, 1, 1),
            (_ROWS_PER_WG, d), warpgroup.OperandSource.RMEM)
        q_smem = sm90_utils.make_smem_layout_a(  # stage s, half h at s * _CONSUMER_WGS + h
            qk_layout, (_ROWS_PER_WG, bn, d), dtype, _CONSUMER_WGS * self.q_stages)
        k_smem = sm90_utils.make_smem_layout_b(qk_layout, (_ROWS_PER_WG, bn, d), dtype, self.stages)
        v_smem = sm90_utils.make_smem_layout_b(
            tensor_utils.LayoutEnum.from_tensor(mV), (_ROWS_PER_WG, d, bn), dtype, self.stages)
        load = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tQ = cpasync.make_tiled_tma_atom(load, mQ, cute.slice_(q_smem, (None, None, 0)), (_ROWS_PER_WG, d))
        tma_k, tK = cpasync.make_tiled_tma_atom(load, mK, cute.slice_(k_smem, (None, None, 0)), (bn, d))
        tma_v, tV = cpasync.make_tiled_tma_atom(load, mV, cute.slice_(v_smem, (None, None, 0)), (d, bn))
        self.q_bytes = cute.size_in_bytes(dtype, cute.slice_(q_smem, (None, None, 0))) * _CONSUMER_WGS
        self.kv_bytes = cute.size_in_bytes(dtype, cute.slice_(k_smem, (None, None, 0)))
        self.v_bytes = cute.size_in_bytes(dtype, cute.slice_(v_smem, (None, None, 0)))

        stages, q_stages = self.stages, self.q_stages

        @cute.struct
        class Storage:
            q_bars: cute.struct.MemRange[cutlass.Int64, 2 * q_stages]
            k_bars: cute.struct.MemRange[cutlass.Int64, 2 * stages]
            v_bars: cute.struct.MemRange[cutlass.Int64, 2 * stages]
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(q_smem)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(k_smem)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(v_smem)], 1024]

        self.storage = Storage
        grid = (cute.ceil_div(cute.size(mQ, mode=[0]), TILE_M), mQ.shape[2], mQ.shape[3])
        if cutlass.const_expr(self.ctas > 0):
            grid = (self.ctas, 1, 1)
        self.kernel(qk_mma, pv_mma, tma_q, tQ, tma_k, tK, tma_v, tV, mSink, mO, mLSE, q_smem, k_smem,
                    v_smem).launch(
            grid=grid, block=[_WG * (1 + _CONSUMER_WGS), 1, 1], stream=stream, min_blocks_per_mp=1)

    def _packed(self, t: cute.Tensor) -> cute.Tensor:
        """``t`` ``(pack, Sq, …)`` as ``((pack, Sq), …)`` with ``pack`` static (TMA boxes need static tiles)."""
        shape, stride = t.shape, t.stride
        layout = cute.make_layout(((self.pack, shape[1]), *shape[2:]), stride=((stride[0], stride[1]), *stride[2:]))
        return cute.make_tensor(t.iterator, layout)

    # ------------------------------------------------------------------------------------------
    # Device side
    # ------------------------------------------------------------------------------------------

    @cute.kernel
    def kernel(self, qk_mma: cute.TiledMma, pv_mma: cute.TiledMma, tma_q: cute.CopyAtom, tQ: cute.Tensor,
               tma_k: cute.CopyAtom, tK: cute.Tensor, tma_v: cute.CopyAtom, tV: cute.Tensor, mSink: cute.Tensor,
               mO: cute.Tensor, mLSE: cute.Tensor, q_smem: cute.ComposedLayout, k_smem: cute.ComposedLayout,
               v_smem: cute.ComposedLayout) -> None:
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // _WG)
        q_rows, kv_len = cute.size(tQ, mode=[0]), tK.shape[0]
        mine = self._items_of_cta(cute.ceil_div(q_rows, TILE_M) * tQ.shape[2] * tQ.shape[3])

        storage = cutlass.memory.SmemAllocator().allocate(self.storage)
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, _CONSUMER_WGS * _WG // 32)
        q_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.q_bars.data_ptr(), num_stages=self.q_stages, producer_group=producer,
            consumer_group=consumers, tx_count=self.q_bytes, defer_sync=True)
        k_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.k_bars.data_ptr(), num_stages=self.stages, producer_group=producer,
            consumer_group=consumers, tx_count=self.kv_bytes, defer_sync=True)
        v_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.v_bars.data_ptr(), num_stages=self.stages, producer_group=producer,
            consumer_group=consumers, tx_count=self.v_bytes, defer_sync=True)
        sQ = storage.sQ.get_tensor(q_smem.outer, swizzle=q_smem.inner)
        sK = storage.sK.get_tensor(k_smem.outer, swizzle=k_smem.inner)
        sV = storage.sV.get_tensor(v_smem.outer, swizzle=v_smem.inner)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        if wg == 0:
            cute.arch.setmaxregister_decrease(_PRODUCER_REGS)
            if warp == 0:
                cpasync.prefetch_descriptor(tma_q)
                cpasync.prefetch_descriptor(tma_k)
                cpasync.prefetch_descriptor(tma_v)
                self._produce(q_pipe, k_pipe, v_pipe, tma_q, tQ, tma_k, tK, tma_v, tV, sQ, sK, sV, mine)
        else:
            cute.arch.setmaxregister_increase(_CONSUMER_REGS)
            self._consume(qk_mma, pv_mma, q_pipe, k_pipe, v_pipe, sQ, sK, sV, mSink, mO, mLSE,
                          tidx % _WG, wg - 1, q_rows, kv_len, mine)

    @cute.jit
    def _items_of_cta(self, items: cutlass.Int32) -> cutlass.Int32:
        """How many work items this CTA runs: one, or its share of the persistent grid's snake."""
        mine = cutlass.Int32(1)
        if cutlass.const_expr(self.ctas > 0):
            cta, _, _ = cute.arch.block_idx()
            rounds = items // self.ctas
            rest = items - rounds * self.ctas
            mine = rounds
            if rounds % 2 == 0:
                if cta < rest:
                    mine = rounds + 1
            else:
                if cta >= self.ctas - rest:
                    mine = rounds + 1
        return mine

    @cute.jit
    def _work_item(self, j: cutlass.Int32, q_rows: cutlass.Int32,
                   heads: cutlass.Int32) -> tuple[cutlass.Int32, cutlass.Int32, cutlass.Int32]:
        """``(m_block, head, batch)`` of this CTA's ``j``-th work item (query tiles last-first when causal);
        ``head`` is the kv head when packed."""
        n_m = (q_rows + TILE_M - 1) // TILE_M
        m_block, head, batch = cute.arch.block_idx()
        if cutlass.const_expr(self.ctas > 0):
            slot = m_block  # the CTA
            if j % 2 == 1:
                slot = self.ctas - 1 - m_block
            i = j * self.ctas + slot
            m_block = i % n_m
            head = (i // n_m) % heads
            batch = (i // n_m) // heads
        if cutlass.const_expr(self.right_bound):  # causal: the longest rows first (shorter tail)
            m_block = n_m - 1 - m_block
        return m_block, head, batch

    @cute.jit
    def _position(self, row: cutlass.Int32) -> cutlass.Int32:
        """The query position of (packed) row ``row``."""
        pos = row
        if cutlass.const_expr(self.pack > 1):
            pos = row // self.pack
        return pos

    @cute.jit
    def _block_range(self, m_block: cutlass.Int32, q_rows: cutlass.Int32,
                     kv_len: cutlass.Int32) -> tuple[cutlass.Int32, cutlass.Int32]:
        """Key blocks ``[n_lo, n_hi)`` that any row of this query tile sees (bottom-right aligned)."""
        offset = kv_len - q_rows // self.pack
        first_row = self._position(m_block * TILE_M)
        last_row = self._position(cutlass.min(m_block * TILE_M + TILE_M, q_rows) - 1)
        hi = kv_len
        if cutlass.const_expr(self.right_bound):
            hi = cutlass.min(kv_len, last_row + offset + self.right + 1)
        lo = 0
        if cutlass.const_expr(self.left_bound):
            lo = cutlass.max(0, first_row + offset - self.left)
        n_lo = lo // self.block_kv
        n_hi = n_lo
        if hi > lo:
            n_hi = (hi + self.block_kv - 1) // self.block_kv
        return n_lo, n_hi

    @cute.jit
    def _produce(self, q_pipe: Any, k_pipe: Any, v_pipe: Any, tma_q: cute.CopyAtom, tQ: cute.Tensor,
                 tma_k: cute.CopyAtom, tK: cute.Tensor, tma_v: cute.CopyAtom, tV: cute.Tensor, sQ: cute.Tensor,
                 sK: cute.Tensor, sV: cute.Tensor, mine: cutlass.Int32) -> None:
        """The producer warp, per work item: Q (both halves, one barrier), then K and V block by block."""
        d, bn = self.head_dim, self.block_kv
        q_rows, kv_len = cute.size(tQ, mode=[0]), tK.shape[0]
        one = cute.make_layout(1)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.q_stages)
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        for j in cutlass.range(0, mine, unroll=1):
            m_block, head, batch = self._work_item(j, q_rows, tQ.shape[2])
            kv_head = head
            if cutlass.const_expr(self.pack == 1):
                kv_head = head // self.group
            n_lo, n_hi = self._block_range(m_block, q_rows, kv_len)
            gQ = cute.flat_divide(tQ, (_ROWS_PER_WG, d))[None, None, None, 0, head, batch]  # (64, D, m)
            gK = cute.flat_divide(tK, (bn, d))[None, None, None, 0, kv_head, batch]  # (bn, D, n)
            gV = cute.flat_divide(tV, (d, bn))[None, None, 0, None, kv_head, batch]  # (D, bn, n)
            tQs, tQg = cpasync.tma_partition(tma_q, 0, one, cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
            tKs, tKg = cpasync.tma_partition(tma_k, 0, one, cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
            tVs, tVg = cpasync.tma_partition(tma_v, 0, one, cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))
            q_pipe.producer_acquire(q_state)
            for half in cutlass.range_constexpr(_CONSUMER_WGS):
                cute.copy(tma_q, tQg[None, m_block * _CONSUMER_WGS + half],
                          tQs[None, q_state.index * _CONSUMER_WGS + half],
                          tma_bar_ptr=q_pipe.producer_get_barrier(q_state))
            q_state.advance()
            for n in cutlass.range(n_lo, n_hi, unroll=1):
                k_pipe.producer_acquire(k_state)
                cute.copy(tma_k, tKg[None, n], tKs[None, k_state.index],
                          tma_bar_ptr=k_pipe.producer_get_barrier(k_state))
                k_state.advance()
                v_pipe.producer_acquire(v_state)
                cute.copy(tma_v, tVg[None, n], tVs[None, v_state.index],
                          tma_bar_ptr=v_pipe.producer_get_barrier(v_state))
                v_state.advance()

    @cute.jit
    def _consume(self, qk_mma: cute.TiledMma, pv_mma: cute.TiledMma, q_pipe: Any, k_pipe: Any, v_pipe: Any,
                 sQ: cute.Tensor, sK: cute.Tensor, sV: cute.Tensor, mSink: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor,
                 tid: cutlass.Int32, half: cutlass.Int32, q_rows: cutlass.Int32, kv_len: cutlass.Int32,
                 mine: cutlass.Int32) -> None:
        """One consumer warpgroup: 64 query rows of each work item, the key loop and the epilogue."""
        d, bn = self.head_dim, self.block_kv
        dtype = sQ.element_type
        pv_mma.set(warpgroup.Field.ACCUMULATE, True)  # O accumulates from zeros; set once, outside any branch
        qk_thr = qk_mma.get_slice(tid)
        pv_thr = pv_mma.get_slice(tid)
        tSrQ = qk_thr.make_fragment_A(qk_thr.partition_A(sQ))  # (MMA, M, K, Q stage x half)
        tSrK = qk_thr.make_fragment_B(qk_thr.partition_B(sK))  # (MMA, N, K, stage)
        tOrV = pv_thr.make_fragment_B(pv_thr.partition_B(sV))  # (MMA, N, K, stage)
        acc_s = qk_thr.make_fragment_C(qk_thr.partition_shape_C((_ROWS_PER_WG, bn)))
        acc_o = pv_thr.make_fragment_C(pv_thr.partition_shape_C((_ROWS_PER_WG, d)))
        tScS = qk_thr.partition_C(cute.make_identity_tensor((_ROWS_PER_WG, bn)))  # (row, col) in the tile
        # P as the A operand of P V: same register order as acc_s, 16-bit.
        rP = cute.make_rmem_tensor(cute.make_layout(((2, 2, 2), 1, bn // 16), stride=((1, 2, 4), 0, 8)), dtype)
        rP_as_s = cute.make_tensor(rP.iterator, acc_s.layout)
        row_max = cute.make_rmem_tensor(cute.make_layout(2), cutlass.Float32)
        row_sum = cute.make_rmem_tensor(cute.make_layout(2), cutlass.Float32)
        corr = cute.make_rmem_tensor(cute.make_layout(2), cutlass.Float32)

        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.q_stages)
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        if half == 1:
            self._pass_turn(1)  # warpgroup 0 issues first (no-op without ping-pong); turns run on across items
        for j in cutlass.range(0, mine, unroll=1):
            m_block, head, batch = self._work_item(j, q_rows, mO.shape[2])
            n_lo, n_hi = self._block_range(m_block, q_rows, kv_len)
            acc_o.fill(0.0)
            row_max.fill(-cutlass.Float32.inf)
            row_sum.fill(0.0)
            row0 = m_block * TILE_M + half * _ROWS_PER_WG
            q_pipe.consumer_wait(q_state)
            q_tile = q_state.index * _CONSUMER_WGS + half
            if n_hi > n_lo:
                # First block: S = Q K^T, softmax, P.
                k_pipe.consumer_wait(k_state)
                self._take_turn(half)
                self._gemm_qk(qk_mma, acc_s, tSrQ, tSrK, q_tile, k_state.index)
                self._pass_turn(half)
                warpgroup.wait_group(0)
                k_pipe.consumer_release(k_state)
                k_state.advance()
                self._softmax(acc_s, tScS, row_max, row_sum, corr, n_lo, row0, q_rows, kv_len)
                rP_as_s.store(acc_s.load().to(dtype))
                for n in cutlass.range(n_lo + 1, n_hi, unroll=1):
                    k_pipe.consumer_wait(k_state)
                    v_pipe.consumer_wait(v_state)
                    self._take_turn(half)
                    self._gemm_qk(qk_mma, acc_s, tSrQ, tSrK, q_tile, k_state.index)
                    self._gemm_pv(pv_mma, acc_o, rP, tOrV, v_state.index)
                    self._pass_turn(half)
                    warpgroup.wait_group(1)  # S is ready; P V of the previous block may still run
                    k_pipe.consumer_release(k_state)
                    k_state.advance()
                    self._softmax(acc_s, tScS, row_max, row_sum, corr, n, row0, q_rows, kv_len)
                    warpgroup.wait_group(0)
                    v_pipe.consumer_release(v_state)
                    v_state.advance()
                    self._rescale(acc_o, corr)
                    rP_as_s.store(acc_s.load().to(dtype))
                v_pipe.consumer_wait(v_state)
                self._take_turn(half)
                self._gemm_pv(pv_mma, acc_o, rP, tOrV, v_state.index)
                self._pass_turn(half)
                warpgroup.wait_group(0)
                v_pipe.consumer_release(v_state)
                v_state.advance()
            q_pipe.consumer_release(q_state)  # every GEMM reading this Q stage is done
            q_state.advance()
            self._epilogue(pv_thr, acc_o, row_max, row_sum, mSink, mO, mLSE, row0, head, batch, q_rows)
        if half == 0:
            self._take_turn(0)  # the other warpgroup's last hand-over: leave no arrival pending

    @cute.jit
    def _take_turn(self, half: cutlass.Int32) -> None:
        """Wait until the other consumer warpgroup has issued its GEMMs (named barrier ``1 + half``)."""
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier(barrier_id=1 + half, number_of_threads=2 * _WG)

    @cute.jit
    def _pass_turn(self, half: cutlass.Int32) -> None:
        """Let the other consumer warpgroup issue its GEMMs (arrive on its barrier ``2 - half``)."""
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier_arrive(barrier_id=2 - half, number_of_threads=2 * _WG)

    @cute.jit
    def _gemm_qk(self, mma: cute.TiledMma, acc: cute.Tensor, tSrQ: cute.Tensor, tSrK: cute.Tensor,
                 q_tile: cutlass.Int32, stage: cutlass.Int32) -> None:
        warpgroup.fence()
        for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
            mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
            cute.gemm(mma, acc, tSrQ[None, None, kb, q_tile], tSrK[None, None, kb, stage], acc)
        warpgroup.commit_group()

    @cute.jit
    def _gemm_pv(self, mma: cute.TiledMma, acc: cute.Tensor, rP: cute.Tensor, tOrV: cute.Tensor,
                 stage: cutlass.Int32) -> None:
        warpgroup.fence()
        for kb in cutlass.range_constexpr(cute.size(rP, mode=[2])):
            cute.gemm(mma, acc, rP[None, None, kb], tOrV[None, None, kb, stage], acc)
        warpgroup.commit_group()

    @cute.jit
    def _needs_mask(self, n: cutlass.Int32, row0: cutlass.Int32, q_rows: cutlass.Int32,
                    kv_len: cutlass.Int32) -> cutlass.Boolean:
        """Whether key block ``n`` has a masked element for some row of ``[row0, row0 + 64)``."""
        offset = kv_len - q_rows // self.pack
        col_lo = n * self.block_kv
        col_hi = col_lo + self.block_kv - 1
        partial = col_hi >= kv_len
        if cutlass.const_expr(self.right_bound):
            partial = partial or col_hi > self._position(row0) + offset + self.right
        if cutlass.const_expr(self.left_bound):
            partial = partial or col_lo < self._position(row0 + _ROWS_PER_WG - 1) + offset - self.left
        return partial

    @cute.jit
    def _softmax(self, acc_s: cute.Tensor, tScS: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor,
                 corr: cute.Tensor, n: cutlass.Int32, row0: cutlass.Int32, q_rows: cutlass.Int32,
                 kv_len: cutlass.Int32) -> None:
        """Online softmax of one score block in place (scores become unnormalised probabilities).

        Register order of a 64 x N wgmma accumulator: element ``4 j + 2 r + c`` is column
        ``8 j + c`` (plus the thread's offset) of this thread's row ``r`` (rows ``+0`` and ``+8``);
        the four threads of a quad share rows.
        """
        quads = cute.size(acc_s) // 4  # loops nest (quad, element): each stays short for the DSL's unroller
        if cutlass.const_expr(self.cap_scale is not None):
            for j in cutlass.range_constexpr(quads):
                for t in cutlass.range_constexpr(4):
                    acc_s[4 * j + t] = cute.math.tanh(acc_s[4 * j + t] * self.cap_scale)  # accurate: fp16 tolerances
        if self._needs_mask(n, row0, q_rows, kv_len):
            # Element 4 j + 2 r + c sits at (row_base + 8 r, col_base + 8 j + c): two live coordinates.
            row_base, col_base = tScS[0]
            col0 = col_base + n * self.block_kv  # key of element 0
            offset = kv_len - q_rows // self.pack
            # Query position minus key of element 0, for this thread's two rows (r = 0, 1).
            diags = (self._position(row0 + row_base) + offset - col0,
                     self._position(row0 + row_base + 8) + offset - col0)
            limit = kv_len - col0  # first column offset past the keys
            for j in cutlass.range_constexpr(quads):
                for t in cutlass.range_constexpr(4):
                    dc = 8 * j + t % 2  # column offset of the element
                    hidden = dc >= limit
                    if cutlass.const_expr(self.right_bound):
                        hidden = hidden or dc > diags[t // 2] + self.right
                    if cutlass.const_expr(self.left_bound):
                        hidden = hidden or dc < diags[t // 2] - self.left
                    if hidden:
                        acc_s[4 * j + t] = -cutlass.Float32.inf
        scale = self.scale_log2
        for r in cutlass.range_constexpr(2):
            m = row_max[r]
            for j in cutlass.range_constexpr(quads):
                for c in cutlass.range_constexpr(2):
                    m = cute.arch.fmax(m, acc_s[4 * j + 2 * r + c])
            m = cute.arch.warp_reduction_max(m, threads_in_group=4)
            safe = m
            if m == -cutlass.Float32.inf:
                safe = 0.0
            corr[r] = cute.math.exp2((row_max[r] - safe) * scale, fastmath=True)
            row_max[r] = m
            shift = safe * scale
            total = 0.0
            for j in cutlass.range_constexpr(quads):
                for c in cutlass.range_constexpr(2):
                    p = cute.math.exp2(acc_s[4 * j + 2 * r + c] * scale - shift, fastmath=True)
                    acc_s[4 * j + 2 * r + c] = p
                    total = total + p
            row_sum[r] = row_sum[r] * corr[r] + total

    @cute.jit
    def _rescale(self, acc_o: cute.Tensor, corr: cute.Tensor) -> None:
        for j in cutlass.range_constexpr(cute.size(acc_o) // 4):
            for t in cutlass.range_constexpr(4):
                acc_o[4 * j + t] = acc_o[4 * j + t] * corr[t // 2]

    @cute.jit
    def _epilogue(self, pv_thr: Any, acc_o: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor,
                  mSink: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, row0: cutlass.Int32,
                  head: cutlass.Int32, batch: cutlass.Int32, q_rows: cutlass.Int32) -> None:
        """Normalise O, store it (rows < Sq, packed: < pack · Sq) and the base-2 log-sum-exp (``+inf`` for
        empty rows). With sinks, ``e^sink`` of the row's query head joins the denominator and the lse."""
        d = self.head_dim
        inv = cute.make_rmem_tensor(cute.make_layout(2), cutlass.Float32)
        lse = cute.make_rmem_tensor(cute.make_layout(2), cutlass.Float32)
        tOcO = pv_thr.partition_C(cute.make_identity_tensor((_ROWS_PER_WG, d)))
        for r in cutlass.range_constexpr(2):
            total = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
            inv[r] = 0.0
            lse[r] = cutlass.Float32.inf
            if total > 0.0:
                inv[r] = 1.0 / total
                lse[r] = row_max[r] * self.scale_log2 + cute.math.log2(total, fastmath=True)
                if cutlass.const_expr(self.sinks):
                    q_head = head
                    if cutlass.const_expr(self.pack > 1):  # packed row i is position i // pack of head i % pack
                        row, _ = tOcO[2 * r]
                        q_head = head * self.pack + (row0 + row) % self.pack
                    sink = mSink[q_head, batch] * _LOG2E
                    top = cute.arch.fmax(lse[r], sink)
                    full = top + cute.math.log2(cute.math.exp2(lse[r] - top, fastmath=True)
                                                + cute.math.exp2(sink - top, fastmath=True), fastmath=True)
                    inv[r] = inv[r] * cute.math.exp2(lse[r] - full, fastmath=True)
                    lse[r] = full
        out = cute.make_rmem_tensor(acc_o.layout, mO.element_type)
        quads = cute.size(acc_o) // 4
        for j in cutlass.range_constexpr(quads):
            for t in cutlass.range_constexpr(4):
                out[4 * j + t] = (acc_o[4 * j + t] * inv[t // 2]).to(mO.element_type)
        gO = cute.flat_divide(mO, (_ROWS_PER_WG, d))[None, None, None, 0, head, batch]  # (64, D, m)
        gO = gO[None, None, row0 // _ROWS_PER_WG]
        tOgO = pv_thr.partition_C(gO)
        for j in cutlass.range_constexpr(quads):
            for t in cutlass.range_constexpr(4):
                row, _ = tOcO[4 * j + t]
                if row0 + row < q_rows:
                    tOgO[4 * j + t] = out[4 * j + t]
        for r in cutlass.range_constexpr(2):
            row, col = tOcO[2 * r]
            if col == 0 and row0 + row < q_rows:
                mLSE[row0 + row, head, batch] = lse[r]
