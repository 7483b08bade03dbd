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
 * Layouts: activations NHWC without borders ([n][h][h][c]), u8 after a
 * ReLU and int8 elsewhere (engine/int8.h); the last
 * conv's output is NHWC FP32. Weights [cout][Kp] int8, K = k*k*cin in KRSC
 * order padded with zeros to Kp, a multiple of KBLK. A conv is a GEMM: rows
 * are output pixels, built by im2col into a per-thread workspace of RB
 * rows; a unit of work is RB rows times a range of output channels,
 * claimed by the pool threads (engine/cpu_pool.h). Four tiles
 * (engine/int8_tiles.c) compute the int32 sums, chosen at create: an AMX
 * one (tdpbusd, tdpbssd for the stem, on 16 x 16 int32 tiles) where the
 * CPU and the kernel allow it, else an AVX512-VNNI one (vpdpbusd), else an
 * AVX2 one for CPUs without AVX-512 (vpmaddwd on bytes widened to 16
 * bits), all on weights repacked for them, else a plain C one whose fixed
 * inner trip count GCC vectorises at -O2.
 * RESNETD_CPU_INT8_GEMM=generic|avx2|vnni|amx forces one; all give the
 * same integers, and the tests run each the CPU has.
 *
 * Precision mixes (engine/calib.h): a table whose mix runs a prefix in
 * float gets an FP32 CPU engine of its own (engine_cpu_forward_prefix),
 * which computes that prefix exactly as at FP32; its last tensor is
 * quantised into this engine's u8 buffer and the INT8 convs go on from
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
#include "engine/int8_tiles.h"
#include "image/preprocess.h"

#define RB 64 /* im2col rows per work unit (a multiple of MR, VR and AR) */
#define I8_MAX_BATCH 4096 /* conv1 has n * 12544 / RB work units: < 2^20 (cpu_pool) */
#define NT R18_NTENSORS /* tensors: conv outputs, image, pool */
#define T_IMAGE R18_T_IMAGE
#define T_POOL R18_T_POOL
#define LAST (RESNET18_NUM_CONVS - 1)
#define STEM_C 64 /* the stem's output channels (resnet18_convs[0].cout) */

/* The vector epilogues: x86-64 only, as the tiles they follow. */
#if HAVE_VNNI_KERNEL
#include <immintrin.h>
#endif

typedef enum { TILE_GENERIC, TILE_AVX2, TILE_VNNI, TILE_AMX, NTILES } i8_tile;
static const char *const tile_names[NTILES] = { "generic", "avx2", "vnni", "amx" };

typedef struct i8_layer {
    const resnet18_conv_desc *d;
    int K, Kp; /* k*k*cin; padded to a multiple of KBLK */
    int8_t *w; /* [cout][Kp] */
    int8_t *wv; /* VNNI, AMX: [cout/16][Kp/4][16][4]; NULL without them */
    int32_t *corr; /* VNNI, the stem (int8 input): [cout], 128 * sum_k w[c][k]; else NULL */
    int16_t *w16; /* AVX2: wv's layout widened to 16 bits; NULL elsewhere */
    float *mult; /* [cout]: s_in * s_w[c] */
    float *b; /* [cout], BN folded */
    int src, res; /* tensors read (res -1: none) */
    int in_u8, res_u8, out_u8; /* which of its tensors are u8 (the rest int8) */
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
    int buf[NT]; /* 8-bit tensor -> buffer */
    int8_t *act[NT]; /* distinct 8-bit buffers (u8 or int8), [max_batch][h][h][c] */
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
                v = v + (float)(L->res_u8 ? (int)((const uint8_t *)res)[o + j] : (int)res[o + j]) * L->res_scale;
            if (L->d->relu && v < 0.0f)
                v = 0.0f;
            if (out8 && L->out_u8)
                ((uint8_t *)out8)[o + j] = int8_quantize_u8(v, L->out_inv);
            else if (out8)
                out8[o + j] = int8_quantize(v, L->out_inv);
            else
                e->last[o + j] = v;
        }
    }
}

#if HAVE_VNNI_KERNEL
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
    /* With an 8-bit output the ReLU is the clamp's lower bound: v < 0 gives
     * rint(v * inv) <= 0 since inv > 0 (calib_load refuses scales <= 0),
     * so 0 either way; -0 and NaN give 0 as well. A u8 output (after a
     * ReLU) clamps to 0..255; the truncating store keeps its low byte. */
    const int relu_in_clamp = L->d->relu && out8;
    const __m512 zero = _mm512_setzero_ps(), hi = _mm512_set1_ps(L->out_u8 ? 255.0f : 127.0f);
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
                const __m512i r32 = L->res_u8 ? _mm512_cvtepu8_epi32(r8) : _mm512_cvtepi8_epi32(r8);
                v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_cvtepi32_ps(r32), res_scale));
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
    const __m256 zero = _mm256_setzero_ps(), hi = _mm256_set1_ps(L->out_u8 ? 255.0f : 127.0f);
    const __m256 lo = relu_in_clamp ? zero : _mm256_set1_ps(-127.0f);
    const __m256 res_scale = _mm256_set1_ps(L->res_scale), inv = _mm256_set1_ps(L->out_inv);
    for (int h = 0; h < CG; h += 8) {
        const __m256 mult = _mm256_loadu_ps(L->mult + c + h), b = _mm256_loadu_ps(L->b + c + h);
        for (int i = 0; i < nrows; i++) {
            const size_t o = (size_t)(m + i) * N + c + h;
            __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(acc[i] + h))), mult);
            v = _mm256_add_ps(v, b);
            if (res) {
                const __m128i r8 = _mm_loadl_epi64((const __m128i *)(res + o));
                const __m256i r32 = L->res_u8 ? _mm256_cvtepu8_epi32(r8) : _mm256_cvtepi8_epi32(r8);
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
            _mm_storel_epi64((__m128i *)(out8 + o), L->out_u8 ? _mm_packus_epi16(q16, q16) : _mm_packs_epi16(q16, q16));
        }
    }
}
#endif

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
        int8_amx_begin();
        for (int c = c0; c < c1; c += CG)
            for (int r = 0; r < rows; r += AR) {
                int32_t acc[AR][CG];
                int8_amx_tile(ws + (size_t)r * Kp, Kp, L->wv + (size_t)c * Kp, (int)Kp, L->in_u8, acc);
                epilogue_avx512(e, L, m0 + r, imin(AR, rows - r), c, acc);
            }
        int8_amx_end();
        return;
    }
#endif
#if HAVE_VNNI_KERNEL
    if (e->tile == TILE_AVX2) {
        for (int r = 0; r < rows; r += VR)
            for (int c = c0; c < c1; c += CG) {
                int32_t acc[VR][CG];
                for (int p = 0; p < CG; p += 16)
                    for (int rr = 0; rr < VR; rr += 2)
                        int8_avx2_tile(ws + (size_t)(r + rr) * Kp, Kp, L->w16 + (size_t)(c + p) * Kp, (int)Kp, L->in_u8,
                                       &acc[rr][p], CG);
                epilogue_avx2(e, L, m0 + r, imin(VR, rows - r), c, acc);
            }
        return;
    }
    if (e->tile == TILE_VNNI) {
        if (!L->in_u8)
            int8_bias_a(ws, (size_t)padded * Kp);
        for (int r = 0; r < rows; r += VR)
            for (int c = c0; c < c1; c += CG) {
                int32_t acc[VR][CG];
                int8_vnni_tile(ws + (size_t)r * Kp, Kp, L->wv + (size_t)c * Kp, (int)Kp, L->in_u8 ? NULL : L->corr + c,
                               acc);
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
                int8_dot_tile(ws + (size_t)r * Kp, Kp, L->w + (size_t)c * Kp, Kp, (int)Kp, L->in_u8, acc);
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

/* 3x3/2 pad-1 max pool of the stem's u8 output. C is a constant so
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
    const uint8_t *in = (const uint8_t *)e->act[e->buf[0]];
    uint8_t *out = (uint8_t *)e->act[e->buf[T_POOL]];
    for (int row = lo; row < hi; row++) {
        int img = row / oh, oy = row % oh;
        int y0 = oy * 2 - 1 < 0 ? 0 : oy * 2 - 1, y1 = imin(oy * 2 + 2, ih);
        for (int ox = 0; ox < oh; ox++) {
            int x0 = ox * 2 - 1 < 0 ? 0 : ox * 2 - 1, x1 = imin(ox * 2 + 2, ih);
            uint8_t m[C]; /* local: no aliasing with the input to rule out */
            memcpy(m, in + (((size_t)img * ih + y0) * ih + x0) * C, (size_t)C);
            for (int iy = y0; iy < y1; iy++)
                for (int ix = x0; ix < x1; ix++) {
                    const uint8_t *p = in + (((size_t)img * ih + iy) * ih + ix) * C;
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
 * boundary's u8 buffer (it follows a ReLU: a block's output, or the
 * pool's), with the scale the INT8 convs read it at. */
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
        uint8_t *dst = (uint8_t *)e->act[e->buf[e->boundary]] + (size_t)row * h * c;
        for (int i = 0; i < h * c; i++)
            dst[i] = int8_quantize_u8(src[i], inv);
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

/* The mix's float prefix on slot's images, ending in the boundary's u8
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

/* Shapes of every tensor, then 8-bit buffers by liveness (resnet18.h's
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

/* L->w into the VNNI and AMX tiles' layout and, for an int8 input, VNNI's
 * bias corrections; or (avx2) that layout widened to 16 bits. */
static int pack_vnni(i8_layer *L, int avx2)
{
    const int N = L->d->cout, Kp = L->Kp;
    L->wv = alloc_bytes((size_t)N * Kp);
    if (!L->wv || (!L->in_u8 && !(L->corr = alloc_bytes((size_t)N * sizeof(int32_t)))))
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
        if (L->corr)
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
        const char *lacks = e->tile == TILE_AMX && !int8_cpu_has_amx() ? "AMX-INT8 (or the kernel does not allow it)"
                            : e->tile == TILE_VNNI && !int8_cpu_has_vnni() ? "AVX512-VNNI"
                            : e->tile == TILE_AVX2 && !int8_cpu_has_avx2() ? "AVX2"
                                                                           : NULL;
        if (lacks) {
            snprintf(err, errlen, "cpu int8 engine: RESNETD_CPU_INT8_GEMM=%s but this CPU lacks %s", force, lacks);
            return -1;
        }
    } else {
        e->tile = int8_cpu_has_amx()    ? TILE_AMX
                  : int8_cpu_has_vnni() ? TILE_VNNI
                  : int8_cpu_has_avx2() ? TILE_AVX2
                                        : TILE_GENERIC;
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
    L->in_u8 = calib_source_unsigned(d->src);
    L->res_u8 = d->residual != R18_NONE && calib_source_unsigned(d->residual);
    L->out_u8 = i != LAST && d->relu;
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
    if (e->tile != TILE_GENERIC && pack_vnni(L, e->tile == TILE_AVX2) != 0)
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
