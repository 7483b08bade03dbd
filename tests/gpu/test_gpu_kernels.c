/* Unit tests of every gpu/ conv kernel against a CPU reference in double, on
 * random data and on shapes chosen so that tiles end raggedly in M, N and
 * K. Every conv tile configuration runs every shape, in FP32 and FP16,
 * with and without split-K; the general tiles also with a shortcut (a
 * downsample's 1x1 conv inside the conv that adds it); INT8 tiles must
 * match engine/int8.h bit for bit, the shortcut's output requantised before
 * the add. The other kernels (stem, normalise, pools, FC bias) are
 * tests/gpu/test_gpu_ops.c's. Exits 77 (skip) when no CUDA device is usable. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gpu/gpu.h"
#include "gpu/gpu_test.h"
#include "engine/int8.h"
#include "tests/lib/testutil.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float rng_float(float a)
{
    return testutil_rand_float(&rng_state, a);
}

static float *rand_array(size_t n, float a)
{
    return testutil_rand_array(&rng_state, n, a);
}

/* ---- convolution -------------------------------------------------------- */

static void conv_ref(const gpu_test_conv_shape *s, const float *in, const float *w, const float *bias, const float *res,
                     int relu, double *out)
{
    for (int n = 0; n < s->n; n++)
        for (int oy = 0; oy < s->oh; oy++)
            for (int ox = 0; ox < s->ow; ox++)
                for (int k = 0; k < s->k; k++) {
                    double acc = bias[k];
                    for (int r = 0; r < s->kh; r++) {
                        int iy = oy * s->stride - s->pad_h + r;
                        if (iy < 0 || iy >= s->h)
                            continue;
                        for (int q = 0; q < s->kw; q++) {
                            int ix = ox * s->stride - s->pad_w + q;
                            if (ix < 0 || ix >= s->w)
                                continue;
                            const float *x = in + (((size_t)n * s->h + iy) * s->w + ix) * s->c;
                            const float *f = w + (((size_t)k * s->kh + r) * s->kw + q) * s->c;
                            for (int c = 0; c < s->c; c++)
                                acc += (double)x[c] * f[c];
                        }
                    }
                    size_t o = (((size_t)n * s->oh + oy) * s->ow + ox) * s->k + k;
                    if (res)
                        acc += res[o];
                    if (relu && acc < 0)
                        acc = 0;
                    out[o] = acc;
                }
}

/* Shapes: ragged M (n*oh*ow not a multiple of any BM), ragged N (k not a
 * multiple of 64), ragged K (kh*kw*c not a multiple of 32 or 64), strided
 * 1x1 (the downsample), and the padded-stem layout (c = 4, kw = 8). */
static const gpu_test_conv_shape conv_shapes[] = {
    /* n  h   w   c   k  kh kw s ph pw oh ow */
    { 2, 9, 9, 16, 24, 3, 3, 1, 1, 1, 0, 0 },
    { 3, 11, 11, 8, 40, 3, 3, 2, 1, 1, 0, 0 },
    { 2, 14, 14, 32, 64, 1, 1, 2, 0, 0, 0, 0 },
    { 2, 20, 20, 4, 16, 7, 8, 2, 3, 4, 0, 10 },
    { 2, 28, 28, 64, 136, 3, 3, 1, 1, 1, 0, 0 },
    { 1, 7, 7, 256, 512, 3, 3, 1, 1, 1, 0, 0 },
    { 5, 6, 6, 24, 8, 3, 3, 1, 1, 1, 0, 0 },
    /* layer1's 64 -> 64 3x3 convs (the patch kernel's shapes): the last
     * tile of each image ragged, ResNet18's width 56, and a grid (w + 2)
     * narrower than the kernel's 16-row loader and epilogue steps */
    { 3, 13, 17, 64, 64, 3, 3, 1, 1, 1, 0, 0 },
    { 2, 6, 56, 64, 64, 3, 3, 1, 1, 1, 0, 0 },
    { 2, 5, 7, 64, 64, 3, 3, 1, 1, 1, 0, 0 },
    /* two 64-channel output slices, each its own CTAs */
    { 2, 7, 9, 64, 128, 3, 3, 1, 1, 1, 0, 0 },
    /* 12 patch-kernel tiles on 2 capped CTAs: each CTA's loop passes both
     * buffers three times */
    { 4, 12, 20, 64, 64, 3, 3, 1, 1, 1, 0, 0 },
};
#define NSHAPES ((int)(sizeof conv_shapes / sizeof conv_shapes[0]))

/* 1 when the tile ran the shape and matched, 0 when the tile does not run it. */
static int check_conv(int fp16, int tile, int splits, int shape, int with_res, int relu)
{
    gpu_test_conv_shape s = conv_shapes[shape];
    char err[256];
    int oh = s.oh ? s.oh : (s.h + 2 * s.pad_h - s.kh) / s.stride + 1;
    int ow = s.ow ? s.ow : (s.w + 2 * s.pad_w - s.kw) / s.stride + 1;
    size_t nin = (size_t)s.n * s.h * s.w * s.c, nw = (size_t)s.k * s.kh * s.kw * s.c;
    size_t nout = (size_t)s.n * oh * ow * s.k;
    float *in = rand_array(nin, 1.0f), *w = rand_array(nw, 0.5f), *bias = rand_array(s.k, 0.5f);
    float *res = with_res ? rand_array(nout, 1.0f) : NULL;
    float *out = malloc(nout * sizeof *out);
    double *ref = malloc(nout * sizeof *ref);
    ck_assert(out && ref);
    int rc = gpu_test_conv(fp16, tile, splits, &s, in, w, bias, res, relu, out, err, sizeof err);
    ck_assert_msg(rc >= 0, "%s", err);
    if (rc == 0) {
        ck_assert_int_eq(s.oh, oh);
        ck_assert_int_eq(s.ow, ow);
        conv_ref(&s, in, w, bias, res, relu, ref);
        double rel = testutil_rel_l2_d(out, ref, nout);
        double tol = fp16 ? 2e-3 : 1e-5;
        ck_assert_msg(rel <= tol, "%s split %d shape %d res %d relu %d: rel L2 %.3g > %.1g",
                      gpu_test_conv_tile_name(fp16, tile), splits, shape, with_res, relu, rel, tol);
    }
    free(in);
    free(w);
    free(bias);
    free(res);
    free(out);
    free(ref);
    return rc == 0;
}

/* RESNETD_GPU_TEST_QUICK=1 (for compute-sanitizer) skips the two large shapes. */
static int quick;
/* RESNETD_GPU_TEST_TILES=TEXT: only the tiles whose names contain it (a
 * racecheck of one new tile in minutes rather than of all in an hour). */
static const char *only_tiles;

static int tile_selected(int kind, int t)
{
    return !only_tiles || strstr(gpu_test_conv_tile_name(kind, t), only_tiles) != NULL;
}

static void check_all_conv(int fp16)
{
    int checked = 0;
    for (int t = 0; t < gpu_test_conv_tiles(fp16); t++) {
        if (!tile_selected(fp16, t))
            continue;
        int usable = gpu_test_conv_tile_usable(fp16, t);
        ck_assert_int_ge(usable, 0);
        if (!usable) {
            printf("conv tile %s: not for this device, skipped\n", gpu_test_conv_tile_name(fp16, t));
            continue;
        }
        int ran = 0;
        for (int sh = 0; sh < NSHAPES; sh++) {
            if (quick && (sh == 4 || sh == 5))
                continue;
            ran += check_conv(fp16, t, 1, sh, sh % 2, 1);
            ran += check_conv(fp16, t, 1, sh, !(sh % 2), sh != 3);
            ran += check_conv(fp16, t, 3, sh, 1, 1); /* split-K, with a ragged last split where K allows */
        }
        ck_assert_msg(ran > 0, "tile %s ran no shape", gpu_test_conv_tile_name(fp16, t));
        printf("conv %s tile %s: %d runs within tolerance\n", fp16 ? "fp16" : "fp32", gpu_test_conv_tile_name(fp16, t),
               ran);
        checked++;
    }
    ck_assert_msg(checked > 0 || only_tiles, "no tile checked");
}

START_TEST(conv_fp32_matches_reference_on_ragged_shapes_every_tile)
{
    check_all_conv(0);
}
END_TEST

START_TEST(conv_fp16_matches_reference_on_ragged_shapes_every_tile)
{
    check_all_conv(1);
}
END_TEST

/* Batch invariance (engine_config.deterministic) rests on this: without
 * split-K, the tiles of one family give every output the same bits, so a
 * layer may change tiles between batch sizes. Whether two families agree
 * is printed, not required (they are planned apart). */
static void check_families(int kind)
{
    enum { MAXF = 4 };
    for (int sh = 0; sh < NSHAPES; sh++) {
        if (quick && (sh == 4 || sh == 5))
            continue;
        gpu_test_conv_shape s = conv_shapes[sh];
        int oh = s.oh ? s.oh : (s.h + 2 * s.pad_h - s.kh) / s.stride + 1;
        int ow = s.ow ? s.ow : (s.w + 2 * s.pad_w - s.kw) / s.stride + 1;
        size_t nin = (size_t)s.n * s.h * s.w * s.c, nw = (size_t)s.k * s.kh * s.kw * s.c;
        size_t nout = (size_t)s.n * oh * ow * s.k;
        float *in = rand_array(nin, 1.0f), *w = rand_array(nw, 0.5f), *bias = rand_array(s.k, 0.5f);
        float *res = rand_array(nout, 1.0f), *out = malloc(nout * sizeof *out);
        float *first[MAXF] = { NULL };
        int first_tile[MAXF];
        ck_assert_ptr_nonnull(out);
        for (int t = 0; t < gpu_test_conv_tiles(kind); t++) {
            if (!tile_selected(kind, t) || gpu_test_conv_tile_usable(kind, t) != 1)
                continue;
            char err[256];
            gpu_test_conv_shape run = conv_shapes[sh];
            int rc = gpu_test_conv(kind, t, 1, &run, in, w, bias, res, 1, out, err, sizeof err);
            ck_assert_msg(rc >= 0, "%s", err);
            if (rc == 1)
                continue;
            int f = gpu_test_conv_tile_family(kind, t);
            ck_assert(f >= 0 && f < MAXF);
            if (!first[f]) {
                first[f] = malloc(nout * sizeof(float));
                ck_assert_ptr_nonnull(first[f]);
                memcpy(first[f], out, nout * sizeof(float));
                first_tile[f] = t;
                continue;
            }
            size_t differ = 0;
            for (size_t i = 0; i < nout; i++)
                differ += memcmp(&out[i], &first[f][i], sizeof(float)) != 0;
            ck_assert_msg(differ == 0, "%s shape %d: %zu of %zu outputs differ from %s's bits (same family)",
                          gpu_test_conv_tile_name(kind, t), sh, differ, nout,
                          gpu_test_conv_tile_name(kind, first_tile[f]));
        }
        for (int a = 0; a < MAXF; a++)
            for (int b = a + 1; b < MAXF; b++)
                if (first[a] && first[b]) {
                    size_t differ = 0;
                    for (size_t i = 0; i < nout; i++)
                        differ += memcmp(&first[a][i], &first[b][i], sizeof(float)) != 0;
                    printf("conv %s shape %d: families %d (%s) and %d (%s): %zu of %zu outputs differ\n",
                           kind ? "fp16" : "fp32", sh, a, gpu_test_conv_tile_name(kind, first_tile[a]), b,
                           gpu_test_conv_tile_name(kind, first_tile[b]), differ, nout);
                }
        for (int f = 0; f < MAXF; f++)
            free(first[f]);
        free(in);
        free(w);
        free(bias);
        free(res);
        free(out);
    }
}

START_TEST(conv_fp32_tiles_of_one_family_give_the_same_bits)
{
    check_families(0);
}
END_TEST

START_TEST(conv_fp16_tiles_of_one_family_give_the_same_bits)
{
    check_families(1);
}
END_TEST

/* ---- FP16 conv with a shortcut: a downsample inside the conv that adds it -- */

/* A conv, then its shortcut's channels, size and stride. */
typedef struct shortcut_shape {
    gpu_test_conv_shape s;
    int c2, h2, w2, stride2;
} shortcut_shape;

/* ResNet's pattern (h2 = 2h, c2 = c/2) with ragged M, N and K; c2 under one
 * k tile; c2 = c; layer3.0's channels. */
static const shortcut_shape shortcut_shapes[] = {
    { { 2, 7, 7, 64, 72, 3, 3, 1, 1, 1, 0, 0 }, 32, 14, 14, 2 },
    { { 3, 5, 6, 16, 24, 3, 3, 1, 1, 1, 0, 0 }, 8, 10, 12, 2 },
    { { 2, 6, 6, 32, 64, 3, 3, 1, 1, 1, 0, 0 }, 32, 11, 11, 2 },
    { { 1, 14, 14, 256, 256, 3, 3, 1, 1, 1, 0, 0 }, 128, 28, 28, 2 },
};
#define NSHORTCUT ((int)(sizeof shortcut_shapes / sizeof shortcut_shapes[0]))

/* 1 when the tile ran the shape and matched, 0 when it does not run shortcuts. */
static int check_shortcut(int tile, int splits, int shape, int relu)
{
    gpu_test_conv_shape s = shortcut_shapes[shape].s;
    const int c2 = shortcut_shapes[shape].c2, h2 = shortcut_shapes[shape].h2, w2 = shortcut_shapes[shape].w2;
    const int st2 = shortcut_shapes[shape].stride2;
    char err[256];
    int oh = (s.h + 2 * s.pad_h - s.kh) / s.stride + 1, ow = (s.w + 2 * s.pad_w - s.kw) / s.stride + 1;
    size_t nout = (size_t)s.n * oh * ow * s.k;
    float *in = rand_array((size_t)s.n * s.h * s.w * s.c, 1.0f), *w = rand_array((size_t)s.k * s.kh * s.kw * s.c, 0.5f);
    float *bias = rand_array(s.k, 0.5f), *out = malloc(nout * sizeof *out);
    gpu_test_shortcut sc = {
        c2, h2, w2, st2, rand_array((size_t)s.n * h2 * w2 * c2, 1.0f), rand_array((size_t)s.k * c2, 0.5f)
    };
    double *ref = malloc(nout * sizeof *ref);
    ck_assert(out && ref);
    int rc = gpu_test_conv_shortcut(1, tile, splits, &s, &sc, in, w, bias, relu, out, err, sizeof err);
    ck_assert_msg(rc >= 0, "%s", err);
    if (rc == 0) {
        conv_ref(&s, in, w, bias, NULL, 0, ref);
        for (int n = 0; n < s.n; n++)
            for (int y = 0; y < oh; y++)
                for (int x = 0; x < ow; x++)
                    for (int k = 0; k < s.k; k++) {
                        const float *a = sc.in + (((size_t)n * h2 + y * st2) * w2 + x * st2) * c2;
                        double *o = ref + (((size_t)n * oh + y) * ow + x) * s.k + k;
                        for (int c = 0; c < c2; c++)
                            *o += (double)a[c] * sc.wgt[(size_t)k * c2 + c];
                        if (relu && *o < 0)
                            *o = 0;
                    }
        double rel = testutil_rel_l2_d(out, ref, nout);
        ck_assert_msg(rel <= 2e-3, "%s split %d shortcut shape %d relu %d: rel L2 %.3g > 2e-3",
                      gpu_test_conv_tile_name(1, tile), splits, shape, relu, rel);
    }
    free(in);
    free(w);
    free(bias);
    free(out);
    free(sc.in);
    free(sc.wgt);
    free(ref);
    return rc == 0;
}

START_TEST(conv_fp16_with_a_shortcut_matches_reference_every_general_tile)
{
    int checked = 0;
    for (int t = 0; t < gpu_test_conv_tiles(1); t++) {
        if (!tile_selected(1, t))
            continue;
        if (gpu_test_conv_tile_usable(1, t) != 1)
            continue;
        int ran = 0;
        for (int sh = 0; sh < NSHORTCUT; sh++) {
            if (quick && sh == NSHORTCUT - 1)
                continue;
            ran += check_shortcut(t, 1, sh, sh % 2);
            ran += check_shortcut(t, 3, sh, 1);
            /* A k tile a split: splits start at the shortcut's first column
             * and (BK 32, shape 3) inside its columns. */
            ran += check_shortcut(t, 64, sh, 1);
        }
        if (ran) {
            printf("conv fp16 tile %s: %d shortcut runs within tolerance\n", gpu_test_conv_tile_name(1, t), ran);
            checked++;
        }
    }
    ck_assert_msg(checked > 0 || only_tiles, "no tile checked");
}
END_TEST

START_TEST(conv_shortcut_refused_outside_its_kinds_and_shapes)
{
    char err[256] = "";
    float in[2 * 6 * 6 * 32] = { 0 }, w[64 * 9 * 32] = { 0 }, bias[64] = { 0 }, in2[2 * 11 * 11 * 32] = { 0 },
                         w2[64 * 32] = { 0 };
    float out[2 * 6 * 6 * 64];
    gpu_test_conv_shape s = { 2, 6, 6, 32, 64, 3, 3, 1, 1, 1, 0, 0 };
    gpu_test_shortcut sc = { 32, 11, 11, 2, in2, w2 };
    ck_assert_int_eq(gpu_test_conv_shortcut(0, 0, 1, &s, &sc, in, w, bias, 1, out, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "shortcut") != NULL, "%s", err); /* FP32 */
    sc.c = 8; /* INT8: not a whole 16-byte chunk */
    err[0] = 0;
    ck_assert_int_eq(gpu_test_conv_shortcut(2, 0, 1, &s, &sc, in, w, bias, 1, out, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "shortcut") != NULL, "%s", err);
    sc.c = 32;
    sc.h = 10; /* output row 5 at stride 2 is past row 9 */
    err[0] = 0;
    ck_assert_int_eq(gpu_test_conv_shortcut(1, 0, 1, &s, &sc, in, w, bias, 1, out, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "shortcut") != NULL, "%s", err);
    sc.h = 11;
    sc.c = 40; /* more channels than the conv's own */
    err[0] = 0;
    ck_assert_int_eq(gpu_test_conv_shortcut(1, 0, 1, &s, &sc, in, w, bias, 1, out, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "shortcut") != NULL, "%s", err);
    /* INT8: up to 256 channels, whose sums stay below 2^22 (the kernels
     * convert them to float through their bits). */
    gpu_test_conv_shape wide = { 1, 2, 2, 288, 64, 1, 1, 1, 0, 0, 0, 0 };
    gpu_test_shortcut sc8 = { 272, 4, 4, 2, in2, w2 };
    err[0] = 0;
    ck_assert_int_eq(gpu_test_conv_shortcut(2, 0, 1, &wide, &sc8, in, w, bias, 1, out, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "shortcut of 272") != NULL, "%s", err);
    sc8.c = 256;
    err[0] = 0;
    ck_assert_int_eq(gpu_test_conv_shortcut(2, 0, 1, &wide, &sc8, in, w, bias, 1, out, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "did not refuse") != NULL, "%s", err);
}
END_TEST

/* ---- INT8 convolution: engine/int8.h, bit for bit ---------------------------- */

/* Shapes as above with int8 channel counts (multiples of 16; the stem,
 * which reads the int8 image, runs only in gpu/stem.cu's kernel), and a
 * 7x7/2 conv. The inputs are u8 (engine/int8.h: every conv but the stem
 * reads a ReLU's output): random bytes, read as 0..255. */
static const gpu_test_conv_shape s8_shapes[] = {
    /* n  h   w   c   k  kh kw s ph pw oh ow */
    { 2, 9, 9, 16, 24, 3, 3, 1, 1, 1, 0, 0 },
    { 3, 11, 11, 32, 40, 3, 3, 2, 1, 1, 0, 0 },
    { 2, 14, 14, 32, 64, 1, 1, 2, 0, 0, 0, 0 },
    { 2, 20, 20, 16, 16, 7, 7, 2, 3, 3, 0, 0 },
    { 2, 28, 28, 64, 136, 3, 3, 1, 1, 1, 0, 0 },
    { 1, 7, 7, 256, 512, 3, 3, 1, 1, 1, 0, 0 },
    { 5, 6, 6, 48, 8, 3, 3, 1, 1, 1, 0, 0 },
    { 3, 13, 17, 64, 64, 3, 3, 1, 1, 1, 0, 0 },
    { 2, 6, 56, 64, 64, 3, 3, 1, 1, 1, 0, 0 },
    { 2, 5, 7, 64, 64, 3, 3, 1, 1, 1, 0, 0 },
    { 2, 7, 9, 64, 128, 3, 3, 1, 1, 1, 0, 0 },
    /* 12 patch-kernel tiles on 2 capped CTAs: each CTA's loop passes both
     * buffers three times */
    { 4, 12, 20, 64, 64, 3, 3, 1, 1, 1, 0, 0 },
    /* layer2's 128 -> 128 3x3 convs (the 128-channel patch kernel): width
     * 28, and a ragged last tile with three output slices */
    { 2, 6, 28, 128, 128, 3, 3, 1, 1, 1, 0, 0 },
    { 3, 9, 11, 128, 192, 3, 3, 1, 1, 1, 0, 0 },
};
#define NS8 ((int)(sizeof s8_shapes / sizeof s8_shapes[0]))

static int8_t rand_s8(void)
{
    return testutil_rand_s8(&rng_state);
}

/* n random int8 values in [-127, 127] (none when p is NULL). */
static void rand_s8_fill(int8_t *p, size_t n)
{
    for (size_t i = 0; p && i < n; i++)
        p[i] = rand_s8();
}

/* The int32 sum of output (b, oy, ox, k) of an INT8 conv: u8 inputs, int8
 * KRSC weights. */
static int32_t s8_acc(const gpu_test_conv_shape *s, const int8_t *in, const int8_t *w, int b, int oy, int ox, int k)
{
    int32_t acc = 0;
    for (int r = 0; r < s->kh; r++) {
        int iy = oy * s->stride - s->pad_h + r;
        for (int q = 0; q < s->kw && iy >= 0 && iy < s->h; q++) {
            int ix = ox * s->stride - s->pad_w + q;
            if (ix < 0 || ix >= s->w)
                continue;
            const uint8_t *x = (const uint8_t *)in + (((size_t)b * s->h + iy) * s->w + ix) * s->c;
            const int8_t *f = w + ((size_t)k * s->kh * s->kw + (size_t)r * s->kw + q) * s->c;
            for (int c = 0; c < s->c; c++)
                acc += x[c] * f[c];
        }
    }
    return acc;
}

/* Per-channel multipliers that spread K-term sums of random u8 by int8
 * values to about +-2 before the output scale: some clamp. */
static float *s8_mults(int k, int K)
{
    float *mult = malloc(k * sizeof *mult);
    ck_assert_ptr_nonnull(mult);
    for (int c = 0; c < k; c++)
        mult[c] = (1.0f + 0.5f * rng_float(1.0f)) / (255.0f * 127.0f * sqrtf((float)K) / 3.0f);
    return mult;
}

/* An output value as the conv stores it: u8 after a ReLU, else int8. */
static int quantized(float v, float inv, int relu)
{
    return relu ? int8_quantize_u8(v, inv) : int8_quantize(v, inv);
}

static int stored(const unsigned char *out, size_t o, int relu)
{
    return relu ? out[o] : (int8_t)out[o];
}

static int at_clamp(int q, int relu)
{
    return relu ? q == 255 : q == 127 || q == -127;
}

/* 1 when the tile ran the shape and matched bit for bit, 0 when it does not
 * run it. The residual is u8 (a block's input) on shapes not 1 mod 3, else
 * int8 (a downsample's output). */
static int check_conv_s8(int tile, int splits, int shape, int with_res, int relu, int out_f32)
{
    const int res_u8 = shape % 3 != 1;
    gpu_test_conv_shape s = s8_shapes[shape];
    char err[256];
    int oh = s.oh ? s.oh : (s.h + 2 * s.pad_h - s.kh) / s.stride + 1;
    int ow = s.ow ? s.ow : (s.w + 2 * s.pad_w - s.kw) / s.stride + 1;
    const int K = s.kh * s.kw * s.c;
    size_t nin = (size_t)s.n * s.h * s.w * s.c, nw = (size_t)s.k * K, nout = (size_t)s.n * oh * ow * s.k;
    int8_t *in = malloc(nin), *w = malloc(nw), *res = with_res ? malloc(nout) : NULL;
    float *bias = rand_array(s.k, 1.0f), *mult = s8_mults(s.k, K);
    unsigned char *out = malloc(nout * 4);
    ck_assert(in && w && out && (!with_res || res));
    rand_s8_fill(in, nin);
    rand_s8_fill(w, nw);
    rand_s8_fill(res, nout);
    const float res_scale = 0.01f, out_inv = 127.0f / 2.5f;
    int rc = gpu_test_conv_s8(tile, splits, &s, in, w, bias, mult, res_scale, out_inv, out_f32, res, res_u8, relu, out,
                              err, sizeof err);
    ck_assert_msg(rc >= 0, "%s", err);
    size_t differ = 0, clamped = 0;
    for (int b = 0; rc == 0 && b < s.n; b++)
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++)
                for (int k = 0; k < s.k; k++) {
                    const int32_t acc = s8_acc(&s, in, w, b, oy, ox, k);
                    size_t o = (((size_t)b * oh + oy) * ow + ox) * s.k + k;
                    float v = testutil_int8_epilogue(acc, mult[k], bias[k], res ? res + o : NULL, res_u8, res_scale,
                                                     relu);
                    if (out_f32) {
                        differ += memcmp(&v, out + 4 * o, sizeof v) != 0;
                    } else {
                        const int q = quantized(v, out_inv, relu);
                        clamped += at_clamp(q, relu);
                        differ += stored(out, o, relu) != q;
                    }
                }
    if (rc == 0) {
        ck_assert_msg(differ == 0, "%s split %d shape %d res %d (u8 %d) relu %d f32 %d: %zu of %zu outputs differ",
                      gpu_test_conv_tile_name(2, tile), splits, shape, with_res, res_u8, relu, out_f32, differ, nout);
        ck_assert_msg(out_f32 || clamped < nout / 4, "shape %d: %zu of %zu outputs clamped", shape, clamped, nout);
    }
    free(in);
    free(w);
    free(res);
    free(bias);
    free(mult);
    free(out);
    return rc == 0;
}

START_TEST(conv_int8_matches_model_int8_bit_for_bit_every_tile)
{
    int checked = 0;
    for (int t = 0; t < gpu_test_conv_tiles(2); t++) {
        if (!tile_selected(2, t))
            continue;
        int usable = gpu_test_conv_tile_usable(2, t);
        ck_assert_int_ge(usable, 0);
        if (!usable) {
            printf("conv tile %s: not for this device, skipped\n", gpu_test_conv_tile_name(2, t));
            continue;
        }
        int ran = 0;
        for (int sh = 0; sh < NS8; sh++) {
            if (quick && (sh == 4 || sh == 5))
                continue;
            ran += check_conv_s8(t, 1, sh, sh % 2, sh != 2, 0); /* shape 2, the downsample: no ReLU */
            ran += check_conv_s8(t, 3, sh, 1, 1, 0); /* split-K: int32 partials */
            if (quick) /* under racecheck: the two above are each tile's code paths */
                continue;
            ran += check_conv_s8(t, 1, sh, !(sh % 2), sh != 3, sh == 5);
            ran += check_conv_s8(t, 2, sh, 1, 0, 1); /* split-K into an FP32 output */
        }
        ck_assert_msg(ran > 0, "tile %s ran no shape", gpu_test_conv_tile_name(2, t));
        printf("conv int8 tile %s: %d runs bit-exact\n", gpu_test_conv_tile_name(2, t), ran);
        checked++;
    }
    ck_assert_msg(checked > 0 || only_tiles, "no tile checked");
}
END_TEST

/* ---- INT8's last conv with the average pool inside --------------------------- */

/* Images of 7x7 (as layer4) and 9x9 (81: more than a 64-row tile, which
 * refuses it), n chosen so that images straddle the tiles' edges (a tile
 * ending in a split image, starting in one, or both); 4x4 (several whole
 * images a tile) and 8x8 (64 rows: whole tiles of 64); k with a ragged
 * 64-channel group in a 128- or 256-wide tile. */
static const gpu_test_conv_shape pool_shapes[] = {
    /* n  h  w   c    k  kh kw s ph pw oh ow */
    { 5, 7, 7, 64, 128, 3, 3, 1, 1, 1, 0, 0 },
    { 6, 4, 4, 32, 192, 3, 3, 1, 1, 1, 0, 0 },
    { 3, 8, 8, 16, 64, 1, 1, 1, 0, 0, 0, 0 },
    { 4, 9, 9, 48, 320, 3, 3, 1, 1, 1, 0, 0 },
};
#define NPOOL ((int)(sizeof pool_shapes / sizeof pool_shapes[0]))

/* 1 when the tile ran the shape and every feature was engine/int8.h's. */
static int check_conv_s8_pool(int tile, int shape, int with_res)
{
    gpu_test_conv_shape s = pool_shapes[shape];
    char err[256];
    const int oh = (s.h + 2 * s.pad_h - s.kh) / s.stride + 1, ow = (s.w + 2 * s.pad_w - s.kw) / s.stride + 1;
    const int K = s.kh * s.kw * s.c, hw = oh * ow;
    size_t nin = (size_t)s.n * s.h * s.w * s.c, nw = (size_t)s.k * K, nout = (size_t)s.n * hw * s.k;
    int8_t *in = malloc(nin), *w = malloc(nw), *res = with_res ? malloc(nout) : NULL;
    float *bias = rand_array(s.k, 1.0f), *mult = s8_mults(s.k, K);
    uint16_t *feat = malloc((size_t)s.n * s.k * sizeof *feat);
    ck_assert(in && w && feat && (!with_res || res));
    rand_s8_fill(in, nin);
    rand_s8_fill(w, nw);
    rand_s8_fill(res, nout);
    const float res_scale = 0.01f;
    int rc = gpu_test_conv_s8_pool(tile, &s, in, w, bias, mult, res_scale, res, 1, feat, err, sizeof err);
    ck_assert_msg(rc >= 0, "%s: %s", gpu_test_conv_tile_name(2, tile), err);
    size_t differ = 0, nonzero = 0;
    for (int b = 0; rc == 0 && b < s.n; b++)
        for (int k = 0; k < s.k; k++) {
            double sum = 0;
            for (int p = 0; p < hw; p++) {
                const size_t o = ((size_t)b * hw + p) * s.k + k;
                sum += testutil_int8_epilogue(s8_acc(&s, in, w, b, p / ow, p % ow, k), mult[k], bias[k],
                                              res ? res + o : NULL, 1, res_scale, 1);
            }
            const float want = int8_round_half((float)(sum / hw)), got = testutil_half_bits(feat[(size_t)b * s.k + k]);
            differ += memcmp(&want, &got, sizeof want) != 0;
            nonzero += want != 0.0f;
        }
    if (rc == 0) {
        ck_assert_msg(differ == 0, "%s pool shape %d res %d: %zu of %d features differ",
                      gpu_test_conv_tile_name(2, tile), shape, with_res, differ, s.n * s.k);
        ck_assert_msg(nonzero > (size_t)s.n * s.k / 4, "pool shape %d: %zu non-zero features", shape, nonzero);
    }
    free(in);
    free(w);
    free(res);
    free(bias);
    free(mult);
    free(feat);
    return rc == 0;
}

START_TEST(conv_int8_with_the_pool_inside_matches_model_int8_every_wgmma_tile)
{
    int checked = 0, wgmma = 0;
    for (int t = 0; t < gpu_test_conv_tiles(2); t++) {
        if (!tile_selected(2, t) || gpu_test_conv_tile_usable(2, t) != 1)
            continue;
        const char *name = gpu_test_conv_tile_name(2, t); /* the general wgmma tiles, not the patch kernels */
        wgmma += strncmp(name, "wgmma_s8_", 9) == 0 && strstr(name, "swap") == NULL;
        int ran = 0;
        for (int sh = 0; sh < NPOOL; sh++) {
            ran += check_conv_s8_pool(t, sh, 1);
            if (!quick)
                ran += check_conv_s8_pool(t, sh, 0);
        }
        if (ran) {
            printf("conv int8 tile %s with the pool inside: %d runs bit-exact\n", gpu_test_conv_tile_name(2, t), ran);
            checked++;
        }
    }
    /* Without sm_90a no tile runs it, and the engine keeps the pool apart. */
    ck_assert_msg(checked > 0 || !wgmma, "no wgmma tile ran the pool inside");
}
END_TEST

/* ---- INT8 conv with a shortcut: the downsample requantised, then added ----- */

/* INT8 channel counts: ResNet's pattern with ragged M and N, c2 = c, and
 * layers 2-4's first blocks (shortcuts of 64, 128 and 256 bytes: half, one
 * and two of the wgmma tiles' k tiles, one, two and four of the 64-byte
 * mma.sync ones). */
static const shortcut_shape s8_shortcut_shapes[] = {
    { { 2, 7, 7, 64, 72, 3, 3, 1, 1, 1, 0, 0 }, 32, 14, 14, 2 },
    { { 3, 5, 6, 16, 24, 3, 3, 1, 1, 1, 0, 0 }, 16, 10, 12, 2 },
    { { 2, 6, 6, 32, 64, 3, 3, 1, 1, 1, 0, 0 }, 32, 11, 11, 2 },
    { { 1, 14, 14, 256, 256, 3, 3, 1, 1, 1, 0, 0 }, 128, 28, 28, 2 },
    { { 1, 7, 7, 512, 512, 3, 3, 1, 1, 1, 0, 0 }, 256, 14, 14, 2 },
    { { 1, 28, 28, 128, 128, 3, 3, 1, 1, 1, 0, 0 }, 64, 56, 56, 2 },
    /* Layer2.0.conv2's channels on a small image: the 128-channel patch
     * kernel runs it too (in the quick runs as well), two tiles an image,
     * so that each capped CTA takes two and uses both buffers. */
    { { 2, 15, 7, 128, 128, 3, 3, 1, 1, 1, 0, 0 }, 64, 30, 14, 2 },
};
#define NS8SHORTCUT ((int)(sizeof s8_shortcut_shapes / sizeof s8_shortcut_shapes[0]))

/* 1 when the tile ran the shape and matched bit for bit, 0 when it does not
 * run shortcuts. */
static int check_shortcut_s8(int tile, int shape, int relu, int out_f32)
{
    gpu_test_conv_shape s = s8_shortcut_shapes[shape].s;
    const int c2 = s8_shortcut_shapes[shape].c2, h2 = s8_shortcut_shapes[shape].h2;
    const int w2 = s8_shortcut_shapes[shape].w2, st2 = s8_shortcut_shapes[shape].stride2;
    char err[256];
    const int oh = (s.h + 2 * s.pad_h - s.kh) / s.stride + 1, ow = (s.w + 2 * s.pad_w - s.kw) / s.stride + 1;
    const int K = s.kh * s.kw * s.c;
    const size_t nin = (size_t)s.n * s.h * s.w * s.c, nw = (size_t)s.k * K, nout = (size_t)s.n * oh * ow * s.k;
    const size_t nin2 = (size_t)s.n * h2 * w2 * c2, nw2 = (size_t)s.k * c2;
    int8_t *in = malloc(nin), *w = malloc(nw), *in2 = malloc(nin2), *w2s = malloc(nw2);
    float *bias = rand_array(s.k, 1.0f), *mult = s8_mults(s.k, K);
    float *bias2 = rand_array(s.k, 1.0f), *mult2 = s8_mults(s.k, c2);
    unsigned char *out = malloc(nout * 4);
    ck_assert(in && w && in2 && w2s && out);
    rand_s8_fill(in, nin);
    rand_s8_fill(w, nw);
    rand_s8_fill(in2, nin2);
    rand_s8_fill(w2s, nw2);
    const float res_scale = 0.02f, out_inv = 127.0f / 2.5f;
    const gpu_test_shortcut_s8 sc = { c2, h2, w2, st2, in2, w2s, mult2, bias2, 127.0f / 2.5f };
    int rc = gpu_test_conv_s8_shortcut(tile, 1, &s, &sc, in, w, bias, mult, res_scale, out_inv, out_f32, relu, out, err,
                                       sizeof err);
    ck_assert_msg(rc >= 0, "%s", err);
    size_t differ = 0, clamped = 0, rclamped = 0;
    for (int b = 0; rc == 0 && b < s.n; b++)
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++)
                for (int k = 0; k < s.k; k++) {
                    const uint8_t *a = (const uint8_t *)in2 +
                                       (((size_t)b * h2 + (size_t)oy * st2) * w2 + (size_t)ox * st2) * c2;
                    int32_t acc2 = 0;
                    for (int c = 0; c < c2; c++)
                        acc2 += a[c] * w2s[(size_t)k * c2 + c];
                    /* The downsample's own output, as its conv would store it. */
                    const int8_t r = int8_quantize(testutil_int8_epilogue(acc2, mult2[k], bias2[k], NULL, 0, 0.f, 0),
                                                   sc.inv);
                    rclamped += r == 127 || r == -127;
                    const size_t o = (((size_t)b * oh + oy) * ow + ox) * s.k + k;
                    const float v = testutil_int8_epilogue(s8_acc(&s, in, w, b, oy, ox, k), mult[k], bias[k], &r, 0,
                                                           res_scale, relu);
                    if (out_f32) {
                        differ += memcmp(&v, out + 4 * o, sizeof v) != 0;
                    } else {
                        const int q = quantized(v, out_inv, relu);
                        clamped += at_clamp(q, relu);
                        differ += stored(out, o, relu) != q;
                    }
                }
    if (rc == 0) {
        ck_assert_msg(differ == 0, "%s shortcut shape %d relu %d f32 %d: %zu of %zu outputs differ",
                      gpu_test_conv_tile_name(2, tile), shape, relu, out_f32, differ, nout);
        ck_assert_msg(clamped < nout / 4 && rclamped < nout / 4, "shape %d: %zu and %zu of %zu clamped", shape, clamped,
                      rclamped, nout);
    }
    free(in);
    free(w);
    free(in2);
    free(w2s);
    free(bias);
    free(mult);
    free(bias2);
    free(mult2);
    free(out);
    return rc == 0;
}

START_TEST(conv_int8_with_a_shortcut_matches_model_int8_every_general_tile)
{
    int checked = 0;
    for (int t = 0; t < gpu_test_conv_tiles(2); t++) {
        if (!tile_selected(2, t))
            continue;
        if (gpu_test_conv_tile_usable(2, t) != 1)
            continue;
        int ran = 0;
        for (int sh = 0; sh < NS8SHORTCUT; sh++) {
            if (quick && sh >= 3 && sh != NS8SHORTCUT - 1)
                continue;
            ran += check_shortcut_s8(t, sh, sh % 2, 0);
            if (!quick)
                ran += check_shortcut_s8(t, sh, 1, sh == 1 || sh == 4);
        }
        /* Every general tile runs shortcuts, and the 128-channel patch
         * kernel; the 64-channel ones none. */
        const char *name = gpu_test_conv_tile_name(2, t);
        ck_assert_msg((ran > 0) == (strstr(name, "swap") == NULL || strstr(name, "swap3x3c128") != NULL),
                      "tile %s ran %d shortcuts", name, ran);
        if (ran) {
            printf("conv int8 tile %s: %d shortcut runs bit-exact\n", name, ran);
            checked++;
        }
    }
    ck_assert_msg(checked > 0 || only_tiles, "no tile checked");
}
END_TEST

START_TEST(conv_int8_shortcut_refuses_split_k)
{
    char err[256] = "";
    int8_t in[2 * 6 * 6 * 32] = { 0 }, w[64 * 9 * 32] = { 0 }, in2[2 * 11 * 11 * 32] = { 0 }, w2[64 * 32] = { 0 };
    float bias[64] = { 0 }, mult[64] = { 0 };
    int8_t out[2 * 6 * 6 * 64];
    gpu_test_conv_shape s = { 2, 6, 6, 32, 64, 3, 3, 1, 1, 1, 0, 0 };
    const gpu_test_shortcut_s8 sc = { 32, 11, 11, 2, in2, w2, mult, bias, 1.0f };
    /* The shortcut's sums must be whole before they are requantised. */
    ck_assert_int_eq(gpu_test_conv_s8_shortcut(0, 3, &s, &sc, in, w, bias, mult, 1.f, 1.f, 0, 1, out, err, sizeof err),
                     -1);
    ck_assert_msg(strstr(err, "invalid argument") != NULL, "%s", err);
}
END_TEST

START_TEST(conv_rejects_unsupported_channels)
{
    gpu_test_conv_shape s = { 1, 5, 5, 6, 8, 3, 3, 1, 1, 1, 0, 0 };
    float in[150] = { 0 }, w[432] = { 0 }, bias[8] = { 0 }, out[200];
    char err[256] = "";
    ck_assert_int_eq(gpu_test_conv(1, 0, 1, &s, in, w, bias, NULL, 1, out, err, sizeof err), -1);
    ck_assert(strstr(err, "channels") != NULL);
}
END_TEST

int main(void)
{
    if (gpu_device_count() == 0) {
        fprintf(stderr, "no CUDA device: skipping\n");
        return 77;
    }
    const char *q = getenv("RESNETD_GPU_TEST_QUICK");
    quick = q && strcmp(q, "1") == 0;
    only_tiles = getenv("RESNETD_GPU_TEST_TILES");
    if (only_tiles && !*only_tiles)
        only_tiles = NULL;
    if (only_tiles) { /* a filter naming no tile would pass every test */
        int n = 0;
        for (int kind = 0; kind <= 2; kind++)
            for (int t = 0; t < gpu_test_conv_tiles(kind); t++)
                n += tile_selected(kind, t);
        printf("RESNETD_GPU_TEST_TILES=%s: %d tiles\n", only_tiles, n);
        if (n == 0)
            return 1;
    }
    setenv("CK_FORK", "no", 1); /* a CUDA context does not survive fork() */
    Suite *s = suite_create("gpu_kernels");
    TCase *tc = tcase_create("kernels");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, conv_fp32_matches_reference_on_ragged_shapes_every_tile);
    tcase_add_test(tc, conv_fp16_matches_reference_on_ragged_shapes_every_tile);
    tcase_add_test(tc, conv_fp32_tiles_of_one_family_give_the_same_bits);
    tcase_add_test(tc, conv_fp16_tiles_of_one_family_give_the_same_bits);
    tcase_add_test(tc, conv_fp16_with_a_shortcut_matches_reference_every_general_tile);
    tcase_add_test(tc, conv_shortcut_refused_outside_its_kinds_and_shapes);
    tcase_add_test(tc, conv_int8_matches_model_int8_bit_for_bit_every_tile);
    tcase_add_test(tc, conv_int8_with_a_shortcut_matches_model_int8_every_general_tile);
    tcase_add_test(tc, conv_int8_shortcut_refuses_split_k);
    tcase_add_test(tc, conv_int8_with_the_pool_inside_matches_model_int8_every_wgmma_tile);
    tcase_add_test(tc, conv_rejects_unsupported_channels);
    suite_add_tcase(s, tc);
    return testutil_run(s);
}
