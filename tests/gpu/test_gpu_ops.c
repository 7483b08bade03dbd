/* Unit tests of the gpu/ kernels around the convs against a CPU reference:
 * the fused stem + max pool (FP16 and INT8, bit for bit with engine/int8.h),
 * normalisation, max and average pools, and the FC's bias. The convs are
 * tests/gpu/test_gpu_kernels.c's. Exits 77 (skip) when no CUDA device is
 * usable. Every shape here is small enough for compute-sanitizer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gpu/gpu.h"
#include "gpu/gpu_test.h"
#include "engine/int8.h"
#include "tests/lib/testutil.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng_u32(void)
{
    return testutil_rand_u32(&rng_state);
}

static float rng_float(float a)
{
    return testutil_rand_float(&rng_state, a);
}

static float *rand_array(size_t n, float a)
{
    return testutil_rand_array(&rng_state, n, a);
}

static int8_t rand_s8(void)
{
    return testutil_rand_s8(&rng_state);
}

/* ---- the fused stem + max pool ----------------------------------------------- */

/* The stem's conv at stem pixel (y, x), channel k, of image b: the sum over
 * 7 filter rows, 8 taps (input column 2x - 4 + s) and 4 channels. */
static double stem_sum_f(const float *in, const float *w, int h, int b, int y, int x, int k)
{
    double acc = 0;
    for (int r = 0; r < 7; r++) {
        int iy = 2 * y - 3 + r;
        for (int s = 0; s < 8 && iy >= 0 && iy < h; s++) {
            int ix = 2 * x - 4 + s;
            if (ix < 0 || ix >= 224)
                continue;
            for (int c = 0; c < 4; c++)
                acc += (double)in[(((size_t)b * h + iy) * 224 + ix) * 4 + c] * w[((k * 7 + r) * 8 + s) * 4 + c];
        }
    }
    return acc;
}

static int32_t stem_sum_s8(const int8_t *in, const int8_t *w, int h, int b, int y, int x, int k)
{
    int32_t acc = 0;
    for (int r = 0; r < 7; r++) {
        int iy = 2 * y - 3 + r;
        for (int s = 0; s < 8 && iy >= 0 && iy < h; s++) {
            int ix = 2 * x - 4 + s;
            if (ix < 0 || ix >= 224)
                continue;
            for (int c = 0; c < 4; c++)
                acc += in[(((size_t)b * h + iy) * 224 + ix) * 4 + c] * w[((k * 7 + r) * 8 + s) * 4 + c];
        }
    }
    return acc;
}

/* The kernel's pooled output (out8 at INT8 = kind 2, else outf) against
 * the 3x3/2 max pool of the reference stem output, [N][H/2][112][64]:
 * INT8 bit for bit, FP16 within rel L2 2e-3. */
static void check_pooled(int kind, int wgmma, int ctas, const double *stem, int N, int H, const int8_t *out8,
                         const float *outf)
{
    enum { W = 224, K = 64 };
    const int ph = H / 4, pw = W / 4, sh = H / 2, sw = W / 2;
    const size_t nout = (size_t)N * ph * pw * K;
    double num = 0, den = 0;
    size_t differ = 0;
    for (int b = 0; b < N; b++)
        for (int y = 0; y < ph; y++)
            for (int x = 0; x < pw; x++)
                for (int k = 0; k < K; k++) {
                    double m = -1e300;
                    for (int sy = 2 * y - 1; sy <= 2 * y + 1; sy++)
                        for (int sx = 2 * x - 1; sx <= 2 * x + 1; sx++)
                            if (sy >= 0 && sy < sh && sx >= 0 && sx < sw) {
                                double v = stem[(((size_t)b * sh + sy) * sw + sx) * K + k];
                                m = v > m ? v : m;
                            }
                    size_t o = (((size_t)b * ph + y) * pw + x) * K + k;
                    if (kind == 2) {
                        differ += ((const uint8_t *)out8)[o] != (uint8_t)m; /* u8: it follows a ReLU */
                    } else {
                        num += (outf[o] - m) * (outf[o] - m);
                        den += m * m;
                    }
                }
    if (kind == 2)
        ck_assert_msg(differ == 0, "int8 stem + pool, %s, %d CTAs: %zu of %zu outputs differ",
                      wgmma ? "wgmma" : "mma.sync", ctas, differ, nout);
    else
        ck_assert_msg(sqrt(num / den) <= 2e-3, "fp16 stem + pool, %s, %d CTAs: rel L2 %.3g",
                      wgmma ? "wgmma" : "mma.sync", ctas, sqrt(num / den));
}

/* The conv, bias and ReLU (FP16: as FP16 values; INT8: int8.h's epilogue
 * and quantisation), then the 3x3/2 pad-1 max pool, against the kernel, at
 * image height H (its pooled rows H / 4, two an item: odd, the last item of
 * an image makes one). Both normalise images 0 and 2 from RGB bytes
 * through a table and read image 1 as given (an FP32 input the engine
 * normalised or quantised). */
static void stem_pool_case(int H)
{
    enum { N = 3, W = 224, K = 64 };
    const int which[N] = { -1, 0, -1 };
    const int ph = H / 4, pw = W / 4, sh = H / 2, sw = W / 2;
    const size_t nin = (size_t)N * H * W * 4, nw = (size_t)K * 7 * 8 * 4, nout = (size_t)N * ph * pw * K;
    char err[256];
    float *bias = rand_array(K, 0.5f), mult[K];
    double *stem = malloc((size_t)N * sh * sw * K * sizeof *stem);
    ck_assert_ptr_nonnull(stem);
    for (int kind = 1; kind <= 2; kind++) {
        float *inf = rand_array(nin, 1.0f), *wf = rand_array(nw, 0.2f), *outf = malloc(nout * sizeof *outf);
        int8_t *in8 = malloc(nin), *w8 = malloc(nw), *out8 = malloc(nout);
        ck_assert(outf && in8 && w8 && out8);
        uint8_t *rgb = malloc((size_t)N * H * W * 3);
        int8_t lut[3][256];
        float lutf[3][256];
        ck_assert_ptr_nonnull(rgb);
        for (size_t i = 0; i < (size_t)N * H * W * 3; i++)
            rgb[i] = (uint8_t)rng_u32();
        /* FP16: values FP16 holds exactly (multiples of 1/64 below 2), so
         * that the reference and the kernel see the same inputs. */
        for (int c = 0; c < 3; c++)
            for (int b = 0; b < 256; b++) {
                lut[c][b] = rand_s8();
                lutf[c][b] = roundf(rng_float(2.0f) * 64.0f) / 64.0f;
            }
        for (size_t i = 0; i < nin; i++) {
            in8[i] = rand_s8();
            inf[i] = roundf(inf[i] * 64.0f) / 64.0f;
        }
        /* The images the kernel normalises, as the reference sees them. */
        for (int b = 0; b < N; b++) {
            if (which[b] >= 0)
                continue;
            for (size_t p = 0; p < (size_t)H * W; p++)
                for (int c = 0; c < 4; c++) {
                    const uint8_t byte = rgb[((size_t)b * H * W + p) * 3 + (c < 3 ? c : 0)];
                    in8[((size_t)b * H * W + p) * 4 + c] = c < 3 ? lut[c][byte] : 0;
                    inf[((size_t)b * H * W + p) * 4 + c] = c < 3 ? lutf[c][byte] : 0.0f;
                }
        }
        for (size_t i = 0; i < nw; i++)
            w8[i] = rand_s8();
        for (int k = 0; k < K; k++)
            mult[k] = (1.0f + 0.5f * rng_float(1.0f)) / (127.0f * 127.0f * 15.0f / 2.0f);
        mult[5] = 0.0f; /* the smallest multiplier the kernel takes (>= 0): a constant epilogue */
        const float out_inv = 127.0f / 2.0f;
        for (int b = 0; b < N; b++)
            for (int y = 0; y < sh; y++)
                for (int x = 0; x < sw; x++)
                    for (int k = 0; k < K; k++) {
                        double v;
                        if (kind == 2) {
                            float f = testutil_int8_epilogue(stem_sum_s8(in8, w8, H, b, y, x, k), mult[k], bias[k],
                                                             NULL, 0, 0.f, 1);
                            v = int8_quantize_u8(f, out_inv);
                        } else {
                            v = stem_sum_f(inf, wf, H, b, y, x, k) + bias[k];
                            v = v < 0 ? 0 : v;
                        }
                        stem[(((size_t)b * sh + y) * sw + x) * K + k] = v;
                    }
        /* The images not given as FP32 tensors (which) are poisoned in the
         * copy of the input the kernel gets, so that it must read them from
         * rgb (FP16: 65024, the half 0x7bf0). */
        const size_t ebytes = kind == 2 ? 1 : sizeof(float);
        unsigned char *given = malloc(nin * ebytes);
        ck_assert_ptr_nonnull(given);
        memcpy(given, kind == 2 ? (void *)in8 : (void *)inf, nin * ebytes);
        for (int b = 0; b < N; b++)
            if (which[b] < 0) {
                if (kind == 2)
                    memset(given + (size_t)b * H * W * 4, 0x7f, (size_t)H * W * 4);
                else
                    for (size_t i = 0; i < (size_t)H * W * 4; i++)
                        ((float *)given)[(size_t)b * H * W * 4 + i] = 65024.0f;
            }
        /* The CTAs take runs of consecutive items, each after the first in
         * an image keeping what the one above left. One CTA through all the
         * items (its raw-row buffers each refilled after use, and not filled
         * for image 1's items), then 2 and 5 CTAs, runs of 5 and 2 of the 9
         * items: runs that start inside an image and cross into the next.
         * Both kernel families: mma.sync, and wgmma where the device has it. */
        for (int step = 0; step < 6; step++) {
            const int wgmma = step / 3, ctas = (const int[]){ 1, 2, 5 }[step % 3];
            int rc = kind == 2 ? gpu_test_stem_pool(2, wgmma, ctas, N, H, given, rgb, &lut[0][0], which, w8, bias, mult,
                                                    out_inv, out8, err, sizeof err)
                               : gpu_test_stem_pool(1, wgmma, ctas, N, H, given, rgb, &lutf[0][0], which, wf, bias,
                                                    NULL, 0.f, outf, err, sizeof err);
            ck_assert_msg(rc >= 0, "%s", err);
            if (rc == 1) {
                if (ctas == 1)
                    printf("%s stem + pool: no wgmma kernels on this device or build, skipped\n",
                           kind == 2 ? "int8" : "fp16");
                continue;
            }
            check_pooled(kind, wgmma, ctas, stem, N, H, out8, outf);
        }
        free(given);
        free(rgb);
        free(inf);
        free(wf);
        free(outf);
        free(in8);
        free(w8);
        free(out8);
    }
    free(bias);
    free(stem);
}

START_TEST(stem_and_max_pool_fused_match_reference)
{
    stem_pool_case(20);
    stem_pool_case(24);
}
END_TEST

START_TEST(normalize_and_maxpool_int8_match_model_int8)
{
    char err[256];
    int8_t lut[3][256];
    for (int c = 0; c < 3; c++)
        for (int v = 0; v < 256; v++)
            lut[c][v] = rand_s8();
    long npix = 3 * 37 * 29;
    uint8_t *in = malloc((size_t)npix * 3);
    int8_t *out = malloc((size_t)npix * 4);
    ck_assert(in && out);
    for (long i = 0; i < npix * 3; i++)
        in[i] = (uint8_t)rng_u32();
    ck_assert_msg(gpu_test_normalize_s8(in, npix, lut, out, err, sizeof err) == 0, "%s", err);
    for (long p = 0; p < npix; p++)
        for (int c = 0; c < 4; c++)
            ck_assert_msg(out[p * 4 + c] == (c < 3 ? lut[c][in[p * 3 + c]] : 0), "pixel %ld channel %d", p, c);
    free(in);
    free(out);

    static const int shapes[][4] = { { 2, 13, 13, 16 }, { 1, 112, 112, 64 }, { 3, 6, 9, 32 } };
    for (int i = 0; i < 3; i++) {
        int n = shapes[i][0], h = shapes[i][1], w = shapes[i][2], c = shapes[i][3];
        int oh = (h - 1) / 2 + 1, ow = (w - 1) / 2 + 1;
        size_t nin = (size_t)n * h * w * c;
        /* u8 values (the stem's output follows a ReLU): random bytes. */
        uint8_t *x = malloc(nin), *y = malloc((size_t)n * oh * ow * c);
        ck_assert(x && y);
        for (size_t j = 0; j < nin; j++)
            x[j] = (uint8_t)rng_u32();
        ck_assert_msg(gpu_test_maxpool_s8((const int8_t *)x, n, h, w, c, oh, ow, (int8_t *)y, err, sizeof err) == 0,
                      "%s", err);
        for (int b = 0; b < n; b++)
            for (int oy = 0; oy < oh; oy++)
                for (int ox = 0; ox < ow; ox++)
                    for (int ch = 0; ch < c; ch++) {
                        int m = -1;
                        for (int iy = oy * 2 - 1; iy <= oy * 2 + 1; iy++)
                            for (int ix = ox * 2 - 1; ix <= ox * 2 + 1; ix++)
                                if (iy >= 0 && iy < h && ix >= 0 && ix < w &&
                                    x[(((size_t)b * h + iy) * w + ix) * c + ch] > m)
                                    m = x[(((size_t)b * h + iy) * w + ix) * c + ch];
                        ck_assert_int_eq(y[(((size_t)b * oh + oy) * ow + ox) * c + ch], m);
                    }
        free(x);
        free(y);
    }
}
END_TEST

/* ---- normalise ------------------------------------------------------------ */

static void check_normalize(int fp16)
{
    static const float mean[3] = { 0.485f, 0.456f, 0.406f }, std[3] = { 0.229f, 0.224f, 0.225f };
    long npix = 3 * 37 * 29; /* not a multiple of the block */
    uint8_t *in = malloc((size_t)npix * 3);
    float *out = malloc((size_t)npix * 4 * sizeof *out);
    char err[256];
    ck_assert(in && out);
    for (long i = 0; i < npix * 3; i++)
        in[i] = (uint8_t)rng_u32();
    ck_assert_msg(gpu_test_normalize(fp16, in, npix, out, err, sizeof err) == 0, "%s", err);
    double num = 0, den = 0;
    for (long p = 0; p < npix; p++) {
        for (int c = 0; c < 3; c++) {
            float ref = ((float)in[p * 3 + c] / 255.0f - mean[c]) / std[c];
            double d = out[p * 4 + c] - ref;
            num += d * d;
            den += (double)ref * ref;
        }
        ck_assert_msg(out[p * 4 + 3] == 0.0f, "pad channel of pixel %ld not zero", p);
    }
    double rel = sqrt(num / den);
    ck_assert_msg(rel <= (fp16 ? 1e-3 : 1e-7), "normalize rel L2 %.3g", rel);
    free(in);
    free(out);
}

START_TEST(normalize_matches_reference)
{
    check_normalize(0);
    check_normalize(1);
}
END_TEST

/* ---- max pool -------------------------------------------------------------- */

static void check_maxpool(int fp16, int n, int h, int w, int c)
{
    int oh = (h + 2 - 3) / 2 + 1, ow = (w + 2 - 3) / 2 + 1;
    size_t nin = (size_t)n * h * w * c, nout = (size_t)n * oh * ow * c;
    float *in = rand_array(nin, 4.0f), *out = malloc(nout * sizeof *out);
    char err[256];
    ck_assert_ptr_nonnull(out);
    ck_assert_msg(gpu_test_maxpool(fp16, in, n, h, w, c, oh, ow, out, err, sizeof err) == 0, "%s", err);
    for (int b = 0; b < n; b++)
        for (int y = 0; y < oh; y++)
            for (int x = 0; x < ow; x++)
                for (int ch = 0; ch < c; ch++) {
                    float m = -INFINITY;
                    for (int dy = -1; dy <= 1; dy++)
                        for (int dx = -1; dx <= 1; dx++) {
                            int iy = y * 2 + dy, ix = x * 2 + dx;
                            if (iy >= 0 && iy < h && ix >= 0 && ix < w) {
                                float v = in[(((size_t)b * h + iy) * w + ix) * c + ch];
                                m = v > m ? v : m;
                            }
                        }
                    float g = out[(((size_t)b * oh + y) * ow + x) * c + ch];
                    ck_assert_msg(g == m, "maxpool (%d,%d,%d,%d): %g != %g", b, y, x, ch, g, m);
                }
    free(in);
    free(out);
}

START_TEST(maxpool_matches_reference_on_odd_and_even_sizes)
{
    for (int fp16 = 0; fp16 <= 1; fp16++) {
        check_maxpool(fp16, 2, 13, 13, 16);
        check_maxpool(fp16, 1, 112, 112, 64);
        check_maxpool(fp16, 3, 6, 9, 8);
    }
}
END_TEST

/* ---- average pool ------------------------------------------------------------ */

START_TEST(avgpool_matches_reference)
{
    /* kinds 0 FP32, 1 FP16, 2 INT8's head (engine/int8.h: exact, as each
     * sum is exact in float64 here); c = 520 leaves a partial block. */
    for (int kind = 0; kind <= 2; kind++) {
        int n = 3, hw = 49, c = 520;
        float *in = rand_array((size_t)n * hw * c, 3.0f), *out = malloc((size_t)n * c * sizeof(float));
        double *ref = malloc((size_t)n * c * sizeof *ref);
        char err[256];
        int exact = 0;
        ck_assert(out && ref);
        ck_assert_msg(gpu_test_avgpool(kind, in, n, hw, c, out, err, sizeof err) == 0, "%s", err);
        for (int b = 0; b < n; b++)
            for (int ch = 0; ch < c; ch++) {
                double s = 0;
                for (int j = 0; j < hw; j++)
                    s += in[((size_t)b * hw + j) * c + ch];
                ref[(size_t)b * c + ch] = s / hw;
                if (kind == 2)
                    exact += out[(size_t)b * c + ch] == int8_round_half((float)(s / hw));
            }
        double rel = testutil_rel_l2_d(out, ref, (size_t)n * c);
        ck_assert_msg(rel <= (kind == 0 ? 1e-6 : 2e-3), "avgpool kind %d rel L2 %.3g", kind, rel);
        if (kind == 2)
            ck_assert_msg(exact == n * c, "INT8 avgpool: %d of %d features as engine/int8.h", exact, n * c);
        free(in);
        free(out);
        free(ref);
    }
}
END_TEST

/* ---- the FC's bias ------------------------------------------------------------- */

/* N images of C classes: every logit gets its class's bias, bit for bit as
 * the host adds it. */
static void check_fc_bias(int N, int C)
{
    float *logits = rand_array((size_t)N * C, 8.0f), *bias = rand_array((size_t)C, 2.0f);
    float *out = malloc((size_t)N * C * sizeof *out);
    char err[256];
    ck_assert(out);
    ck_assert_msg(gpu_test_fc_bias(logits, bias, N, C, out, err, sizeof err) == 0, "%s", err);
    for (int b = 0; b < N; b++)
        for (int j = 0; j < C; j++)
            ck_assert_msg(out[(size_t)b * C + j] == logits[(size_t)b * C + j] + bias[j], "%d classes: logit %d,%d", C,
                          b, j);
    free(logits);
    free(bias);
    free(out);
}

START_TEST(fc_bias_matches_reference)
{
    check_fc_bias(7, 1000); /* ImageNet's head */
    check_fc_bias(13, 10); /* a fine-tune's head */
    check_fc_bias(1, 3001); /* one image, more classes than a block */
    check_fc_bias(257, 7); /* more images than a block's threads */
}
END_TEST

int main(void)
{
    if (gpu_device_count() == 0) {
        fprintf(stderr, "no CUDA device: skipping\n");
        return 77;
    }
    setenv("CK_FORK", "no", 1); /* a CUDA context does not survive fork() */
    Suite *s = suite_create("gpu_ops");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, normalize_and_maxpool_int8_match_model_int8);
    tcase_add_test(tc, stem_and_max_pool_fused_match_reference);
    tcase_add_test(tc, normalize_matches_reference);
    tcase_add_test(tc, maxpool_matches_reference_on_odd_and_even_sizes);
    tcase_add_test(tc, avgpool_matches_reference);
    tcase_add_test(tc, fc_bias_matches_reference);
    suite_add_tcase(s, tc);
    return testutil_run(s);
}
