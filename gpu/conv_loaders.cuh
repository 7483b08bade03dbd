// The conv kernels' shared geometry (gpu/conv.cu): where a row of the implicit
// GEMM's A starts, and the 16-byte chunk loaders every kernel family uses.
// Included by the family headers; gpu/conv.cu instantiates them.
#ifndef RESNETD_GPU_CONV_LOADERS_CUH
#define RESNETD_GPU_CONV_LOADERS_CUH

#include "gpu/kernels.cuh"
#include "gpu/mma.cuh"

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
__device__ __forceinline__ const T *igemm_a_addr(const conv_shape &s, const igemm_row<T> &row, const igemm_col &col,
                                                 bool kvalid, bool *valid)
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

#endif
