/* Tests engine/engine_cpu.c against torchvision's FP32 logits (tests/ref),
 * on every GEMM back end this CPU can run (avx512, blas): random images,
 * the torchvision input tensors of the test JPEGs, F16/BF16 weight files, a
 * 10-class fine-tuned head, max-batch enforcement with batch-size
 * independence, bit-identical logits at any batch position and size, and
 * images given as normalised FP32 tensors
 * (engine.input_f32) beside uint8 ones. Output buffers are
 * poisoned with NaN before every run, so stale logits cannot pass. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/engine.h"
#include "engine/engine_registry.h"
#include "util/npy.h"
#include "image/preprocess.h"
#include "model/resnet18.h"
#include "tests/lib/invariance.h"
#include "tests/lib/testutil.h"

#define REL_L2_MAX 1e-5
#define NBACKENDS 2

static const char *const backends[NBACKENDS] = { "avx512", "blas" };

/* Creates a CPU engine on back end b, or returns NULL when this CPU cannot
 * run it (the test then passes vacuously for that back end, saying so). */
static engine *make_engine(int b, const resnet18_weights *w, int max_batch)
{
    ck_assert_int_eq(setenv("RESNETD_CPU_GEMM", backends[b], 1), 0);
    engine_config cfg = { .device = ENGINE_DEVICE_CPU, .max_batch = max_batch };
    char err[512] = "";
    engine *e = engine_create(w, &cfg, err, sizeof err);
    if (!e && b == 0 && strstr(err, "lacks AVX-512F")) {
        fprintf(stderr, "%s: avx512 back end not tested\n", err);
        return NULL;
    }
    ck_assert_msg(e != NULL, "engine_create(%s): %s", backends[b], err);
    ck_assert_int_eq(e->device, ENGINE_DEVICE_CPU);
    ck_assert_int_eq(e->precision, ENGINE_PRECISION_FP32);
    ck_assert_int_eq(e->max_batch, max_batch);
    ck_assert_int_eq(e->nslots, 2);
    return e;
}

static void load_weights(const char *file, resnet18_weights *w)
{
    char err[512];
    int rc = weights_load(testutil_ref_path(file), w, err, sizeof err);
    ck_assert_msg(rc == 0, "weights_load: %s", err);
}

static void load_npy(const char *name, const char *dtype, npy_array *a)
{
    char err[512];
    ck_assert_msg(npy_read(testutil_ref_path(name), a, err, sizeof err) == 0, "%s: %s", name, err);
    ck_assert_msg(strcmp(a->dtype, dtype) == 0, "%s: dtype %s, want %s", name, a->dtype, dtype);
}

/* Runs n images through slot `slot`, with poisoned logits first. */
static void run(engine *e, int slot, const uint8_t *images, int n)
{
    char err[512] = "";
    memcpy(e->input[slot], images, (size_t)n * RESNET18_INPUT_BYTES);
    for (size_t i = 0; i < (size_t)e->max_batch * (size_t)e->classes; i++)
        e->logits[slot][i] = NAN;
    ck_assert_msg(engine_submit(e, slot, n, err, sizeof err) == 0, "submit: %s", err);
    ck_assert_msg(engine_wait(e, slot, err, sizeof err) == 0, "wait: %s", err);
}

/* Per image of `classes` logits: rel L2 <= tol and identical top-5 (or
 * ranking, for fewer classes) against want. */
static void expect_logits(const float *got, const float *want, int n, int classes, double tol, const char *what)
{
    double worst = 0;
    const int top = classes < 5 ? classes : 5;
    for (int i = 0; i < n; i++) {
        const float *g = got + (size_t)i * classes, *r = want + (size_t)i * classes;
        double rel = testutil_rel_l2(g, r, (size_t)classes);
        ck_assert_msg(rel <= tol, "%s image %d: rel L2 %.3g > %.3g", what, i, rel, tol);
        int tg[5], tr[5];
        testutil_topk(g, classes, top, tg);
        testutil_topk(r, classes, top, tr);
        for (int k = 0; k < top; k++)
            ck_assert_msg(tg[k] == tr[k], "%s image %d: top-5 differ at rank %d (%d vs %d)", what, i, k, tg[k], tr[k]);
        if (rel > worst)
            worst = rel;
    }
    fprintf(stderr, "%s: %d images, worst rel L2 %.3g\n", what, n, worst);
}

/* Random uint8 images with the reference weights file given, in one batch. */
static void check_random(int b, const char *weights_file, const char *logits_file, double tol)
{
    testutil_require_reference();
    resnet18_weights w;
    load_weights(weights_file, &w);
    npy_array img, ref;
    load_npy("random_u8.npy", "|u1", &img);
    load_npy(logits_file, "<f4", &ref);
    int n = (int)img.shape[0];
    ck_assert_int_eq(img.ndim, 4);
    ck_assert_uint_eq(img.count, (size_t)n * RESNET18_INPUT_BYTES);
    ck_assert_int_eq(ref.ndim, 2);
    ck_assert_uint_eq(ref.shape[0], (size_t)n);
    ck_assert_uint_eq(ref.shape[1], (size_t)w.classes);
    engine *e = make_engine(b, &w, n);
    weights_free(&w); /* the engine keeps its own copy */
    if (e) {
        ck_assert_uint_eq((size_t)e->classes, ref.shape[1]);
        char what[128];
        snprintf(what, sizeof what, "%s %s", backends[b], logits_file);
        run(e, 1, img.data, n);
        expect_logits(e->logits[1], ref.data, n, e->classes, tol, what);
        engine_destroy(e);
    }
    npy_free(&img);
    npy_free(&ref);
}

START_TEST(random_images_match_torchvision_f32_weights)
{
    check_random(_i, "weights.safetensors", "random_logits.npy", REL_L2_MAX);
}
END_TEST

START_TEST(f16_weights_match_torchvision_f16_rounded_weights)
{
    check_random(_i, "weights-f16.safetensors", "random_logits_f16w.npy", REL_L2_MAX);
}
END_TEST

START_TEST(bf16_weights_match_torchvision_bf16_rounded_weights)
{
    check_random(_i, "weights-bf16.safetensors", "random_logits_bf16w.npy", REL_L2_MAX);
}
END_TEST

START_TEST(fine_tuned_10_class_head_matches_torchvision)
{
    check_random(_i, "ft10/weights.safetensors", "ft10/random_logits.npy", REL_L2_MAX);
}
END_TEST

/* The crops torchvision normalised for the test JPEGs: since its input
 * tensor is normalise(crop), this is the golden "torchvision input" test. */
static void check_jpeg_crops(int b, const char *weights_file, const char *logits_file)
{
    testutil_require_reference();
    resnet18_weights w;
    load_weights(weights_file, &w);
    npy_array ref;
    load_npy(logits_file, "<f4", &ref);
    ck_assert_int_eq(ref.ndim, 2);
    ck_assert_uint_eq(ref.shape[1], (size_t)w.classes);
    size_t len;
    char *list = (char *)testutil_read_file(testutil_ref_path("jpegs.txt"), &len);
    ck_assert_msg(list != NULL, "cannot read jpegs.txt");
    list[len] = '\0';
    const int batch = 4;
    engine *e = make_engine(b, &w, batch);
    weights_free(&w);
    if (!e) {
        free(list);
        npy_free(&ref);
        return;
    }
    uint8_t *images = malloc((size_t)batch * RESNET18_INPUT_BYTES);
    ck_assert_ptr_nonnull(images);
    int count = 0, pending = 0;
    char *save = NULL;
    for (char *name = strtok_r(list, "\n", &save);; name = strtok_r(NULL, "\n", &save)) {
        if (name && *name) {
            char rel[512];
            snprintf(rel, sizeof rel, "crop/%s.npy", name);
            npy_array crop;
            load_npy(rel, "|u1", &crop);
            ck_assert_msg(crop.count == RESNET18_INPUT_BYTES, "%s: %zu bytes", rel, crop.count);
            memcpy(images + (size_t)pending * RESNET18_INPUT_BYTES, crop.data, RESNET18_INPUT_BYTES);
            npy_free(&crop);
            pending++;
        }
        if (pending == batch || (!name && pending > 0)) {
            ck_assert_uint_ge(ref.shape[0], (size_t)(count + pending));
            run(e, 0, images, pending);
            char what[64];
            snprintf(what, sizeof what, "%s %s jpeg crops %d..%d", backends[b], weights_file, count,
                     count + pending - 1);
            expect_logits(e->logits[0], (const float *)ref.data + (size_t)count * (size_t)e->classes, pending,
                          e->classes, REL_L2_MAX, what);
            count += pending;
            pending = 0;
        }
        if (!name)
            break;
    }
    ck_assert_int_eq((size_t)count, ref.shape[0]);
    free(images);
    free(list);
    npy_free(&ref);
    engine_destroy(e);
}

START_TEST(jpeg_crops_match_torchvision_logits)
{
    check_jpeg_crops(_i, "weights.safetensors", "logits.npy");
}
END_TEST

START_TEST(jpeg_crops_match_torchvision_logits_10_class_head)
{
    check_jpeg_crops(_i, "ft10/weights.safetensors", "ft10/logits.npy");
}
END_TEST

/* torchvision's own input tensors (input/NAME.npy) given as FP32 inputs,
 * interleaved with uint8 images whose pixels are random garbage for the
 * FP32 slots: the logits match torchvision's on those tensors. */
START_TEST(fp32_input_tensors_match_torchvision_logits)
{
    testutil_require_reference();
    resnet18_weights w;
    load_weights("weights.safetensors", &w);
    npy_array ref;
    load_npy("logits.npy", "<f4", &ref);
    size_t len;
    char *list = (char *)testutil_read_file(testutil_ref_path("jpegs.txt"), &len);
    ck_assert_msg(list != NULL, "cannot read jpegs.txt");
    list[len] = '\0';
    const int n = 3;
    engine *e = make_engine(_i, &w, n);
    weights_free(&w);
    if (!e) {
        free(list);
        npy_free(&ref);
        return;
    }
    npy_array t[3];
    int rows[3], got = 0, row = 0;
    char *save = NULL;
    for (char *name = strtok_r(list, "\n", &save); name && got < n; name = strtok_r(NULL, "\n", &save), row++) {
        char rel[512];
        snprintf(rel, sizeof rel, "input/%s.npy", name);
        load_npy(rel, "<f4", &t[got]);
        ck_assert_uint_eq(t[got].count, (size_t)RESNET18_INPUT_BYTES);
        rows[got++] = row;
    }
    ck_assert_int_eq(got, n);
    uint8_t *noise = malloc((size_t)n * RESNET18_INPUT_BYTES);
    ck_assert_ptr_nonnull(noise);
    for (size_t i = 0; i < (size_t)n * RESNET18_INPUT_BYTES; i++)
        noise[i] = (uint8_t)(i * 2654435761u >> 13);
    for (int i = 0; i < n; i++)
        e->input_f32[0][i] = t[i].data;
    run(e, 0, noise, n);
    for (int i = 0; i < n; i++) {
        char what[64];
        snprintf(what, sizeof what, "%s fp32 input row %d", backends[_i], rows[i]);
        expect_logits(e->logits[0] + (size_t)i * (size_t)e->classes,
                      (const float *)ref.data + (size_t)rows[i] * (size_t)e->classes, 1, e->classes, REL_L2_MAX, what);
        e->input_f32[0][i] = NULL;
        npy_free(&t[i]);
    }
    free(noise);
    free(list);
    npy_free(&ref);
    engine_destroy(e);
}
END_TEST

/* normalise(pixels) given as an FP32 input gives bit-identical logits to
 * the pixels themselves, in any position of a mixed batch. */
START_TEST(fp32_input_of_normalised_pixels_equals_uint8_path)
{
    testutil_require_reference();
    resnet18_weights w;
    load_weights("weights.safetensors", &w);
    npy_array img;
    load_npy("random_u8.npy", "|u1", &img);
    int n = (int)img.shape[0] < 4 ? (int)img.shape[0] : 4;
    ck_assert_int_ge(n, 2);
    engine *e = make_engine(_i, &w, n);
    weights_free(&w);
    if (!e) {
        npy_free(&img);
        return;
    }
    float *want = malloc((size_t)n * (size_t)e->classes * sizeof(float));
    float *chw = malloc((size_t)n * RESNET18_INPUT_BYTES * sizeof(float));
    uint8_t *mixed = malloc((size_t)n * RESNET18_INPUT_BYTES);
    ck_assert(want && chw && mixed);
    run(e, 1, img.data, n);
    memcpy(want, e->logits[1], (size_t)n * (size_t)e->classes * sizeof(float));
    memcpy(mixed, img.data, (size_t)n * RESNET18_INPUT_BYTES);
    for (int i = 0; i < n; i += 2) {
        preprocess_normalize_chw((const uint8_t *)img.data + (size_t)i * RESNET18_INPUT_BYTES,
                                 chw + (size_t)i * RESNET18_INPUT_BYTES);
        memset(mixed + (size_t)i * RESNET18_INPUT_BYTES, 0x5a, RESNET18_INPUT_BYTES);
        e->input_f32[1][i] = chw + (size_t)i * RESNET18_INPUT_BYTES;
    }
    run(e, 1, mixed, n);
    for (int i = 0; i < n; i++)
        ck_assert_msg(memcmp(e->logits[1] + (size_t)i * (size_t)e->classes, want + (size_t)i * (size_t)e->classes,
                             (size_t)e->classes * sizeof(float)) == 0,
                      "%s image %d (%s) differs", backends[_i], i, i % 2 == 0 ? "fp32" : "uint8");
    free(want);
    free(chw);
    free(mixed);
    npy_free(&img);
    engine_destroy(e);
}
END_TEST

START_TEST(batch_outside_1_to_max_is_rejected)
{
    resnet18_weights w;
    char err[512];
    ck_assert_int_eq(weights_synthetic(7, &w, err, sizeof err), 0);
    engine_config too_small = { .device = ENGINE_DEVICE_CPU, .max_batch = 0 };
    ck_assert_ptr_null(engine_create(&w, &too_small, err, sizeof err));
    engine *e = make_engine(_i, &w, 3);
    weights_free(&w);
    if (!e)
        return;
    memset(e->input[0], 0x80, 3 * (size_t)RESNET18_INPUT_BYTES);
    int bad[] = { 0, -1, 4, 1000 };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        err[0] = '\0';
        ck_assert_int_eq(engine_submit(e, 0, bad[k], err, sizeof err), -1);
        ck_assert_msg(strstr(err, "1..3") != NULL, "message for n=%d: '%s'", bad[k], err);
    }
    ck_assert_int_eq(engine_submit(e, 1, 3, err, sizeof err), 0);
    ck_assert_int_eq(engine_wait(e, 1, err, sizeof err), 0);
    ck_assert_int_eq(engine_submit(e, 2, 1, err, sizeof err), -1); /* no slot 2 */
    engine_destroy(e);
}
END_TEST

/* Batches of 1, 2, 3 and max give each image the logits it gets alone. */
START_TEST(any_batch_size_gives_per_image_logits)
{
    testutil_require_reference();
    resnet18_weights w;
    load_weights("weights.safetensors", &w);
    npy_array img;
    load_npy("random_u8.npy", "|u1", &img);
    const int max = (int)img.shape[0];
    ck_assert_int_ge(max, 4);
    engine *e = make_engine(_i, &w, max);
    weights_free(&w);
    if (!e) {
        npy_free(&img);
        return;
    }
    const size_t C = (size_t)e->classes;
    float *alone = malloc((size_t)max * C * sizeof(float));
    ck_assert_ptr_nonnull(alone);
    for (int i = 0; i < max; i++) {
        run(e, 0, (const uint8_t *)img.data + (size_t)i * RESNET18_INPUT_BYTES, 1);
        memcpy(alone + (size_t)i * C, e->logits[0], C * sizeof(float));
    }
    const int sizes[] = { 1, 2, 3, max };
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int n = sizes[s];
        /* Start at the last images, so each size sees different ones. */
        int first = max - n;
        run(e, 1, (const uint8_t *)img.data + (size_t)first * RESNET18_INPUT_BYTES, n);
        char what[64];
        snprintf(what, sizeof what, "%s batch %d vs alone", backends[_i], n);
        expect_logits(e->logits[1], alone + (size_t)first * C, n, e->classes, 1e-6, what);
    }
    free(alone);
    npy_free(&img);
    engine_destroy(e);
}
END_TEST

/* The same image gives the same bits at every position of every batch size
 * 1..8, beside other images (tests/lib/invariance.h): what a cache, an A/B test
 * or an audit downstream relies on. A GEMM over the whole batch broke it on
 * the blas back end (a row's sums depended on its place in the tiles). */
START_TEST(same_image_same_bits_at_any_position_and_batch_size)
{
    testutil_require_reference();
    resnet18_weights w;
    load_weights("weights.safetensors", &w);
    npy_array img;
    load_npy("random_u8.npy", "|u1", &img);
    ck_assert_int_ge((int)img.shape[0], 8);
    const int max = 8;
    engine *e = make_engine(_i, &w, max);
    weights_free(&w);
    if (e) {
        int sizes[8];
        int n = invariance_all_sizes(max, sizes);
        /* Probes: a noise image and a photo-like one; three more fill. */
        invariance_check(e, (const uint8_t *)img.data + 3 * (size_t)RESNET18_INPUT_BYTES, 5, sizes, n, backends[_i], 1);
        engine_destroy(e);
    }
    npy_free(&img);
}
END_TEST

/* 1 thread (no workers), 2, and 3 (more than this machine may have; layer
 * splits by rows and by columns both occur) agree per image. */
START_TEST(thread_count_does_not_change_logits)
{
    testutil_require_reference();
    resnet18_weights w;
    load_weights("weights.safetensors", &w);
    npy_array img;
    load_npy("random_u8.npy", "|u1", &img);
    const int n = 3;
    ck_assert_int_ge((int)img.shape[0], n);
    ck_assert_int_eq(setenv("RESNETD_CPU_GEMM", backends[_i], 1), 0);
    float *first = malloc((size_t)n * (size_t)w.classes * sizeof(float));
    ck_assert_ptr_nonnull(first);
    for (int threads = 1; threads <= 3; threads++) {
        engine_config cfg = { .device = ENGINE_DEVICE_CPU, .max_batch = n, .threads = threads };
        char err[512] = "";
        engine *e = engine_create(&w, &cfg, err, sizeof err);
        if (!e && _i == 0 && strstr(err, "lacks AVX-512F"))
            break;
        ck_assert_msg(e != NULL, "engine_create(%d threads): %s", threads, err);
        run(e, 0, img.data, n);
        if (threads == 1) {
            memcpy(first, e->logits[0], (size_t)n * (size_t)e->classes * sizeof(float));
        } else {
            char what[64];
            snprintf(what, sizeof what, "%s %d threads vs 1", backends[_i], threads);
            expect_logits(e->logits[0], first, n, e->classes, 1e-6, what);
        }
        engine_destroy(e);
    }
    free(first);
    weights_free(&w);
    npy_free(&img);
}
END_TEST

static Suite *engine_cpu_suite(void)
{
    Suite *s = suite_create("engine_cpu");
    TCase *tc = tcase_create("golden");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, random_images_match_torchvision_f32_weights, 0, NBACKENDS);
    tcase_add_loop_test(tc, jpeg_crops_match_torchvision_logits, 0, NBACKENDS);
    tcase_add_loop_test(tc, f16_weights_match_torchvision_f16_rounded_weights, 0, NBACKENDS);
    tcase_add_loop_test(tc, bf16_weights_match_torchvision_bf16_rounded_weights, 0, NBACKENDS);
    tcase_add_loop_test(tc, fine_tuned_10_class_head_matches_torchvision, 0, NBACKENDS);
    tcase_add_loop_test(tc, jpeg_crops_match_torchvision_logits_10_class_head, 0, NBACKENDS);
    tcase_add_loop_test(tc, fp32_input_tensors_match_torchvision_logits, 0, NBACKENDS);
    tcase_add_loop_test(tc, fp32_input_of_normalised_pixels_equals_uint8_path, 0, NBACKENDS);
    tcase_add_loop_test(tc, batch_outside_1_to_max_is_rejected, 0, NBACKENDS);
    tcase_add_loop_test(tc, any_batch_size_gives_per_image_logits, 0, NBACKENDS);
    tcase_add_loop_test(tc, thread_count_does_not_change_logits, 0, NBACKENDS);
    tcase_add_loop_test(tc, same_image_same_bits_at_any_position_and_batch_size, 0, NBACKENDS);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return testutil_run(engine_cpu_suite());
}
