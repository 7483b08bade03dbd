/* The CPU engine at INT8: ResNet18 with int8 weights and activations,
 * int32 accumulation and a fused requantising epilogue, behind the engine
 * interface. The arithmetic is engine/int8.h's, exactly: every conv (the
 * stem included) is integer; the head is float, its FC on FP16-rounded
 * features and weights.
 *
 * Why the stem is INT8 too: with an FP32 stem its output would depend on
 * the summation order of a float GEMM, so no two implementations (this
 * one, the CUDA engine's, the torch emulation in the tests) could
 * agree on the int8 tensors that follow. Integer all the way, they agree
 * bit for bit; only the average pool and the FC (as small as they are)
 * are float, and they come last.
 *
 * Layouts: activations NHWC int8 without borders ([n][h][h][c]); the last
 * conv's output is NHWC FP32. Weights [cout][Kp] int8, K = k*k*cin in KRSC
 * order padded with zeros to Kp, a multiple of KBLK. A conv is a GEMM: rows
 * are output pixels, built by im2col into a per-thread workspace of RB
 * rows; a unit of work is RB rows times a range of output channels,
 * claimed by the pool threads (engine/cpu_pool.h). Four tiles compute the
 * int32 sums, chosen at create: an AMX one (tdpbssd on 16 x 16 int32
 * tiles) where the CPU and the kernel allow it, else an AVX512-VNNI one
 * (vpdpbusd), else an AVX2 one for CPUs without AVX-512 (vpmaddubsw on
 * the non-negative inputs of every conv but the stem, vpmaddwd on bytes
 * widened to 16 bits for the stem), all on weights repacked for them, else
 * a plain C one whose fixed inner trip count GCC vectorises at -O2.
 * RESNETD_CPU_INT8_GEMM=generic|avx2|vnni|amx forces one; all give the
 * same integers, and the tests run each the CPU has.
 *
 * Precision mixes (engine/calib.h): a table whose mix runs a prefix in
 * float gets an FP32 CPU engine of its own (engine_cpu_forward_prefix),
 * which computes that prefix exactly as at FP32; its last tensor is
 * quantised into this engine's int8 buffer and the INT8 convs go on from
 * there.
 *
 * Every buffer is allocated at create for max_batch; submit computes under
 * a mutex (the activations are shared by the slots) and wait has nothing
 * left to do. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "engine/calib.h"
#include "engine/cpu_pool.h"
#include "engine/engine.h"
#include "engine/engine_cpu.h"
#include "engine/int8.h"
#include "image/preprocess.h"

#define KBLK 64 /* K padding: the inner loop's trip count */
#define MR 4 /* rows per dot-product tile */
#define NR 4 /* output channels per tile */
#define VR 8 /* rows per VNNI tile */
#define CG 32 /* output channels per work-unit step (a VNNI tile's) */
#define AR 32 /* rows per AMX tile: two 16-row A tiles */
#define RB 64 /* im2col rows per work unit (a multiple of MR, VR and AR) */
#define I8_MAX_BATCH 4096 /* conv1 has n * 12544 / RB work units: < 2^20 (cpu_pool) */
#define NT R18_NTENSORS /* tensors: conv outputs, image, pool */
#define T_IMAGE R18_T_IMAGE
#define T_POOL R18_T_POOL
#define LAST (RESNET18_NUM_CONVS - 1)
#define STEM_C 64 /* the stem's output channels (resnet18_convs[0].cout) */

/* The AVX512-VNNI and AMX tiles are x86-64 only, used when the CPU has
 * them (and RESNETD_CPU_INT8_GEMM does not say otherwise); they give the
 * same integers as the generic tile, which the tests check. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#define HAVE_VNNI_KERNEL 1
#else
#define HAVE_VNNI_KERNEL 0
#endif
/* AMX intrinsics: GCC 11, clang 12. */
#if HAVE_VNNI_KERNEL && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define HAVE_AMX_KERNEL 1
#else
#define HAVE_AMX_KERNEL 0
#endif

typedef enum { TILE_GENERIC, TILE_AVX2, TILE_VNNI, TILE_AMX, NTILES } i8_tile;
static const char *const tile_names[NTILES] = { "generic", "avx2", "vnni", "amx" };

typedef struct i8_layer {
    const resnet18_conv_desc *d;
    int K, Kp; /* k*k*cin; padded to a multiple of KBLK */
    int8_t *w; /* [cout][Kp] */
    int8_t *wv; /* VNNI, AMX: [cout/16][Kp/4][16][4]; NULL without them */
    int32_t *corr; /* VNNI: [cout], 128 * sum_k w[c][k] */
    int16_t *w16; /* AVX2, the stem: wv's layout widened to 16 bits; NULL elsewhere */
    float *mult; /* [cout]: s_in * s_w[c] */
    float *b; /* [cout], BN folded */
    int src, res; /* tensors read (res -1: none) */
    float res_scale; /* scale of the residual tensor */
    float out_inv; /* 1 / scale of the output (unused by the last conv) */
} i8_layer;

typedef struct i8_engine {
    engine pub;
    int nthreads;
    i8_tile tile; /* which tile computes the sums */
    i8_layer layer[RESNET18_NUM_CONVS];
    int pool_h;
    int th[NT], tc[NT]; /* tensor -> height (= width), channels */
    int buf[NT]; /* int8 tensor -> buffer */
    int8_t *act[NT]; /* distinct int8 buffers, [max_batch][h][h][c] */
    int nact;
    float *last; /* the last conv's FP32 output, [max_batch][7][7][512] */
    float *feat; /* [max_batch][512] */
    float *fc_w, *fc_b; /* [classes][512], [classes] */
    int8_t *ws; /* im2col rows: nthreads x RB x ws_stride */
    size_t ws_stride; /* the largest Kp */
    float in_inv; /* 1 / scale of the input image */
    int8_t qlut[3][256]; /* uint8 pixel -> quantised normalised value */
    int float_convs; /* the mix's float prefix (calib_mix_float_convs) */
    engine *prefix; /* the FP32 engine that runs it; NULL without one */
    int boundary; /* the tensor it ends with (this engine's numbering) */
    const float *fdata; /* that tensor in FP32 while it is quantised */
    int fpad; /* its zero border */
    pthread_mutex_t run_mu;
    cpu_pool pool;
    /* The job being run. */
    const i8_layer *L;
    int n, slot;
    int M, rblocks, cparts; /* conv: rows, row blocks, channel ranges per block */
    int small_units;
} i8_engine;

static int imin(int a, int b)
{
    return a < b ? a : b;
}

/* Zeroed and 64-byte aligned (cpu_engine_alloc). */
static void *alloc_bytes(size_t n)
{
    return cpu_engine_alloc(n);
}

/* ---- the integer GEMM ------------------------------------------------------ */

/* out[r][j] = sum_k a[r][k] * w[j][k] for MR rows (stride lda) and NR
 * weight rows (stride ldw), Kp a multiple of KBLK. Exact: int32 never
 * overflows for ResNet18's K (see int8.h). */
CPU_VECTOR_CLONES
static void dot_tile(const int8_t *restrict a, size_t lda, const int8_t *restrict w, size_t ldw, int Kp,
                     int32_t out[MR][NR])
{
    const int8_t *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda;
    const int8_t *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;
    int32_t s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
    int32_t s20 = 0, s21 = 0, s22 = 0, s23 = 0, s30 = 0, s31 = 0, s32 = 0, s33 = 0;
    for (int k0 = 0; k0 < Kp; k0 += KBLK)
        for (int k = k0; k < k0 + KBLK; k++) {
            int x0 = a0[k], x1 = a1[k], x2 = a2[k], x3 = a3[k];
            int y0 = w0[k], y1 = w1[k], y2 = w2[k], y3 = w3[k];
            s00 += x0 * y0;
            s01 += x0 * y1;
            s02 += x0 * y2;
            s03 += x0 * y3;
            s10 += x1 * y0;
            s11 += x1 * y1;
            s12 += x1 * y2;
            s13 += x1 * y3;
            s20 += x2 * y0;
            s21 += x2 * y1;
            s22 += x2 * y2;
            s23 += x2 * y3;
            s30 += x3 * y0;
            s31 += x3 * y1;
            s32 += x3 * y2;
            s33 += x3 * y3;
        }
    out[0][0] = s00;
    out[0][1] = s01;
    out[0][2] = s02;
    out[0][3] = s03;
    out[1][0] = s10;
    out[1][1] = s11;
    out[1][2] = s12;
    out[1][3] = s13;
    out[2][0] = s20;
    out[2][1] = s21;
    out[2][2] = s22;
    out[2][3] = s23;
    out[3][0] = s30;
    out[3][1] = s31;
    out[3][2] = s32;
    out[3][3] = s33;
}

/* Writes rows [m0, m0 + rows) of conv d's int8 A matrix (KRSC columns,
 * zero past K up to Kp) into dst; rows at or past M are zero. */
static void im2col_i8(const resnet18_conv_desc *d, const int8_t *in, int m0, int rows, int M, int8_t *dst, size_t Kp)
{
    const int oh = d->out_h, ih = d->in_h, cin = d->cin, k = d->k, s = d->stride, p = d->pad;
    const size_t seg = (size_t)k * cin;
    /* Only the bytes no copy writes are zeroed (a whole-row memset before
     * the copies cost as much as the copies), the pixel is stepped rather
     * than divided out, and the stem's 21-byte copies (7 taps of 3
     * channels) have a constant size, which GCC inlines. */
    int img = m0 / (oh * oh), rem = m0 % (oh * oh), oy = rem / oh, ox = rem % oh;
    for (int r = 0; r < rows; r++) {
        int8_t *row = dst + (size_t)r * Kp;
        if (m0 + r >= M) {
            memset(row, 0, Kp);
            continue;
        }
        const int8_t *base = in + (size_t)img * ih * ih * cin;
        int x0 = ox * s - p;
        int kx0 = x0 < 0 ? -x0 : 0, kx1 = imin(k, ih - x0);
        if (kx1 < kx0)
            kx1 = kx0;
        const size_t left = (size_t)kx0 * cin, mid = (size_t)(kx1 - kx0) * cin;
        for (int ky = 0; ky < k; ky++) {
            int8_t *seg_dst = row + ky * seg;
            int iy = oy * s - p + ky;
            if (iy < 0 || iy >= ih || mid == 0) {
                memset(seg_dst, 0, seg);
                continue;
            }
            if (left)
                memset(seg_dst, 0, left);
            const int8_t *src = base + ((size_t)iy * ih + x0 + kx0) * cin;
            if (mid == 7 * 3)
                memcpy(seg_dst + left, src, 7 * 3);
            else
                memcpy(seg_dst + left, src, mid);
            if (left + mid < seg)
                memset(seg_dst + left + mid, 0, seg - left - mid);
        }
        if ((size_t)k * seg < Kp)
            memset(row + (size_t)k * seg, 0, Kp - (size_t)k * seg);
        if (++ox == oh) {
            ox = 0;
            if (++oy == oh) {
                oy = 0;
                img++;
            }
        }
    }
}

/* The residual an epilogue of L adds (NULL: none) and its int8 output
 * (NULL: the last conv, whose FP32 output goes to e->last). */
static void epilogue_tensors(const i8_engine *e, const i8_layer *L, const int8_t **res, int8_t **out8)
{
    *res = L->res >= 0 ? e->act[e->buf[L->res]] : NULL;
    *out8 = L - e->layer == LAST ? NULL : e->act[e->buf[L - e->layer]];
}

/* The epilogue of int8.h for rows [r0, r0 + nrows) of the unit's block,
 * channels [c, c + ncols): acc[i][j] is row r0 + i, channel c + j (row
 * stride lda). */
static void epilogue(i8_engine *e, const i8_layer *L, int m, int nrows, int c, int ncols, const int32_t *acc, int lda)
{
    const int N = L->d->cout;
    const int8_t *res;
    int8_t *out8;
    epilogue_tensors(e, L, &res, &out8);
    for (int i = 0; i < nrows; i++) {
        const size_t o = (size_t)(m + i) * N + c;
        for (int j = 0; j < ncols; j++) {
            float v = (float)acc[i * lda + j] * L->mult[c + j];
            v = v + L->b[c + j];
            if (res)
                v = v + (float)res[o + j] * L->res_scale;
            if (L->d->relu && v < 0.0f)
                v = 0.0f;
            if (out8)
                out8[o + j] = int8_quantize(v, L->out_inv);
            else
                e->last[o + j] = v;
        }
    }
}

#if HAVE_VNNI_KERNEL
/* acc[VR][CG] = A[VR][Kp] * W^T for CG channels with AVX512-VNNI: vpdpbusd
 * multiplies unsigned by signed bytes, so A comes biased by 128 (a ^ 0x80
 * is a + 128 as unsigned; bias_a) and 128 * sum_k w[c][k] (corr) is taken
 * off again: the same exact integers as dot_tile. wv is the channel
 * panel's weights as [Kp/4][16][4] per 16 channels, the second 16 at
 * wv + Kp * 16. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void vnni_tile(const int8_t *a, size_t lda,
                                                                             const int8_t *wv, int Kp,
                                                                             const int32_t *corr, int32_t acc[VR][CG])
{
    __m512i s[VR][2];
    for (int r = 0; r < VR; r++)
        s[r][0] = s[r][1] = _mm512_setzero_si512();
    const int8_t *w1 = wv + (size_t)Kp * 16;
    for (int k = 0; k < Kp; k += 4) {
        __m512i b0 = _mm512_load_si512(wv + (size_t)k * 16), b1 = _mm512_load_si512(w1 + (size_t)k * 16);
#pragma GCC unroll 8
        for (int r = 0; r < VR; r++) {
            int32_t x;
            memcpy(&x, a + r * lda + k, 4);
            __m512i av = _mm512_set1_epi32(x);
            s[r][0] = _mm512_dpbusd_epi32(s[r][0], av, b0);
            s[r][1] = _mm512_dpbusd_epi32(s[r][1], av, b1);
        }
    }
    __m512i c0 = _mm512_loadu_si512(corr), c1 = _mm512_loadu_si512(corr + 16);
    for (int r = 0; r < VR; r++) {
        _mm512_storeu_si512(acc[r], _mm512_sub_epi32(s[r][0], c0));
        _mm512_storeu_si512(acc[r] + 16, _mm512_sub_epi32(s[r][1], c1));
    }
}

/* a ^ 0x80 over n bytes (a multiple of 64, a 64-byte aligned): the im2col
 * rows biased once for vnni_tile, not at each of their uses. */
__attribute__((target("avx512f"))) static void bias_a(int8_t *a, size_t n)
{
    const __m512i bias = _mm512_set1_epi32((int)0x80808080u);
    for (size_t i = 0; i < n; i += 64)
        _mm512_store_si512(a + i, _mm512_xor_si512(_mm512_load_si512(a + i), bias));
}

#if HAVE_AMX_KERNEL
/* AMX's tile configuration: tmm0-3 the int32 sums of 32 rows x 32
 * channels, tmm4-5 two 16-row A tiles of 64 bytes, tmm6-7 two 16-channel
 * weight panels of 16 rows of 4 bytes a channel (the VNNI layout). */
typedef struct __attribute__((aligned(64))) amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* A constant object: GCC 12 drops stores to a local one before
 * ldtilecfg, whose 64-byte read it does not see. */
static const amx_config amx_cfg = {
    .palette = 1,
    .colsb = { 64, 64, 64, 64, 64, 64, 64, 64 },
    .rows = { 16, 16, 16, 16, 16, 16, 16, 16 },
};

/* Loads the configuration on the calling thread (tile state is per thread). */
__attribute__((target("amx-tile"))) static void amx_begin(void)
{
    _tile_loadconfig(&amx_cfg);
}

__attribute__((target("amx-tile"))) static void amx_end(void)
{
    _tile_release();
}

/* acc[AR][CG] = A[AR][Kp] * W^T with AMX: tdpbssd multiplies signed bytes,
 * so neither A's bias nor vnni_tile's correction is needed. wv as for
 * vnni_tile; each 64-byte k step is 16 of its rows. */
__attribute__((target("amx-tile,amx-int8"))) static void amx_tile(const int8_t *a, size_t lda, const int8_t *wv, int Kp,
                                                                  int32_t acc[AR][CG])
{
    const int8_t *w1 = wv + (size_t)Kp * 16;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int k = 0; k < Kp; k += 64) {
        _tile_loadd(4, a + k, lda);
        _tile_loadd(5, a + 16 * lda + k, lda);
        _tile_loadd(6, wv + (size_t)k * 16, 64);
        _tile_loadd(7, w1 + (size_t)k * 16, 64);
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
    }
    _tile_stored(0, acc[0], CG * 4);
    _tile_stored(1, acc[0] + 16, CG * 4);
    _tile_stored(2, acc[16], CG * 4);
    _tile_stored(3, acc[16] + 16, CG * 4);
}
#endif

/* epilogue() on AVX-512 for the VNNI and AMX tiles, 16 channels a step: the same
 * float operations in the same order (-ffp-contract=off keeps each
 * multiply and add apart; rounding to nearest even; NaN to 0 before the
 * clamp), so the same bytes. The scalar form took half the engine's time. */
__attribute__((target("avx512f,avx512bw"))) static void epilogue_avx512(i8_engine *e, const i8_layer *L, int m,
                                                                        int nrows, int c, int32_t (*acc)[CG])
{
    const int N = L->d->cout;
    const int8_t *res;
    int8_t *out8;
    epilogue_tensors(e, L, &res, &out8);
    /* With an int8 output the ReLU is the clamp's lower bound: v < 0 gives
     * rint(v * inv) <= 0 since inv > 0 (calib_load refuses scales <= 0),
     * so 0 either way; -0 and NaN give 0 as well. */
    const int relu_in_clamp = L->d->relu && out8;
    const __m512 zero = _mm512_setzero_ps(), hi = _mm512_set1_ps(127.0f);
    const __m512 lo = relu_in_clamp ? zero : _mm512_set1_ps(-127.0f);
    const __m512 res_scale = _mm512_set1_ps(L->res_scale), inv = _mm512_set1_ps(L->out_inv);
    for (int h = 0; h < CG; h += 16) {
        const __m512 mult = _mm512_loadu_ps(L->mult + c + h), b = _mm512_loadu_ps(L->b + c + h);
        for (int i = 0; i < nrows; i++) {
            const size_t o = (size_t)(m + i) * N + c + h;
            __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(acc[i] + h)), mult);
            v = _mm512_add_ps(v, b);
            if (res) {
                __m128i r8 = _mm_loadu_si128((const __m128i *)(res + o));
                v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(r8)), res_scale));
            }
            if (!out8) {
                if (L->d->relu) /* v < 0 only: NaN and -0 pass, as in epilogue() */
                    v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ), zero);
                _mm512_storeu_ps(e->last + o, v);
                continue;
            }
            __m512 q = _mm512_roundscale_ps(_mm512_mul_ps(v, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __mmask16 ordered = _mm512_cmp_ps_mask(q, q, _CMP_ORD_Q); /* NaN lanes convert to 0 */
            q = _mm512_min_ps(_mm512_max_ps(q, lo), hi);
            _mm_storeu_si128((__m128i *)(out8 + o), _mm512_cvtepi32_epi8(_mm512_maskz_cvtps_epi32(ordered, q)));
        }
    }
}
#endif

/* out[r][j] (row stride ldo) = A[r][Kp] * W^T for 2 rows and 16 channels
 * with AVX2: vpmaddwd multiplies 16-bit values and adds pairs, exactly
 * (no saturation, unlike vpmaddubsw on bytes). A's 4 bytes of a k step
 * are widened and broadcast; w16 is the 16 channels' weights as
 * [Kp/4][16][4] int16, so one 32-byte row holds 4 channels' 4 values and
 * each sum comes out as two partials, added at the end. */
__attribute__((target("avx2"))) static void avx2_tile(const int8_t *a, size_t lda, const int16_t *w16, int Kp,
                                                      int32_t *out, int ldo)
{
    /* Eight named accumulators: with an array GCC kept them in memory. */
    __m256i s00 = _mm256_setzero_si256(), s01 = s00, s02 = s00, s03 = s00;
    __m256i s10 = s00, s11 = s00, s12 = s00, s13 = s00;
    const int8_t *a1 = a + lda;
    for (int k = 0; k < Kp; k += 4) {
        const __m256i *w = (const __m256i *)(w16 + (size_t)k * 16);
        const __m256i w0 = _mm256_load_si256(w), w1 = _mm256_load_si256(w + 1);
        const __m256i w2 = _mm256_load_si256(w + 2), w3 = _mm256_load_si256(w + 3);
        int32_t x0, x1;
        memcpy(&x0, a + k, 4);
        memcpy(&x1, a1 + k, 4);
        const __m256i v0 = _mm256_broadcastq_epi64(_mm_cvtepi8_epi16(_mm_cvtsi32_si128(x0)));
        const __m256i v1 = _mm256_broadcastq_epi64(_mm_cvtepi8_epi16(_mm_cvtsi32_si128(x1)));
        s00 = _mm256_add_epi32(s00, _mm256_madd_epi16(v0, w0));
        s01 = _mm256_add_epi32(s01, _mm256_madd_epi16(v0, w1));
        s02 = _mm256_add_epi32(s02, _mm256_madd_epi16(v0, w2));
        s03 = _mm256_add_epi32(s03, _mm256_madd_epi16(v0, w3));
        s10 = _mm256_add_epi32(s10, _mm256_madd_epi16(v1, w0));
        s11 = _mm256_add_epi32(s11, _mm256_madd_epi16(v1, w1));
        s12 = _mm256_add_epi32(s12, _mm256_madd_epi16(v1, w2));
        s13 = _mm256_add_epi32(s13, _mm256_madd_epi16(v1, w3));
    }
    /* hadd pairs within 128-bit lanes gives channels {0, 1, 4, 5 | 2, 3,
     * 6, 7} of the eight; the permute puts them in order. */
    _mm256_storeu_si256((__m256i *)out, _mm256_permute4x64_epi64(_mm256_hadd_epi32(s00, s01), 0xD8));
    _mm256_storeu_si256((__m256i *)(out + 8), _mm256_permute4x64_epi64(_mm256_hadd_epi32(s02, s03), 0xD8));
    _mm256_storeu_si256((__m256i *)(out + ldo), _mm256_permute4x64_epi64(_mm256_hadd_epi32(s10, s11), 0xD8));
    _mm256_storeu_si256((__m256i *)(out + ldo + 8), _mm256_permute4x64_epi64(_mm256_hadd_epi32(s12, s13), 0xD8));
}

/* out[r][j] (row stride ldo) = A[r][Kp] * W^T for 4 rows and 16 channels
 * whose A bytes are all in [0, 127], as every conv's input is but the
 * stem's (it reads a ReLU's output): vpmaddubsw then multiplies them as
 * unsigned by the signed weights and adds pairs without saturating
 * (2 * 127 * 127 < 2^15), and vpmaddwd by ones widens the pairs to
 * 32 bits: 3 instructions for 32 products where avx2_tile takes 2 for 16.
 * wv is the VNNI layout of the 16 channels. */
__attribute__((target("avx2"))) static void avx2_u8_tile(const int8_t *a, size_t lda, const int8_t *wv, int Kp,
                                                         int32_t *out, int ldo)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s00 = _mm256_setzero_si256(), s01 = s00, s10 = s00, s11 = s00;
    __m256i s20 = s00, s21 = s00, s30 = s00, s31 = s00;
#define U8_STEP(acc0, acc1, row)                                                              \
    do {                                                                                      \
        int32_t x;                                                                            \
        memcpy(&x, a + (row)*lda + k, 4);                                                     \
        const __m256i av = _mm256_set1_epi32(x);                                              \
        acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(_mm256_maddubs_epi16(av, w0), ones)); \
        acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(_mm256_maddubs_epi16(av, w1), ones)); \
    } while (0)
    for (int k = 0; k < Kp; k += 4) {
        const __m256i *w = (const __m256i *)(wv + (size_t)k * 16);
        const __m256i w0 = _mm256_load_si256(w), w1 = _mm256_load_si256(w + 1);
        U8_STEP(s00, s01, 0);
        U8_STEP(s10, s11, 1);
        U8_STEP(s20, s21, 2);
        U8_STEP(s30, s31, 3);
    }
#undef U8_STEP
    _mm256_storeu_si256((__m256i *)out, s00);
    _mm256_storeu_si256((__m256i *)(out + 8), s01);
    _mm256_storeu_si256((__m256i *)(out + ldo), s10);
    _mm256_storeu_si256((__m256i *)(out + ldo + 8), s11);
    _mm256_storeu_si256((__m256i *)(out + 2 * ldo), s20);
    _mm256_storeu_si256((__m256i *)(out + 2 * ldo + 8), s21);
    _mm256_storeu_si256((__m256i *)(out + 3 * ldo), s30);
    _mm256_storeu_si256((__m256i *)(out + 3 * ldo + 8), s31);
}

/* epilogue() with AVX2, 8 channels a step, for the AVX2 tile: the same
 * float operations as epilogue_avx512. */
__attribute__((target("avx2"))) static void epilogue_avx2(i8_engine *e, const i8_layer *L, int m, int nrows, int c,
                                                          int32_t (*acc)[CG])
{
    const int N = L->d->cout;
    const int8_t *res;
    int8_t *out8;
    epilogue_tensors(e, L, &res, &out8);
    const int relu_in_clamp = L->d->relu && out8; /* see epilogue_avx512 */
    const __m256 zero = _mm256_setzero_ps(), hi = _mm256_set1_ps(127.0f);
    const __m256 lo = relu_in_clamp ? zero : _mm256_set1_ps(-127.0f);
    const __m256 res_scale = _mm256_set1_ps(L->res_scale), inv = _mm256_set1_ps(L->out_inv);
    for (int h = 0; h < CG; h += 8) {
        const __m256 mult = _mm256_loadu_ps(L->mult + c + h), b = _mm256_loadu_ps(L->b + c + h);
        for (int i = 0; i < nrows; i++) {
            const size_t o = (size_t)(m + i) * N + c + h;
            __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(acc[i] + h))), mult);
            v = _mm256_add_ps(v, b);
            if (res) {
                __m256i r32 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(res + o)));
                v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_cvtepi32_ps(r32), res_scale));
            }
            if (!out8) {
                if (L->d->relu) /* v < 0 only: NaN and -0 pass, as in epilogue() */
                    v = _mm256_blendv_ps(v, zero, _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
                _mm256_storeu_ps(e->last + o, v);
                continue;
            }
            __m256 q = _mm256_round_ps(_mm256_mul_ps(v, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m256 ordered = _mm256_cmp_ps(q, q, _CMP_ORD_Q);
            q = _mm256_and_ps(_mm256_min_ps(_mm256_max_ps(q, lo), hi), ordered); /* NaN lanes to +0 */
            const __m256i q32 = _mm256_cvtps_epi32(q);
            const __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q32), _mm256_extracti128_si256(q32, 1));
            _mm_storel_epi64((__m128i *)(out8 + o), _mm_packs_epi16(q16, q16));
        }
    }
}

/* One unit of the current conv: row block u / cparts, channel range
 * u % cparts (in groups of CG channels). */
static void conv_unit(void *ctx, int u, int tid)
{
    i8_engine *e = ctx;
    const i8_layer *L = e->L;
    const int N = L->d->cout, M = e->M;
    const size_t Kp = (size_t)L->Kp;
    int blk = u / e->cparts, c0, c1;
    cpu_pool_split(N / CG, e->cparts, u % e->cparts, &c0, &c1);
    c0 *= CG;
    c1 *= CG;
    const int m0 = blk * RB, rows = imin(RB, M - m0);
    int8_t *ws = e->ws + (size_t)tid * RB * e->ws_stride;
    const int step = e->tile == TILE_AMX ? AR : VR, padded = (rows + step - 1) / step * step;
    im2col_i8(L->d, e->act[e->buf[L->src]], m0, padded, M, ws, Kp);
#if HAVE_AMX_KERNEL
    if (e->tile == TILE_AMX) {
        amx_begin();
        for (int c = c0; c < c1; c += CG)
            for (int r = 0; r < rows; r += AR) {
                int32_t acc[AR][CG];
                amx_tile(ws + (size_t)r * Kp, Kp, L->wv + (size_t)c * Kp, (int)Kp, acc);
                epilogue_avx512(e, L, m0 + r, imin(AR, rows - r), c, acc);
            }
        amx_end();
        return;
    }
#endif
#if HAVE_VNNI_KERNEL
    if (e->tile == TILE_AVX2) {
        for (int r = 0; r < rows; r += VR)
            for (int c = c0; c < c1; c += CG) {
                int32_t acc[VR][CG];
                for (int p = 0; p < CG; p += 16)
                    if (L->w16) /* the stem: signed input */
                        for (int rr = 0; rr < VR; rr += 2)
                            avx2_tile(ws + (size_t)(r + rr) * Kp, Kp, L->w16 + (size_t)(c + p) * Kp, (int)Kp,
                                      &acc[rr][p], CG);
                    else
                        for (int rr = 0; rr < VR; rr += 4)
                            avx2_u8_tile(ws + (size_t)(r + rr) * Kp, Kp, L->wv + (size_t)(c + p) * Kp, (int)Kp,
                                         &acc[rr][p], CG);
                epilogue_avx2(e, L, m0 + r, imin(VR, rows - r), c, acc);
            }
        return;
    }
    if (e->tile == TILE_VNNI) {
        bias_a(ws, (size_t)padded * Kp);
        for (int r = 0; r < rows; r += VR)
            for (int c = c0; c < c1; c += CG) {
                int32_t acc[VR][CG];
                vnni_tile(ws + (size_t)r * Kp, Kp, L->wv + (size_t)c * Kp, (int)Kp, L->corr + c, acc);
                epilogue_avx512(e, L, m0 + r, imin(VR, rows - r), c, acc);
            }
        return;
    }
#endif
    /* CG channels' weights (at most 147 KiB) stay in cache while every
     * row of the block passes them. */
    for (int cb = c0; cb < c1; cb += CG)
        for (int r = 0; r < rows; r += MR)
            for (int c = cb; c < cb + CG; c += NR) {
                int32_t acc[MR][NR];
                dot_tile(ws + (size_t)r * Kp, Kp, L->w + (size_t)c * Kp, Kp, (int)Kp, acc);
                epilogue(e, L, m0 + r, imin(MR, rows - r), c, NR, acc[0], NR);
            }
}

/* ---- the other steps ----------------------------------------------------- */

/* Image rows -> int8 NHWC: uint8 pixels through the quantised LUT, or a
 * normalised FP32 CHW tensor quantised directly (the same values). */
static void quantize_input_unit(void *ctx, int u, int tid)
{
    i8_engine *e = ctx;
    const int img = RESNET18_IMG;
    const size_t plane = (size_t)img * img;
    int lo, hi;
    (void)tid;
    cpu_pool_split(e->n * img, e->small_units, u, &lo, &hi);
    for (int row = lo; row < hi; row++) {
        int8_t *out = e->act[e->buf[T_IMAGE]] + (size_t)row * img * 3;
        const float *chw = e->pub.input_f32[e->slot][row / img];
        if (chw) {
            const float *src = chw + (size_t)(row % img) * img;
            for (int x = 0; x < img; x++)
                for (int c = 0; c < 3; c++)
                    out[x * 3 + c] = int8_quantize(src[c * plane + (size_t)x], e->in_inv);
            continue;
        }
        const uint8_t *in = e->pub.input[e->slot] + (size_t)row * img * 3;
        for (int i = 0; i < img * 3; i += 3)
            for (int c = 0; c < 3; c++)
                out[i + c] = e->qlut[c][in[i + c]];
    }
}

/* 3x3/2 pad-1 max pool of the stem's int8 output. C is a constant so
 * that GCC vectorises the channel loop (a byte at a time, it took 9% of
 * the engine's time). */
CPU_VECTOR_CLONES
static void maxpool_unit(void *ctx, int u, int tid)
{
    i8_engine *e = ctx;
    const int ih = resnet18_convs[0].out_h, oh = e->pool_h;
    enum { C = STEM_C };
    int lo, hi;
    (void)tid;
    cpu_pool_split(e->n * oh, e->small_units, u, &lo, &hi);
    const int8_t *in = e->act[e->buf[0]];
    int8_t *out = e->act[e->buf[T_POOL]];
    for (int row = lo; row < hi; row++) {
        int img = row / oh, oy = row % oh;
        int y0 = oy * 2 - 1 < 0 ? 0 : oy * 2 - 1, y1 = imin(oy * 2 + 2, ih);
        for (int ox = 0; ox < oh; ox++) {
            int x0 = ox * 2 - 1 < 0 ? 0 : ox * 2 - 1, x1 = imin(ox * 2 + 2, ih);
            int8_t m[C]; /* local: no aliasing with the input to rule out */
            memcpy(m, in + (((size_t)img * ih + y0) * ih + x0) * C, (size_t)C);
            for (int iy = y0; iy < y1; iy++)
                for (int ix = x0; ix < x1; ix++) {
                    const int8_t *p = in + (((size_t)img * ih + iy) * ih + ix) * C;
                    for (int c = 0; c < C; c++)
                        m[c] = p[c] > m[c] ? p[c] : m[c];
                }
            memcpy(out + (((size_t)img * oh + oy) * oh + ox) * C, m, (size_t)C);
        }
    }
}

/* Average pool of image `img` of the last conv's FP32 output, then the FC
 * (cpu_engine_fc), as engine/int8.h says: int8.h leaves the FC's order
 * free, and cpu_engine_fc's independent lanes let GCC vectorise without
 * reassociating (one sum a class took 8% of the engine's time once the
 * convs ran on AMX). */
static void head_unit(void *ctx, int img, int tid)
{
    i8_engine *e = ctx;
    const resnet18_conv_desc *d = &resnet18_convs[LAST];
    const int hw = d->out_h * d->out_h, C = d->cout, classes = e->pub.classes;
    float *f = e->feat + (size_t)img * C;
    (void)tid;
    for (int c = 0; c < C; c++) {
        const float *src = e->last + (size_t)img * hw * C + c;
        double s = 0.0;
        for (int p = 0; p < hw; p++)
            s += src[(size_t)p * C];
        f[c] = int8_round_half((float)(s / hw));
    }
    cpu_engine_fc(f, e->fc_w, e->fc_b, classes, RESNET18_FEATURES, e->pub.logits[e->slot] + (size_t)img * classes);
}

static void run_conv(i8_engine *e, int i)
{
    const i8_layer *L = &e->layer[i];
    e->L = L;
    e->M = e->n * L->d->out_h * L->d->out_h;
    e->rblocks = (e->M + RB - 1) / RB;
    /* Few row blocks (the 7x7 layers, small batches): split the channels
     * too, so every thread has work. */
    e->cparts = e->rblocks >= 2 * e->nthreads ? 1 : imin(L->d->cout / CG, 2 * e->nthreads);
    cpu_pool_run(&e->pool, conv_unit, e, e->rblocks * e->cparts);
}

/* The float prefix's last tensor (NHWC FP32 with a border of fpad) -> the
 * boundary's int8 buffer, with the scale the INT8 convs read it at. */
static void quantize_boundary_unit(void *ctx, int u, int tid)
{
    i8_engine *e = ctx;
    const int h = e->th[e->boundary], c = e->tc[e->boundary], side = h + 2 * e->fpad;
    const float inv = e->layer[e->float_convs - 1].out_inv;
    int lo, hi;
    (void)tid;
    cpu_pool_split(e->n * h, e->small_units, u, &lo, &hi);
    for (int row = lo; row < hi; row++) {
        const int img = row / h, y = row % h;
        const float *src = e->fdata + (((size_t)img * side + (size_t)(y + e->fpad)) * side + (size_t)e->fpad) * c;
        int8_t *dst = e->act[e->buf[e->boundary]] + (size_t)row * h * c;
        for (int i = 0; i < h * c; i++)
            dst[i] = int8_quantize(src[i], inv);
    }
}

/* engine_cpu_forward_prefix's hand-off: quantise on this engine's threads.
 * Its shape is the boundary's here (both engines take their shapes from
 * resnet18_plan_tensors). */
static void take_boundary(void *ctx, int tensor, const float *data, int n, int h, int c, int pad)
{
    i8_engine *e = ctx;
    (void)tensor;
    (void)n;
    (void)h;
    (void)c;
    e->fdata = data;
    e->fpad = pad;
    cpu_pool_run(&e->pool, quantize_boundary_unit, e, e->small_units);
}

/* The mix's float prefix on slot's images, ending in the boundary's int8
 * tensor. The FP32 engine has one slot of its own: the images are copied
 * there (a few % of its convs' time). */
static void run_float_prefix(i8_engine *e)
{
    char err[256];
    engine *f = e->prefix;
    memcpy(f->input[0], e->pub.input[e->slot], (size_t)e->n * RESNET18_INPUT_BYTES);
    memcpy(f->input_f32[0], e->pub.input_f32[e->slot], (size_t)e->n * sizeof *f->input_f32[0]);
    /* Cannot fail: the arguments were checked at create. */
    if (engine_cpu_forward_prefix(f, 0, e->n, e->float_convs, take_boundary, e, err, sizeof err) != 0)
        abort();
}

static void forward(void *ctx, int slot, int n)
{
    i8_engine *e = ctx;
    e->n = n;
    e->slot = slot;
    e->small_units = imin(4 * e->nthreads, n * e->pool_h);
    if (e->prefix)
        run_float_prefix(e);
    else
        cpu_pool_run(&e->pool, quantize_input_unit, e, e->small_units);
    for (int i = e->float_convs; i < RESNET18_NUM_CONVS; i++) {
        run_conv(e, i);
        if (i == 0)
            cpu_pool_run(&e->pool, maxpool_unit, e, e->small_units);
    }
    cpu_pool_run(&e->pool, head_unit, e, n);
}

/* ---- engine interface ------------------------------------------------------ */

static int i8_submit(void *ctx, int slot, int n, char *err, size_t errlen)
{
    i8_engine *e = ctx;
    return cpu_engine_submit(&e->run_mu, e->pub.max_batch, forward, e, slot, n, err, errlen);
}

static void i8_destroy(void *ctx)
{
    i8_engine *e = ctx;
    if (!e)
        return;
    cpu_pool_stop(&e->pool);
    pthread_mutex_destroy(&e->run_mu);
    engine_destroy(e->prefix);
    for (int i = 0; i < RESNET18_NUM_CONVS; i++) {
        free(e->layer[i].w);
        free(e->layer[i].wv);
        free(e->layer[i].corr);
        free(e->layer[i].w16);
        free(e->layer[i].mult);
        free(e->layer[i].b);
    }
    for (int i = 0; i < e->nact; i++)
        free(e->act[i]);
    cpu_engine_free_slots(&e->pub);
    free(e->last);
    free(e->feat);
    free(e->fc_w);
    free(e->fc_b);
    free(e->ws);
    free(e);
}

static const engine_ops i8_ops = {
    .name = "cpu",
    .submit = i8_submit,
    .wait = cpu_engine_wait,
    .destroy = i8_destroy,
    .device_memory = cpu_engine_no_device_memory,
    .pinned_memory = cpu_engine_no_device_memory,
};

static int tensor_id(int x)
{
    return resnet18_tensor_id(x);
}

/* Shapes of every tensor, then int8 buffers by liveness (resnet18.h's
 * plan). Returns the buffer count and each one's bytes per image, or -1. */
static int plan_buffers(i8_engine *e, size_t per_image[NT], char *err, size_t errlen)
{
    resnet18_tensors tp;
    if (resnet18_plan_tensors(&tp, CG, err, errlen) != 0) {
        char why[256];
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, errlen, "cpu int8 engine: %s", why);
        return -1;
    }
    memcpy(e->th, tp.h, sizeof e->th);
    memcpy(e->tc, tp.c, sizeof e->tc);
    e->pool_h = tp.h[T_POOL];
    int order[NT], n = 0;
    size_t elems[NT];
    order[n++] = T_IMAGE;
    order[n++] = 0;
    order[n++] = T_POOL;
    for (int i = 1; i < LAST; i++) /* the last conv's output is FP32, elsewhere */
        order[n++] = i;
    for (int t = 0; t < NT; t++)
        elems[t] = (size_t)e->th[t] * e->th[t] * e->tc[t];
    int nbuf = resnet18_share_buffers(&tp, order, n, elems, e->buf, per_image);
    e->buf[LAST] = -1;
    return nbuf;
}

static int cpu_has_avx2(void)
{
#if HAVE_VNNI_KERNEL
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

static int cpu_has_vnni(void)
{
#if HAVE_VNNI_KERNEL
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
#else
    return 0;
#endif
}

/* AMX-INT8 in the CPU (CPUID.7.0:EDX bits 24, 25) and tile data allowed
 * for this process: Linux hands it out on request (arch_prctl
 * ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 18), and refuses where the
 * kernel or a hypervisor does not support it. */
static int cpu_has_amx(void)
{
#if HAVE_AMX_KERNEL && defined(SYS_arch_prctl)
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25)))
        return 0;
    return cpu_has_vnni() && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return 0;
#endif
}

/* L->w into the VNNI and AMX tiles' layout and VNNI's bias corrections,
 * or (avx2) that layout widened to 16 bits. */
static int pack_vnni(i8_layer *L, int avx2)
{
    const int N = L->d->cout, Kp = L->Kp;
    L->wv = alloc_bytes((size_t)N * Kp);
    L->corr = alloc_bytes((size_t)N * sizeof(int32_t));
    if (!L->wv || !L->corr)
        return -1;
    if (avx2 && !(L->w16 = alloc_bytes((size_t)N * Kp * sizeof(int16_t))))
        return -1;
    for (int c = 0; c < N; c++) {
        int32_t sum = 0;
        for (int k = 0; k < Kp; k++) {
            int8_t v = L->w[(size_t)c * Kp + k];
            sum += v;
            L->wv[(((size_t)(c / 16) * (Kp / 4) + (size_t)(k / 4)) * 16 + (size_t)(c % 16)) * 4 + (size_t)(k % 4)] = v;
        }
        L->corr[c] = 128 * sum;
    }
    for (size_t i = 0; avx2 && i < (size_t)N * Kp; i++)
        L->w16[i] = L->wv[i];
    return 0;
}

/* The GEMM tile: RESNETD_CPU_INT8_GEMM's (refused where the CPU lacks
 * it), else the best this CPU runs. 0, or -1 with err. */
static int pick_tile(i8_engine *e, char *err, size_t errlen)
{
    const char *force = getenv("RESNETD_CPU_INT8_GEMM");
    if (force && *force) {
        int k = 0;
        while (k < NTILES && strcmp(force, tile_names[k]) != 0)
            k++;
        if (k == NTILES) {
            snprintf(err, errlen,
                     "cpu int8 engine: RESNETD_CPU_INT8_GEMM must be generic, avx2, vnni or amx (got '%s')", force);
            return -1;
        }
        e->tile = (i8_tile)k;
        const char *lacks = e->tile == TILE_AMX && !cpu_has_amx()     ? "AMX-INT8 (or the kernel does not allow it)"
                            : e->tile == TILE_VNNI && !cpu_has_vnni() ? "AVX512-VNNI"
                            : e->tile == TILE_AVX2 && !cpu_has_avx2() ? "AVX2"
                                                                      : NULL;
        if (lacks) {
            snprintf(err, errlen, "cpu int8 engine: RESNETD_CPU_INT8_GEMM=%s but this CPU lacks %s", force, lacks);
            return -1;
        }
    } else {
        e->tile = cpu_has_amx() ? TILE_AMX : cpu_has_vnni() ? TILE_VNNI : cpu_has_avx2() ? TILE_AVX2 : TILE_GENERIC;
    }
    return 0;
}

/* Conv i's quantised weights (packed for the tile), scales and bias;
 * grows e->ws_stride to its K. 0, or -1 out of memory. */
static int load_layer(i8_engine *e, const resnet18_weights *w, const calib_table *t, int i)
{
    i8_layer *L = &e->layer[i];
    const resnet18_conv_desc *d = &resnet18_convs[i];
    const int N = d->cout;
    L->d = d;
    L->K = d->k * d->k * d->cin;
    L->Kp = (L->K + KBLK - 1) / KBLK * KBLK;
    L->src = tensor_id(d->src);
    L->res = d->residual == R18_NONE ? -1 : tensor_id(d->residual);
    L->w = alloc_bytes((size_t)N * L->Kp);
    L->mult = alloc_bytes((size_t)N * sizeof(float));
    L->b = alloc_bytes((size_t)N * sizeof(float));
    int8_t *q = malloc((size_t)N * L->K);
    if (!L->w || !L->mult || !L->b || !q) {
        free(q);
        return -1;
    }
    calib_conv_params(w, t, i, q, L->mult, &L->res_scale, &L->out_inv);
    for (int c = 0; c < N; c++)
        memcpy(L->w + (size_t)c * L->Kp, q + (size_t)c * L->K, (size_t)L->K);
    free(q);
    memcpy(L->b, w->conv[i].b, (size_t)N * sizeof(float));
    /* AVX2: 16-bit weights where the input may be negative (the
     * stem's image); a ReLU's or the pool's output takes avx2_u8_tile. */
    const int signed_in = L->src == T_IMAGE ||
                          (L->src >= 0 && L->src < RESNET18_NUM_CONVS && !resnet18_convs[L->src].relu);
    if (e->tile != TILE_GENERIC && pack_vnni(L, e->tile == TILE_AVX2 && signed_in) != 0)
        return -1;
    if ((size_t)L->Kp > e->ws_stride)
        e->ws_stride = (size_t)L->Kp;
    return 0;
}

/* The FP32 engine for the table's float prefix, if its mix has one. */
static int make_prefix(i8_engine *e, const resnet18_weights *w, const engine_config *cfg, char *err, size_t errlen)
{
    e->float_convs = calib_mix_float_convs(cfg->calib->mix);
    if (e->float_convs < 0) {
        snprintf(err, errlen, "cpu int8 engine: the table's mix is not a calib_mix");
        return -1;
    }
    if (e->float_convs == 0)
        return 0;
    e->boundary = tensor_id(calib_mix_boundary(cfg->calib->mix));
    engine_config fc = *cfg;
    fc.precision = ENGINE_PRECISION_FP32;
    fc.nslots = 1;
    fc.calib = NULL;
    char why[512];
    if (!(e->prefix = engine_cpu_create(w, &fc, why, sizeof why))) {
        snprintf(err, errlen, "cpu int8 engine: its %s prefix: %s", calib_mix_name(cfg->calib->mix), why);
        return -1;
    }
    return 0;
}

engine *engine_cpu_int8_create(const resnet18_weights *w, const engine_config *cfg, char *err, size_t errlen)
{
    const calib_table *t = cfg->calib;
    if (!t) {
        snprintf(err, errlen, "cpu int8 engine: no calibration table");
        return NULL;
    }
    if (cfg->max_batch < 1 || cfg->max_batch > I8_MAX_BATCH || cfg->nslots < 0 || cfg->nslots > ENGINE_MAX_SLOTS ||
        cfg->threads < 0 || cfg->threads > CPU_POOL_MAX_THREADS) {
        snprintf(err, errlen, "cpu int8 engine: max batch must be 1..%d, slots 0..%d, threads 0..%d", I8_MAX_BATCH,
                 ENGINE_MAX_SLOTS, CPU_POOL_MAX_THREADS);
        return NULL;
    }
    i8_engine *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, errlen, "cpu int8 engine: out of memory");
        return NULL;
    }
    int rc = pthread_mutex_init(&e->run_mu, NULL);
    if (rc != 0) {
        free(e);
        snprintf(err, errlen, "cpu int8 engine: pthread_mutex_init: %s", strerror(rc));
        return NULL;
    }
    cpu_engine_init_pub(&e->pub, &i8_ops, e, ENGINE_PRECISION_INT8, w, cfg); /* integer convs, per-image head */
    e->nthreads = cfg->threads ? cfg->threads : cpu_pool_cpu_count();
    if (pick_tile(e, err, errlen) != 0)
        goto fail;

    size_t per_image[NT];
    int nbuf = plan_buffers(e, per_image, err, errlen);
    if (nbuf < 0)
        goto fail;
    const size_t mb = (size_t)cfg->max_batch;
    const resnet18_conv_desc *dl = &resnet18_convs[LAST];
    const size_t last_floats = (size_t)dl->out_h * dl->out_h * dl->cout;
    size_t per_image_bytes = (last_floats + RESNET18_FEATURES) * 4;
    for (int b = 0; b < nbuf; b++)
        per_image_bytes += per_image[b];
    if (cpu_engine_check_memory(&e->pub, "cpu int8 engine", per_image_bytes, err, errlen) != 0)
        goto fail;
    for (int b = 0; b < nbuf; b++) {
        if (!(e->act[b] = alloc_bytes(per_image[b] * mb)))
            goto oom;
        e->nact++;
    }
    if (cpu_engine_alloc_slots(&e->pub, "cpu int8 engine", err, errlen) != 0)
        goto fail;
    e->last = alloc_bytes(mb * last_floats * sizeof(float));
    e->feat = alloc_bytes(mb * RESNET18_FEATURES * sizeof(float));
    e->fc_w = alloc_bytes((size_t)w->classes * RESNET18_FEATURES * sizeof(float));
    e->fc_b = alloc_bytes((size_t)w->classes * sizeof(float));
    if (!e->last || !e->feat || !e->fc_w || !e->fc_b)
        goto oom;
    for (size_t i = 0; i < (size_t)w->classes * RESNET18_FEATURES; i++)
        e->fc_w[i] = int8_round_half(w->fc_w[i]);
    memcpy(e->fc_b, w->fc_b, (size_t)w->classes * sizeof(float));

    for (int i = 0; i < RESNET18_NUM_CONVS; i++)
        if (load_layer(e, w, t, i) != 0)
            goto oom;
    e->ws = alloc_bytes((size_t)e->nthreads * RB * e->ws_stride);
    if (!e->ws)
        goto oom;
    calib_input_lut(t, e->qlut, &e->in_inv);
    if (make_prefix(e, w, cfg, err, errlen) != 0)
        goto fail;

    if (cpu_pool_start(&e->pool, e->nthreads, err, errlen) != 0)
        goto fail;
    return &e->pub;

oom:
    snprintf(err, errlen, "cpu int8 engine: out of memory for max batch %d", cfg->max_batch);
fail:
    i8_destroy(e);
    return NULL;
}

const float *engine_cpu_int8_last_conv(engine *pub)
{
    return pub && pub->ops == &i8_ops ? ((i8_engine *)pub->ctx)->last : NULL;
}

const char *engine_cpu_int8_tile(const engine *pub)
{
    return pub && pub->ops == &i8_ops ? tile_names[((const i8_engine *)pub->ctx)->tile] : NULL;
}
