// The FP16 (and INT8) warpgroup conv kernel (sm_90a: wgmma), sharing the
// mma.sync kernel's loaders and epilogues: one of gpu/conv.cu's kernel
// families, instantiated by its tile table.
#ifndef RESNETD_GPU_CONV_WGMMA_CUH
#define RESNETD_GPU_CONV_WGMMA_CUH

#include "gpu/conv_mma.cuh"
#include "gpu/wgmma.cuh"

/* ===================================================================== */
/* FP16 warpgroup kernel (sm_90a: wgmma)                                 */
/* ===================================================================== */

// Hopper's warpgroup MMA (wgmma.mma_async m64nNk16) reads both operands
// straight from shared memory and runs asynchronously to the issuing
// warps, where mma.sync needs every fragment moved to registers first
// (ldmatrix) and tops out well below the tensor cores' rate on sm_90.
// The tiles are loaded as in the mma.sync kernel (cp.async, the same
// im2col addressing) but stored in the layout wgmma reads: K-major rows of
// 64 halves (128 bytes) with the 128-byte swizzle (16-byte chunk c of row
// r at chunk c ^ (r % 8)), so that no two rows of an 8-row group share a
// bank. One warpgroup (4 warps) computes 64 rows of the CTA tile; one
// wgmma group per k tile stays in flight while the next is issued, and the
// loads run STAGES - 1 tiles ahead (gpu/wgmma.cuh has the instructions).

// 1 in the code that has the wgmma kernels: a build whose NVCCFLAGS lack
// sm_90a compiles them empty, and they must then never be picked.
__device__ int g_has_wgmma;

__global__ void wgmma_probe_kernel(void)
{
#ifdef RESNETD_WGMMA
    g_has_wgmma = 1;
#else
    g_has_wgmma = 0;
#endif
}

template <int BM, int BN, int STAGES>
struct wg_tile {
    static constexpr int bk = 64;
    static constexpr int threads = BM / 64 * 128;
    static constexpr int stage_bytes = (BM + BN) * 128;
    static constexpr int pipe_smem = STAGES * stage_bytes + 1024;  // +1024: aligning the base
    static constexpr int epi_smem = BM * (BN + 8) * 4 + 1024;
    static constexpr int smem = pipe_smem > epi_smem ? pipe_smem : epi_smem;
    static constexpr int rt_off = smem - 1024;  // from the aligned base: INT8's shortcut's residual tile
    static constexpr int sc_smem_s8 = smem + BM * BN;
};

// S8 and SC as in conv2d_igemm_f16_kernel: wgmma m64nNk32 s8 on the same tiles.
// Tiles up to 128 x 128 ask for two CTAs per SM (128 registers a thread)
// where their shared memory allows it, so that one CTA's epilogue overlaps
// the other's main loop. ONEBAR: one barrier a k step instead of two, the
// loads STAGES - 2 tiles ahead instead of STAGES - 1 (step, below). POOL
// (INT8, no shortcut): the average pool inside (epilogue_pool_s8), as
// kernels of their own, so that the others' code stays as it was.
template <int BM, int BN, int STAGES, bool S8, bool SC = false, bool ONEBAR = false, bool POOL = false>
__global__ void __launch_bounds__(BM / 64 * 128, BM <= 128 && BN <= 128 ? 2 : 1)
    conv2d_igemm_wgmma_kernel(const conv_shape s, const __half *__restrict__ in, const __half *__restrict__ wgt,
                              const float *__restrict__ bias, const void *__restrict__ res, void *__restrict__ out,
                              int relu, float *__restrict__ partial, int kt_per_split, const conv_q8 q)
{
#ifdef RESNETD_WGMMA
    typedef typename acc_type<S8>::type acc_t;
    typedef wg_tile<BM, BN, STAGES> cfg;
    constexpr bool SCR = S8 && SC;
    constexpr int T = cfg::threads, BK = cfg::bk, KCH = BK / 8, ROW_STEP = T / KCH;
    // B_PER rounds up: at 192 rows (384 threads, 48 loader rows a pass) a
    // thread's last weight row may lie past BN, and is then never loaded.
    constexpr int A_PER = BM / ROW_STEP, B_PER = (BN + ROW_STEP - 1) / ROW_STEP, NACC = BN / 2;
    constexpr bool B_PART = BN % ROW_STEP != 0;
    static_assert(BM % 64 == 0 && BM % ROW_STEP == 0 && STAGES >= 3, "tile shape");
    static_assert(!POOL || (S8 && !SC), "the pool inside: INT8 without a shortcut");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    // Swizzled tiles must start on 1024-byte boundaries.
    unsigned char *smem = smem_raw + ((1024u - ((unsigned)__cvta_generic_to_shared(smem_raw) & 1023u)) & 1023u);
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);

    const int M = s.n * s.oh * s.ow, N = s.k, KM = s.kh * s.kw * s.c, K = SC ? conv_k(s) : KM;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wq = warp & 3;  // warpgroup; warp within it
    const int kc = tid % KCH, row0 = tid / KCH;

    igemm_row<__half> arow[A_PER];
    const __half *brow[B_PER];
    bool bvalid[B_PER];
    igemm_rows_make<__half, A_PER, B_PER, SC>(s, in, wgt, m0, n0, row0, ROW_STEP, arow, brow, bvalid);
    if constexpr (B_PART)
        bvalid[B_PER - 1] = bvalid[B_PER - 1] && row0 + (B_PER - 1) * ROW_STEP < BN;
    int kt0;
    int KT = igemm_ktiles(K, BK, partial, kt_per_split, &kt0);
    prefetch_weights<B_PER, STAGES - 1>(brow, bvalid, SCR ? KM : kt0 * BK, K, BK, kc);
    pdl_sync();
    if (res && !partial)  // L2 prefetch of the residual
        prefetch_res<BM, BN, T, S8 ? 1 : 2>(res, m0, n0, M, N, tid);
    const int KTS = SCR ? (s.c2 + BK - 1) / BK : 0;  // as in the mma.sync kernel
    if (SCR)
        KT = KTS + (KM + BK - 1) / BK;
    const int kmain = SCR ? KM : K;  // the end of the columns the tap tiles load
    int loaded = 0;
    igemm_kiter kit = igemm_kiter_make(s, kt0 * BK + kc * 8), kit_sc = kit;
    if constexpr (SCR)
        kit_sc = igemm_kiter_make(s, KM + kc * 8);
    auto load_b = [&](unsigned char *bs, int k, bool kvalid) {
#pragma unroll
        for (int i = 0; i < B_PER; i++) {
            int r = row0 + i * ROW_STEP;
            if (B_PART && i == B_PER - 1 && r >= BN)
                break;  // past the tile (its smem is the next stage's A)
            bool v = kvalid && bvalid[i];
            cp_async16(bs + r * 128 + ((kc ^ (r & 7)) << 4), v ? brow[i] + k : wgt, v);
        }
    };
    // As in the mma.sync kernel.
    auto load_k = [&](int stage, igemm_kiter &it, int kend, auto &&chunk) {
        const int k = it.k;
        const bool kvalid = k < kend;
        const igemm_col col = it.col;
        igemm_kiter_next(s, it, BK);
        unsigned char *as = smem + stage * cfg::stage_bytes;
#pragma unroll
        for (int i = 0; i < A_PER; i++) {
            int r = row0 + i * ROW_STEP;
            chunk(as + r * 128 + ((kc ^ (r & 7)) << 4), arow[i], col, kvalid);
        }
        load_b(as + BM * 128, k, kvalid);
    };
    auto load_main = [&](int stage) {  // the next tap tile, in order
        load_k(stage, kit, kmain, [&](unsigned char *dst, const igemm_row<__half> &row, const igemm_col &col, bool kv) {
            load_a_chunk<S8, SC && !SCR>(dst, s, row, col, kv, in);
        });
    };
    auto load_tile = [&](int stage) {  // SCR: the shortcut's tiles, then the taps'
        if (!SCR || loaded >= KTS) {
            load_main(stage);
            return;
        }
        loaded++;
        load_k(stage, kit_sc, K, [&](unsigned char *dst, const igemm_row<__half> &row, const igemm_col &col, bool kv) {
            load_sc_chunk(dst, s, row, col, kv, in);
        });
    };

    acc_t acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; i++)
        acc[i] = 0;
    wgmma_pin(acc);

    // Loads run STAGES - 1 tiles ahead of the MMAs: the stage refilled in
    // iteration kt is the one the wgmma group of kt - 1 read, free once
    // every warpgroup has waited for that group (the second barrier).
    // ONEBAR: STAGES - 2 ahead, refilling the stage group kt - 2 read, which
    // every warpgroup waited for (wgmma_wait<1> in iteration kt - 1) before
    // the barrier that opens iteration kt: that barrier suffices, and the
    // loads are issued after this tile's MMAs.
    constexpr int AHEAD = ONEBAR ? STAGES - 2 : STAGES - 1;  // tiles the loads run ahead
    auto step = [&](int kt, auto &&load) {
        cp_async_wait<AHEAD - 1>();
        fence_proxy_async_smem();
        __syncthreads();  // tile kt is visible to every warp
        const uint32_t as = sbase + (kt % STAGES) * cfg::stage_bytes;
        const uint64_t da = wgmma_desc(as + wg * 64 * 128), db = wgmma_desc(as + BM * 128);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)  // +32 bytes of K per step: +2 in descriptor units
            wgmma_op<BN, acc_t, S8 ? WG_U8S8 : WG_S8S8>::mma(acc, da + 2 * kk, db + 2 * kk);  // INT8: u8 activations
        wgmma_commit();
        auto load_ahead = [&] {
            if (kt + AHEAD < KT)
                load((kt + AHEAD) % STAGES);
            cp_async_commit();
        };
        if constexpr (ONEBAR)
            load_ahead();
        wgmma_wait<1>();
        wgmma_pin(acc);
        if constexpr (!ONEBAR) {
            __syncthreads();
            load_ahead();
        }
    };
    // At the switch, the shortcut's sums go to the residual tile. The
    // factors of JG column groups load together (the first group's under
    // the last shortcut MMAs), before the stores, which may alias them for
    // the compiler: a group at a time, each waiting on its own loads, took
    // a fifth of layer3.0.conv2's time at 128 x 256 (bench/gpu-notes-diary.md).
    run_k_tiles<AHEAD, SCR>(KT, KTS, load_tile, load_main, step, [&] {
        if constexpr (SCR) {
            constexpr int JG = 8;
            static_assert(BN / 8 % JG == 0, "whole column groups");
            int8_t *rt = reinterpret_cast<int8_t *>(smem + cfg::rt_off);
            const int rb = wg * 64 + wq * 16 + (lane >> 2), cb = 2 * (lane & 3);
#pragma unroll
            for (int j0 = 0; j0 < BN / 8; j0 += JG) {
                sc_pair f[JG];
#pragma unroll
                for (int u = 0; u < JG; u++)
                    f[u] = sc_pair_load(q, n0 + 8 * (j0 + u) + cb, N);
                if (j0 == 0) {
                    wgmma_wait<0>();
                    wgmma_pin(acc);
                }
#pragma unroll
                for (int u = 0; u < JG; u++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int i = 4 * (j0 + u) + 2 * h;
                        const int c = 8 * (j0 + u) + cb;
                        sc_requant2(acc[i], acc[i + 1], f[u], q.sc_inv, rt + s8_rt<BN>::at(rb + 8 * h, c));
                        acc[i] = acc[i + 1] = 0;
                    }
            }
            wgmma_pin(acc);
        }
    });
    wgmma_wait<0>();
    wgmma_pin(acc);
    cp_async_wait<0>();

    // Accumulator i of this thread: row 16 * wq + lane / 4 (+ 8 for i % 4
    // >= 2) of its warpgroup's 64, column 8 * (i / 4) + 2 * (lane % 4) +
    // i % 2.
    const int rbase = wg * 64 + wq * 16 + (lane >> 2), cbase = 2 * (lane & 3);
    if (partial) {
        float *p = partial + (size_t)blockIdx.z * M * N;
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            int col = n0 + 8 * j + cbase;
            if (col >= N)
                continue;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int row = m0 + rbase + 8 * h;
                if (row < M)
                    *reinterpret_cast<float2 *>(p + (size_t)row * N + col) = make_float2(
                        partial_bits(acc[4 * j + 2 * h]), partial_bits(acc[4 * j + 2 * h + 1]));
            }
        }
        return;
    }

    // Epilogue as in the mma.sync kernel: acc + bias staged in shared
    // memory as FP32 (INT8: the raw int32 sums), then 8 channels of a row
    // per thread with 16-byte residual loads and output stores.
    constexpr int LDC = BN + 8;
    __syncthreads();  // every warpgroup is done with the tiles
    if constexpr (S8) {
        int *Ci = reinterpret_cast<int *>(smem);
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                *reinterpret_cast<int2 *>(Ci + (rbase + 8 * h) * LDC + 8 * j +
                                          cbase) = make_int2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        __syncthreads();
        if constexpr (POOL) {
            epilogue_pool_s8<BM, BN, T>(Ci, LDC, m0, n0, M, N, bias, q, static_cast<const int8_t *>(res), relu, tid);
        } else {
            const int8_t *r8 = SCR ? reinterpret_cast<const int8_t *>(smem + cfg::rt_off)
                                   : static_cast<const int8_t *>(res);
            epilogue_rows_s8<BM, BN, T, SCR, !(BM <= 128 && BN <= 128)>(Ci, LDC, m0, n0, M, N, bias, q, r8, relu, out,
                                                                        tid);
        }
        return;
    }
    float *Cs = reinterpret_cast<float *>(smem);
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        int c = 8 * j + cbase;
        float b0 = n0 + c < N ? bias[n0 + c] : 0.f, b1 = n0 + c < N ? bias[n0 + c + 1] : 0.f;
#pragma unroll
        for (int h = 0; h < 2; h++)
            *reinterpret_cast<float2 *>(Cs + (rbase + 8 * h) * LDC + c) = make_float2(acc[4 * j + 2 * h] + b0,
                                                                                      acc[4 * j + 2 * h + 1] + b1);
    }
    __syncthreads();
    epilogue_rows_f16<BM, BN, T>(Cs, LDC, m0, n0, M, N, static_cast<const __half *>(res), relu,
                                 static_cast<__half *>(out), tid);
#else
    (void)s;
    (void)in;
    (void)wgt;
    (void)bias;
    (void)res;
    (void)out;
    (void)relu;
    (void)partial;
    (void)kt_per_split;
    (void)q;
#endif
}

#endif
