// Convolution as an implicit GEMM: the im2col unroll happens in the tile
// loader's addressing, the GEMM in registers, and the epilogue (folded-BN
// bias, optional residual add, ReLU) before the one store of the output.
//
// GEMM view: M = n*oh*ow output pixels (rows of the NHWC output), N = cout,
// K = kh*kw*cin in (r, s, c) order, the order of a KRSC weight row, so both
// operands are K-contiguous: A[m][k] gathered from the input, B[n][k] the
// weights. Tiles move in 16-byte chunks (8 halves or 4 floats) that never
// straddle a filter tap, which is what conv_shape_check enforces. A conv
// with a shortcut (conv_shape.c2) has c2 more K columns after the taps,
// gathered from the second input at the output pixel x stride2: to the
// loaders, a tap row past the filter's. FP16 sums them with the taps';
// INT8 runs them first and requantises their sums on their own
// (engine/int8.h), into a residual tile in shared memory.
//
// Two kernels from one template family share the geometry and the loaders:
//   conv2d_igemm_f16_kernel: FP16 tensor cores (mma.sync m16n8k16, FP32
//     accumulate), ldmatrix fragments, a STAGES-deep cp.async pipeline.
//   conv2d_igemm_f32_kernel: FP32 SIMT, 8x8 outputs per thread, register-
//     staged double buffering (exact FP32 for parity with the CPU engine).
// Tile shapes are template parameters; kTilesF16/kTilesF32 list the
// instantiations; the engine times them per layer and batch (or asks
// conv_plan_pick's cost model) and may split K when a layer has few tiles.
//
// INT8 (kTilesS8) runs the FP16 kernels themselves, instantiated with S8:
// an int8 NHWC tensor of c channels is byte for byte an FP16 one of c/2,
// and the s8 MMA fragments (mma.sync m16n8k32, wgmma m64nNk32 K-major)
// have the f16 ones' byte layout (m16n8k16, m64nNk16), so the loaders,
// swizzles and ldmatrix run unchanged on int8 data described as halves.
// Only the MMA (s8, exact int32 sums) and the epilogue differ: engine/int8.h's
// requantisation, bit for bit the CPU INT8 engine's.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <atomic>
#include <type_traits>
#include "gpu/kernels.cuh"
#include "gpu/mma.cuh"
#include "gpu/wgmma.cuh"

/* ===================================================================== */
/* Geometry shared by both kernels                                       */
/* ===================================================================== */

conv_shape conv_shape_make(int n, int h, int w, int c, int k, int kh, int kw, int stride, int pad_h,
                           int pad_w)
{
    conv_shape s;
    s.n = n; s.h = h; s.w = w; s.c = c;
    s.k = k; s.kh = kh; s.kw = kw;
    s.stride = stride; s.pad_h = pad_h; s.pad_w = pad_w;
    s.oh = (h + 2 * pad_h - kh) / stride + 1;
    s.ow = (w + 2 * pad_w - kw) / stride + 1;
    s.c2 = 0; s.h2 = 0; s.w2 = 0; s.stride2 = 1;
    s.in2 = NULL;
    return s;
}

int conv_shape_check(const conv_shape *s, int kind, char *err, size_t errlen)
{
    // Elements per 16-byte chunk; the stem's layouts: a chunk is two FP16
    // pixels of 4 channels, or four INT8 pixels of 4 (loaded as two pairs).
    int chunk = kind == CONV_INT8 ? 16 : kind == CONV_FP16 ? 8 : 4;
    int stem_layout = ((kind == CONV_FP16 && s->c == 4) || (kind == CONV_INT8 && s->c == 4 && s->kw % 4 == 0)) &&
                      s->kw % 2 == 0 && s->w % 2 == 0 && s->pad_w % 2 == 0 && s->stride % 2 == 0;
    if (s->n < 1 || s->h < 1 || s->w < 1 || s->c < 1 || s->k < 1 || s->kh < 1 || s->kw < 1 ||
        s->stride < 1 || s->pad_h < 0 || s->pad_w < 0 || s->oh < 1 || s->ow < 1) {
        snprintf(err, errlen, "conv shape out of range");
        return -1;
    }
    if (s->c % chunk != 0 && !stem_layout) {
        snprintf(err, errlen, "conv input channels %d not a multiple of %d", s->c, chunk);
        return -1;
    }
    if (s->k % 8 != 0) {
        snprintf(err, errlen, "conv output channels %d not a multiple of 8", s->k);
        return -1;
    }
    if ((double)s->n * s->oh * s->ow * s->k >= 2147483647.0 || (double)s->n * s->h * s->w * s->c >= 2147483647.0) {
        snprintf(err, errlen, "conv tensor too large");
        return -1;
    }
    if (s->c2 != 0) {  // the shortcut's loader: whole chunks within its own columns, stride-1 rows
        if (kind == CONV_FP32 || s->c2 < 0 || s->c2 % chunk != 0 || s->c2 > s->c || s->stride != 1 ||
            s->h2 < 1 || s->w2 < 1 || s->stride2 < 1 || (long)(s->oh - 1) * s->stride2 >= s->h2 ||
            (long)(s->ow - 1) * s->stride2 >= s->w2 || (double)s->n * s->h2 * s->w2 * s->c2 >= 2147483647.0 ||
            (kind == CONV_INT8 && s->c2 > CONV_S8_SC_MAX_C2)) {
            snprintf(err, errlen, "conv shortcut of %d channels not supported for this shape", s->c2);
            return -1;
        }
    }
    return 0;
}

// Where row m of A starts: its image's base pointer and the top-left input
// coordinate of its receptive field. Rows past M get a coordinate that is
// outside every image, so their chunks load as zeros.
template <typename T>
struct igemm_row {
    const T *base;
    int iy, ix;
};

template <typename T>
__device__ __forceinline__ igemm_row<T> igemm_row_make(const conv_shape &s, const T *in, int m, int M)
{
    igemm_row<T> r;
    if (m < M) {
        int hw = s.oh * s.ow;
        int img = m / hw, rem = m - img * hw;
        int oy = rem / s.ow, ox = rem - oy * s.ow;
        r.base = in + (size_t)img * s.h * s.w * s.c;
        r.iy = oy * s.stride - s.pad_h;
        r.ix = ox * s.stride - s.pad_w;
    } else {
        r.base = in;
        r.iy = -(1 << 28);
        r.ix = 0;
    }
    return r;
}

// The filter tap (r, s) and channel c of GEMM column k.
struct igemm_col {
    int r, s, c;
};

__device__ __forceinline__ igemm_col igemm_col_make(const conv_shape &s, int k)
{
    igemm_col q;
    int rs = k / s.c;
    q.c = k - rs * s.c;
    q.r = rs / s.kw;
    q.s = rs - q.r * s.kw;
    return q;
}

// A thread's GEMM column as the k tiles go by: tiles are loaded strictly in
// order, so (r, s, c) advances by BK with a compare or two instead of two
// integer divisions per tile; where a tile spans many taps (the stem: 2 to 4
// channel elements a tap) the divisions are cheaper than stepping tap by
// tap (ncu: the INT8 stem was bound by integer issue, ALU 54%).
struct igemm_kiter {
    int k;
    igemm_col col;
};

__device__ __forceinline__ igemm_kiter igemm_kiter_make(const conv_shape &s, int k)
{
    igemm_kiter it;
    it.k = k;
    it.col = igemm_col_make(s, k);
    return it;
}

__device__ __forceinline__ void igemm_kiter_next(const conv_shape &s, igemm_kiter &it, int bk)
{
    it.k += bk;
    it.col.c += bk;
    if (s.c < bk) {  // uniform: the stem's few channels
        const int taps = it.col.c / s.c;
        it.col.c -= taps * s.c;
        it.col.s += taps;
        const int rows = it.col.s / s.kw;
        it.col.s -= rows * s.kw;
        it.col.r += rows;
        return;
    }
    while (it.col.c >= s.c) {
        it.col.c -= s.c;
        if (++it.col.s == s.kw) {
            it.col.s = 0;
            it.col.r++;
        }
    }
}

// Address of A[m][k..k+chunk) and whether it lies inside the image.
template <typename T>
__device__ __forceinline__ const T *igemm_a_addr(const conv_shape &s, const igemm_row<T> &row,
                                                 const igemm_col &col, bool kvalid, bool *valid)
{
    int iy = row.iy + col.r, ix = row.ix + col.s;
    *valid = kvalid && (unsigned)iy < (unsigned)s.h && (unsigned)ix < (unsigned)s.w;
    return row.base + ((size_t)iy * s.w + ix) * s.c + col.c;
}

// A loading thread's rows: A rows m0 + row0 + i * step (their image and
// receptive field) and B rows n0 + row0 + i * step (weight rows; valid
// below N).
template <typename T, int A_PER, int B_PER, bool SC = false>
__device__ __forceinline__ void igemm_rows_make(const conv_shape &s, const T *in, const T *wgt, int m0, int n0,
                                                int row0, int step, igemm_row<T> (&arow)[A_PER],
                                                const T *(&brow)[B_PER], bool (&bvalid)[B_PER])
{
    const int M = s.n * s.oh * s.ow, N = s.k, K = SC ? conv_k(s) : s.kh * s.kw * s.c;
#pragma unroll
    for (int i = 0; i < A_PER; i++)
        arow[i] = igemm_row_make(s, in, m0 + row0 + i * step, M);
#pragma unroll
    for (int i = 0; i < B_PER; i++) {
        int n = n0 + row0 + i * step;
        bvalid[i] = n < N;
        brow[i] = wgt + (size_t)(bvalid[i] ? n : 0) * K;
    }
}

// The k tiles this CTA covers: all of them, or with split-K (partial set)
// CTA z's share [*kt0, *kt0 + returned count); the split-K epilogue
// kernel then finishes the layer.
__device__ __forceinline__ int igemm_ktiles(int K, int bk, const float *partial, int kt_per_split, int *kt0)
{
    int kt = (K + bk - 1) / bk;
    *kt0 = 0;
    if (!partial)
        return kt;
    *kt0 = blockIdx.z * kt_per_split;
    return min(kt - *kt0, kt_per_split);
}

// Asks L2 to fetch the 128-byte line at p, kept ahead of other lines
// (evict_last is a priority, not a pin).
__device__ __forceinline__ void prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2::evict_last [%0];\n" ::"l"(p));
}

// The residual rows of a BM x BN output tile (ES-byte elements, rows N
// apart) into L2 as the tile starts: the epilogue reads them after the
// main loop, where each read waited on DRAM (an FP16 conv with a residual
// took 0.02-0.03 ms longer than the same conv without, at batch 256).
template <int BM, int BN, int T, int ES>
__device__ __forceinline__ void prefetch_res(const void *res, int m0, int n0, int M, int N, int tid)
{
    constexpr int LINES = (BN * ES + 127) / 128;  // a tile row's lines
    for (int id = tid; id < BM * LINES; id += T) {
        const int r = id / LINES, col = n0 + (id % LINES) * (128 / ES);
        if (m0 + r < M && col < N)
            prefetch_l2(static_cast<const char *>(res) + ((size_t)(m0 + r) * N + col) * ES);
    }
}

// Before pdl_sync: the first NT k tiles of a loading thread's weight rows
// (columns k0, k0 + bk, ... below kend; bk in halves) into L2, a line a
// row and tile from the rows' first loader (kc 0), so that the pipeline's
// first loads find them there. The weights are no kernel's output.
template <int B_PER, int NT>
__device__ __forceinline__ void prefetch_weights(const __half *const (&brow)[B_PER], const bool (&bvalid)[B_PER],
                                                 int k0, int kend, int bk, int kc)
{
    if (kc != 0)
        return;
#pragma unroll
    for (int i = 0; i < B_PER; i++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (bvalid[i] && k0 + t * bk < kend)
                prefetch_l2(brow[i] + k0 + t * bk);
}

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

// One 16-byte chunk of A into smem: one copy, or for the INT8 stem (4-byte
// pixels: the chunk is 4 pixels, only 8-byte aligned when the first is at
// an x = 2 mod 4) two copies of a pixel pair each, inside or outside the
// image as a pair (x even, w even).
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
    if (S8 && s.c == 2) {
        const bool v2 = kvalid && (unsigned)(row.iy + col.r) < (unsigned)s.h && (unsigned)(row.ix + col.s + 2) < (unsigned)s.w;
        cp_async8(dst, v ? src : in, v);
        cp_async8(static_cast<char *>(dst) + 8, v2 ? src + 4 : in, v2);
        return;
    }
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
struct __align__(16) s8_chan8 {
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
__device__ __forceinline__ void store8_s8(const int (&a)[8], const s8_chan8 &f, const conv_q8 &q, uint2 rbits,
                                          bool res, int relu, void *out, size_t o)
{
    const float *m = f.m, *b = f.b;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int r = (int)(int8_t)(((j < 4 ? rbits.x : rbits.y) >> (8 * (j % 4))) & 0xff);
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
        const uint32_t w0 = int8_pack2(t[1], t[0], int8_pack2(t[3], t[2], 0)),
                       w1 = int8_pack2(t[5], t[4], int8_pack2(t[7], t[6], 0));
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
    sc_pair f = {make_float2(0.f, 0.f), make_float2(0.f, 0.f)};
    if (col < N) {
        f.m = __ldg(reinterpret_cast<const float2 *>(q.sc_mult + col));
        f.b = __ldg(reinterpret_cast<const float2 *>(q.sc_bias + col));
    }
    return f;
}

// The shortcut's sums are below 2^22 in magnitude (conv_shape_check: at
// most CONV_S8_SC_MAX_C2 products of values in [-127, 127]), so a float
// made from their bits is exact: two full-rate operations instead of a
// conversion at a quarter of the rate, for a tile's worth of sums.
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
    __device__ static __forceinline__ int at(int r, int c) { return r * BN + ((((c >> 3) ^ (r & 7)) << 3) | (c & 7)); }
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
            const int id = HOIST ? min(id0 + k * T, IDS - 1) : id0 + k * T, r = id / (BN / 8),
                      c = (id % (BN / 8)) * 8, col = n0 + c;
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
        epilogue_rows_s8_as<BM, BN, T, RT, S8_OUT_RUNTIME, false>(Cs, ldc, m0, n0, M, N, bias, q, res, relu, out,
                                                                  tid);
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
__device__ __forceinline__ void run_k_tiles(int KT, int KTS, LT &&load_tile, LM &&load_main, ST &&step,
                                            SW &&at_switch)
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
    static constexpr int rt_off = smem;                    // INT8's shortcut: the residual tile after both
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
    conv2d_igemm_f16_kernel(const conv_shape s, const __half *__restrict__ in,
                            const __half *__restrict__ wgt, const float *__restrict__ bias,
                            const void *__restrict__ res, void *__restrict__ out, int relu,
                            float *__restrict__ partial, int kt_per_split, const conv_q8 q)
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
    __half *Bs = As + STAGES * BM * LDS;                // [STAGES][BN][LDS]

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
                    mma_16816(acc[mi][ni], a[mi], b[ni]);
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
                        *reinterpret_cast<float2 *>(p + (size_t)row * N + col) =
                            make_float2(partial_bits(acc[mi][ni][2 * h]), partial_bits(acc[mi][ni][2 * h + 1]));
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
                *reinterpret_cast<float2 *>(Cs + r * LDC + c) =
                    make_float2(acc[mi][ni][2 * h] + b0, acc[mi][ni][2 * h + 1] + b1);
            }
    }
    __syncthreads();
    epilogue_rows_f16<BM, BN, T>(Cs, LDC, m0, n0, M, N, static_cast<const __half *>(res), relu,
                                 static_cast<__half *>(out), tid);
}

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
    conv2d_igemm_wgmma_kernel(const conv_shape s, const __half *__restrict__ in,
                              const __half *__restrict__ wgt, const float *__restrict__ bias,
                              const void *__restrict__ res, void *__restrict__ out, int relu,
                              float *__restrict__ partial, int kt_per_split, const conv_q8 q)
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
            wgmma_op<BN, acc_t>::mma(acc, da + 2 * kk, db + 2 * kk);
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
                    *reinterpret_cast<float2 *>(p + (size_t)row * N + col) =
                        make_float2(partial_bits(acc[4 * j + 2 * h]), partial_bits(acc[4 * j + 2 * h + 1]));
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
                *reinterpret_cast<int2 *>(Ci + (rbase + 8 * h) * LDC + 8 * j + cbase) =
                    make_int2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        __syncthreads();
        if constexpr (POOL) {
            epilogue_pool_s8<BM, BN, T>(Ci, LDC, m0, n0, M, N, bias, q, static_cast<const int8_t *>(res), relu, tid);
        } else {
            const int8_t *r8 =
                SCR ? reinterpret_cast<const int8_t *>(smem + cfg::rt_off) : static_cast<const int8_t *>(res);
            epilogue_rows_s8<BM, BN, T, SCR, !(BM <= 128 && BN <= 128)>(Ci, LDC, m0, n0, M, N, bias, q, r8, relu,
                                                                       out, tid);
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
            *reinterpret_cast<float2 *>(Cs + (rbase + 8 * h) * LDC + c) =
                make_float2(acc[4 * j + 2 * h] + b0, acc[4 * j + 2 * h + 1] + b1);
    }
    __syncthreads();
    epilogue_rows_f16<BM, BN, T>(Cs, LDC, m0, n0, M, N, static_cast<const __half *>(res), relu,
                                 static_cast<__half *>(out), tid);
#else
    (void)s; (void)in; (void)wgt; (void)bias; (void)res; (void)out; (void)relu; (void)partial;
    (void)kt_per_split; (void)q;
#endif
}

/* ===================================================================== */
/* 3x3 convs from an input patch in shared memory (sm_90a)              */
/* ===================================================================== */

// As an implicit GEMM, a 3x3 conv reads each input pixel from L2 nine
// times (once per tap), and with 64 output channels each pixel row feeds
// few MACs: layer1 ran at ~230 TFLOP/s, bound by that traffic. Here a CTA
// loads its input patch once and forms the nine taps' tiles from it in
// shared memory.
//
// Output pixels are numbered on a grid as wide as the zero-padded input
// (w + 2 columns, the last two of each row computed and dropped), so that
// output m and tap (r, s) read padded-input pixel m + r * (w + 2) + s: a
// tap's tile is TP consecutive patch rows (one pixel's 64 channels = one
// swizzled row), which one wgmma descriptor addresses. CTAs are persistent
// and load the next tile's patch while this one computes.
//
// The roles are swapped from the implicit GEMM's: the 64 output channels
// are wgmma's M and TP output pixels its N. A (the weights, 64 x 9 ROWB bytes)
// lives in registers for the life of the CTA, loaded once; B is the TP
// patch rows, K-major as stored. Shared memory then feeds only B: 32 MACs
// a byte at FP16 and 64 at INT8. (The first version, pixels as A and the
// weights as B in shared memory, read both: 16 and 32, just what the
// tensor cores need at full rate; it was 10-25% slower.) One warpgroup per
// CTA and two or three CTAs per SM, so that one CTA's epilogue runs under
// another's MMAs. The accumulators hold channels x pixels, so the staging
// tile is written transposed, [pixel][channel]. FP16 stages FP32 sums,
// padded to 68 words a row (the four pixels and eight channels one store
// instruction covers then fall in 32 different banks), and reads the
// residual from global memory, every load of a tile issued before the
// epilogue's barrier. INT8 finishes each value in registers and stages
// bytes: a quarter of the shared-memory traffic, which was the kernel's
// busiest unit (72%). For that, the weights' rows are permuted so that a
// thread's two accumulator rows are adjacent channels (2 bytes a pixel),
// the factors of those two channels stay in registers, and the tile's
// residual slice loads with its patch into the byte tile, where each
// thread reads it and writes its output in place.
//
// Only for 3x3, stride 1, pad 1 (conv_halo_fits), input pixels of ROWB
// bytes (64 FP16 or INT8 channels, or 128 INT8 ones: layer2's, whose 144
// KB of weights fit in two CTAs' registers where FP16's do not), output
// channels a multiple of 64: each CTA computes one 64-channel slice, fixed
// for its life, and the slices' CTAs share the patches through L2; no
// split-K. ROWB 64 (INT8, 64 channels): rows with the 64-byte swizzle
// (chunk c of row r at c ^ ((r >> 1) & 3)), each tap two wgmma k32 steps.
// INT8's epilogue is engine/int8.h's.

// A tile of TP outputs reads TP + 2 (w + 2) + 2 patch rows; the buffers
// hold TP + SWAP_HALO_ROWS (w <= 61). Output offsets are ints.
#define SWAP_HALO_ROWS 128
static int conv_halo_fits(const conv_shape *s, int c)
{
    return s->c == c && s->k % 64 == 0 && s->kh == 3 && s->kw == 3 && s->stride == 1 && s->pad_h == 1 &&
           s->pad_w == 1 && s->oh == s->h && s->ow == s->w && 2 * (s->w + 2) + 2 <= SWAP_HALO_ROWS &&
           (double)s->n * s->h * s->w * s->k < 2147483647.0;
}

// Where 16-byte chunk c of swizzled row r goes, for rows of ROWB bytes.
template <int ROWB>
__device__ __forceinline__ int halo_swz(int r, int c)
{
    return ROWB == 128 ? c ^ (r & 7) : c ^ ((r >> 1) & 3);
}

// A position (y, x) on a grid w wide, stepped forward without a division.
struct grid_pos {
    int y, x;
};

__device__ __forceinline__ grid_pos grid_pos_make(int lin, int w)
{
    grid_pos g;
    g.y = lin / w;
    g.x = lin - g.y * w;
    return g;
}

__device__ __forceinline__ void grid_pos_step(grid_pos &g, int step, int w)
{
    g.x += step;
    while (g.x >= w) {
        g.x -= w;
        g.y++;
    }
}

// Shared memory: two patch buffers, then FP16's staging tile ([TP][SWAP_LDC]
// floats) or INT8's two byte tiles ([TP][64], one a patch buffer).
#define SWAP_LDC 68
#define SWAP_SMEM(S8, TP, ROWB) \
    (2 * ((TP) + SWAP_HALO_ROWS) * (ROWB) + ((S8) ? 2 * (TP) * 64 : (TP) * SWAP_LDC * 4) + 1024)

// The output offsets (elements, channel co0) of rows r, r + step, ... of
// a tile of TP padded-grid positions; -1 past the image, in a padding
// column or for a tile past the last.
template <int N>
__device__ __forceinline__ void swap_offsets(const conv_shape &s, int tpi, int TP, int ntiles, int tile, int r,
                                             int step, int co0, int (&o)[N])
{
    const int img = tile / tpi, PW = s.w + 2;
    grid_pos g = grid_pos_make((tile - img * tpi) * TP + r, PW);
#pragma unroll
    for (int k = 0; k < N; k++) {
        o[k] = tile < ntiles && g.y < s.h && g.x < s.w ? ((img * s.h + g.y) * s.w + g.x) * s.k + co0 : -1;
        grid_pos_step(g, step, PW);
    }
}

// Registers (ptxas, CUDA 13.0): ROWB 128 (FP16, or INT8 with 128
// channels) 248 and 244 of 255 at two CTAs per SM (144 hold A, 64 the
// accumulators); INT8 with 64 channels 168 of 168 at three (TP 128), 246
// of 255 at two (TP 256: 128 accumulators); a spill here would put A or
// the accumulators in local memory, so check `-Xptxas -v` after edits.
// The SC instantiation (INT8, 128 channels, the shortcut inside): 255,
// 8 bytes spilled, reloaded three times a tile outside the MMAs' operands.
// INT8's byte tiles: chunk c of pixel p's 64 bytes at c ^ ((p >> 1) & 3),
// so that neither the epilogue's 2-byte stores (four pixels two apart, a
// 16-byte chunk each) nor the 16-byte reads (two pixels in turn) share a
// bank.
//
// SC (INT8, 128 channels: layer2.0.conv2): the block's downsample inside,
// a 1x1 conv of conv_shape.in2 (64 channels) at stride2. Each tile's
// shortcut pixels load with its patch; its sums (the downsample's weights,
// after the taps in each weight row, from shared memory) are finished by
// the downsample's own epilogue (sc_requant2) into the byte tile, where
// the epilogue reads the residual, before the taps' MMAs start.
template <bool S8, int TP, int MINB, int ROWB, bool SC = false>
__global__ void __launch_bounds__(128, MINB)
    conv3x3_swap_kernel(const conv_shape s, const __half *__restrict__ in_, const __half *__restrict__ wgt_,
                        const float *__restrict__ bias, const void *__restrict__ res_, void *__restrict__ out,
                        int relu, float *__restrict__ partial, int kt_per_split, const conv_q8 q)
{
    (void)partial;
    (void)kt_per_split;
#ifdef RESNETD_WGMMA
    static_assert(ROWB == 128 || (S8 && ROWB == 64), "pixel row");
    static_assert(!SC || (S8 && ROWB == 128), "the shortcut: INT8, 128 channels");
    typedef typename acc_type<S8>::type acc_t;
    constexpr int WROW = 9 * ROWB + (SC ? 64 : 0);  // a weight row's bytes (SC: the shortcut's 64 after the taps)
    constexpr int T = 128, CH = ROWB / 16, PROWS = TP + SWAP_HALO_ROWS;
    constexpr int KS = 9 * ROWB / 32, NACC = TP / 2;  // k steps of 32 bytes; accumulators
    constexpr int PER = TP * 8 / T;                   // epilogue: 8-channel groups per thread
    constexpr int STEP = T / CH;                      // the patch loader's row step
    constexpr int RPT = TP / 32;                      // INT8: byte-tile rows per thread (16-byte chunk tid % 4)
    // The swizzled chunk of a row depends on its row bits 0-2 only.
    static_assert(STEP % 8 == 0, "loader step");
    const unsigned char *in = reinterpret_cast<const unsigned char *>(in_);
    const unsigned char *wgt = reinterpret_cast<const unsigned char *>(wgt_);
    const int PW = s.w + 2, HP = s.h * PW;  // the padded output grid of one image
    const int tpi = (HP + TP - 1) / TP, ntiles = s.n * tpi;
    // This CTA's 64 output channels from co0; CTAs cta, cta + nctas, ... of
    // a slice take its tiles (conv_launch makes the grid a multiple of nh).
    const int nh = s.k / 64, co0 = 64 * ((int)blockIdx.x % nh);
    const int cta = (int)blockIdx.x / nh, nctas = (int)gridDim.x / nh;
    const int prows = TP + 2 * PW + 2;
    const int tid = threadIdx.x, lane = tid & 31, wq = tid >> 5;
    const int ch = 16 * wq + (lane >> 2);  // this thread's channels: ch and ch + 8

    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024u - ((unsigned)__cvta_generic_to_shared(smem_raw) & 1023u)) & 1023u);
    unsigned char *const patches = smem;  // two buffers of PROWS rows
    float *const cs = reinterpret_cast<float *>(patches + 2 * PROWS * ROWB);  // FP16: [TP][SWAP_LDC]
    unsigned char *const bt = patches + 2 * PROWS * ROWB;                    // INT8: [2][TP][64]
    unsigned char *const dsb = bt + 2 * TP * 64;   // SC: [2][TP][64] the shortcut's input pixels
    unsigned char *const dsw = dsb + 2 * TP * 64;  // SC: [64][64] its weights, rows as the accumulators' channels
    const int rq = tid & 3;  // INT8: this thread's chunk of a byte-tile row

    // A thread loads chunk tid % CH of patch rows tid / CH + STEP j: the
    // smem address steps by STEP rows (the same swizzle), the input pixel
    // index by STEP less 2 for each padded row wrapped (the padded grid's
    // rows are 2 wider), with no division or 64-bit multiply per row.
    auto load_patch = [&](int tile, int b) {
        const int img = tile / tpi, m0 = (tile - img * tpi) * TP, c = tid % CH, r0 = tid / CH;
        unsigned char *p = patches + (b * PROWS + r0) * ROWB + (halo_swz<ROWB>(r0, c) << 4);
        const unsigned char *base = in + (size_t)img * s.h * s.w * ROWB + c * 16;
        grid_pos g = grid_pos_make(m0 + r0, PW);  // padded (y, x) = input (y - 1, x - 1)
        int pix = (g.y - 1) * s.w + g.x - 1;
        for (int qr = r0; qr < prows; qr += STEP) {
            const bool v = (unsigned)(g.y - 1) < (unsigned)s.h && (unsigned)(g.x - 1) < (unsigned)s.w;
            cp_async16(p, v ? base + (ptrdiff_t)pix * ROWB : in, v);
            p += STEP * ROWB;
            g.x += STEP;
            pix += STEP;
            while (g.x >= PW) {
                g.x -= PW;
                g.y++;
                pix -= 2;
            }
        }
    };

    // INT8: a tile's residual slice into byte tile b, rows tid / 4 + 32 k
    // (o: their offsets).
    auto load_res = [&](const int(&o)[RPT], int b) {
#pragma unroll
        for (int k = 0; k < RPT; k++) {
            const int r = (tid >> 2) + 32 * k;
            if (o[k] >= 0)
                cp_async16(bt + (b * TP + r) * 64 + ((rq ^ ((r >> 1) & 3)) << 4),
                           static_cast<const unsigned char *>(res_) + o[k] + 16 * rq, true);
        }
    };

    // SC: a tile's shortcut pixels (padded-grid position (y, x) reads in2's
    // (y, x) * stride2; none in the padding columns) into buffer b, rows
    // tid / 4 + 32 k with the 64-byte swizzle.
    auto load_ds = [&](int tile, int b) {
        const int img = tile / tpi, c = tid & 3;
        const unsigned char *base = static_cast<const unsigned char *>(s.in2) + (size_t)img * s.h2 * s.w2 * 64 + c * 16;
        grid_pos g = grid_pos_make((tile - img * tpi) * TP + (tid >> 2), PW);
#pragma unroll
        for (int k = 0; k < RPT; k++) {
            const int r = (tid >> 2) + 32 * k;
            const bool v = g.y < s.h && g.x < s.w;
            cp_async16(dsb + (b * TP + r) * 64 + (halo_swz<64>(r, c) << 4),
                       v ? base + ((size_t)g.y * s.w2 + g.x) * s.stride2 * 64 : base, v);
            grid_pos_step(g, 32, PW);
        }
    };

    // A tile's patch into patch buffer b and (INT8) its residual slice or
    // (SC) its shortcut pixels into buffer b: one cp.async group, empty past
    // the last tile. INT8's offsets of a tile's byte-tile rows are made
    // again for its epilogue: kept in registers, they made the 64-channel
    // kernel spill.
    auto prefetch = [&](int tile, int b) {
        if (tile < ntiles) {
            load_patch(tile, b);
            if constexpr (SC)
                load_ds(tile, b);
            if (S8 && res_) {
                int o8[RPT];
                swap_offsets(s, tpi, TP, ntiles, tile, tid >> 2, 32, co0, o8);
                load_res(o8, b);
            }
            if (!S8 && res_ && (tid & 7) == 0) {  // L2 prefetch of the residual: a pixel's 64 channels a line
                int o[PER];
                swap_offsets(s, tpi, TP, ntiles, tile, tid >> 3, T / 8, co0, o);
#pragma unroll
                for (int k = 0; k < PER; k++)
                    if (o[k] >= 0)
                        prefetch_l2(static_cast<const __half *>(res_) + o[k]);
            }
        }
        cp_async_commit();
    };

    // A fragments: rows ch and ch + 8 of the KRSC weights (one row is an
    // output channel's 9 * ROWB bytes; INT8: channels 16 wq + 2 (lane / 4)
    // and the next), 4 bytes at 32 j + 4 (lane % 4) and 16 bytes further.
    const int c2 = co0 + 16 * wq + 2 * (lane >> 2);  // INT8: this thread's two channels
    uint32_t a[KS][4];
    {
        const unsigned char *w0 = wgt + (size_t)(S8 ? c2 : co0 + ch) * WROW + 4 * (lane & 3),
                            *w8 = w0 + (S8 ? 1 : 8) * WROW;
#pragma unroll
        for (int j = 0; j < KS; j++) {
            a[j][0] = __ldg(reinterpret_cast<const unsigned *>(w0 + 32 * j));
            a[j][1] = __ldg(reinterpret_cast<const unsigned *>(w8 + 32 * j));
            a[j][2] = __ldg(reinterpret_cast<const unsigned *>(w0 + 32 * j + 16));
            a[j][3] = __ldg(reinterpret_cast<const unsigned *>(w8 + 32 * j + 16));
        }
    }
    const float b0 = S8 ? 0.f : bias[co0 + ch], b8 = S8 ? 0.f : bias[co0 + ch + 8];
    const int c = (tid & 7) * 8;  // FP16 epilogue's channels: c..c+7 of the slice
    float2 m2 = {}, bb2 = {};     // INT8: the factors of channels c2, c2 + 1
    if constexpr (S8) {
        m2 = __ldg(reinterpret_cast<const float2 *>(q.mult + c2));
        bb2 = __ldg(reinterpret_cast<const float2 *>(bias + c2));
    }
    // SC: the shortcut's weights, row R of dsw the channel of accumulator
    // row R (as the A fragments above: channels in pairs), in the first
    // patch's group.
    if constexpr (SC)
        for (int k = tid; k < 64 * 4; k += T) {
            const int R = k >> 2, c = k & 3, chn = co0 + 16 * (R >> 4) + 2 * (R & 7) + ((R >> 3) & 1);
            cp_async16(dsw + R * 64 + (halo_swz<64>(R, c) << 4), wgt + (size_t)chn * WROW + 9 * ROWB + c * 16, true);
        }
    // The weights and factors (no kernel's output) load before pdl_sync, the
    // first patch after it, while the weights are still in flight.
    pdl_sync();
    prefetch(cta, 0);

    // The MMAs of the tile in patch buffer b into acc, one wgmma group.
    auto issue_mma = [&](acc_t(&acc)[NACC], int b) {
#pragma unroll
        for (int i = 0; i < NACC; i++)
            acc[i] = 0;
        wgmma_pin(acc);
        wgmma_fence();
        const uint32_t pbase = (uint32_t)__cvta_generic_to_shared(patches + b * PROWS * ROWB);
#pragma unroll
        for (int t = 0; t < 9; t++) {
            // B starts at any patch row, mid swizzle pattern: the swizzle
            // follows the absolute address bits, as the rows were stored,
            // so the descriptor's base offset stays 0 (measured on an H100:
            // base offset (a >> 7) & 7 gave rel L2 1.06).
            const uint32_t pb = pbase + ((t / 3) * PW + t % 3) * ROWB;
            const uint64_t db = ROWB == 64 ? wgmma_desc64(pb) : wgmma_desc(pb);
#pragma unroll
            for (int kk = 0; kk < ROWB / 32; kk++)
                wgmma_rs<TP, acc_t>::mma(acc, a[t * (ROWB / 32) + kk], db + 2 * kk);
        }
        wgmma_commit();
    };

    // The epilogue of a tile whose sums are in acc, from (INT8) byte tile b.
    auto epilogue = [&](acc_t(&acc)[NACC], int tile, int buf) {
        if constexpr (S8) {
            // Accumulator i: channel c2 + (i / 2) % 2, pixel p = 8 (i / 4) +
            // 2 (lane % 4) + i % 2, whose chunk wq sits at wq ^ (lane % 4).
            // Each pair's residual, the int8.h epilogue, and the output pair
            // in the residual's place.
            unsigned char *const tb =
                bt + buf * TP * 64 + 128 * (lane & 3) + ((wq ^ (lane & 3)) << 4) + 2 * (lane >> 2);
#pragma unroll
            for (int j = 0; j < TP / 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const bool hr = SC || res_ != NULL;  // SC: the shortcut's output is the residual
                    const uint32_t r = hr ? *reinterpret_cast<const uint16_t *>(tb + 512 * j + 64 * e) : 0u;
                    const int q0 = int8_requant_lo(
                        s8_value(acc[4 * j + e], m2.x, bb2.x, (int8_t)(r & 0xff), q.res_scale, hr), q.out_inv, relu);
                    const int q1 = int8_requant_lo(
                        s8_value(acc[4 * j + 2 + e], m2.y, bb2.y, (int8_t)(r >> 8 & 0xff), q.res_scale, hr),
                        q.out_inv, relu);
                    *reinterpret_cast<uint16_t *>(tb + 512 * j + 64 * e) = (uint16_t)int8_pack2(q1, q0, 0);
                }
            int o8[RPT];
            swap_offsets(s, tpi, TP, ntiles, tile, tid >> 2, 32, co0, o8);
            __syncthreads();
#pragma unroll
            for (int k = 0; k < RPT; k++) {
                const int r = (tid >> 2) + 32 * k;
                if (o8[k] >= 0)
                    *reinterpret_cast<uint4 *>(static_cast<int8_t *>(out) + o8[k] + 16 * rq) =
                        *reinterpret_cast<const uint4 *>(bt + (buf * TP + r) * 64 + ((rq ^ ((r >> 1) & 3)) << 4));
            }
        } else {
            // Accumulator i: channel ch (+ 8 for i % 4 >= 2), pixel 8 (i / 4)
            // + 2 (lane % 4) + i % 2; staged + bias as [pixel][channel].
#pragma unroll
            for (int i = 0; i < NACC; i++)
                cs[(8 * (i >> 2) + 2 * (lane & 3) + (i & 1)) * SWAP_LDC + ch + 8 * ((i >> 1) & 1)] =
                    acc[i] + ((i >> 1) & 1 ? b8 : b0);
            // Thread: channels c..c+7 of pixels tid / 8 + 16 k; every residual
            // load issued before the barrier, not one per store (earlier, the
            // loads would not fit in registers beside the accumulators).
            int o[PER];
            uint4 rv[PER];
            swap_offsets(s, tpi, TP, ntiles, tile, tid >> 3, T / 8, co0 + c, o);
#pragma unroll
            for (int k = 0; k < PER; k++) {
                rv[k] = uint4{};
                if (o[k] >= 0 && res_)
                    rv[k] = *reinterpret_cast<const uint4 *>(static_cast<const __half *>(res_) + o[k]);
            }
            __syncthreads();
#pragma unroll
            for (int k = 0; k < PER; k++) {
                const uint4 r = rv[k];
                if (o[k] >= 0)
                    store8_f16(cs + ((tid >> 3) + k * (T / 8)) * SWAP_LDC + c,
                               res_ ? reinterpret_cast<const __half *>(&r) : NULL, relu,
                               static_cast<__half *>(out) + o[k]);
            }
        }
    };

    int buf = 0;
    for (int tile = cta; tile < ntiles; tile += nctas) {
        // This tile's patch, the one group in flight; the barrier also
        // orders the previous tile's epilogue reads of the staging tile
        // before this tile's writes.
        cp_async_wait<0>();
        fence_proxy_async_smem();
        __syncthreads();
        acc_t acc[NACC];
        if constexpr (SC) {  // the shortcut's sums, finished into byte tile buf as the epilogue's residual
#pragma unroll
            for (int i = 0; i < NACC; i++)
                acc[i] = 0;
            wgmma_pin(acc);
            wgmma_fence();
            const uint64_t da = wgmma_desc64((uint32_t)__cvta_generic_to_shared(dsw)),
                           db = wgmma_desc64((uint32_t)__cvta_generic_to_shared(dsb + buf * TP * 64));
#pragma unroll
            for (int kk = 0; kk < 2; kk++)
                wgmma_op<TP, acc_t>::mma(acc, da + 2 * kk, db + 2 * kk);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_pin(acc);
            int8_t *const tb = reinterpret_cast<int8_t *>(bt + buf * TP * 64 + 128 * (lane & 3) +
                                                          ((wq ^ (lane & 3)) << 4) + 2 * (lane >> 2));
            const sc_pair f = sc_pair_load(q, c2, s.k);
#pragma unroll
            for (int j = 0; j < TP / 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    sc_requant2(acc[4 * j + e], acc[4 * j + 2 + e], f, q.sc_inv, tb + 512 * j + 64 * e);
        }
        issue_mma(acc, buf);
        // Under the MMAs: the next tile's patch (and residual) into the
        // other buffers, last read by the previous tile's MMAs (waited for
        // before the barrier above) and epilogue.
        prefetch(tile + nctas, buf ^ 1);
        wgmma_wait<0>();
        wgmma_pin(acc);
        epilogue(acc, tile, buf);
        buf ^= 1;
    }
    cp_async_wait<0>();
#else
    (void)s; (void)in_; (void)wgt_; (void)bias; (void)res_; (void)out; (void)relu; (void)q;
#endif
}

/* ===================================================================== */
/* FP32 SIMT kernel                                                      */
/* ===================================================================== */

// CTA tile BM x BN, K step 8, each thread 8x8 outputs split in two 4x4
// quadrants BM/2 (BN/2) apart so that its smem reads are two float4s.
template <int BM, int BN>
struct f32_tile {
    static constexpr int threads = (BM / 8) * (BN / 8);
    static constexpr int smem = 0;  // static shared memory
};

template <int BM, int BN>
__global__ void __launch_bounds__((BM / 8) * (BN / 8))
    conv2d_igemm_f32_kernel(const conv_shape s, const float *__restrict__ in, const float *__restrict__ wgt,
                            const float *__restrict__ bias, const float *__restrict__ res,
                            float *__restrict__ out, int relu, float *__restrict__ partial, int kt_per_split)
{
    constexpr int BK = 8, T = (BM / 8) * (BN / 8), KCH = BK / 4;
    constexpr int A_PER = BM * KCH / T, B_PER = BN * KCH / T, ROW_STEP = T / KCH;
    static_assert(BM * KCH % T == 0 && BN * KCH % T == 0, "loader shape");
    __shared__ __align__(16) float As[2][BK][BM + 4];
    __shared__ __align__(16) float Bs[2][BK][BN + 4];

    const int M = s.n * s.oh * s.ow, N = s.k, K = s.kh * s.kw * s.c;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int tid = threadIdx.x, kc = tid % KCH, row0 = tid / KCH;
    const int tx = tid % (BN / 8), ty = tid / (BN / 8);

    igemm_row<float> arow[A_PER];
    const float *brow[B_PER];
    bool bvalid[B_PER];
    igemm_rows_make(s, in, wgt, m0, n0, row0, ROW_STEP, arow, brow, bvalid);
    pdl_sync();
    int kt0;  // split-K as in the FP16 kernel
    const int KT = igemm_ktiles(K, BK, partial, kt_per_split, &kt0);
    float4 ra[A_PER], rb[B_PER];
    igemm_kiter kit = igemm_kiter_make(s, kt0 * BK + kc * 4);
    auto load_regs = [&]() {  // the next k tile, in order
        const int k = kit.k;
        const bool kvalid = k < K;
        const igemm_col col = kit.col;
        igemm_kiter_next(s, kit, BK);
#pragma unroll
        for (int i = 0; i < A_PER; i++) {
            bool v;
            const float *src = igemm_a_addr(s, arow[i], col, kvalid, &v);
            ra[i] = v ? __ldg(reinterpret_cast<const float4 *>(src)) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int i = 0; i < B_PER; i++)
            rb[i] = kvalid && bvalid[i] ? __ldg(reinterpret_cast<const float4 *>(brow[i] + k))
                                        : make_float4(0.f, 0.f, 0.f, 0.f);
    };
    auto store_smem = [&](int buf) {
#pragma unroll
        for (int i = 0; i < A_PER; i++) {
            int r = row0 + i * ROW_STEP;
            As[buf][kc * 4 + 0][r] = ra[i].x;
            As[buf][kc * 4 + 1][r] = ra[i].y;
            As[buf][kc * 4 + 2][r] = ra[i].z;
            As[buf][kc * 4 + 3][r] = ra[i].w;
        }
#pragma unroll
        for (int i = 0; i < B_PER; i++) {
            int r = row0 + i * ROW_STEP;
            Bs[buf][kc * 4 + 0][r] = rb[i].x;
            Bs[buf][kc * 4 + 1][r] = rb[i].y;
            Bs[buf][kc * 4 + 2][r] = rb[i].z;
            Bs[buf][kc * 4 + 3][r] = rb[i].w;
        }
    };

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
            acc[i][j] = 0.f;

    load_regs();
    store_smem(0);
    __syncthreads();
    for (int kt = 0; kt < KT; kt++) {
        int buf = kt & 1;
        if (kt + 1 < KT)
            load_regs();  // tile kt + 1: global loads in flight during the FMAs below
#pragma unroll
        for (int k = 0; k < BK; k++) {
            float a[8], b[8];
            *reinterpret_cast<float4 *>(a) = *reinterpret_cast<const float4 *>(&As[buf][k][ty * 4]);
            *reinterpret_cast<float4 *>(a + 4) = *reinterpret_cast<const float4 *>(&As[buf][k][BM / 2 + ty * 4]);
            *reinterpret_cast<float4 *>(b) = *reinterpret_cast<const float4 *>(&Bs[buf][k][tx * 4]);
            *reinterpret_cast<float4 *>(b + 4) = *reinterpret_cast<const float4 *>(&Bs[buf][k][BN / 2 + tx * 4]);
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 8; j++)
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        if (kt + 1 < KT)
            store_smem(buf ^ 1);  // buf ^ 1 was last read before the previous barrier
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 8; i++) {
        int row = m0 + (i < 4 ? ty * 4 + i : BM / 2 + ty * 4 + i - 4);
        if (row >= M)
            continue;
#pragma unroll
        for (int jh = 0; jh < 2; jh++) {
            int col = n0 + (jh == 0 ? tx * 4 : BN / 2 + tx * 4);
            if (col >= N)
                continue;
            size_t o = (size_t)row * N + col;
            if (partial) {
                *reinterpret_cast<float4 *>(partial + (size_t)blockIdx.z * M * N + o) =
                    make_float4(acc[i][jh * 4], acc[i][jh * 4 + 1], acc[i][jh * 4 + 2], acc[i][jh * 4 + 3]);
                continue;
            }
            float4 bb = *reinterpret_cast<const float4 *>(bias + col);
            float4 v = make_float4(acc[i][jh * 4] + bb.x, acc[i][jh * 4 + 1] + bb.y, acc[i][jh * 4 + 2] + bb.z,
                                   acc[i][jh * 4 + 3] + bb.w);
            if (res) {
                float4 r = *reinterpret_cast<const float4 *>(res + o);
                v.x += r.x; v.y += r.y; v.z += r.z; v.w += r.w;
            }
            if (relu) {
                v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f);
                v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
            }
            *reinterpret_cast<float4 *>(out + o) = v;
        }
    }
}

/* ===================================================================== */
/* FP32 on tensor cores: 3xTF32                                          */
/* ===================================================================== */

// Each FP32 operand x is split into tf32 hi = rna(x) and lo = rna(x - hi);
// a*b ~ a_lo*b_hi + a_hi*b_lo + a_hi*b_hi (a_lo*b_lo, ~2^-22 relative, is
// dropped), accumulated in FP32 (see the k8 step below). Products keep
// about 21 bits: close to FP32 SIMT, at tensor-core speed. Same loader,
// pipeline and fragment layout as the FP16 kernel: 16-byte chunks are 4
// floats, and ldmatrix's b16 8x8 matrices are 8x4 float matrices, exactly
// the m16n8k8 tf32 fragments.
__device__ __forceinline__ uint32_t tf32_rna(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ void mma_1688_tf32(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <int N>
__device__ __forceinline__ void tf32_split(const uint32_t (&x)[N], uint32_t (&hi)[N], uint32_t (&lo)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) {
        float f = __uint_as_float(x[i]);
        hi[i] = tf32_rna(f);
        lo[i] = tf32_rna(f - __uint_as_float(hi[i]));
    }
}

template <int BM, int BN, int BK, int WM, int WN, int STAGES, int MINB>
struct x3_tile {
    static constexpr int threads = WM * WN * 32;
    static constexpr int lds = BK + 4;  // floats per smem row: +16 bytes keeps ldmatrix conflict-free
    static constexpr int smem = STAGES * (BM + BN) * lds * 4;
};

template <int BM, int BN, int BK, int WM, int WN, int STAGES, int MINB>
__global__ void __launch_bounds__(WM *WN * 32, MINB)
    conv2d_igemm_3xtf32_kernel(const conv_shape s, const float *__restrict__ in, const float *__restrict__ wgt,
                               const float *__restrict__ bias, const float *__restrict__ res,
                               float *__restrict__ out, int relu, float *__restrict__ partial, int kt_per_split)
{
    typedef x3_tile<BM, BN, BK, WM, WN, STAGES, MINB> cfg;
    constexpr int T = cfg::threads, LDS = cfg::lds, KCH = BK / 4;
    constexpr int A_PER = BM * KCH / T, B_PER = BN * KCH / T, ROW_STEP = T / KCH;
    constexpr int WTM = BM / WM, WTN = BN / WN, MI = WTM / 16, NI = WTN / 8;
    static_assert(BM * KCH % T == 0 && BN * KCH % T == 0 && T % KCH == 0, "loader shape");
    static_assert(WTM % 16 == 0 && WTN % 16 == 0 && BK % 8 == 0, "warp tile shape");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    float *As = reinterpret_cast<float *>(smem_raw);  // [STAGES][BM][LDS]
    float *Bs = As + STAGES * BM * LDS;               // [STAGES][BN][LDS]

    const int M = s.n * s.oh * s.ow, N = s.k, K = s.kh * s.kw * s.c;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WN, wn = warp % WN;
    const int kc = tid % KCH, row0 = tid / KCH;

    igemm_row<float> arow[A_PER];
    const float *brow[B_PER];
    bool bvalid[B_PER];
    igemm_rows_make(s, in, wgt, m0, n0, row0, ROW_STEP, arow, brow, bvalid);
    pdl_sync();
    int kt0;
    const int KT = igemm_ktiles(K, BK, partial, kt_per_split, &kt0);
    igemm_kiter kit = igemm_kiter_make(s, kt0 * BK + kc * 4);
    auto load_tile = [&](int stage) {  // the next k tile, in order
        const int k = kit.k;
        const bool kvalid = k < K;
        const igemm_col col = kit.col;
        igemm_kiter_next(s, kit, BK);
        float *as = As + stage * BM * LDS, *bs = Bs + stage * BN * LDS;
#pragma unroll
        for (int i = 0; i < A_PER; i++) {
            bool v;
            const float *src = igemm_a_addr(s, arow[i], col, kvalid, &v);
            cp_async16(as + (row0 + i * ROW_STEP) * LDS + kc * 4, v ? src : in, v);
        }
#pragma unroll
        for (int i = 0; i < B_PER; i++) {
            bool v = kvalid && bvalid[i];
            cp_async16(bs + (row0 + i * ROW_STEP) * LDS + kc * 4, v ? brow[i] + k : wgt, v);
        }
    };

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                acc[i][j][q] = 0.f;

#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        if (st < KT)
            load_tile(st);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (kt + STAGES - 1 < KT)
            load_tile((kt + STAGES - 1) % STAGES);
        cp_async_commit();
        const float *as = As + (kt % STAGES) * BM * LDS, *bs = Bs + (kt % STAGES) * BN * LDS;
#pragma unroll
        for (int kk = 0; kk < BK / 8; kk++) {
            uint32_t b_hi[NI][2], b_lo[NI][2];
#pragma unroll
            for (int nj = 0; nj < NI / 2; nj++) {
                uint32_t r[4], h[4], l[4];
                ldmatrix_x4(r, bs + (wn * WTN + nj * 16 + (lane >> 4) * 8 + (lane & 7)) * LDS + kk * 8 +
                                   ((lane >> 3) & 1) * 4);
                tf32_split(r, h, l);
                b_hi[2 * nj][0] = h[0]; b_hi[2 * nj][1] = h[1]; b_hi[2 * nj + 1][0] = h[2]; b_hi[2 * nj + 1][1] = h[3];
                b_lo[2 * nj][0] = l[0]; b_lo[2 * nj][1] = l[1]; b_lo[2 * nj + 1][0] = l[2]; b_lo[2 * nj + 1][1] = l[3];
            }
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                uint32_t a[4], a_hi[4], a_lo[4];
                ldmatrix_x4(a, as + (wm * WTM + mi * 16 + (lane & 15)) * LDS + kk * 8 + (lane >> 4) * 4);
                tf32_split(a, a_hi, a_lo);
#pragma unroll
                for (int ni = 0; ni < NI; ni++) {
                    // The tensor core's internal sums do not round to nearest:
                    // over thousands of k they drift by ~1e-5. So each k8
                    // step sums into a fresh t, added to acc with FP32 adds.
                    float t[4] = {0.f, 0.f, 0.f, 0.f};
                    mma_1688_tf32(t, a_lo, b_hi[ni]);
                    mma_1688_tf32(t, a_hi, b_lo[ni]);
                    mma_1688_tf32(t, a_hi, b_hi[ni]);
#pragma unroll
                    for (int q = 0; q < 4; q++)
                        acc[mi][ni][q] += t[q];
                }
            }
        }
    }
    cp_async_wait<0>();

#pragma unroll
    for (int ni = 0; ni < NI; ni++) {
        int col = n0 + wn * WTN + ni * 8 + (lane & 3) * 2;
        if (col >= N)
            continue;
        float b0 = bias[col], b1 = bias[col + 1];
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int row = m0 + wm * WTM + mi * 16 + (lane >> 2) + h * 8;
                if (row >= M)
                    continue;
                size_t o = (size_t)row * N + col;
                float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
                if (partial) {
                    *reinterpret_cast<float2 *>(partial + (size_t)blockIdx.z * M * N + o) = make_float2(v0, v1);
                    continue;
                }
                v0 += b0;
                v1 += b1;
                if (res) {
                    float2 r = *reinterpret_cast<const float2 *>(res + o);
                    v0 += r.x;
                    v1 += r.y;
                }
                if (relu) {
                    v0 = fmaxf(v0, 0.f);
                    v1 = fmaxf(v1, 0.f);
                }
                *reinterpret_cast<float2 *>(out + o) = make_float2(v0, v1);
            }
    }
}

/* ===================================================================== */
/* Split-K epilogue                                                      */
/* ===================================================================== */

// out[m][n] = relu?(sum_z partial[z][m][n] + bias[n] (+ res[m][n])), four
// channels per thread.
__device__ __forceinline__ void store4(float *p, float4 v)
{
    *reinterpret_cast<float4 *>(p) = v;
}
__device__ __forceinline__ void store4(__half *p, float4 v)
{
    __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
    uint2 u;
    u.x = *reinterpret_cast<uint32_t *>(&a);
    u.y = *reinterpret_cast<uint32_t *>(&b);
    *reinterpret_cast<uint2 *>(p) = u;
}
__device__ __forceinline__ float4 load4(const float *p)
{
    return *reinterpret_cast<const float4 *>(p);
}
__device__ __forceinline__ float4 load4(const __half *p)
{
    uint2 u = *reinterpret_cast<const uint2 *>(p);
    float2 a = __half22float2(*reinterpret_cast<__half2 *>(&u.x)), b = __half22float2(*reinterpret_cast<__half2 *>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}

template <typename T>
__global__ void __launch_bounds__(256)
    splitk_epilogue_kernel(const float *__restrict__ partial, int splits, int M, int N, const float *__restrict__ bias,
                           const T *__restrict__ res, int relu, T *__restrict__ out)
{
    pdl_sync();
    long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    long total = (long)M * N;
    if (i >= total)
        return;
    int col = (int)(i % N);
    float4 v = *reinterpret_cast<const float4 *>(bias + col);
    for (int z = 0; z < splits; z++) {
        float4 p = *reinterpret_cast<const float4 *>(partial + (size_t)z * total + i);
        v.x += p.x; v.y += p.y; v.z += p.z; v.w += p.w;
    }
    if (res) {
        float4 r = load4(res + i);
        v.x += r.x; v.y += r.y; v.z += r.z; v.w += r.w;
    }
    if (relu) {
        v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f);
        v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
    }
    store4(out + i, v);
}

// INT8: the int32 partial sums added exactly, then engine/int8.h's
// epilogue; four channels per thread.
__global__ void __launch_bounds__(256)
    splitk_epilogue_s8_kernel(const int *__restrict__ partial, int splits, int M, int N,
                              const float *__restrict__ bias, const conv_q8 q, const int8_t *__restrict__ res,
                              int relu, void *__restrict__ out)
{
    pdl_sync();
    long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    long total = (long)M * N;
    if (i >= total)
        return;
    int col = (int)(i % N);
    int4 a = make_int4(0, 0, 0, 0);
    for (int z = 0; z < splits; z++) {
        int4 p = *reinterpret_cast<const int4 *>(partial + (size_t)z * total + i);
        a.x += p.x; a.y += p.y; a.z += p.z; a.w += p.w;
    }
    const int acc[4] = {a.x, a.y, a.z, a.w};
    int8_t r[4] = {0, 0, 0, 0};
    if (res)
        *reinterpret_cast<uint32_t *>(r) = *reinterpret_cast<const uint32_t *>(res + i);
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; j++)
        v[j] = s8_value(acc[j], q.mult[col + j], bias[col + j], r[j], q.res_scale, res != NULL);  // ReLU below
    if (q.out_f32) {
#pragma unroll
        for (int j = 0; j < 4; j++)
            v[j] = s8_relu(v[j], relu);
        *reinterpret_cast<float4 *>(reinterpret_cast<float *>(out) + i) = make_float4(v[0], v[1], v[2], v[3]);
        return;
    }
    int t[4];
#pragma unroll
    for (int j = 0; j < 4; j++)
        t[j] = int8_requant_lo(v[j], q.out_inv, relu);
    *reinterpret_cast<uint32_t *>(reinterpret_cast<int8_t *>(out) + i) =
        int8_pack2(t[1], t[0], int8_pack2(t[3], t[2], 0));
}

/* ===================================================================== */
/* The tile table and the host launchers                                 */
/* ===================================================================== */

// The FP16 and INT8 kernels share one signature (INT8 data passed as
// halves, q used only by INT8).
typedef void (*f16_kernel_fn)(const conv_shape, const __half *, const __half *, const float *, const void *,
                              void *, int, float *, int, const conv_q8);
typedef void (*f32_kernel_fn)(const conv_shape, const float *, const float *, const float *,
                              const float *, float *, int, float *, int);

struct f16_entry {
    conv_tile_info info;
    f16_kernel_fn fn;
    f16_kernel_fn fn_sc;  // the general tiles and INT8's 128-channel patch kernel: with a shortcut, else NULL
    int smem_sc;          // its dynamic shared memory (INT8's holds the residual tile too)
    int ctas_sc;          // filled by conv_init: its CTAs per SM
    f16_kernel_fn fn_pool;  // INT8's general wgmma tiles: with the average pool inside, else NULL
};
// fn_pool of a wgmma tile: INT8's only.
template <int BM, int BN, int ST, bool S8, bool ONEBAR>
struct wg_pool_fn {
    static f16_kernel_fn get() { return NULL; }
};
template <int BM, int BN, int ST, bool ONEBAR>
struct wg_pool_fn<BM, BN, ST, true, ONEBAR> {
    static f16_kernel_fn get() { return conv2d_igemm_wgmma_kernel<BM, BN, ST, true, false, ONEBAR, true>; }
};
struct f32_entry {
    conv_tile_info info;
    f32_kernel_fn fn;
};

// Tile families (conv_tile_info.family; tests/gpu/test_gpu_kernels.c checks
// each and prints whether two agree). FP16's mma.sync, wgmma and patch
// kernels all give the same bits (H200, every test shape): one family. FP32's
// SIMT and 3xTF32 tiles round differently: two. INT8's sums are exact.
// FAMILY_PLAIN: every tile but the 3xTF32 ones.
enum { FAMILY_PLAIN, FAMILY_3XTF32 };

// Names and info.bk of INT8 tiles count int8 elements (bytes): twice the
// halves of the kernel's own BK.
#define F16_TILE(BM, BN, BK, WM, WN, ST, MINB)                                                               \
    {{"f16_" #BM "x" #BN "x" #BK "_w" #WM "x" #WN "_s" #ST, BM, BN, BK,                                     \
      f16_tile<BM, BN, BK, WM, WN, ST, MINB>::threads, f16_tile<BM, BN, BK, WM, WN, ST, MINB>::smem, 0, 0, 0, 0, FAMILY_PLAIN}, \
     conv2d_igemm_f16_kernel<BM, BN, BK, WM, WN, ST, MINB, false>,                                             \
     conv2d_igemm_f16_kernel<BM, BN, BK, WM, WN, ST, MINB, false, true>,                                       \
     f16_tile<BM, BN, BK, WM, WN, ST, MINB>::smem, 0, NULL}
#define S8_TILE(BM, BN, BK, WM, WN, ST, MINB, NAME_BK)                                                       \
    {{"s8_" #BM "x" #BN "x" #NAME_BK "_w" #WM "x" #WN "_s" #ST, BM, BN, 2 * BK,                             \
      f16_tile<BM, BN, BK, WM, WN, ST, MINB>::threads, f16_tile<BM, BN, BK, WM, WN, ST, MINB>::smem, 0, 0, 0, 0, FAMILY_PLAIN}, \
     conv2d_igemm_f16_kernel<BM, BN, BK, WM, WN, ST, MINB, true>,                                              \
     conv2d_igemm_f16_kernel<BM, BN, BK, WM, WN, ST, MINB, true, true>,                                        \
     f16_tile<BM, BN, BK, WM, WN, ST, MINB>::sc_smem_s8, 0, NULL}
// The wgmma tiles: INT8's shortcut kernels hold the residual tile beyond
// the pipeline (sc_smem_s8). The one-barrier pipeline (ONEBAR), names
// ending "b1": the autotuner took it for layer3's convs at 128 x 256 x 4
// stages (bench/gpu-notes-diary.md), not at 128 x 128, whose two CTAs an
// SM a fourth stage would cost.
#define WG_TILE_OF(NAME, BM, BN, ST, S8, ONEBAR)                                                          \
    {{NAME, BM, BN, (S8) ? 128 : 64, wg_tile<BM, BN, ST>::threads, wg_tile<BM, BN, ST>::smem, 0, 1, 0, 0, FAMILY_PLAIN}, \
     conv2d_igemm_wgmma_kernel<BM, BN, ST, S8, false, ONEBAR>,                                            \
     conv2d_igemm_wgmma_kernel<BM, BN, ST, S8, true, ONEBAR>,                                             \
     (S8) ? wg_tile<BM, BN, ST>::sc_smem_s8 : wg_tile<BM, BN, ST>::smem, 0,                               \
     wg_pool_fn<BM, BN, ST, S8, ONEBAR>::get()}
#define WG_TILE(BM, BN, ST) WG_TILE_OF("wgmma_" #BM "x" #BN "x64_s" #ST, BM, BN, ST, false, false)
#define WG_S8_TILE(BM, BN, ST) WG_TILE_OF("wgmma_s8_" #BM "x" #BN "x128_s" #ST, BM, BN, ST, true, false)
#define WG_TILE1(BM, BN, ST) WG_TILE_OF("wgmma_" #BM "x" #BN "x64_s" #ST "b1", BM, BN, ST, false, true)
#define WG_S8_TILE1(BM, BN, ST) WG_TILE_OF("wgmma_s8_" #BM "x" #BN "x128_s" #ST "b1", BM, BN, ST, true, true)
// The patch kernel for C input channels at TP pixels a tile (the planner's
// bm; info.bk as the wgmma tiles' for the kind).
#define SWAP_TILE(S8, C, TP, MINB)                                                                                 \
    {{(S8) ? "wgmma_s8_swap3x3c" #C "_n" #TP : "wgmma_swap3x3c" #C "_n" #TP, TP, 64, (S8) ? 128 : 64, 128,          \
      SWAP_SMEM(S8, TP, (S8) ? (C) : 2 * (C)), 0, 1, C, 0, FAMILY_PLAIN},                                                         \
     conv3x3_swap_kernel<S8, TP, MINB, (S8) ? (C) : 2 * (C)>, NULL, 0, 0, NULL}
// INT8's 128-channel patch kernel, also with the shortcut (its pixels and
// weights in shared memory after the byte tiles).
#define SWAP_SC_TILE(TP, MINB)                                                                                   \
    {{"wgmma_s8_swap3x3c128_n" #TP, TP, 64, 128, 128, SWAP_SMEM(true, TP, 128), 0, 1, 128, 0, FAMILY_PLAIN},                   \
     conv3x3_swap_kernel<true, TP, MINB, 128>, conv3x3_swap_kernel<true, TP, MINB, 128, true>,                    \
     SWAP_SMEM(true, TP, 128) + 2 * (TP) * 64 + 64 * 64, 0, NULL}
#define F32_TILE(BM, BN) \
    {{"f32_" #BM "x" #BN, BM, BN, 8, f32_tile<BM, BN>::threads, 0, 0, 0, 0, 0, FAMILY_PLAIN}, conv2d_igemm_f32_kernel<BM, BN>}
#define X3_TILE(BM, BN, BK, WM, WN, ST, MINB)                                                                \
    {{"3xtf32_" #BM "x" #BN "x" #BK "_w" #WM "x" #WN "_s" #ST, BM, BN, BK,                                  \
      x3_tile<BM, BN, BK, WM, WN, ST, MINB>::threads, x3_tile<BM, BN, BK, WM, WN, ST, MINB>::smem, 0, 0, 0, 0, FAMILY_3XTF32}, \
     conv2d_igemm_3xtf32_kernel<BM, BN, BK, WM, WN, ST, MINB>}

static f16_entry kTilesF16[] = {
    F16_TILE(256, 128, 32, 4, 2, 3, 1),
    F16_TILE(128, 128, 32, 2, 4, 4, 2),
    F16_TILE(128, 128, 64, 2, 4, 3, 2),
    F16_TILE(128, 64, 64, 2, 2, 3, 2),
    F16_TILE(256, 64, 32, 4, 2, 4, 2),
    F16_TILE(128, 64, 32, 2, 2, 4, 3),
    F16_TILE(128, 64, 32, 2, 2, 3, 4),
    F16_TILE(64, 128, 32, 2, 2, 4, 3),
    F16_TILE(64, 64, 64, 2, 2, 3, 3),
    F16_TILE(32, 64, 64, 1, 2, 3, 4),
    WG_TILE(128, 128, 4),
    WG_TILE(128, 128, 3),
    WG_TILE(128, 64, 4),
    WG_TILE(64, 128, 4),
    WG_TILE(64, 64, 4),
    WG_TILE(128, 256, 3),
    WG_TILE(256, 64, 4),
    WG_TILE1(128, 256, 4),
    // Three warpgroups: layer4 at batch 256 in one wave (66 x 2 CTAs on
    // 132 SMs), where 128 x 128 took 1.5. FP16 only: INT8's 128 x 128
    // stayed faster there (bench/gpu-notes-diary.md).
    WG_TILE(192, 256, 3),
    SWAP_TILE(false, 64, 128, 2),
};
// The FP16 shapes again; the patch kernel for 64 (64-byte rows) and 128
// channels.
static f16_entry kTilesS8[] = {
    S8_TILE(256, 128, 32, 4, 2, 3, 1, 64),
    S8_TILE(128, 128, 32, 2, 4, 4, 2, 64),
    S8_TILE(128, 128, 64, 2, 4, 3, 2, 128),
    S8_TILE(128, 64, 64, 2, 2, 3, 2, 128),
    S8_TILE(256, 64, 32, 4, 2, 4, 2, 64),
    S8_TILE(128, 64, 32, 2, 2, 4, 3, 64),
    S8_TILE(64, 128, 32, 2, 2, 4, 3, 64),
    S8_TILE(64, 64, 64, 2, 2, 3, 3, 128),
    S8_TILE(32, 64, 64, 1, 2, 3, 4, 128),
    WG_S8_TILE(128, 128, 4),
    WG_S8_TILE(128, 128, 3),
    WG_S8_TILE(128, 64, 4),
    WG_S8_TILE(64, 128, 4),
    WG_S8_TILE(64, 64, 4),
    WG_S8_TILE(128, 256, 3),
    WG_S8_TILE(256, 64, 4),
    WG_S8_TILE1(128, 256, 4),
    SWAP_TILE(true, 64, 128, 3),
    SWAP_TILE(true, 64, 256, 2),
    SWAP_SC_TILE(128, 2),
};
static f32_entry kTilesF32[] = {
    F32_TILE(128, 128),
    F32_TILE(128, 64),
    F32_TILE(64, 64),
    F32_TILE(32, 64),
    X3_TILE(128, 128, 16, 2, 4, 3, 1),
    X3_TILE(128, 64, 16, 2, 2, 4, 2),
    X3_TILE(128, 64, 16, 4, 2, 4, 1),
    X3_TILE(64, 64, 32, 2, 2, 3, 2),
};
#define NTILES_F16 ((int)(sizeof kTilesF16 / sizeof kTilesF16[0]))
#define NTILES_F32 ((int)(sizeof kTilesF32 / sizeof kTilesF32[0]))
#define NTILES_S8 ((int)(sizeof kTilesS8 / sizeof kTilesS8[0]))

// The FP16-signature table of a kind (FP16 or INT8), with its size.
static f16_entry *half_table(int kind, int *n)
{
    *n = kind == CONV_INT8 ? NTILES_S8 : NTILES_F16;
    return kind == CONV_INT8 ? kTilesS8 : kTilesF16;
}

// Persistent grids: the SMs of the device conv_init last ran on (another
// count only changes how many tiles each CTA loops over), or the test's cap.
static int g_num_sms = 1;
static int g_persistent_cap = 0;

void conv_set_persistent_cap(int ctas)
{
    g_persistent_cap = ctas > 0 ? ctas : 0;
}

int conv_persistent_cap(void)
{
    return g_persistent_cap;
}

// Programmatic launches: conv_init clears g_pdl_ok for good once a device
// before 9.0 is seen (atomics: a reload creates engines on another thread);
// t_pdl is this thread's choice (conv_set_pdl).
static std::atomic<int> g_pdl_ok{1}, g_pdl_init{0};
static thread_local int t_pdl = -1;

int conv_pdl_supported(void)
{
    return g_pdl_init && g_pdl_ok;
}

int conv_set_pdl(int on)
{
    const int old = t_pdl;
    t_pdl = on;
    return old;
}

int conv_pdl_on(void)
{
    return conv_pdl_supported() && t_pdl != 0;
}

int conv_tile_fits(int kind, int tile, const conv_shape *s)
{
    const conv_tile_info *t = conv_tile_get(kind, tile);
    if (s->c2 > 0) {  // the shortcut: the general tiles; INT8's 128-channel patch kernel one of 64 channels
        int n;
        return t && kind != CONV_FP32 && half_table(kind, &n)[tile].fn_sc &&
               (!t->halo || (conv_halo_fits(s, t->halo) && s->c2 == 64));
    }
    return t && (!t->halo || conv_halo_fits(s, t->halo));
}

int conv_pool_fits(int kind, const conv_plan *p, const conv_shape *s)
{
    const conv_tile_info *t = conv_tile_get(kind, p->tile);
    int n;
    return t && kind == CONV_INT8 && half_table(kind, &n)[p->tile].fn_pool && p->splits == 1 && s->c2 == 0 &&
           s->k % 64 == 0 && s->oh * s->ow <= t->bm;
}

int conv_tile_count(int kind)
{
    return kind == CONV_INT8 ? NTILES_S8 : kind == CONV_FP16 ? NTILES_F16 : NTILES_F32;
}

const conv_tile_info *conv_tile_get(int kind, int tile)
{
    if (tile < 0 || tile >= conv_tile_count(kind))
        return NULL;
    return kind == CONV_INT8 ? &kTilesS8[tile].info : kind == CONV_FP16 ? &kTilesF16[tile].info
                                                                         : &kTilesF32[tile].info;
}

cudaError_t conv_init(void)
{
    // The sm_90a cubin, with the wgmma kernels, loads only on 9.0 devices.
    // RESNETD_NO_WGMMA=1 leaves them out (to compare, or to rule them out).
    const char *no_wgmma = getenv("RESNETD_NO_WGMMA");
    int dev, major = 0, minor = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&g_num_sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess)
        return e;
    // Programmatic launches (kernels.cuh) need 9.0 or later on every
    // device the process uses.
    if (major < 9)
        g_pdl_ok = 0;
    g_pdl_init = 1;
    int has_wgmma = 0;
    if (major == 9 && minor == 0 && !(no_wgmma && strcmp(no_wgmma, "1") == 0)) {
        wgmma_probe_kernel<<<1, 1>>>();
        e = cudaGetLastError();
        if (e == cudaSuccess)
            e = cudaMemcpyFromSymbol(&has_wgmma, g_has_wgmma, sizeof has_wgmma);
        if (e != cudaSuccess)
            return e;
    }
    if ((e = stem_pool_init(g_num_sms, has_wgmma)) != cudaSuccess)
        return e;
    for (int kind = CONV_FP16; kind <= CONV_INT8; kind++) {
        int n;
        f16_entry *tab = half_table(kind, &n);
        for (int i = 0; i < n; i++) {
            conv_tile_info *t = &tab[i].info;
            t->usable = !t->sm90a || has_wgmma;
            if (!t->usable)
                continue;
            e = cudaFuncSetAttribute(tab[i].fn, cudaFuncAttributeMaxDynamicSharedMemorySize, t->smem);
            if (e == cudaSuccess && tab[i].fn_sc)
                e = cudaFuncSetAttribute(tab[i].fn_sc, cudaFuncAttributeMaxDynamicSharedMemorySize, tab[i].smem_sc);
            if (e == cudaSuccess && tab[i].fn_pool)
                e = cudaFuncSetAttribute(tab[i].fn_pool, cudaFuncAttributeMaxDynamicSharedMemorySize, t->smem);
            if (e == cudaSuccess)
                e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&t->ctas_per_sm, tab[i].fn, t->threads, t->smem);
            if (e == cudaSuccess && tab[i].fn_sc)
                e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&tab[i].ctas_sc, tab[i].fn_sc, t->threads,
                                                                  tab[i].smem_sc);
            if (e != cudaSuccess)
                return e;
        }
    }
    for (int i = 0; i < NTILES_F32; i++) {
        conv_tile_info *t = &kTilesF32[i].info;
        t->usable = 1;
        e = t->smem > 0 ? cudaFuncSetAttribute(kTilesF32[i].fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                           t->smem)
                                    : cudaSuccess;
        if (e == cudaSuccess)
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&t->ctas_per_sm, kTilesF32[i].fn, t->threads, t->smem);
        if (e != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

// CTAs per SM of the tile's kernel for the shape (its shortcut's
// instantiation may hold more shared memory), at least 1.
static int tile_ctas(int kind, int tile, const conv_shape *s)
{
    int n, c = conv_tile_get(kind, tile)->ctas_per_sm;
    if (s->c2 > 0 && kind != CONV_FP32)
        c = half_table(kind, &n)[tile].ctas_sc;
    return c > 0 ? c : 1;
}

// Split-K for a tile: when its CTAs would fill under half the GPU, split K
// so that about one full wave runs, keeping at least 4 k tiles per split.
// unsplit: never.
static conv_plan plan_for_tile(int kind, int tile, const conv_shape *s, int num_sms, int unsplit)
{
    const conv_tile_info *t = conv_tile_get(kind, tile);
    long M = (long)s->n * s->oh * s->ow;
    long ctas = ((M + t->bm - 1) / t->bm) * ((s->k + t->bn - 1) / t->bn);
    long slots = (long)num_sms * tile_ctas(kind, tile, s);
    int kt = (conv_k(*s) + t->bk - 1) / t->bk;
    conv_plan p = {tile, 1, kt};
    if (!unsplit && !t->halo && !(kind == CONV_INT8 && s->c2 > 0) && ctas * 2 <= slots) {  // INT8's shortcut: no split
        long want = slots / ctas;
        int splits = (int)(want < 16 ? want : 16);
        if (splits > kt / 4)
            splits = kt / 4;
        if (splits > 1) {
            p.kt_per_split = (kt + splits - 1) / splits;
            p.splits = (kt + p.kt_per_split - 1) / p.kt_per_split;
        }
    }
    return p;
}

// Tile i may run shape s under filter f.
static int tile_allowed(int kind, int i, const conv_shape *s, const conv_filter *f)
{
    const conv_tile_info *t = conv_tile_get(kind, i);
    return t->usable && conv_tile_fits(kind, i, s) && (!f || f->family < 0 || t->family == f->family);
}

int conv_plan_candidates(int kind, const conv_shape *s, int num_sms, const conv_filter *f, conv_plan *out, int max)
{
    int n = 0;
    for (int i = 0; i < conv_tile_count(kind) && n < max; i++)
        if (tile_allowed(kind, i, s, f))
            out[n++] = plan_for_tile(kind, i, s, num_sms, f && f->unsplit);
    return n;
}

// Estimated time of a plan: the waves of CTAs it takes, each as long as a
// tile's work divided by how well that tile shape uses the SM (bigger tiles
// reuse each loaded byte more), plus the split-K epilogue's traffic.
// Without an allowed general tile, the first allowed one.
conv_plan conv_plan_pick(int kind, const conv_shape *s, int num_sms, const conv_filter *f)
{
    long M = (long)s->n * s->oh * s->ow;
    conv_plan best = {-1, 1, 1};
    double best_t = 1e300;
    for (int i = 0; i < conv_tile_count(kind); i++) {
        if (!tile_allowed(kind, i, s, f))
            continue;
        const conv_tile_info *t = conv_tile_get(kind, i);
        conv_plan p = plan_for_tile(kind, i, s, num_sms, f && f->unsplit);
        if (best.tile < 0)
            best = p;
        if (t->halo)
            continue;
        int per_sm = tile_ctas(kind, i, s);
        long ctas = ((M + t->bm - 1) / t->bm) * ((s->k + t->bn - 1) / t->bn) * p.splits;
        long slots = (long)num_sms * per_sm;
        long waves = (ctas + slots - 1) / slots;
        double intensity = (double)t->bm * t->bn / (t->bm + t->bn);  // MACs per loaded element
        double eff = intensity / (intensity + 16.0);
        double tm = (double)waves * t->bm * t->bn * p.kt_per_split * t->bk * per_sm / eff;
        if (p.splits > 1)
            tm += (double)M * s->k * p.splits * 64.0 + 2e6;  // partials out and back, one more launch
        if (tm < best_t * 0.999) {
            best_t = tm;
            best = p;
        }
    }
    if (best.tile < 0)
        best = plan_for_tile(kind, 0, s, num_sms, f && f->unsplit);
    return best;
}

size_t conv_workspace_bytes(const conv_shape *s, const conv_plan *p)
{
    return p->splits > 1 ? (size_t)p->splits * s->n * s->oh * s->ow * s->k * sizeof(float) : 0;
}

cudaError_t conv_launch(int kind, const conv_plan *p, const conv_shape *s, const void *in, const void *in2,
                        const void *w, const float *bias, const void *res, int relu, void *out, float *workspace,
                        const conv_q8 *q, cudaStream_t st)
{
    // Not t->usable: that is the planner's filter, and conv_init on another
    // device (cuda:all with mixed GPUs) may change it after this plan was made.
    const conv_tile_info *t = conv_tile_get(kind, p->tile);
    if (!t || p->splits < 1 || (p->splits > 1 && !workspace) || ((kind == CONV_INT8) != (q != NULL)) ||
        (s->c2 > 0 && (!in2 || !conv_tile_fits(kind, p->tile, s))) ||
        (kind == CONV_INT8 && s->c2 > 0 && (p->splits != 1 || res || !q->sc_mult || !q->sc_bias)))
        return cudaErrorInvalidValue;
    if (kind == CONV_INT8 && q->pool_out &&
        (!conv_pool_fits(kind, p, s) || !q->out_f32 || !q->pool_part || !q->pool_cnt || q->pool_hw != s->oh * s->ow))
        return cudaErrorInvalidValue;
    if (kind == CONV_INT8 && ((((uintptr_t)bias | (uintptr_t)q->mult) & 15) != 0 ||
                              (((uintptr_t)q->sc_mult | (uintptr_t)q->sc_bias) & 7) != 0))
        return cudaErrorMisalignedAddress;  // the epilogue reads them as float4, the shortcut's as float2
    long M = (long)s->n * s->oh * s->ow;
    float *partial = p->splits > 1 ? workspace : NULL;
    dim3 grid((unsigned)((M + t->bm - 1) / t->bm), (unsigned)((s->k + t->bn - 1) / t->bn), (unsigned)p->splits);
    if (t->halo) {  // persistent CTAs over the padded-grid tiles
        if (kind == CONV_FP32 || p->splits != 1 || !conv_halo_fits(s, t->halo) || (q && q->out_f32))
            return cudaErrorInvalidValue;  // INT8: the epilogue writes int8 only
        const long nh = s->k / 64;  // 64-channel slices; every slice the same number of CTAs
        long tiles = (long)s->n * ((s->h * (s->w + 2) + t->bm - 1) / t->bm) * nh;
        long most = g_persistent_cap > 0 ? g_persistent_cap : (long)g_num_sms * tile_ctas(kind, p->tile, s);
        long ctas = (tiles < most ? tiles : most) / nh * nh;
        grid = dim3((unsigned)(ctas > nh ? ctas : nh), 1, 1);
    }
    const conv_q8 none = {};
    cudaError_t e;
    if (kind != CONV_FP32) {
        conv_shape h = *s;
        if (kind == CONV_INT8) {  // int8 channels as pairs: the kernels' halves
            h.c /= 2;
            h.c2 /= 2;
        }
        h.in2 = in2;
        int n;
        const f16_entry &en = half_table(kind, &n)[p->tile];
        const f16_kernel_fn fn = s->c2 > 0 ? en.fn_sc : q && q->pool_out ? en.fn_pool : en.fn;
        e = launch_k(fn, grid, t->threads, s->c2 > 0 ? en.smem_sc : t->smem, st, h, (const __half *)in,
                     (const __half *)w, bias, res, out, relu, partial, p->kt_per_split, q ? *q : none);
    } else {
        e = launch_k(kTilesF32[p->tile].fn, grid, t->threads, t->smem, st, *s, (const float *)in, (const float *)w,
                     bias, (const float *)res, (float *)out, relu, partial, p->kt_per_split);
    }
    if (e != cudaSuccess || !partial)
        return e;
    unsigned blocks = (unsigned)((M * s->k / 4 + 255) / 256);
    if (kind == CONV_INT8)
        return launch_k(splitk_epilogue_s8_kernel, blocks, 256, 0, st, (const int *)partial, p->splits, (int)M, s->k,
                        bias, *q, (const int8_t *)res, relu, out);
    if (kind == CONV_FP16)
        return launch_k(splitk_epilogue_kernel<__half>, blocks, 256, 0, st, partial, p->splits, (int)M, s->k, bias,
                        (const __half *)res, relu, (__half *)out);
    return launch_k(splitk_epilogue_kernel<float>, blocks, 256, 0, st, partial, p->splits, (int)M, s->k, bias,
                    (const float *)res, relu, (float *)out);
}
