// The FP16 (and INT8) tensor-core conv kernel on mma.sync, with its
// epilogues: one of gpu/conv.cu's kernel families, instantiated by its tile
// table (kTilesF16, kTilesS8).
#ifndef RESNETD_GPU_CONV_MMA_CUH
#define RESNETD_GPU_CONV_MMA_CUH

#include "gpu/conv_loaders.cuh"

/* ===================================================================== */
/* FP16 tensor-core kernel                                               */
/* ===================================================================== */

// One 16-byte chunk of the shortcut's columns (channel col.c of the
// second input). Stride 1 (conv_shape_check): the output pixel is the
// receptive field's corner + the padding; rows past M have it far below 0.
// (conv_launch runs SC kernels only with c2 > 0; c2 = 0 loads zeros.)
__device__ __forceinline__ void load_sc_chunk(void *dst, const conv_shape &s, const igemm_row<__half> &row,
                                              const igemm_col &col, bool kvalid, const __half *in)
{
    const int oy = row.iy + s.pad_h, ox = row.ix + s.pad_w;
    const bool v = kvalid && oy >= 0 && s.c2 > 0;
    const __half *src = in;
    if (v) {
        const int img = (int)(row.base - in) / (s.h * s.w * s.c);
        src = static_cast<const __half *>(s.in2) + ((img * s.h2 + oy * s.stride2) * s.w2 + ox * s.stride2) * s.c2 +
              col.c;
    }
    cp_async16(dst, src, v);
}

// One 16-byte chunk of A into smem: one copy.
template <bool S8, bool SC>
__device__ __forceinline__ void load_a_chunk(void *dst, const conv_shape &s, const igemm_row<__half> &row,
                                             const igemm_col &col, bool kvalid, const __half *in)
{
    if (SC && col.r == s.kh) {  // the shortcut's columns: tap row kh is past the filter
        load_sc_chunk(dst, s, row, col, kvalid, in);
        return;
    }
    bool v;
    const __half *src = igemm_a_addr(s, row, col, kvalid, &v);
    cp_async16(dst, v ? src : in, v);
}

// Raw sums as the split-K partial buffer's 32-bit words (int32 for INT8).
__device__ __forceinline__ float partial_bits(float x)
{
    return x;
}
__device__ __forceinline__ float partial_bits(int x)
{
    return __int_as_float(x);
}

// The epilogue's factors of channels col..col+7: mult and bias are 16-byte
// aligned (conv_launch checks), so four vector loads, which callers hoist
// out of their loops (a store may alias them for the compiler).
struct __align__(16) s8_chan8
{
    float m[8], b[8];
};

__device__ __forceinline__ s8_chan8 s8_chan8_load(const float *bias, const conv_q8 &q, int col)
{
    s8_chan8 f;
    *reinterpret_cast<float4 *>(f.m) = __ldg(reinterpret_cast<const float4 *>(q.mult + col));
    *reinterpret_cast<float4 *>(f.m + 4) = __ldg(reinterpret_cast<const float4 *>(q.mult + col + 4));
    *reinterpret_cast<float4 *>(f.b) = __ldg(reinterpret_cast<const float4 *>(bias + col));
    *reinterpret_cast<float4 *>(f.b + 4) = __ldg(reinterpret_cast<const float4 *>(bias + col + 4));
    return f;
}

// The factors of a thread's 8 channels in an epilogue whose threads keep
// their channels across rows (T a multiple of BN / 8), else zeros.
template <int BN, int T>
__device__ __forceinline__ s8_chan8 s8_fixed_chan8(const float *bias, const conv_q8 &q, int n0, int N, int tid)
{
    s8_chan8 f{};
    const int c0 = (tid % (BN / 8)) * 8;
    if (T % (BN / 8) == 0 && n0 + c0 < N)
        f = s8_chan8_load(bias, q, n0 + c0);
    return f;
}

// Eight int32 sums of one output row, channels f's: the epilogue, then 8
// int8 values (one 8-byte store) or, for the last conv, 8 floats (OUT:
// which, or q.out_f32 at run time). rbits: the 8 residual values (res:
// there is one); o: the output's element index.
enum { S8_OUT_RUNTIME, S8_OUT_I8, S8_OUT_F32 };
template <int OUT>
__device__ __forceinline__ void store8_s8(const int (&a)[8], const s8_chan8 &f, const conv_q8 &q, uint2 rbits, bool res,
                                          int relu, void *out, size_t o)
{
    const float *m = f.m, *b = f.b;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int r = q8_byte(j < 4 ? rbits.x : rbits.y, j % 4, q.res_u8);
        v[j] = s8_value(a[j], m[j], b[j], r, q.res_scale, res);  // ReLU below
    }
    if (OUT == S8_OUT_F32 || (OUT == S8_OUT_RUNTIME && q.out_f32)) {
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = s8_relu(v[j], relu);
        float *f = reinterpret_cast<float *>(out) + o;
        *reinterpret_cast<float4 *>(f) = make_float4(v[0], v[1], v[2], v[3]);
        *reinterpret_cast<float4 *>(f + 4) = make_float4(v[4], v[5], v[6], v[7]);
    } else {
        int t[8];
#pragma unroll
        for (int j = 0; j < 8; j++)
            t[j] = int8_requant_lo(v[j], q.out_inv, relu);
        const uint32_t w0 = q8_pack2(t[1], t[0], q8_pack2(t[3], t[2], 0, relu), relu),
                       w1 = q8_pack2(t[5], t[4], q8_pack2(t[7], t[6], 0, relu), relu);
        *reinterpret_cast<uint2 *>(reinterpret_cast<int8_t *>(out) + o) = make_uint2(w0, w1);
    }
}

// INT8's shortcut: the factors (mult, bias) of output channels col and
// col + 1, or zeros past N (N % 8 == 0, col even: both or neither), which
// finish any sums as 0.
struct sc_pair {
    float2 m, b;
};

__device__ __forceinline__ sc_pair sc_pair_load(const conv_q8 &q, int col, int N)
{
    sc_pair f = { make_float2(0.f, 0.f), make_float2(0.f, 0.f) };
    if (col < N) {
        f.m = __ldg(reinterpret_cast<const float2 *>(q.sc_mult + col));
        f.b = __ldg(reinterpret_cast<const float2 *>(q.sc_bias + col));
    }
    return f;
}

// A shortcut's sum below 2^22 in magnitude as a float made from its bits,
// exactly: two full-rate operations instead of a conversion at a quarter of
// the rate, for a tile's worth of sums. Every sum is below 2^22 but with
// 256 input channels (CONV_S8_SC_MAX_C2).
__device__ __forceinline__ float sc_int2float(int a)
{
    return __fsub_rn(__int_as_float(0x4B400000 + a), 12582912.0f);
}

// The shortcut's sums a0, a1 (channels f's) finished as the downsample's
// own epilogue would (engine/int8.h: no residual, no ReLU, its output's
// scale, inv) into 2 bytes of the residual tile.
__device__ __forceinline__ void sc_requant2(int a0, int a1, const sc_pair &f, float inv, int8_t *rt)
{
    const int t0 = int8_requant_lo(__fadd_rn(__fmul_rn(sc_int2float(a0), f.m.x), f.b.x), inv, 0);
    const int t1 = int8_requant_lo(__fadd_rn(__fmul_rn(sc_int2float(a1), f.m.y), f.b.y), inv, 0);
    *reinterpret_cast<uint16_t *>(rt) = (uint16_t)int8_pack2(t1, t0, 0);
}

// A thread's 8-channel group stays the same across its rows when T is a
// multiple of BN / 8: its factors are then loaded once. The residual
// loads of R rows at a time are issued before their stores (which, for
// the compiler, may alias them). RT: res is the shortcut's residual tile
// in shared memory (s8_rt), not the output-shaped tensor.
// The residual tile: BM rows of BN bytes, unpadded (with padding the
// 128 x 128 wgmma tile no longer fits two CTAs an SM), 8-byte chunk c of
// row r at chunk c ^ (r % 8): the 2-byte stores of 8 rows then hit 16
// banks, and the epilogue's 8-byte loads stay whole.
template <int BN>
struct s8_rt {
    static_assert(BN % 64 == 0, "a row holds 8 chunks to swizzle");
    __device__ static __forceinline__ int at(int r, int c)
    {
        return r * BN + ((((c >> 3) ^ (r & 7)) << 3) | (c & 7));
    }
};
// HOIST: each pass reads its R rows' sums (as well as their residuals)
// before its first store, with the output type fixed (OUT) rather than a
// branch in each row, so that no row's shared-memory loads wait on the
// row before. Faster at one CTA an SM (128 x 256: two warps a scheduler
// to hide that latency), slower at two (bench/gpu-notes-diary.md).
template <int BM, int BN, int T, bool RT, int OUT, bool HOIST>
__device__ __forceinline__ void epilogue_rows_s8_as(const int *Cs, int ldc, int m0, int n0, int M, int N,
                                                    const float *bias, const conv_q8 &q, const int8_t *res, int relu,
                                                    void *out, int tid)
{
    constexpr bool FIXED = T % (BN / 8) == 0;
    constexpr int IDS = BM * BN / 8, R = 4;
    const s8_chan8 f0 = s8_fixed_chan8<BN, T>(bias, q, n0, N, tid);
    for (int id0 = tid; id0 < IDS; id0 += R * T) {
        uint2 rv[R];
        int a[R][8];
#pragma unroll
        for (int k = 0; k < R; k++) {
            // HOIST: rows past the tile's last read its last row's (not stored).
            const int id = HOIST ? min(id0 + k * T, IDS - 1) : id0 + k * T, r = id / (BN / 8), c = (id % (BN / 8)) * 8,
                      col = n0 + c;
            if constexpr (HOIST) {
                *reinterpret_cast<int4 *>(a[k]) = *reinterpret_cast<const int4 *>(Cs + r * ldc + c);
                *reinterpret_cast<int4 *>(a[k] + 4) = *reinterpret_cast<const int4 *>(Cs + r * ldc + c + 4);
            }
            rv[k] = make_uint2(0, 0);
            if (RT && id < IDS)
                rv[k] = *reinterpret_cast<const uint2 *>(res + s8_rt<BN>::at(r, c));
            else if (!RT && res && id < IDS && m0 + r < M && col < N)
                rv[k] = *reinterpret_cast<const uint2 *>(res + (size_t)(m0 + r) * N + col);
        }
#pragma unroll
        for (int k = 0; k < R; k++) {
            const int id = id0 + k * T, r = id / (BN / 8), c = (id % (BN / 8)) * 8;
            const int row = m0 + r, col = n0 + c;
            if (id >= IDS || row >= M || col >= N)
                continue;
            if constexpr (!HOIST) {
                *reinterpret_cast<int4 *>(a[k]) = *reinterpret_cast<const int4 *>(Cs + r * ldc + c);
                *reinterpret_cast<int4 *>(a[k] + 4) = *reinterpret_cast<const int4 *>(Cs + r * ldc + c + 4);
            }
            const size_t o = (size_t)row * N + col;
            store8_s8<OUT>(a[k], FIXED ? f0 : s8_chan8_load(bias, q, col), q, rv[k], res != NULL, relu, out, o);
        }
    }
}

template <int BM, int BN, int T, bool RT = false, bool HOIST = false>
__device__ __forceinline__ void epilogue_rows_s8(const int *Cs, int ldc, int m0, int n0, int M, int N,
                                                 const float *bias, const conv_q8 &q, const int8_t *res, int relu,
                                                 void *out, int tid)
{
    if constexpr (!HOIST)
        epilogue_rows_s8_as<BM, BN, T, RT, S8_OUT_RUNTIME, false>(Cs, ldc, m0, n0, M, N, bias, q, res, relu, out, tid);
    else if (q.out_f32)
        epilogue_rows_s8_as<BM, BN, T, RT, S8_OUT_F32, HOIST>(Cs, ldc, m0, n0, M, N, bias, q, res, relu, out, tid);
    else
        epilogue_rows_s8_as<BM, BN, T, RT, S8_OUT_I8, HOIST>(Cs, ldc, m0, n0, M, N, bias, q, res, relu, out, tid);
}

// INT8's last conv with the average pool inside (conv_q8.pool_out): each
// (row, 8 channels) of the staged sums finished in FP32 in place, then
// each image's rows in the tile summed per channel in float64 (in row
// order; engine/int8.h's sums are exact, so any order gives its bits). An
// image wholly in the tile gets its mean here; one split between two tiles
// leaves its part's sums in pool_part, and the CTA that arrives second
// adds the two, always part 0 + part 1. That saves the last conv's FP32
// store (25.7 MB at batch 256) and the pool's kernel, which read it back.
template <int BM, int BN, int T>
__device__ __forceinline__ void epilogue_pool_s8(int *Ci, int ldc, int m0, int n0, int M, int N, const float *bias,
                                                 const conv_q8 &q, const int8_t *res, int relu, int tid)
{
    static_assert(BN % 64 == 0, "the pool's counters are per 64 channels");
    // As epilogue_rows_s8_as: the residual loads of R rows issued first.
    float *Cf = reinterpret_cast<float *>(Ci);
    constexpr bool FIXED = T % (BN / 8) == 0;
    constexpr int IDS = BM * BN / 8, R = 4;
    const s8_chan8 f0 = s8_fixed_chan8<BN, T>(bias, q, n0, N, tid);
    for (int id0 = tid; id0 < IDS; id0 += R * T) {
        uint2 rv[R];
#pragma unroll
        for (int k = 0; k < R; k++) {
            const int id = id0 + k * T, row = m0 + id / (BN / 8), col = n0 + (id % (BN / 8)) * 8;
            rv[k] = make_uint2(0, 0);
            if (res && id < IDS && row < M && col < N)
                rv[k] = *reinterpret_cast<const uint2 *>(res + (size_t)row * N + col);
        }
#pragma unroll
        for (int k = 0; k < R; k++) {
            const int id = id0 + k * T, r = id / (BN / 8), c = (id % (BN / 8)) * 8;
            if (id >= IDS || m0 + r >= M || n0 + c >= N)
                continue;
            int a[8];
            *reinterpret_cast<int4 *>(a) = *reinterpret_cast<const int4 *>(Ci + r * ldc + c);
            *reinterpret_cast<int4 *>(a + 4) = *reinterpret_cast<const int4 *>(Ci + r * ldc + c + 4);
            // In place: the floats overwrite the sums just read.
            store8_s8<S8_OUT_F32>(a, FIXED ? f0 : s8_chan8_load(bias, q, n0 + c), q, rv[k], res != NULL, relu, Cf,
                                  (size_t)(r * ldc + c));
        }
    }
    __syncthreads();
    const int hw = q.pool_hw, mend = min(m0 + BM, M), img0 = m0 / hw, nseg = (mend - 1) / hw - img0 + 1;
    for (int t = tid; t < nseg * BN; t += T) {
        const int img = img0 + t / BN, c = t % BN, col = n0 + c;
        const int lo = max(img * hw, m0), hi = min(img * hw + hw, mend);
        if (col >= N)
            continue;
        double sum = 0;
#pragma unroll 7
        for (int row = lo; row < hi; row++)
            sum += Cf[(row - m0) * ldc + c];
        if (lo == img * hw && hi == img * hw + hw)
            q.pool_out[(size_t)img * N + col] = __float2half_rn((float)(sum / hw));
        else
            q.pool_part[((size_t)img * 2 + (lo == img * hw ? 0 : 1)) * N + col] = sum;
    }
    // A split image can only be the tile's first or last (hw <= BM).
    const bool split_first = m0 % hw != 0 || (nseg == 1 && mend < img0 * hw + hw);
    const bool split_last = nseg > 1 && mend < (img0 + nseg - 1) * hw + hw;
    if (!split_first && !split_last)
        return;
    __shared__ int second[2];
    __threadfence();  // this CTA's parts, seen by the other CTA before its count
    __syncthreads();
    if (tid < 2) {
        const bool split = tid == 0 ? split_first : split_last;
        int *cnt = q.pool_cnt + (size_t)(img0 + (tid == 0 ? 0 : nseg - 1)) * (N / 64) + n0 / 64;
        second[tid] = split && atomicAdd(cnt, 1) == 1;
        if (second[tid])
            *cnt = 0;  // for the next pass
    }
    __syncthreads();
    for (int t = tid; t < 2 * BN; t += T) {
        const int g = t / BN, c = t % BN, col = n0 + c;
        if (!second[g] || col >= N)
            continue;
        __threadfence();  // the other CTA's parts, after its count
        const int img = img0 + (g == 0 ? 0 : nseg - 1);
        const double *pp = q.pool_part + (size_t)img * 2 * N + col;
        const double sum = __ldcg(pp) + __ldcg(pp + N);
        q.pool_out[(size_t)img * N + col] = __float2half_rn((float)(sum / hw));
    }
}

// Eight FP32 sums of one output row (bias added) + 8 residual halves (res,
// may be NULL), ReLU, stored as 8 halves at out: 16-byte accesses.
__device__ __forceinline__ void store8_f16(const float *sums, const __half *res, int relu, __half *out)
{
    float v[8];
    *reinterpret_cast<float4 *>(v) = *reinterpret_cast<const float4 *>(sums);
    *reinterpret_cast<float4 *>(v + 4) = *reinterpret_cast<const float4 *>(sums + 4);
    if (res) {
        uint4 rv = *reinterpret_cast<const uint4 *>(res);
        const __half2 *rh = reinterpret_cast<const __half2 *>(&rv);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 f = __half22float2(rh[j]);
            v[2 * j] += f.x;
            v[2 * j + 1] += f.y;
        }
    }
    uint4 ov;
    __half2 *oh = reinterpret_cast<__half2 *>(&ov);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float a = v[2 * j], b = v[2 * j + 1];
        if (relu) {
            a = fmaxf(a, 0.f);
            b = fmaxf(b, 0.f);
        }
        oh[j] = __floats2half2_rn(a, b);
    }
    *reinterpret_cast<uint4 *>(out) = ov;
}

// The FP16 kernels' epilogue after the accumulators (bias added) are staged
// in shared memory as FP32 (Cs, ldc floats a row): each thread finishes 8
// channels of a row at a time.
template <int BM, int BN, int T>
__device__ __forceinline__ void epilogue_rows_f16(const float *Cs, int ldc, int m0, int n0, int M, int N,
                                                  const __half *res, int relu, __half *out, int tid)
{
    for (int id = tid; id < BM * BN / 8; id += T) {
        int r = id / (BN / 8), c = (id % (BN / 8)) * 8;
        int row = m0 + r, col = n0 + c;
        if (row >= M || col >= N)
            continue;
        size_t o = (size_t)row * N + col;
        store8_f16(Cs + r * ldc + c, res ? res + o : NULL, relu, out + o);
    }
}

// Every k tile of a CTA through the pipeline: the prologue's AHEAD loads
// (the tiles the loads run ahead of the MMAs), then step(kt, loader) a
// tile. SCR: the shortcut's KTS tiles first (load_tile loads either kind),
// at_switch() once their sums are complete, then the taps' tiles in a loop
// of their own (load_main alone), which is then the loop of the kernels
// without a shortcut.
template <int AHEAD, bool SCR, typename LT, typename LM, typename ST, typename SW>
__device__ __forceinline__ void run_k_tiles(int KT, int KTS, LT &&load_tile, LM &&load_main, ST &&step, SW &&at_switch)
{
#pragma unroll
    for (int st = 0; st < AHEAD; st++) {
        if (st < KT)
            load_tile(st);
        cp_async_commit();
    }
    int kt = 0;
    if constexpr (SCR) {
        for (; kt < KTS; kt++)
            step(kt, load_tile);
        at_switch();
    }
    for (; kt < KT; kt++)
        step(kt, load_main);
}

// CTA tile BM x BN, K step BK; WM x WN warps, each owning a
// (BM/WM) x (BN/WN) block of the output; STAGES tiles in flight.
template <int BM, int BN, int BK, int WM, int WN, int STAGES, int MINB>
struct f16_tile {
    static constexpr int threads = WM * WN * 32;
    static constexpr int lds = BK + 8;  // halves per smem row: +16 bytes keeps ldmatrix conflict-free
    static constexpr int pipe_smem = STAGES * (BM + BN) * lds * 2;
    static constexpr int epi_smem = BM * (BN + 8) * 4;  // the FP32 epilogue tile, reusing the same memory
    static constexpr int smem = pipe_smem > epi_smem ? pipe_smem : epi_smem;
    static constexpr int rt_off = smem;  // INT8's shortcut: the residual tile after both
    static constexpr int sc_smem_s8 = smem + BM * BN;
};

// S8: int8 data described as halves (see the top of the file), s8 MMA,
// int32 sums, engine/int8.h's epilogue with q; res and out are then int8
// (out FP32 when q.out_f32). Otherwise FP16 and q unused. SC: a shortcut
// (conv_shape.c2), instantiated apart so that the other convs' loaders
// stay as they were (the shortcut's branch slowed them). S8 and SC (no
// split-K): the shortcut's k tiles run first; at the first tap tile the
// sums are finished as the downsample's output (sc_requant2) into the
// residual tile, and the accumulators start again from 0.
template <int BM, int BN, int BK, int WM, int WN, int STAGES, int MINB, bool S8, bool SC = false>
__global__ void __launch_bounds__(WM *WN * 32, MINB)
    conv2d_igemm_f16_kernel(const conv_shape s, const __half *__restrict__ in, const __half *__restrict__ wgt,
                            const float *__restrict__ bias, const void *__restrict__ res, void *__restrict__ out,
                            int relu, float *__restrict__ partial, int kt_per_split, const conv_q8 q)
{
    typedef typename acc_type<S8>::type acc_t;
    typedef f16_tile<BM, BN, BK, WM, WN, STAGES, MINB> cfg;
    constexpr bool SCR = S8 && SC;
    constexpr int T = cfg::threads, LDS = cfg::lds, KCH = BK / 8;
    constexpr int A_PER = BM * KCH / T, B_PER = BN * KCH / T, ROW_STEP = T / KCH;
    constexpr int WTM = BM / WM, WTN = BN / WN, MI = WTM / 16, NI = WTN / 8;
    static_assert(BM * KCH % T == 0 && BN * KCH % T == 0 && T % KCH == 0, "loader shape");
    static_assert(WTM % 16 == 0 && WTN % 16 == 0 && BK % 16 == 0, "warp tile shape");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    __half *As = reinterpret_cast<__half *>(smem_raw);  // [STAGES][BM][LDS]
    __half *Bs = As + STAGES * BM * LDS;  // [STAGES][BN][LDS]

    const int M = s.n * s.oh * s.ow, N = s.k, KM = s.kh * s.kw * s.c, K = SC ? conv_k(s) : KM;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WN, wn = warp % WN;
    const int kc = tid % KCH, row0 = tid / KCH;

    igemm_row<__half> arow[A_PER];
    const __half *brow[B_PER];
    bool bvalid[B_PER];
    igemm_rows_make<__half, A_PER, B_PER, SC>(s, in, wgt, m0, n0, row0, ROW_STEP, arow, brow, bvalid);
    // Split-K: CTA z covers k tiles [kt0, kt0 + KT) and leaves the
    // epilogue to splitk_epilogue_kernel.
    int kt0;
    int KT = igemm_ktiles(K, BK, partial, kt_per_split, &kt0);
    prefetch_weights<B_PER, STAGES - 1>(brow, bvalid, SCR ? KM : kt0 * BK, K, BK, kc);
    pdl_sync();
    if (res && !partial)  // L2 prefetch of the residual
        prefetch_res<BM, BN, T, S8 ? 1 : 2>(res, m0, n0, M, N, tid);
    // SCR: tiles [0, KTS) hold the shortcut's columns [KM, K), the rest the taps'.
    const int KTS = SCR ? (s.c2 + BK - 1) / BK : 0;
    if (SCR)
        KT = KTS + (KM + BK - 1) / BK;
    const int kmain = SCR ? KM : K;  // the end of the columns the tap tiles load
    int loaded = 0;
    igemm_kiter kit = igemm_kiter_make(s, kt0 * BK + kc * 8), kit_sc = kit;
    if constexpr (SCR)
        kit_sc = igemm_kiter_make(s, KM + kc * 8);
    auto load_b = [&](__half *bs, int k, bool kvalid) {
#pragma unroll
        for (int i = 0; i < B_PER; i++) {
            bool v = kvalid && bvalid[i];
            cp_async16(bs + (row0 + i * ROW_STEP) * LDS + kc * 8, v ? brow[i] + k : wgt, v);
        }
    };
    // The next k tile of iterator it (columns below kend) into a stage, A by chunk(dst, row, col, kvalid).
    auto load_k = [&](int stage, igemm_kiter &it, int kend, auto &&chunk) {
        const int k = it.k;
        const bool kvalid = k < kend;
        const igemm_col col = it.col;
        igemm_kiter_next(s, it, BK);
        __half *as = As + stage * BM * LDS;
#pragma unroll
        for (int i = 0; i < A_PER; i++)
            chunk(as + (row0 + i * ROW_STEP) * LDS + kc * 8, arow[i], col, kvalid);
        load_b(Bs + stage * BN * LDS, k, kvalid);
    };
    auto load_main = [&](int stage) {  // the next tap tile: 0, 1, 2, ... in order
        load_k(stage, kit, kmain, [&](__half *dst, const igemm_row<__half> &row, const igemm_col &col, bool kv) {
            load_a_chunk<S8, SC && !SCR>(dst, s, row, col, kv, in);
        });
    };
    auto load_tile = [&](int stage) {  // SCR: the shortcut's tiles, then the taps'
        if (!SCR || loaded >= KTS) {
            load_main(stage);
            return;
        }
        loaded++;
        load_k(stage, kit_sc, K, [&](__half *dst, const igemm_row<__half> &row, const igemm_col &col, bool kv) {
            load_sc_chunk(dst, s, row, col, kv, in);
        });
    };

    acc_t acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[i][j][e] = 0;

    auto step = [&](int kt, auto &&load) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // tile kt visible to all; the stage refilled next is free
        int next = kt + STAGES - 1;
        if (next < KT)
            load(next % STAGES);
        cp_async_commit();

        const __half *as = As + (kt % STAGES) * BM * LDS, *bs = Bs + (kt % STAGES) * BN * LDS;
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t a[MI][4], b[NI][2];
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
                ldmatrix_x4(a[mi], as + (wm * WTM + mi * 16 + (lane & 15)) * LDS + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int nj = 0; nj < NI / 2; nj++) {
                uint32_t r[4];
                ldmatrix_x4(r, bs + (wn * WTN + nj * 16 + (lane >> 4) * 8 + (lane & 7)) * LDS + kk * 16 +
                                   ((lane >> 3) & 1) * 8);
                b[2 * nj][0] = r[0];
                b[2 * nj][1] = r[1];
                b[2 * nj + 1][0] = r[2];
                b[2 * nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int ni = 0; ni < NI; ni++)
                    mma_act(acc[mi][ni], a[mi], b[ni]);
        }
    };
    // At the switch, the shortcut's sums go to the residual tile.
    run_k_tiles<STAGES - 1, SCR>(KT, KTS, load_tile, load_main, step, [&] {
        if constexpr (SCR) {
            int8_t *rt = reinterpret_cast<int8_t *>(smem_raw + cfg::rt_off);
#pragma unroll
            for (int ni = 0; ni < NI; ni++) {
                const int c = wn * WTN + ni * 8 + (lane & 3) * 2;
                const sc_pair f = sc_pair_load(q, n0 + c, N);
#pragma unroll
                for (int mi = 0; mi < MI; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int r = wm * WTM + mi * 16 + (lane >> 2) + h * 8;
                        sc_requant2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1], f, q.sc_inv, rt + s8_rt<BN>::at(r, c));
                        acc[mi][ni][2 * h] = acc[mi][ni][2 * h + 1] = 0;
                    }
            }
        }
    });
    cp_async_wait<0>();

    // Split-K: raw partial sums (FP32, int32 bits at INT8) straight from the accumulators
    // (row lane/4 [+8], cols 2*(lane%4) [+1] of each m16n8 block).
    if (partial) {
        float *p = partial + (size_t)blockIdx.z * M * N;
#pragma unroll
        for (int ni = 0; ni < NI; ni++) {
            int col = n0 + wn * WTN + ni * 8 + (lane & 3) * 2;
            if (col >= N)
                continue;
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int row = m0 + wm * WTM + mi * 16 + (lane >> 2) + h * 8;
                    if (row < M)
                        *reinterpret_cast<float2 *>(p + (size_t)row * N + col) = make_float2(
                            partial_bits(acc[mi][ni][2 * h]), partial_bits(acc[mi][ni][2 * h + 1]));
                }
        }
        return;
    }

    // Epilogue: acc + bias staged in shared memory as FP32 (in the
    // pipeline's buffers, free now), then each thread finishes 8 channels of a row
    // with 16-byte residual loads and output stores.
    constexpr int LDC = BN + 8;  // +8 floats: a half-warp's float2 stores hit 32 distinct banks
    static_assert(BM * LDC * 4 <= cfg::smem, "epilogue tile must fit in the kernel's smem");
    __syncthreads();  // every warp is done with As/Bs
    if constexpr (S8) {  // raw int32 sums staged; int8.h's epilogue does the rest
        int *Ci = reinterpret_cast<int *>(smem_raw);
#pragma unroll
        for (int ni = 0; ni < NI; ni++) {
            int c = wn * WTN + ni * 8 + (lane & 3) * 2;
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int r = wm * WTM + mi * 16 + (lane >> 2) + h * 8;
                    *reinterpret_cast<int2 *>(Ci + r * LDC + c) = make_int2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
                }
        }
        __syncthreads();
        const int8_t *r8 = SCR ? reinterpret_cast<const int8_t *>(smem_raw + cfg::rt_off)
                               : static_cast<const int8_t *>(res);
        epilogue_rows_s8<BM, BN, T, SCR>(Ci, LDC, m0, n0, M, N, bias, q, r8, relu, out, tid);
        return;
    }
    float *Cs = reinterpret_cast<float *>(smem_raw);
#pragma unroll
    for (int ni = 0; ni < NI; ni++) {
        int c = wn * WTN + ni * 8 + (lane & 3) * 2;
        float b0 = n0 + c < N ? bias[n0 + c] : 0.f, b1 = n0 + c < N ? bias[n0 + c + 1] : 0.f;
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int r = wm * WTM + mi * 16 + (lane >> 2) + h * 8;
                *reinterpret_cast<float2 *>(Cs + r * LDC + c) = make_float2(acc[mi][ni][2 * h] + b0,
                                                                            acc[mi][ni][2 * h + 1] + b1);
            }
    }
    __syncthreads();
    epilogue_rows_f16<BM, BN, T>(Cs, LDC, m0, n0, M, N, static_cast<const __half *>(res), relu,
                                 static_cast<__half *>(out), tid);
}

#endif
