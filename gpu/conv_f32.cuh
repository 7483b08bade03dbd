// The FP32 conv kernels: SIMT (exact FP32, parity with the CPU engine) and
// 3xTF32 on tensor cores: gpu/conv.cu's FP32 kernel families, instantiated
// by its tile table (kTilesF32).
#ifndef RESNETD_GPU_CONV_F32_CUH
#define RESNETD_GPU_CONV_F32_CUH

#include "gpu/conv_loaders.cuh"

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
                            const float *__restrict__ bias, const float *__restrict__ res, float *__restrict__ out,
                            int relu, float *__restrict__ partial, int kt_per_split)
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
                *reinterpret_cast<float4 *>(partial + (size_t)blockIdx.z * M * N + o) = make_float4(
                    acc[i][jh * 4], acc[i][jh * 4 + 1], acc[i][jh * 4 + 2], acc[i][jh * 4 + 3]);
                continue;
            }
            float4 bb = *reinterpret_cast<const float4 *>(bias + col);
            float4 v = make_float4(acc[i][jh * 4] + bb.x, acc[i][jh * 4 + 1] + bb.y, acc[i][jh * 4 + 2] + bb.z,
                                   acc[i][jh * 4 + 3] + bb.w);
            if (res) {
                float4 r = *reinterpret_cast<const float4 *>(res + o);
                v.x += r.x;
                v.y += r.y;
                v.z += r.z;
                v.w += r.w;
            }
            if (relu) {
                v.x = fmaxf(v.x, 0.f);
                v.y = fmaxf(v.y, 0.f);
                v.z = fmaxf(v.z, 0.f);
                v.w = fmaxf(v.w, 0.f);
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
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
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
                               const float *__restrict__ bias, const float *__restrict__ res, float *__restrict__ out,
                               int relu, float *__restrict__ partial, int kt_per_split)
{
    typedef x3_tile<BM, BN, BK, WM, WN, STAGES, MINB> cfg;
    constexpr int T = cfg::threads, LDS = cfg::lds, KCH = BK / 4;
    constexpr int A_PER = BM * KCH / T, B_PER = BN * KCH / T, ROW_STEP = T / KCH;
    constexpr int WTM = BM / WM, WTN = BN / WN, MI = WTM / 16, NI = WTN / 8;
    static_assert(BM * KCH % T == 0 && BN * KCH % T == 0 && T % KCH == 0, "loader shape");
    static_assert(WTM % 16 == 0 && WTN % 16 == 0 && BK % 8 == 0, "warp tile shape");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    float *As = reinterpret_cast<float *>(smem_raw);  // [STAGES][BM][LDS]
    float *Bs = As + STAGES * BM * LDS;  // [STAGES][BN][LDS]

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
                b_hi[2 * nj][0] = h[0];
                b_hi[2 * nj][1] = h[1];
                b_hi[2 * nj + 1][0] = h[2];
                b_hi[2 * nj + 1][1] = h[3];
                b_lo[2 * nj][0] = l[0];
                b_lo[2 * nj][1] = l[1];
                b_lo[2 * nj + 1][0] = l[2];
                b_lo[2 * nj + 1][1] = l[3];
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
                    float t[4] = { 0.f, 0.f, 0.f, 0.f };
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

#endif
