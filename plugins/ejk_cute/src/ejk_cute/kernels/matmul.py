"""The Hopper GEMM in the CuTe DSL: ``c[:, :, l] = a[:, :, l] @ b[:, :, l]ᵀ`` with float32 accumulation.

Imports CUTLASS at import time: ``ejk_cute._matmul`` imports this module only when it first traces a call.
No ``from __future__ import annotations``: the DSL reads the annotations as types.

Logical operands (``cutlass.jax.TensorSpec.mode`` presents the JAX buffers this way, no copies):
``a`` is ``(M, K, L)``, ``b`` is ``(N, K, L)``, ``c`` is ``(M, N, L)``; each may be K- or M/N-major
(the backward's transposed operands are the other majorness of the same buffers).

One CTA per SM (persistent), ``1 + consumers`` warpgroups:

- warpgroup 0, warp 0 (the producer) walks the CTA's output tiles and issues TMA loads of the
  ``[tile_m, 64]`` / ``[tile_n, 64]`` K-slices into a ``stages``-deep shared-memory ring guarded
  by a ``PipelineTmaAsync`` (transaction-count barriers); in a cluster the slices are multicast
  to the CTAs that share them (``a`` along the cluster's N, ``b`` along its M);
- the consumer warpgroups (two when ``tile_m >= 128``, each owning half the rows) issue wgmma on
  the ring (one batch of MMAs in flight while the next slice is waited for), release slices as
  their MMAs retire, then round the float32 accumulators to ``c``'s dtype and write them through
  shared memory with TMA stores (subtiles, double buffered, ``PipelineTmaStore``).

The grid is persistent: ``(cluster_m, cluster_n, clusters)`` with as many clusters as fit on the
GPU; cluster ``z`` walks cluster tiles ``z, z + clusters, ...`` of a swizzled order (``_tile``:
bands of ``swizzle`` cluster rows, for L2 reuse). Out-of-range rows and columns need no code:
TMA loads zero-fill past the tensor and TMA stores clip, so any M, N and K run (the strides must
be 16-byte aligned, which the gate checks).
"""

from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory as memory
import cutlass.pipeline as pipeline
import cutlass.tensor_utils as tensor_utils
import cutlass.utils.hopper_helpers as sm90

__all__ = ["WgmmaGemm", "launch"]

WARPGROUP = 128
_BLOCK_K = 64  # four k=16 wgmma steps per stage: 128 bytes of 16-bit K per row (the 128B swizzle)
PRODUCER_REGS = 40
CONSUMER_REGS = 232
EPI_STAGES = 2
EPI_BARRIER = 1  # named barrier id of the consumers' epilogue sync (0 is __syncthreads)


class WgmmaGemm:
    """Compile-time plan of one kernel: tile, cluster, stages, swizzle and the grid's cluster budget."""

    def __init__(self, tile_m: int, tile_n: int, cluster_m: int, cluster_n: int, stages: int, swizzle: int,
                 max_clusters: int) -> None:
        self.tile = (tile_m, tile_n, _BLOCK_K)
        self.cluster = (cluster_m, cluster_n)
        self.stages = stages
        self.swizzle = swizzle
        self.max_clusters = max_clusters
        self.consumers = 2 if tile_m >= 128 else 1
        self.threads = (1 + self.consumers) * WARPGROUP
        self.mcast_a = cluster_n  # CTAs of a cluster row share a's slice
        self.mcast_b = cluster_m

    # ------------------------------------------------------------------------------------------
    # Host side: layouts, TMA descriptors, grid
    # ------------------------------------------------------------------------------------------

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream) -> None:
        self._plan_layouts(a, b, c)
        tile_m, tile_n, tile_k = self.tile
        tma_a, g_a = self._tma_load(a, self.a_smem, (tile_m, tile_k), self.mcast_a)
        tma_b, g_b = self._tma_load(b, self.b_smem, (tile_n, tile_k), self.mcast_b)
        tma_c, g_c = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(), c, cute.slice_(self.c_smem, (None, None, 0)),
            self.epi_tile)

        # The persistent grid: (cluster_m, cluster_n, clusters), each cluster walking cluster tiles.
        cluster_rows = (cute.size(c, mode=[0]) + tile_m * self.cluster[0] - 1) // (tile_m * self.cluster[0])
        cluster_cols = (cute.size(c, mode=[1]) + tile_n * self.cluster[1] - 1) // (tile_n * self.cluster[1])
        work = cluster_rows * cluster_cols * cute.size(c, mode=[2])
        grid = (*self.cluster, cutlass.min(work, self.max_clusters))

        self.shared = self._shared_struct()
        self.kernel(tma_a, g_a, tma_b, g_b, tma_c, g_c, self.mma, self.a_smem, self.b_smem, self.c_smem,
                    cluster_rows, cluster_cols, work).launch(
            grid=grid, block=[self.threads, 1, 1], cluster=(*self.cluster, 1), min_blocks_per_mp=1, stream=stream)

    def _plan_layouts(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor) -> None:
        """The MMA, the shared-memory ring's and epilogue's layouts for these operands (host side)."""
        self.ab_dtype = a.element_type
        self.c_dtype = c.element_type
        a_major = tensor_utils.LayoutEnum.from_tensor(a)
        b_major = tensor_utils.LayoutEnum.from_tensor(b)
        self.c_major = tensor_utils.LayoutEnum.from_tensor(c)
        self.mma = sm90.make_trivial_tiled_mma(
            self.ab_dtype, self.ab_dtype, a_major.sm90_mma_major_mode(), b_major.sm90_mma_major_mode(),
            cutlass.Float32, (self.consumers, 1, 1), tiler_mn=(64, self.tile[1]))
        self.a_smem = sm90.make_smem_layout_a(a_major, self.tile, self.ab_dtype, self.stages)
        self.b_smem = sm90.make_smem_layout_b(b_major, self.tile, self.ab_dtype, self.stages)
        self.epi_tile = sm90.compute_tile_shape_or_override(self.tile, self.c_dtype,
                                                            is_cooperative=self.consumers == 2)
        self.c_smem = sm90.make_smem_layout_epi(self.c_dtype, self.c_major, self.epi_tile, EPI_STAGES)

    def _shared_struct(self) -> Any:
        """The CTA's shared memory: the ring's barriers, the ``a`` / ``b`` ring and the epilogue buffers."""

        @cute.struct
        class Shared:
            ring_barriers: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sa: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(self.a_smem)], 1024]
            sb: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(self.b_smem)], 1024]
            sc: cute.struct.Align[cute.struct.MemRange[self.c_dtype, cute.cosize(self.c_smem)], 1024]

        return Shared

    @staticmethod
    def _tma_load(x: cute.Tensor, staged: cute.ComposedLayout, tile: tuple[int, int], mcast: int) -> tuple[Any, Any]:
        op = (cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp() if mcast > 1
              else cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp())
        return cute.nvgpu.cpasync.make_tiled_tma_atom(op, x, cute.slice_(staged, (None, None, 0)), tile,
                                                      num_multicast=mcast)

    # ------------------------------------------------------------------------------------------
    # Device side
    # ------------------------------------------------------------------------------------------

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, g_a: cute.Tensor, tma_b: cute.CopyAtom, g_b: cute.Tensor,
               tma_c: cute.CopyAtom, g_c: cute.Tensor, mma: cute.TiledMma, a_smem: cute.ComposedLayout,
               b_smem: cute.ComposedLayout, c_smem: cute.ComposedLayout,
               cluster_rows: cutlass.Int32, cluster_cols: cutlass.Int32, work: cutlass.Int32) -> None:
        tile_m, tile_n, tile_k = self.tile
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        warpgroup = cute.arch.make_warp_uniform(tidx // WARPGROUP)
        if warp == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_b)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_c)

        storage = memory.SmemAllocator().allocate(self.shared)
        coord, mask_a, mask_b, ring = self._cluster_ring(storage, a_smem, b_smem)

        s_a = storage.sa.get_tensor(a_smem.outer, swizzle=a_smem.inner)
        s_b = storage.sb.get_tensor(b_smem.outer, swizzle=b_smem.inner)
        s_c = storage.sc.get_tensor(c_smem.outer, swizzle=c_smem.inner)

        # Global tiles: (tile_m, tile_k, m, k, l) and so on.
        t_a = cute.local_tile(g_a, (tile_m, tile_k), (None, None, None))
        t_b = cute.local_tile(g_b, (tile_n, tile_k), (None, None, None))
        t_c = cute.local_tile(g_c, (tile_m, tile_n), (None, None, None))
        k_tiles = cute.size(t_a, mode=[3])
        ta_s, ta_g = cute.nvgpu.cpasync.tma_partition(
            tma_a, coord[1], cute.make_layout(self.cluster[1]), cute.group_modes(s_a, 0, 2),
            cute.group_modes(t_a, 0, 2))
        tb_s, tb_g = cute.nvgpu.cpasync.tma_partition(
            tma_b, coord[0], cute.make_layout(self.cluster[0]), cute.group_modes(s_b, 0, 2),
            cute.group_modes(t_b, 0, 2))

        pipeline.pipeline_init_wait(cluster_shape_mn=self.cluster)
        _, _, first = cute.arch.block_idx()
        _, _, stride = cute.arch.grid_dim()

        if warpgroup == 0:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == 0:
                state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                w = first
                while w < work:
                    m, n, batch = self._tile(w, cluster_rows, cluster_cols)
                    src_a = ta_g[(None, m, None, batch)]
                    src_b = tb_g[(None, n, None, batch)]
                    for k in range(k_tiles):
                        ring.producer_acquire(state)
                        full = ring.producer_get_barrier(state)
                        cute.copy(tma_a, src_a[(None, k)], ta_s[(None, state.index)], tma_bar_ptr=full,
                                  mcast_mask=mask_a)
                        cute.copy(tma_b, src_b[(None, k)], tb_s[(None, state.index)], tma_bar_ptr=full,
                                  mcast_mask=mask_b)
                        ring.producer_commit(state)
                        state.advance()
                    w += stride
                ring.producer_tail(state)
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            self._consume(tidx - WARPGROUP, warpgroup - 1, warp, ring, mma, s_a, s_b, s_c, t_c, k_tiles,
                          tma_c, cluster_rows, cluster_cols, first, stride, work)

    def _cluster_ring(self, storage: Any, a_smem: cute.ComposedLayout,
                      b_smem: cute.ComposedLayout) -> tuple[Any, Any, Any, pipeline.PipelineTmaAsync]:
        """This CTA's coordinate in its cluster, the multicast masks of its ``a`` / ``b`` loads, and the ring.

        The ring's barriers are initialised and announced to the cluster (``pipeline_init_arrive``);
        the caller waits for the cluster (``pipeline_init_wait``) before the first load.
        """
        cluster_layout = cute.make_layout((*self.cluster, 1))
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        coord = cluster_layout.get_flat_coord(rank)
        mask_a = cute.make_layout_image_mask(cluster_layout, coord, mode=1) if self.mcast_a > 1 else 0
        mask_b = cute.make_layout_image_mask(cluster_layout, coord, mode=0) if self.mcast_b > 1 else 0
        slice_bytes = (cute.size_in_bytes(self.ab_dtype, cute.slice_(a_smem, (None, None, 0)))
                       + cute.size_in_bytes(self.ab_dtype, cute.slice_(b_smem, (None, None, 0))))
        # Every consumer warp of every CTA that reads a multicast slice releases it.
        releases = (self.mcast_a + self.mcast_b - 1) * self.consumers * 4
        ring = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.ring_barriers.data_ptr(), num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, releases),
            tx_count=slice_bytes, cta_layout_vmnk=cute.make_layout((1, *cluster_layout.shape)), defer_sync=True)
        pipeline.pipeline_init_arrive(cluster_shape_mn=self.cluster, is_relaxed=True)
        return coord, mask_a, mask_b, ring

    def _tile(self, w: cutlass.Int32, cluster_rows: cutlass.Int32,
              cluster_cols: cutlass.Int32) -> tuple[Any, Any, Any]:
        """The ``(m, n, l)`` tile of this CTA in the cluster tile ``w`` of the swizzled walk.

        Cluster tiles go in bands of ``swizzle`` cluster rows: down a band's rows, then across
        its columns, so consecutive clusters share ``b``'s columns and, ``swizzle`` steps apart,
        ``a``'s rows (L2 reuse); bands, then batches, follow each other.
        """
        per_batch = cluster_rows * cluster_cols
        batch = w // per_batch
        r = w - batch * per_batch
        band = self.swizzle * cluster_cols
        g = r // band
        within = r - g * band
        rows = cutlass.min(self.swizzle, cluster_rows - g * self.swizzle)
        x, y, _ = cute.arch.block_idx()
        m = (g * self.swizzle + within % rows) * self.cluster[0] + x
        n = (within // rows) * self.cluster[1] + y
        return m, n, batch

    def _epilogue_fragments(self, tid: cutlass.Int32, mma: cute.TiledMma, acc: cute.Tensor,
                            s_c: cute.Tensor) -> tuple[Any, Any, Any, Any, Any]:
        """The epilogue's registers -> shared copy (stmatrix where it applies) of consumer thread ``tid``.

        Returns the tiled copy, its destination in ``s_c``, the accumulators in its order, and a
        float32 and an output-dtype register chunk of one ``epi_tile`` subtile.
        """
        store_atom = sm90.get_smem_store_op(self.c_major, elem_ty_d=self.c_dtype, elem_ty_acc=cutlass.Float32)
        c_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(self.c_major.is_m_major_c(), 4),
                                     self.c_dtype)
        r2s = cute.make_tiled_copy_S(store_atom, cute.make_tiled_copy_C_atom(c_atom, mma))
        thr_r2s = r2s.get_slice(tid)
        chunk_shape = cute.shape(thr_r2s.partition_S(s_c))[:3]
        chunk = cute.make_rmem_tensor(chunk_shape, cutlass.Float32)
        chunk_out = cute.make_rmem_tensor(chunk_shape, self.c_dtype)
        return r2s, thr_r2s.partition_D(s_c), r2s.retile(acc), chunk, chunk_out

    @cute.jit
    def _zero_past(self, ragged: Any, slot: cutlass.Int32) -> None:
        """Zero K entries ``valid:64`` of this warpgroup's 64 rows of ``a``'s ring slot ``slot``.

        The rows past a ragged reduction's end were loaded (TMA cannot stop there); zeroing one
        operand removes their products. Each warpgroup only reads its own rows of ``a``, so a
        warpgroup barrier (after a proxy fence: wgmma reads shared memory through the async
        proxy) is all the synchronisation needed.
        """
        s_a, consumer, valid = ragged
        if valid < self.tile[2]:
            tid = cute.arch.thread_idx()[0] % WARPGROUP
            rows = 64
            per_thread = rows * self.tile[2] // WARPGROUP
            for i in cutlass.range_constexpr(per_thread):
                index = i * WARPGROUP + tid
                col = index // rows
                if col >= valid:
                    s_a[(consumer * rows + index % rows, col, slot)] = self.ab_dtype(0)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=EPI_BARRIER + 1 + consumer, number_of_threads=WARPGROUP)

    @cute.jit
    def _mainloop(self, ring: pipeline.PipelineTmaAsync, mma: cute.TiledMma, acc: cute.Tensor,
                  frag_a: cute.Tensor, frag_b: cute.Tensor, read: pipeline.PipelineState,
                  release: pipeline.PipelineState, k_tiles: cutlass.Int32, ragged: Any = None) -> tuple[Any, Any]:
        """``acc = a_tile @ b_tileᵀ`` over ``k_tiles`` ring slices; returns the advanced ring states.

        One slice's MMAs stay in flight while the next slice is awaited; a slice is released as
        soon as the MMAs reading it retire. ``ragged`` (a reduction that ends inside its last
        slice): ``(s_a, consumer, valid)``: only ``valid`` K entries of the last slice count, the
        rest of this warpgroup's ``a`` rows are zeroed in shared memory first (see :meth:`_zero_past`).
        """
        k_blocks = cute.size(frag_a, mode=[2])
        acc.fill(0.0)
        mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        cute.nvgpu.warpgroup.fence()
        for k in range(k_tiles):
            ring.consumer_wait(read)
            if cutlass.const_expr(ragged is not None):  # noqa: SIM102 (a compile-time test, then a runtime one)
                if k == k_tiles - 1:
                    self._zero_past(ragged, read.index)
            for kb in cutlass.range_constexpr(k_blocks):
                at = (None, None, kb, read.index)
                cute.gemm(mma, acc, frag_a[at], frag_b[at], acc)
            cute.nvgpu.warpgroup.commit_group()
            read.advance()
            if k > 0:
                cute.nvgpu.warpgroup.wait_group(1)
                ring.consumer_release(release)
                release.advance()
        cute.nvgpu.warpgroup.wait_group(0)
        if k_tiles > 0:
            ring.consumer_release(release)
            release.advance()
        return read, release

    @cute.jit
    def _store_tile(self, tile_c: cute.Tensor, tma_c: cute.CopyAtom, s_c: cute.Tensor, r2s: cute.TiledCopy,
                    r2s_dst: cute.Tensor, r2s_acc: cute.Tensor, chunk: cute.Tensor, chunk_out: cute.Tensor,
                    epi_sync: pipeline.NamedBarrier, stores: pipeline.PipelineTmaStore, warp: cutlass.Int32,
                    written: cutlass.Int32) -> cutlass.Int32:
        """The epilogue of one output tile (``tile_c``: TMA coordinates): returns ``written`` plus its subtiles.

        Subtiles of epi_tile go in the accumulator registers' order: each thread's fragment runs
        over all columns of one row repeat before the next repeat (256-row tiles), so subtiles go
        row-major, 16 consecutive registers per 128x32 subtile; each is rounded, written to a
        shared buffer (two, in turn) and stored by TMA.
        """
        chunk_size = cute.size(chunk)
        out = cute.zipped_divide(tile_c, self.epi_tile)
        sc_part, gc_part = cute.nvgpu.cpasync.tma_partition(
            tma_c, 0, cute.make_layout(1), cute.group_modes(s_c, 0, 2), out)
        grid_shape = out.shape[1]
        order = cute.make_layout(grid_shape, stride=(grid_shape[1], 1))
        for e in cutlass.range_constexpr(cute.size(out, mode=[1])):
            for v in cutlass.range_constexpr(chunk_size):
                chunk[v] = r2s_acc[e * chunk_size + v]
            chunk_out.store(chunk.load().to(self.c_dtype))
            buf = (written + e) % EPI_STAGES
            cute.copy(r2s, chunk_out, r2s_dst[(None, None, None, buf)])
            cute.arch.fence_proxy("async.shared", space="cta")
            epi_sync.arrive_and_wait()
            if warp == 4:  # the first consumer warp issues the store
                cute.copy(tma_c, sc_part[(None, buf)], gc_part[(None, order.get_hier_coord(e))])
                stores.producer_commit()
                stores.producer_acquire()
            epi_sync.arrive_and_wait()
        return written + cute.size(out, mode=[1])

    @cute.jit
    def _consume(self, tid: cutlass.Int32, consumer: cutlass.Int32, warp: cutlass.Int32,
                 ring: pipeline.PipelineTmaAsync, mma: cute.TiledMma, s_a: cute.Tensor, s_b: cute.Tensor,
                 s_c: cute.Tensor, t_c: cute.Tensor, k_tiles: cutlass.Int32, tma_c: cute.CopyAtom,
                 cluster_rows: cutlass.Int32, cluster_cols: cutlass.Int32, first: cutlass.Int32,
                 stride: cutlass.Int32, work: cutlass.Int32) -> None:
        """The consumer warpgroups: wgmma over the ring, then the epilogue, tile after tile."""
        threads = self.consumers * WARPGROUP
        thr_mma = mma.get_slice(consumer * WARPGROUP)
        frag_a = mma.make_fragment_A(thr_mma.partition_A(s_a))
        frag_b = mma.make_fragment_B(thr_mma.partition_B(s_b))
        acc = cute.make_rmem_tensor(thr_mma.partition_C(t_c).shape[:3], cutlass.Float32)

        r2s, r2s_dst, r2s_acc, chunk, chunk_out = self._epilogue_fragments(tid, mma, acc, s_c)
        epi_sync = pipeline.NamedBarrier(barrier_id=EPI_BARRIER, num_threads=threads)
        stores = pipeline.PipelineTmaStore.create(
            num_stages=EPI_STAGES, producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, threads))

        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        written = cutlass.Int32(0)
        w = first
        while w < work:
            m, n, batch = self._tile(w, cluster_rows, cluster_cols)
            read, release = self._mainloop(ring, mma, acc, frag_a, frag_b, read, release, k_tiles)

            written = self._store_tile(t_c[(None, None, m, n, batch)], tma_c, s_c, r2s, r2s_dst, r2s_acc, chunk,
                                       chunk_out, epi_sync, stores, warp, written)
            w += stride
        stores.producer_tail()


@cute.jit
def launch(stream: cuda.CUstream, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, *, tile_m: cutlass.Constexpr,
           tile_n: cutlass.Constexpr, cluster_m: cutlass.Constexpr, cluster_n: cutlass.Constexpr,
           stages: cutlass.Constexpr, swizzle: cutlass.Constexpr, max_clusters: cutlass.Constexpr) -> None:
    """``cutlass_call``'s entry: ``c = a @ bᵀ`` per batch with the given compile-time plan."""
    WgmmaGemm(tile_m, tile_n, cluster_m, cluster_n, stages, swizzle, max_clusters)(a, b, c, stream)
