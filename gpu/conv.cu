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
//
// The kernel families live in headers, one each, as templates this file
// instantiates: conv_loaders.cuh (shared geometry and loaders), conv_mma.cuh
// (mma.sync), conv_wgmma.cuh (wgmma), conv_halo.cuh (3x3 from a shared
// patch), conv_f32.cuh (SIMT and 3xTF32). Here: shapes, split-K, the tile
// tables, the plan choice and the launchers.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <atomic>
#include "gpu/kernels.cuh"
#include "gpu/mma.cuh"
#include "gpu/wgmma.cuh"

/* ===================================================================== */
/* Shapes                                                                */
/* ===================================================================== */

conv_shape conv_shape_make(int n, int h, int w, int c, int k, int kh, int kw, int stride, int pad_h, int pad_w)
{
    conv_shape s;
    s.n = n;
    s.h = h;
    s.w = w;
    s.c = c;
    s.k = k;
    s.kh = kh;
    s.kw = kw;
    s.stride = stride;
    s.pad_h = pad_h;
    s.pad_w = pad_w;
    s.oh = (h + 2 * pad_h - kh) / stride + 1;
    s.ow = (w + 2 * pad_w - kw) / stride + 1;
    s.c2 = 0;
    s.h2 = 0;
    s.w2 = 0;
    s.stride2 = 1;
    s.in2 = NULL;
    return s;
}

int conv_shape_check(const conv_shape *s, int kind, char *err, size_t errlen)
{
    // Elements per 16-byte chunk; the FP16 stem's layout: a chunk is two
    // pixels of 4 channels. (INT8 kernels read u8, engine/int8.h, so not the
    // int8 image: its stem is gpu/stem.cu's.)
    int chunk = kind == CONV_INT8 ? 16 : kind == CONV_FP16 ? 8 : 4;
    int stem_layout = kind == CONV_FP16 && s->c == 4 && s->kw % 2 == 0 && s->w % 2 == 0 && s->pad_w % 2 == 0 &&
                      s->stride % 2 == 0;
    if (s->n < 1 || s->h < 1 || s->w < 1 || s->c < 1 || s->k < 1 || s->kh < 1 || s->kw < 1 || s->stride < 1 ||
        s->pad_h < 0 || s->pad_w < 0 || s->oh < 1 || s->ow < 1) {
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
        if (kind == CONV_FP32 || s->c2 < 0 || s->c2 % chunk != 0 || s->c2 > s->c || s->stride != 1 || s->h2 < 1 ||
            s->w2 < 1 || s->stride2 < 1 || (long)(s->oh - 1) * s->stride2 >= s->h2 ||
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
#include "gpu/conv_f32.cuh"
#include "gpu/conv_halo.cuh"

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
    float2 a = __half22float2(*reinterpret_cast<__half2 *>(&u.x)),
           b = __half22float2(*reinterpret_cast<__half2 *>(&u.y));
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
        v.x += p.x;
        v.y += p.y;
        v.z += p.z;
        v.w += p.w;
    }
    if (res) {
        float4 r = load4(res + i);
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
    store4(out + i, v);
}

// INT8: the int32 partial sums added exactly, then engine/int8.h's
// epilogue; four channels per thread.
__global__ void __launch_bounds__(256)
    splitk_epilogue_s8_kernel(const int *__restrict__ partial, int splits, int M, int N, const float *__restrict__ bias,
                              const conv_q8 q, const int8_t *__restrict__ res, int relu, void *__restrict__ out)
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
        a.x += p.x;
        a.y += p.y;
        a.z += p.z;
        a.w += p.w;
    }
    const int acc[4] = { a.x, a.y, a.z, a.w };
    const uint32_t r = res ? *reinterpret_cast<const uint32_t *>(res + i) : 0u;
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; j++)  // ReLU below
        v[j] = s8_value(acc[j], q.mult[col + j], bias[col + j], q8_byte(r, j, q.res_u8), q.res_scale, res != NULL);
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
    *reinterpret_cast<uint32_t *>(reinterpret_cast<int8_t *>(out) + i) = q8_pack2(t[1], t[0],
                                                                                  q8_pack2(t[3], t[2], 0, relu), relu);
}

/* ===================================================================== */
/* The tile table and the host launchers                                 */
/* ===================================================================== */

// The FP16 and INT8 kernels share one signature (INT8 data passed as
// halves, q used only by INT8).
typedef void (*f16_kernel_fn)(const conv_shape, const __half *, const __half *, const float *, const void *, void *,
                              int, float *, int, const conv_q8);
typedef void (*f32_kernel_fn)(const conv_shape, const float *, const float *, const float *, const float *, float *,
                              int, float *, int);

struct f16_entry {
    conv_tile_info info;
    f16_kernel_fn fn;
    f16_kernel_fn fn_sc;  // the general tiles and INT8's 128-channel patch kernel: with a shortcut, else NULL
    int smem_sc;  // its dynamic shared memory (INT8's holds the residual tile too)
    int ctas_sc;  // filled by conv_init: its CTAs per SM
    f16_kernel_fn fn_pool;  // INT8's general wgmma tiles: with the average pool inside, else NULL
};
// fn_pool of a wgmma tile: INT8's only.
template <int BM, int BN, int ST, bool S8, bool ONEBAR>
struct wg_pool_fn {
    static f16_kernel_fn get()
    {
        return NULL;
    }
};
template <int BM, int BN, int ST, bool ONEBAR>
struct wg_pool_fn<BM, BN, ST, true, ONEBAR> {
    static f16_kernel_fn get()
    {
        return conv2d_igemm_wgmma_kernel<BM, BN, ST, true, false, ONEBAR, true>;
    }
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
#define F16_TILE(BM, BN, BK, WM, WN, ST, MINB)                                  \
    {                                                                           \
        { "f16_" #BM "x" #BN "x" #BK "_w" #WM "x" #WN "_s" #ST,                 \
          BM,                                                                   \
          BN,                                                                   \
          BK,                                                                   \
          f16_tile<BM, BN, BK, WM, WN, ST, MINB>::threads,                      \
          f16_tile<BM, BN, BK, WM, WN, ST, MINB>::smem,                         \
          0,                                                                    \
          0,                                                                    \
          0,                                                                    \
          0,                                                                    \
          FAMILY_PLAIN },                                                       \
            conv2d_igemm_f16_kernel<BM, BN, BK, WM, WN, ST, MINB, false>,       \
            conv2d_igemm_f16_kernel<BM, BN, BK, WM, WN, ST, MINB, false, true>, \
            f16_tile<BM, BN, BK, WM, WN, ST, MINB>::smem, 0, NULL               \
    }
#define S8_TILE(BM, BN, BK, WM, WN, ST, MINB, NAME_BK)                         \
    {                                                                          \
        { "s8_" #BM "x" #BN "x" #NAME_BK "_w" #WM "x" #WN "_s" #ST,            \
          BM,                                                                  \
          BN,                                                                  \
          2 * BK,                                                              \
          f16_tile<BM, BN, BK, WM, WN, ST, MINB>::threads,                     \
          f16_tile<BM, BN, BK, WM, WN, ST, MINB>::smem,                        \
          0,                                                                   \
          0,                                                                   \
          0,                                                                   \
          0,                                                                   \
          FAMILY_PLAIN },                                                      \
            conv2d_igemm_f16_kernel<BM, BN, BK, WM, WN, ST, MINB, true>,       \
            conv2d_igemm_f16_kernel<BM, BN, BK, WM, WN, ST, MINB, true, true>, \
            f16_tile<BM, BN, BK, WM, WN, ST, MINB>::sc_smem_s8, 0, NULL        \
    }
// The wgmma tiles: INT8's shortcut kernels hold the residual tile beyond
// the pipeline (sc_smem_s8). The one-barrier pipeline (ONEBAR), names
// ending "b1": the autotuner took it for layer3's convs at 128 x 256 x 4
// stages (bench/gpu-notes-diary.md), not at 128 x 128, whose two CTAs an
// SM a fourth stage would cost.
#define WG_TILE_OF(NAME, BM, BN, ST, S8, ONEBAR)                                                     \
    {                                                                                                \
        { NAME, BM, BN, (S8) ? 128 : 64, wg_tile<BM, BN, ST>::threads, wg_tile<BM, BN, ST>::smem, 0, \
          1,    0,  0,  FAMILY_PLAIN },                                                              \
            conv2d_igemm_wgmma_kernel<BM, BN, ST, S8, false, ONEBAR>,                                \
            conv2d_igemm_wgmma_kernel<BM, BN, ST, S8, true, ONEBAR>,                                 \
            (S8) ? wg_tile<BM, BN, ST>::sc_smem_s8 : wg_tile<BM, BN, ST>::smem, 0,                   \
            wg_pool_fn<BM, BN, ST, S8, ONEBAR>::get()                                                \
    }
#define WG_TILE(BM, BN, ST) WG_TILE_OF("wgmma_" #BM "x" #BN "x64_s" #ST, BM, BN, ST, false, false)
#define WG_S8_TILE(BM, BN, ST) WG_TILE_OF("wgmma_s8_" #BM "x" #BN "x128_s" #ST, BM, BN, ST, true, false)
#define WG_TILE1(BM, BN, ST) WG_TILE_OF("wgmma_" #BM "x" #BN "x64_s" #ST "b1", BM, BN, ST, false, true)
#define WG_S8_TILE1(BM, BN, ST) WG_TILE_OF("wgmma_s8_" #BM "x" #BN "x128_s" #ST "b1", BM, BN, ST, true, true)
// The patch kernel for C input channels at TP pixels a tile (the planner's
// bm; info.bk as the wgmma tiles' for the kind).
#define SWAP_TILE(S8, C, TP, MINB)                                                    \
    {                                                                                 \
        { (S8) ? "wgmma_s8_swap3x3c" #C "_n" #TP : "wgmma_swap3x3c" #C "_n" #TP,      \
          TP,                                                                         \
          64,                                                                         \
          (S8) ? 128 : 64,                                                            \
          128,                                                                        \
          SWAP_SMEM(S8, TP, (S8) ? (C) : 2 * (C)),                                    \
          0,                                                                          \
          1,                                                                          \
          C,                                                                          \
          0,                                                                          \
          FAMILY_PLAIN },                                                             \
            conv3x3_swap_kernel<S8, TP, MINB, (S8) ? (C) : 2 * (C)>, NULL, 0, 0, NULL \
    }
// INT8's 128-channel patch kernel, also with the shortcut (its pixels and
// weights in shared memory after the byte tiles).
#define SWAP_SC_TILE(TP, MINB)                                                                                    \
    {                                                                                                             \
        { "wgmma_s8_swap3x3c128_n" #TP, TP, 64, 128, 128, SWAP_SMEM(true, TP, 128), 0, 1, 128, 0, FAMILY_PLAIN }, \
            conv3x3_swap_kernel<true, TP, MINB, 128>, conv3x3_swap_kernel<true, TP, MINB, 128, true>,             \
            SWAP_SMEM(true, TP, 128) + 2 * (TP)*64 + 64 * 64, 0, NULL                                             \
    }
#define F32_TILE(BM, BN)                                                                           \
    {                                                                                              \
        { "f32_" #BM "x" #BN, BM, BN, 8, f32_tile<BM, BN>::threads, 0, 0, 0, 0, 0, FAMILY_PLAIN }, \
            conv2d_igemm_f32_kernel<BM, BN>                                                        \
    }
#define X3_TILE(BM, BN, BK, WM, WN, ST, MINB)                        \
    {                                                                \
        { "3xtf32_" #BM "x" #BN "x" #BK "_w" #WM "x" #WN "_s" #ST,   \
          BM,                                                        \
          BN,                                                        \
          BK,                                                        \
          x3_tile<BM, BN, BK, WM, WN, ST, MINB>::threads,            \
          x3_tile<BM, BN, BK, WM, WN, ST, MINB>::smem,               \
          0,                                                         \
          0,                                                         \
          0,                                                         \
          0,                                                         \
          FAMILY_3XTF32 },                                           \
            conv2d_igemm_3xtf32_kernel<BM, BN, BK, WM, WN, ST, MINB> \
    }

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
static std::atomic<int> g_pdl_ok{ 1 }, g_pdl_init{ 0 };
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
    return kind == CONV_INT8 ? &kTilesS8[tile].info : kind == CONV_FP16 ? &kTilesF16[tile].info : &kTilesF32[tile].info;
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
        e = t->smem > 0 ? cudaFuncSetAttribute(kTilesF32[i].fn, cudaFuncAttributeMaxDynamicSharedMemorySize, t->smem)
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
    conv_plan p = { tile, 1, kt };
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
    conv_plan best = { -1, 1, 1 };
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
