/* Tests engine/engine_cpu_int8.c and engine/calib.c: the INT8 CPU engine
 * against tests/reference.py's independent torch emulation of
 * engine/int8.h, with the same table (tests/ref/int8/table.json).
 *
 * Tolerance: both sides compute every int8 tensor exactly (integer convs,
 * the same float32 epilogue steps, the same rounding), so the int8
 * activations are identical; what differs is only the summation order of
 * the FP32 average pool and FC (the reference does them in float64). That
 * is float32 rounding of a 512-term dot product, about 1e-7 relative, so
 * rel L2 <= 1e-5 per image and equal top-5. A single int8 value off by one
 * anywhere in the network moves the logits by far more (~1e-4 and up), so
 * this checks the integer path, not just closeness.
 *
 * Every GEMM tile the CPU has (AMX, AVX512-VNNI, AVX2, generic) is
 * checked, and all must give the same bits. Also: batch size and thread
 * count change nothing (bit for bit; on every tile, the same image at any
 * position of any batch size 1..8), tables
 * round-trip exactly, bad tables are refused with a reason, and
 * engine_create refuses INT8 without a table or with another weights'.
 *
 * Precision mixes (engine/calib.h): at each float mix, on each FP32 GEMM
 * back end (RESNETD_CPU_GEMM) that runs its float prefix, the engine's
 * logits of the random images against reference.py's emulation with an
 * FP32 prefix, and every INT8 tile gives the same bits. Tables with a mix
 * round-trip (version 3), older tables (versions 1 and 2, int8 everywhere)
 * load as the same thresholds at u8, malformed ones are refused; each
 * mix's float convs and boundary are as documented.
 *
 * Tolerance of a mix: after the boundary both sides are exact, but before
 * it torch and the engine add the FP32 sums in different orders, so a
 * boundary value within an ulp or so of a rounding midpoint can quantise
 * to the neighbouring int8 level. Emulations whose sums differ in order
 * (float64 sums, sums split in two halves of the channels) flip 0 to 4 of
 * the boundary's 50k-200k values per image. The INT8 layers after it are
 * chaotic: each flip spreads through every requantisation, and one to four
 * of them move an image's logits by up to 0.018 rel L2 (none: 1e-7).
 * Measured so, the mean over the 8 images is at most 0.0066 and one image
 * at most 0.0175, while any other mix's emulation is 0.035 or more away
 * on average (0.01 on a single image). Hence MIX_TOL_MEAN 0.015, about
 * 2.3x from either side, MIX_TOL_IMAGE 0.03, and the mean against every
 * other mix's emulation (int8's included) must be 3x the mean against its
 * own (testutil_expect_nearest), so an engine that ignored the mix fails. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "engine/calib.h"
#include "engine/engine.h"
#include "engine/engine_cpu.h"
#include "engine/engine_registry.h"
#include "image/preprocess.h"
#include "util/npy.h"
#include "model/resnet18.h"
#include "tests/lib/invariance.h"
#include "tests/lib/testutil.h"

#define REL_L2_MAX 1e-5
#define NKERNELS 4
#define NGEMMS 2
#define MIX_TOL_MEAN 0.015
#define MIX_TOL_IMAGE 0.03

/* The GEMM tiles (RESNETD_CPU_INT8_GEMM): all must give the same integers. */
static const char *const kernels[NKERNELS] = { "amx", "vnni", "avx2", "generic" };
/* The FP32 GEMM back ends (RESNETD_CPU_GEMM) of a mix's float prefix. */
static const char *const gemms[NGEMMS] = { "avx512", "blas" };

static void load_weights(resnet18_weights *w)
{
    char err[512];
    ck_assert_msg(weights_load(testutil_ref_path("weights.safetensors"), w, err, sizeof err) == 0, "weights_load: %s",
                  err);
}

static void load_table(calib_table *t)
{
    char err[512];
    ck_assert_msg(calib_load(testutil_ref_path("int8/table.json"), t, err, sizeof err) == 0, "%s", err);
}

static void load_npy(const char *name, const char *dtype, npy_array *a)
{
    char err[512];
    ck_assert_msg(npy_read(testutil_ref_path(name), a, err, sizeof err) == 0, "%s: %s", name, err);
    ck_assert_msg(strcmp(a->dtype, dtype) == 0, "%s: dtype %s, want %s", name, a->dtype, dtype);
}

/* NULL (and says so) when this CPU cannot run kernel k, or the FP32 back
 * end that RESNETD_CPU_GEMM forces for a mix's float prefix. */
static engine *make_kernel_engine(int k, const resnet18_weights *w, const calib_table *t, int max_batch)
{
    ck_assert_int_eq(setenv("RESNETD_CPU_INT8_GEMM", kernels[k], 1), 0);
    engine_config cfg = {
        .device = ENGINE_DEVICE_CPU, .precision = ENGINE_PRECISION_INT8, .max_batch = max_batch, .calib = t
    };
    char err[512] = "";
    engine *e = engine_create(w, &cfg, err, sizeof err);
    if (!e && strstr(err, "but this CPU lacks") && (k < NKERNELS - 1 || strstr(err, "AVX-512F"))) {
        fprintf(stderr, "%s: %s tile not tested\n", err, kernels[k]);
        return NULL;
    }
    ck_assert_msg(e != NULL, "engine_create(int8, %s): %s", kernels[k], err);
    return e;
}

static engine *make_engine(const resnet18_weights *w, const calib_table *t, int max_batch, int threads)
{
    ck_assert_int_eq(unsetenv("RESNETD_CPU_INT8_GEMM"), 0);
    engine_config cfg = { .device = ENGINE_DEVICE_CPU,
                          .precision = ENGINE_PRECISION_INT8,
                          .max_batch = max_batch,
                          .threads = threads,
                          .calib = t };
    char err[512] = "";
    engine *e = engine_create(w, &cfg, err, sizeof err);
    ck_assert_msg(e != NULL, "engine_create(int8): %s", err);
    ck_assert_int_eq(e->device, ENGINE_DEVICE_CPU);
    ck_assert_int_eq(e->precision, ENGINE_PRECISION_INT8);
    ck_assert_str_eq(engine_precision_name(e->precision), "int8");
    return e;
}

/* Runs the first n images of slot 0 (already filled), logits poisoned first. */
static void run(engine *e, int n)
{
    char err[512] = "";
    for (size_t i = 0; i < (size_t)e->max_batch * (size_t)e->classes; i++)
        e->logits[0][i] = NAN;
    ck_assert_msg(engine_submit(e, 0, n, err, sizeof err) == 0, "submit: %s", err);
    ck_assert_msg(engine_wait(e, 0, err, sizeof err) == 0, "wait: %s", err);
}

static void expect_logits(const float *got, const float *want, int n, int classes, const char *what)
{
    double worst = 0;
    for (int i = 0; i < n; i++) {
        const float *g = got + (size_t)i * classes, *r = want + (size_t)i * classes;
        double rel = testutil_rel_l2(g, r, (size_t)classes);
        ck_assert_msg(rel <= REL_L2_MAX, "%s image %d: rel L2 %.3g > %.3g", what, i, rel, REL_L2_MAX);
        int tg[5], tr[5];
        testutil_topk(g, classes, 5, tg);
        testutil_topk(r, classes, 5, tr);
        for (int k = 0; k < 5; k++)
            ck_assert_msg(tg[k] == tr[k], "%s image %d: top-5 differ at rank %d", what, i, k);
        if (rel > worst)
            worst = rel;
    }
    fprintf(stderr, "%s: %d images, worst rel L2 vs the torch INT8 emulation %.3g\n", what, n, worst);
}

START_TEST(uint8_images_match_the_torch_int8_emulation)
{
    testutil_require_reference();
    resnet18_weights w;
    calib_table t;
    load_weights(&w);
    load_table(&t);
    npy_array img, ref;
    load_npy("random_u8.npy", "|u1", &img);
    load_npy("int8/random_logits.npy", "<f4", &ref);
    const int n = (int)img.shape[0];
    ck_assert_uint_eq(ref.count, (size_t)n * (size_t)w.classes);
    engine *e = make_kernel_engine(_i, &w, &t, n);
    if (e) {
        memcpy(e->input[0], img.data, (size_t)n * RESNET18_INPUT_BYTES);
        run(e, n);
        char what[64];
        snprintf(what, sizeof what, "%s: random uint8 images", kernels[_i]);
        expect_logits(e->logits[0], ref.data, n, e->classes, what);
        engine_destroy(e);
    }
    weights_free(&w);
    npy_free(&img);
    npy_free(&ref);
}
END_TEST

/* The test JPEGs' torchvision input tensors, given as FP32 (input_f32). */
START_TEST(fp32_input_tensors_match_the_torch_int8_emulation)
{
    const char *ref_dir = testutil_require_reference();
    resnet18_weights w;
    calib_table t;
    load_weights(&w);
    load_table(&t);
    npy_array ref;
    load_npy("int8/logits.npy", "<f4", &ref);
    const int n = (int)ref.shape[0];
    engine *e = make_kernel_engine(_i, &w, &t, 8);
    if (!e) {
        weights_free(&w);
        npy_free(&ref);
        return;
    }
    char path[4096], name[256];
    snprintf(path, sizeof path, "%s/jpegs.txt", ref_dir);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s", path);
    npy_array in[8];
    int done = 0;
    while (done < n) {
        int b = 0;
        for (; b < 8 && done + b < n; b++) {
            ck_assert(fscanf(f, "%255s", name) == 1);
            char rel[300];
            snprintf(rel, sizeof rel, "input/%s.npy", name);
            load_npy(rel, "<f4", &in[b]);
            ck_assert_uint_eq(in[b].count, 3u * RESNET18_IMG * RESNET18_IMG);
            e->input_f32[0][b] = in[b].data;
        }
        run(e, b);
        char what[64];
        snprintf(what, sizeof what, "%s: JPEG input tensors %d..%d", kernels[_i], done, done + b - 1);
        expect_logits(e->logits[0], (const float *)ref.data + (size_t)done * e->classes, b, e->classes, what);
        for (int i = 0; i < b; i++) {
            e->input_f32[0][i] = NULL;
            npy_free(&in[i]);
        }
        done += b;
    }
    ck_assert_int_eq(fclose(f), 0);
    engine_destroy(e);
    weights_free(&w);
    npy_free(&ref);
}
END_TEST

/* The AMX, VNNI, AVX2 (vector epilogues included) and generic tiles give
 * the same bits: the last conv's FP32 output, which every int8 tensor
 * before it feeds, and the logits. Random and smooth images plus a
 * non-finite FP32 one, with the reference table, with its scales divided
 * by 8 (most values clamp at the ends: +-127, or 255 for u8), and with
 * subnormal scales, whose inverses are +inf: every nonzero value quantises
 * to an end and every zero to NaN, which must give 0 (the epilogues' NaN
 * paths). */
/* The reference weights, table and random uint8 images. */
/* A table for synthetic weights, every scale 0.05. */
static void synthetic_table(calib_table *t)
{
    memset(t, 0, sizeof *t);
    snprintf(t->weights_sha256, sizeof t->weights_sha256, "%s", CALIB_WEIGHTS_SYNTHETIC);
    for (int i = 0; i < CALIB_NTENSORS; i++)
        t->scale[i] = 0.05f;
}

static void load_reference(resnet18_weights *w, calib_table *t, npy_array *img)
{
    testutil_require_reference();
    load_weights(w);
    load_table(t);
    load_npy("random_u8.npy", "|u1", img);
}

START_TEST(every_int8_tile_gives_the_same_bits)
{
    resnet18_weights w;
    calib_table t;
    npy_array img;
    load_reference(&w, &t, &img);
    const int n = (int)img.shape[0] + 1, C = w.classes;
    const size_t last_n = (size_t)n * 7 * 7 * 512;
    static float bad[3 * RESNET18_IMG * RESNET18_IMG];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        bad[i] = i % 5 == 0 ? NAN : i % 5 == 1 ? INFINITY : i % 5 == 2 ? -INFINITY : (float)(i % 7) - 3.0f;
    float *want_last = malloc(last_n * sizeof(float)), *want_logits = malloc((size_t)n * C * sizeof(float));
    ck_assert(want_last && want_logits);
    static const char *const tables[] = { "reference", "coarse", "subnormal" };
    int ran = 0;
    for (int variant = 0; variant < 3; variant++) {
        for (int i = 0; i < CALIB_NTENSORS && variant > 0; i++)
            t.scale[i] = variant == 1 ? t.scale[i] / 8 : 1e-40f;
        int first = 1;
        ran = 0;
        for (int k = 0; k < NKERNELS; k++) {
            engine *e = make_kernel_engine(k, &w, &t, n);
            if (!e)
                continue;
            memcpy(e->input[0], img.data, (size_t)(n - 1) * RESNET18_INPUT_BYTES);
            e->input_f32[0][n - 1] = bad;
            run(e, n);
            const float *last = engine_cpu_int8_last_conv(e);
            ck_assert_ptr_nonnull(last);
            ran++;
            if (first) {
                memcpy(want_last, last, last_n * sizeof(float));
                memcpy(want_logits, e->logits[0], (size_t)n * C * sizeof(float));
                first = 0;
            } else {
                ck_assert_msg(memcmp(last, want_last, last_n * sizeof(float)) == 0,
                              "%s table: the last conv's output of the %s tile differs", tables[variant], kernels[k]);
                ck_assert_msg(memcmp(e->logits[0], want_logits, (size_t)n * C * sizeof(float)) == 0,
                              "%s table: the logits of the %s tile differ", tables[variant], kernels[k]);
            }
            engine_destroy(e);
        }
    }
    if (ran < 2)
        fprintf(stderr, "only %d INT8 tile on this CPU: no two tiles to compare\n", ran);
    free(want_last);
    free(want_logits);
    weights_free(&w);
    npy_free(&img);
}
END_TEST

/* Per-image results do not depend on the batch or the threads: bit for bit. */
/* On every tile the CPU has: the same image gives the same bits at every
 * position of every batch size 1..8, beside other images. */
START_TEST(same_image_same_bits_at_any_position_and_batch_size)
{
    testutil_require_reference();
    resnet18_weights w;
    calib_table t;
    load_weights(&w);
    load_table(&t);
    npy_array img;
    load_npy("random_u8.npy", "|u1", &img);
    ck_assert_int_ge((int)img.shape[0], 8);
    const int max = 8;
    engine *e = make_kernel_engine(_i, &w, &t, max);
    weights_free(&w);
    if (e) {
        int sizes[8];
        int n = invariance_all_sizes(max, sizes);
        invariance_check(e, (const uint8_t *)img.data + 3 * (size_t)RESNET18_INPUT_BYTES, 5, sizes, n, kernels[_i], 1);
        engine_destroy(e);
    }
    ck_assert_int_eq(unsetenv("RESNETD_CPU_INT8_GEMM"), 0);
    npy_free(&img);
}
END_TEST

START_TEST(batch_size_and_threads_change_nothing)
{
    resnet18_weights w;
    calib_table t;
    npy_array img;
    load_reference(&w, &t, &img);
    const int n = 4, C = w.classes;
    float *alone = malloc((size_t)n * C * sizeof(float));
    ck_assert_ptr_nonnull(alone);
    engine *e = make_engine(&w, &t, n, 1);
    for (int i = 0; i < n; i++) {
        memcpy(e->input[0], (const uint8_t *)img.data + (size_t)i * RESNET18_INPUT_BYTES, RESNET18_INPUT_BYTES);
        run(e, 1);
        memcpy(alone + (size_t)i * C, e->logits[0], (size_t)C * sizeof(float));
    }
    engine_destroy(e);
    for (int threads = 2; threads <= 3; threads++) {
        e = make_engine(&w, &t, n, threads);
        memcpy(e->input[0], img.data, (size_t)n * RESNET18_INPUT_BYTES);
        run(e, n);
        ck_assert_msg(memcmp(e->logits[0], alone, (size_t)n * C * sizeof(float)) == 0,
                      "batch of %d on %d threads differs from one image at a time on 1", n, threads);
        engine_destroy(e);
    }
    free(alone);
    weights_free(&w);
    npy_free(&img);
}
END_TEST

START_TEST(int8_is_refused_without_a_table_or_with_another_weights_table)
{
    resnet18_weights w;
    char err[512];
    ck_assert_int_eq(weights_synthetic(7, &w, err, sizeof err), 0);
    calib_table t;
    memset(&t, 0, sizeof t);
    for (int i = 0; i < CALIB_NTENSORS; i++)
        t.scale[i] = 0.05f;
    snprintf(t.weights_sha256, sizeof t.weights_sha256, "%064d", 0);
    engine_config cfg = { .device = ENGINE_DEVICE_CPU, .precision = ENGINE_PRECISION_INT8, .max_batch = 1 };
    ck_assert_ptr_null(engine_create(&w, &cfg, err, sizeof err));
    ck_assert_msg(strstr(err, "calibration table") != NULL, "%s", err);
    cfg.calib = &t;
    ck_assert_ptr_null(engine_create(&w, &cfg, err, sizeof err));
    ck_assert_msg(strstr(err, "made for weights with SHA-256 0000") != NULL, "%s", err);
    snprintf(t.weights_sha256, sizeof t.weights_sha256, "%s", CALIB_WEIGHTS_SYNTHETIC);
    engine *e = engine_create(&w, &cfg, err, sizeof err);
    ck_assert_msg(e != NULL, "%s", err);
    ck_assert_int_eq(engine_warm_up(e, err, sizeof err), 0);
    /* Observing needs the FP32 engine: an INT8 one has no FP32 tensors. */
    ck_assert_int_eq(engine_cpu_observe(e, NULL, NULL, err, sizeof err), -1);
    engine_destroy(e);
    weights_free(&w);
}
END_TEST

/* A non-finite FP32 input quantises as int8.h says (NaN 0, +-inf +-127):
 * defined behaviour, finite logits. */
START_TEST(non_finite_fp32_input_gives_finite_logits)
{
    resnet18_weights w;
    char err[512];
    ck_assert_int_eq(weights_synthetic(7, &w, err, sizeof err), 0);
    calib_table t;
    synthetic_table(&t);
    engine *e = make_engine(&w, &t, 1, 1);
    static float bad[3 * RESNET18_IMG * RESNET18_IMG];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        bad[i] = i % 3 == 0 ? NAN : i % 3 == 1 ? INFINITY : -INFINITY;
    e->input_f32[0][0] = bad;
    run(e, 1);
    for (int k = 0; k < e->classes; k++)
        ck_assert_msg(isfinite(e->logits[0][k]), "logit %d of a non-finite input is %g", k, e->logits[0][k]);
    engine_destroy(e);
    weights_free(&w);
}
END_TEST

static char tmpdir[64];

static const char *tmp_path(const char *name)
{
    static char p[128];
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/test_engine_int8.XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    }
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    return p;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fputs(text, f) >= 0, 1);
    ck_assert_int_eq(fclose(f), 0);
}

START_TEST(tables_round_trip_every_float_exactly)
{
    calib_table t, back;
    memset(&t, 0, sizeof t);
    snprintf(t.weights_sha256, sizeof t.weights_sha256, "%s",
             "0123456789abcdef0123456789abcdef"
             "0123456789abcdef0123456789abcdef");
    t.method = CALIB_PERCENTILE;
    t.percentile = 99.99;
    t.images = 123;
    t.check = (calib_check){ .images = 357, .agreement = 100.0 * 349 / 357, .rel_l2 = 0.0132 };
    /* Awkward floats: a subnormal-free spread with full mantissas. */
    for (int i = 0; i < CALIB_NTENSORS; i++)
        t.scale[i] = nextafterf(0.01f * (float)(i + 1) / 3.0f, 1.0f);
    char err[512];
    const char *p = tmp_path("t.json");
    ck_assert_msg(calib_save(p, &t, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(calib_load(p, &back, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(back.weights_sha256, t.weights_sha256);
    ck_assert_int_eq(back.method, CALIB_PERCENTILE);
    ck_assert_int_eq(back.images, 123);
    ck_assert(back.percentile == 99.99);
    ck_assert_int_eq(back.check.images, 357);
    ck_assert(back.check.agreement == t.check.agreement && back.check.rel_l2 == t.check.rel_l2);
    for (int i = 0; i < CALIB_NTENSORS; i++)
        ck_assert_msg(back.scale[i] == t.scale[i], "scale %d: %.9g != %.9g", i, back.scale[i], t.scale[i]);
    ck_assert_int_eq(unlink(p), 0);
    ck_assert_int_eq(rmdir(tmpdir), 0);
    tmpdir[0] = '\0';
}
END_TEST

/* Each bad table is refused with a message that says what is wrong. */
START_TEST(bad_tables_are_refused_with_a_reason)
{
    static const struct {
        const char *json, *want;
    } cases[] = {
        { "not json", "not JSON" },
        { "{\"format\": \"other\"}", "not a resnetd INT8 calibration table" },
        { "{\"format\": \"resnetd-int8-calibration\", \"version\": 4}", "unsupported \"version\"" },
        { "{\"format\": \"resnetd-int8-calibration\", \"version\": 0}", "unsupported \"version\"" },
        { "{\"format\": \"resnetd-int8-calibration\", \"version\": 1, \"mix\": \"float:stem\"}",
          "\"mix\" is required from version 2 and not allowed in version 1" },
        { "{\"format\": \"resnetd-int8-calibration\", \"version\": 2, \"weights_sha256\": \"synthetic\"}",
          "\"mix\" is required from version 2 and not allowed in version 1" },
        { "{\"format\": \"resnetd-int8-calibration\", \"version\": 3, \"weights_sha256\": \"synthetic\"}",
          "\"mix\" is required from version 2 and not allowed in version 1" },
        { "{\"format\": \"resnetd-int8-calibration\", \"version\": 2, \"mix\": \"float:layer4\"}",
          "\"mix\" must be one of int8, float:stem, float:layer1.0" },
        { "{\"format\": \"resnetd-int8-calibration\", \"version\": 2, \"mix\": \"FLOAT:STEM\"}", "\"mix\" must be" },
        { "{\"format\": \"resnetd-int8-calibration\", \"version\": 2, \"mix\": 1}", "\"mix\" must be" },
        { "{\"format\": \"resnetd-int8-calibration\", \"version\": 1, \"weights_sha256\": \"xyz\"}", "weights_sha256" },
        { "{\"format\": \"resnetd-int8-calibration\", \"version\": 1, \"weights_sha256\": \"synthetic\", "
          "\"method\": \"entropy\", \"images\": 1, \"scales\": {\"input\": 0.1}}",
          "has no scale for tensor conv1" },
        { "{\"format\": \"resnetd-int8-calibration\", \"version\": 1, \"weights_sha256\": \"synthetic\", "
          "\"method\": \"minmax\", \"images\": 1, \"scales\": {}}",
          "\"method\"" },
        { "{\"format\": \"resnetd-int8-calibration\", \"version\": 1, \"weights_sha256\": \"synthetic\", "
          "\"method\": \"entropy\", \"images\": 1, \"scales\": {}, \"check\": {\"images\": 0, "
          "\"top1_agreement\": 99, \"rel_l2\": 0.01}}",
          "\"check\" must be" },
        { "{\"format\": \"resnetd-int8-calibration\", \"version\": 1, \"weights_sha256\": \"synthetic\", "
          "\"method\": \"entropy\", \"images\": 1, \"scales\": {}, \"check\": {\"images\": 10, "
          "\"top1_agreement\": 101, \"rel_l2\": 0.01}}",
          "agreement outside 0..100" },
        { "{\"format\": \"resnetd-int8-calibration\", \"version\": 1, \"weights_sha256\": \"synthetic\", "
          "\"method\": \"entropy\", \"images\": 1, \"scales\": {}, \"check\": {\"images\": 10, "
          "\"top1_agreement\": 99, \"rel_l2\": -1}}",
          "rel_l2 that is not" },
    };
    char err[512], p[128];
    calib_table t;
    snprintf(p, sizeof p, "%s", tmp_path("bad.json"));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_text(p, cases[i].json);
        ck_assert_int_eq(calib_load(p, &t, err, sizeof err), -1);
        ck_assert_msg(strstr(err, cases[i].want) && strstr(err, p), "case %zu: '%s' lacks '%s'", i, err, cases[i].want);
    }
    /* A whole table with one scale zero, then with an extra tensor. */
    calib_table good;
    memset(&good, 0, sizeof good);
    snprintf(good.weights_sha256, sizeof good.weights_sha256, "%s", CALIB_WEIGHTS_SYNTHETIC);
    good.images = 1;
    for (int i = 0; i < CALIB_NTENSORS; i++)
        good.scale[i] = 0.5f;
    good.scale[5] = 0.0f;
    ck_assert_int_eq(calib_save(p, &good, err, sizeof err), 0);
    ck_assert_int_eq(calib_load(p, &t, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "not a positive float32") && strstr(err, calib_tensor_name(5)), "%s", err);
    /* Scales whose reciprocal or products are not finite: a subnormal one
     * (1 / s is inf) and a huge one (s_in * s_w overflows). */
    static const float odd[] = { 1e-40f, 1e35f };
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        good.scale[5] = odd[i];
        ck_assert_int_eq(calib_save(p, &good, err, sizeof err), 0);
        ck_assert_int_eq(calib_load(p, &t, err, sizeof err), -1);
        ck_assert_msg(strstr(err, "not a positive float32") && strstr(err, calib_tensor_name(5)), "%g: %s",
                      (double)odd[i], err);
    }
    ck_assert_int_eq(calib_load(tmp_path("missing.json"), &t, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "cannot read"), "%s", err);
    ck_assert_int_eq(unlink(p), 0);
    ck_assert_int_eq(rmdir(tmpdir), 0);
    tmpdir[0] = '\0';
}
END_TEST

/* The histogram doubles its range as larger values come, and the two
 * statistics read it as documented. */
START_TEST(histogram_statistics)
{
    static calib_hist h;
    memset(&h, 0, sizeof h);
    float x[1000];
    for (int i = 0; i < 1000; i++)
        x[i] = (float)(i % 100) / 100.0f; /* 0 .. 0.99, ten of each */
    calib_hist_add(&h, x, 1000);
    ck_assert(h.range == 0.99f);
    float big = 3.0f;
    calib_hist_add(&h, &big, 1);
    ck_assert(h.range == 0.99f * 4);
    uint64_t total = 0;
    for (int b = 0; b < CALIB_BINS; b++)
        total += h.count[b];
    ck_assert_uint_eq(total, 1001);
    /* The 100th percentile covers the outlier; 90% stays within the bulk;
     * at 255 levels the same threshold makes half the step. mse keeps the
     * outlier: clipping it at 1 costs 4 in squared error, the bulk's
     * rounding at 127 levels up to 3 about 0.05. */
    ck_assert_float_ge(calib_scale_percentile(&h, 100.0, 127) * 127.0f, 3.0f);
    ck_assert_float_le(calib_scale_percentile(&h, 90.0, 127) * 127.0f, 1.0f);
    ck_assert_float_eq(calib_scale_percentile(&h, 100.0, 255) * 255.0f,
                       calib_scale_percentile(&h, 100.0, 127) * 127.0f);
    const float mse = calib_scale_mse(&h, 127) * 127.0f;
    ck_assert_float_ge(mse, 2.5f);
    ck_assert_float_le(mse, 4.0f);
    /* A long tail (exponential quantiles, |x| up to ~12) and one far
     * outlier: entropy clips well below the outlier, above the median. */
    static float tail[100000];
    memset(&h, 0, sizeof h);
    for (int i = 0; i < 100000; i++)
        tail[i] = -logf(((float)i + 0.5f) / 100000.0f);
    tail[7] = 50.0f;
    calib_hist_add(&h, tail, 100000);
    for (int levels = 127; levels <= 255; levels += 128) {
        float s = calib_scale_entropy(&h, levels) * (float)levels;
        ck_assert_float_lt(s, 20.0f);
        ck_assert_float_gt(s, 0.7f);
        /* mse weighs the outlier's clipping (squared) against 100,000
         * roundings: past the tail's end, short of the outlier. */
        s = calib_scale_mse(&h, levels) * (float)levels;
        ck_assert_float_lt(s, 50.0f);
        ck_assert_float_gt(s, 8.0f);
    }
    ck_assert_float_ge(calib_scale_mse(&h, 255) * 255.0f, calib_scale_mse(&h, 127) * 127.0f);
    memset(&h, 0, sizeof h);
    ck_assert_float_eq(calib_scale_entropy(&h, 255), 1.0f);
    ck_assert_float_eq(calib_scale_percentile(&h, 99.0, 127), 1.0f);
    ck_assert_float_eq(calib_scale_mse(&h, 255), 1.0f);
}
END_TEST

/* ---- Precision mixes (engine/calib.h) ------------------------------------ */

/* _i: float mix 1 + _i / NGEMMS, its prefix on FP32 back end _i % NGEMMS;
 * every INT8 tile the CPU has after it, the first against the emulation
 * (see the top for the tolerance), the others the same bits as the first
 * (the prefix is the same code, the INT8 part exact on every tile). */
START_TEST(each_float_mix_matches_its_fp32_prefix_emulation_on_every_gemm)
{
    const calib_mix mix = (calib_mix)(CALIB_MIX_STEM + _i / NGEMMS);
    const char *gemm = gemms[_i % NGEMMS];
    resnet18_weights w;
    calib_table t;
    npy_array img, emu[CALIB_NMIXES];
    load_reference(&w, &t, &img);
    t.mix = mix;
    const int n = (int)img.shape[0], C = w.classes;
    const float *refs[CALIB_NMIXES];
    const char *names[CALIB_NMIXES];
    for (int m = 0; m < CALIB_NMIXES; m++) {
        names[m] = calib_mix_name((calib_mix)m);
        load_npy(testutil_mix_logits(names[m], 0), "<f4", &emu[m]);
        ck_assert_uint_eq(emu[m].count, (size_t)n * (size_t)C);
        refs[m] = emu[m].data;
    }
    float *first = malloc((size_t)n * C * sizeof(float));
    ck_assert_ptr_nonnull(first);
    ck_assert_int_eq(setenv("RESNETD_CPU_GEMM", gemm, 1), 0);
    int ran = 0, first_k = -1;
    for (int k = 0; k < NKERNELS; k++) {
        engine *e = make_kernel_engine(k, &w, &t, n);
        if (!e)
            continue;
        memcpy(e->input[0], img.data, (size_t)n * RESNET18_INPUT_BYTES);
        run(e, n);
        char what[96];
        snprintf(what, sizeof what, "%s, FP32 %s, INT8 %s", names[mix], gemm, kernels[k]);
        if (ran++ == 0) {
            testutil_expect_nearest(e->logits[0], refs, names, CALIB_NMIXES, mix, n, C, MIX_TOL_MEAN, MIX_TOL_IMAGE,
                                    what);
            memcpy(first, e->logits[0], (size_t)n * C * sizeof(float));
            first_k = k;
        } else {
            ck_assert_msg(memcmp(e->logits[0], first, (size_t)n * C * sizeof(float)) == 0,
                          "%s: the logits differ from the %s tile's", what, kernels[first_k]);
        }
        engine_destroy(e);
    }
    if (ran == 0)
        fprintf(stderr, "%s: FP32 %s not on this CPU: not tested\n", names[mix], gemm);
    ck_assert_int_eq(unsetenv("RESNETD_CPU_GEMM"), 0);
    ck_assert_int_eq(unsetenv("RESNETD_CPU_INT8_GEMM"), 0);
    free(first);
    for (int m = 0; m < CALIB_NMIXES; m++)
        npy_free(&emu[m]);
    weights_free(&w);
    npy_free(&img);
}
END_TEST

/* Version 1 and 2 tables (int8 everywhere, every scale threshold / 127)
 * load with the same thresholds at 255 levels after a ReLU, the other
 * tensors' scales unchanged, and without the check they recorded. */
START_TEST(older_tables_load_as_their_thresholds_at_u8)
{
    char err[512], p[128], text[4096];
    snprintf(p, sizeof p, "%s", tmp_path("old.json"));
    for (int version = 1; version <= 2; version++) {
        int n = snprintf(text, sizeof text,
                         "{\"format\": \"resnetd-int8-calibration\", \"version\": %d,%s \"weights_sha256\": "
                         "\"synthetic\", \"method\": \"entropy\", \"images\": 5, \"check\": {\"images\": 10, "
                         "\"top1_agreement\": 90, \"rel_l2\": 0.01}, \"scales\": {",
                         version, version == 2 ? " \"mix\": \"float:stem\"," : "");
        for (int i = 0; i < CALIB_NTENSORS; i++)
            n += snprintf(text + n, sizeof text - (size_t)n, "%s\"%s\": 0.5", i ? ", " : "", calib_tensor_name(i));
        snprintf(text + n, sizeof text - (size_t)n, "}}");
        write_text(p, text);
        calib_table t;
        ck_assert_msg(calib_load(p, &t, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(t.mix, version == 2 ? CALIB_MIX_STEM : CALIB_MIX_INT8);
        ck_assert_int_eq(t.check.images, 0);
        int unsigned_tensors = 0;
        for (int i = 0; i < CALIB_NTENSORS; i++) {
            const float want = calib_tensor_unsigned(i) ? (float)(0.5 * 127.0 / 255.0) : 0.5f;
            ck_assert_msg(t.scale[i] == want, "version %d, %s: %.9g", version, calib_tensor_name(i), t.scale[i]);
            unsigned_tensors += calib_tensor_unsigned(i);
        }
        /* Every conv output but the three downsamples'; not the input. */
        ck_assert_int_eq(unsigned_tensors, CALIB_NTENSORS - 4);
        ck_assert(!calib_tensor_unsigned(0) && calib_tensor_unsigned(1));
    }
    ck_assert_int_eq(unlink(p), 0);
    ck_assert_int_eq(rmdir(tmpdir), 0);
    tmpdir[0] = '\0';
}
END_TEST

/* Every mix round-trips, written as version 3 with its "mix" (which a
 * resnetd older than u8 refuses rather than misreads). */
START_TEST(mix_tables_round_trip_as_version_3)
{
    calib_table t, back;
    memset(&t, 0, sizeof t);
    snprintf(t.weights_sha256, sizeof t.weights_sha256, "%s", CALIB_WEIGHTS_SYNTHETIC);
    t.images = 1;
    for (int i = 0; i < CALIB_NTENSORS; i++)
        t.scale[i] = 0.25f + (float)i / 64.0f;
    char err[512], p[128];
    snprintf(p, sizeof p, "%s", tmp_path("mix.json"));
    for (int m = 0; m < CALIB_NMIXES; m++) {
        t.mix = (calib_mix)m;
        ck_assert_msg(calib_save(p, &t, err, sizeof err) == 0, "%s", err);
        size_t len;
        char *text = (char *)testutil_read_file(p, &len), want[64];
        ck_assert_ptr_nonnull(text);
        snprintf(want, sizeof want, "\"mix\": \"%s\"", calib_mix_name(t.mix));
        ck_assert_msg(strstr(text, "\"version\": 3") && strstr(text, want), "%s", text);
        free(text);
        memset(&back, 0xff, sizeof back);
        ck_assert_msg(calib_load(p, &back, err, sizeof err) == 0, "%s: %s", calib_mix_name(t.mix), err);
        ck_assert_int_eq(back.mix, m);
        for (int i = 0; i < CALIB_NTENSORS; i++)
            ck_assert(back.scale[i] == t.scale[i]);
    }
    ck_assert_int_eq(unlink(p), 0);
    ck_assert_int_eq(rmdir(tmpdir), 0);
    tmpdir[0] = '\0';
}
END_TEST

/* Each mix's name, float convs and boundary as engine/calib.h documents
 * them; the boundary is the only tensor of the float prefix that the INT8
 * part reads (so quantising it alone is enough), and the last conv of its
 * stage. */
START_TEST(mix_names_float_convs_and_boundaries)
{
    static const char *const names[CALIB_NMIXES] = {
        "int8",           "float:stem",   "float:layer1.0", "float:layer1",
        "float:layer2.0", "float:layer2", "float:layer3.0", "float:layer3"
    };
    static const int nconvs[CALIB_NMIXES] = { 0, 1, 3, 5, 8, 10, 13, 15 };
    static const int boundary[CALIB_NMIXES] = { R18_IMAGE, R18_POOL, 2, 4, 7, 9, 12, 14 };
    static const char *const last[CALIB_NMIXES] = { NULL,
                                                    NULL,
                                                    "layer1.0.conv2",
                                                    "layer1.1.conv2",
                                                    "layer2.0.conv2",
                                                    "layer2.1.conv2",
                                                    "layer3.0.conv2",
                                                    "layer3.1.conv2" };
    for (int m = 0; m < CALIB_NMIXES; m++) {
        calib_mix parsed = CALIB_NMIXES;
        ck_assert_str_eq(calib_mix_name((calib_mix)m), names[m]);
        ck_assert_int_eq(calib_parse_mix(names[m], &parsed), 0);
        ck_assert_int_eq(parsed, m);
        ck_assert_int_eq(calib_mix_float_convs((calib_mix)m), nconvs[m]);
        ck_assert_int_eq(calib_mix_boundary((calib_mix)m), boundary[m]);
        if (last[m])
            ck_assert_str_eq(resnet18_convs[boundary[m]].name, last[m]);
        for (int j = nconvs[m]; j < RESNET18_NUM_CONVS && m > 0; j++) {
            const int in[2] = { resnet18_convs[j].src, resnet18_convs[j].residual };
            for (int r = 0; r < 2; r++)
                ck_assert_msg(in[r] == R18_NONE || in[r] >= nconvs[m] || in[r] == boundary[m],
                              "%s: conv %d (%s) reads tensor %d of the float prefix", names[m], j,
                              resnet18_convs[j].name, in[r]);
        }
    }
    calib_mix parsed = CALIB_MIX_LAYER2;
    static const char *const bad[] = { "",     "float",          "float:layer4",   "Float:stem",   "int8 ",
                                       "fp16", "float:layer1.1", "float:layer4.0", "float:layer1." };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_int_eq(calib_parse_mix(bad[i], &parsed), -1);
    ck_assert_int_eq(parsed, CALIB_MIX_LAYER2);
    ck_assert_str_eq(calib_mix_name(CALIB_NMIXES), "?");
    ck_assert_int_eq(calib_mix_float_convs(CALIB_NMIXES), -1);
}
END_TEST

/* A table whose mix is no calib_mix (a caller's bug: calib_load never
 * gives one) is refused, not read past the end of the mixes. */
/* A float mix's prefix reads images given as FP32 tensors too (they go to
 * its FP32 engine as pointers): the random images as their normalised CHW
 * tensors (the engines' own normalisation table) give the same bits as the
 * uint8 images, odd positions only, so that each batch mixes both kinds. */
START_TEST(a_float_mix_takes_fp32_input_tensors)
{
    resnet18_weights w;
    calib_table t;
    npy_array img;
    load_reference(&w, &t, &img);
    t.mix = CALIB_MIX_LAYER1_0;
    const int n = (int)img.shape[0];
    const size_t plane = (size_t)RESNET18_IMG * RESNET18_IMG, classes = (size_t)w.classes;
    engine *e = make_engine(&w, &t, n, 0);
    float lut[3][256];
    preprocess_normalize_lut(lut);
    float *chw = malloc((size_t)n * 3 * plane * sizeof *chw);
    float *want = malloc((size_t)n * classes * sizeof *want);
    ck_assert(chw && want);
    const uint8_t *px = img.data;
    for (int i = 0; i < n; i++)
        for (size_t p = 0; p < plane; p++)
            for (int c = 0; c < 3; c++)
                chw[((size_t)i * 3 + (size_t)c) * plane + p] = lut[c][px[((size_t)i * plane + p) * 3 + (size_t)c]];
    memcpy(e->input[0], img.data, (size_t)n * RESNET18_INPUT_BYTES);
    run(e, n);
    memcpy(want, e->logits[0], (size_t)n * classes * sizeof *want);
    for (int i = 1; i < n; i += 2) {
        memset(e->input[0] + (size_t)i * RESNET18_INPUT_BYTES, 0, RESNET18_INPUT_BYTES);
        e->input_f32[0][i] = chw + (size_t)i * 3 * plane;
    }
    run(e, n);
    ck_assert_msg(memcmp(e->logits[0], want, (size_t)n * classes * sizeof *want) == 0,
                  "float:layer1.0: FP32 input tensors give other logits than their uint8 images");
    for (int i = 0; i < n; i++)
        e->input_f32[0][i] = NULL;
    engine_destroy(e);
    free(chw);
    free(want);
    npy_free(&img);
    weights_free(&w);
}
END_TEST

START_TEST(an_engine_refuses_a_mix_outside_calib_mix)
{
    resnet18_weights w;
    char err[512] = "";
    ck_assert_int_eq(weights_synthetic(7, &w, err, sizeof err), 0);
    calib_table t;
    synthetic_table(&t);
    t.mix = CALIB_NMIXES;
    engine_config cfg = {
        .device = ENGINE_DEVICE_CPU, .precision = ENGINE_PRECISION_INT8, .max_batch = 1, .calib = &t
    };
    ck_assert_ptr_null(engine_create(&w, &cfg, err, sizeof err));
    ck_assert_msg(strstr(err, "not a calib_mix") != NULL, "%s", err);
    weights_free(&w);
}
END_TEST

static Suite *engine_int8_suite(void)
{
    Suite *s = suite_create("engine_int8");
    TCase *tc = tcase_create("int8");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, uint8_images_match_the_torch_int8_emulation, 0, NKERNELS);
    tcase_add_loop_test(tc, fp32_input_tensors_match_the_torch_int8_emulation, 0, NKERNELS);
    tcase_add_test(tc, every_int8_tile_gives_the_same_bits);
    tcase_add_test(tc, batch_size_and_threads_change_nothing);
    tcase_add_loop_test(tc, same_image_same_bits_at_any_position_and_batch_size, 0, NKERNELS);
    tcase_add_test(tc, int8_is_refused_without_a_table_or_with_another_weights_table);
    tcase_add_test(tc, non_finite_fp32_input_gives_finite_logits);
    tcase_add_test(tc, tables_round_trip_every_float_exactly);
    tcase_add_test(tc, bad_tables_are_refused_with_a_reason);
    tcase_add_test(tc, histogram_statistics);
    tcase_add_loop_test(tc, each_float_mix_matches_its_fp32_prefix_emulation_on_every_gemm, 0,
                        (CALIB_NMIXES - 1) * NGEMMS);
    tcase_add_test(tc, mix_tables_round_trip_as_version_3);
    tcase_add_test(tc, older_tables_load_as_their_thresholds_at_u8);
    tcase_add_test(tc, mix_names_float_convs_and_boundaries);
    tcase_add_test(tc, a_float_mix_takes_fp32_input_tensors);
    tcase_add_test(tc, an_engine_refuses_a_mix_outside_calib_mix);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return testutil_run(engine_int8_suite());
}
