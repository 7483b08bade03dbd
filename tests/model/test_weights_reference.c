/* Tests for model/weights.c on the torchvision resnet18 weights that
 * tests/reference.py writes (F32, F16, BF16 and a 10-class fine-tune): each
 * loads, its BN fold matches the file read a second way by a small reader
 * here, and the reduced precisions equal the F32 fold up to their rounding. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "model/resnet18.h"
#include "tests/lib/testutil.h"
#include "tests/model/weights_testutil.h"

/* Reads a tensor of a reference file a second way: jansson on the header
 * and the tests' own F16/BF16 decoding. Returns malloc'd floats. */
static float *ref_tensor(const uint8_t *file, size_t len, const char *name, size_t *n)
{
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | file[i];
    ck_assert(hlen <= len - 8);
    json_t *h = json_loadb((const char *)file + 8, hlen, 0, NULL);
    ck_assert(h != NULL);
    json_t *e = json_object_get(h, name);
    ck_assert_msg(e != NULL, "reference file lacks %s", name);
    const char *dt = json_string_value(json_object_get(e, "dtype"));
    uint64_t b = (uint64_t)json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 0));
    uint64_t end = (uint64_t)json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 1));
    size_t es = strcmp(dt, "F32") == 0 ? 4 : 2;
    const uint8_t *p = file + 8 + hlen + b;
    *n = (size_t)(end - b) / es;
    float *v = malloc(*n * sizeof *v);
    ck_assert(v != NULL);
    for (size_t i = 0; i < *n; i++, p += es) {
        uint32_t u = es == 4 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24
                             : (uint32_t)p[0] | (uint32_t)p[1] << 8;
        if (strcmp(dt, "F16") == 0)
            v[i] = (float)half_value((uint16_t)u);
        else if (strcmp(dt, "BF16") == 0)
            u <<= 16;
        if (strcmp(dt, "F16") != 0)
            memcpy(&v[i], &u, 4);
    }
    json_decref(h);
    return v;
}

/* Loads a reference file and checks a few tensors' folds against ref_tensor. */
static void check_reference(const char *file, resnet18_weights *w)
{
    const char *path = testutil_ref_path(file);
    char err[512] = "";
    ck_assert_msg(weights_load(path, w, err, sizeof err) == 0, "%s", err);
    char want[65];
    sha256sum(path, want);
    ck_assert_str_eq(w->sha256, want);
    size_t len = 0;
    uint8_t *bytes = testutil_read_file(path, &len);
    ck_assert(bytes != NULL);
    static const int convs[] = { 0, 6, 14, 19 }; /* stem, a downsample, deep 3x3s */
    for (size_t k = 0; k < sizeof convs / sizeof convs[0]; k++) {
        const resnet18_conv_desc *d = &resnet18_convs[convs[k]];
        char name[96];
        size_t n, nc;
        snprintf(name, sizeof name, "%s.weight", d->name);
        float *wt = ref_tensor(bytes, len, name, &n);
        float *bn[4];
        const char *f[4] = { "weight", "bias", "running_mean", "running_var" };
        for (int j = 0; j < 4; j++) {
            snprintf(name, sizeof name, "%s.%s", d->bn, f[j]);
            bn[j] = ref_tensor(bytes, len, name, &nc);
            ck_assert_uint_eq(nc, (size_t)d->cout);
        }
        ck_assert_uint_eq(n, (size_t)d->cout * d->cin * d->k * d->k);
        int K = d->k, C = d->cin, bad = 0;
        for (int o = 0; o < d->cout; o++) {
            double inv_std = 1.0 / sqrt((double)bn[3][o] + 1e-5);
            bad += !near_ulp(w->conv[convs[k]].b[o], (float)(bn[1][o] - (double)bn[2][o] * bn[0][o] * inv_std));
            for (int c = 0; c < C; c++)
                for (int y = 0; y < K; y++)
                    for (int x = 0; x < K; x++) {
                        float want_w = (float)(wt[((o * C + c) * K + y) * K + x] * (double)bn[0][o] * inv_std);
                        bad += !near_ulp(w->conv[convs[k]].w[((o * K + y) * K + x) * C + c], want_w);
                    }
        }
        ck_assert_msg(bad == 0, "%s: %s has %d values off the fold", file, d->name, bad);
        free(wt);
        for (int j = 0; j < 4; j++)
            free(bn[j]);
    }
    size_t n;
    float *fc = ref_tensor(bytes, len, "fc.weight", &n);
    ck_assert_uint_eq(n, (size_t)w->classes * RESNET18_FEATURES);
    ck_assert(memcmp(fc, w->fc_w, n * sizeof *fc) == 0);
    free(fc);
    free(bytes);
}

START_TEST(test_reference_f32_loads_and_folds)
{
    resnet18_weights w;
    check_reference("weights.safetensors", &w);
    ck_assert_int_eq(w.classes, 1000);
    /* torchvision's BN folding really does something here: scales differ from 1. */
    ck_assert(w.conv[0].b[0] != 0);
    weights_free(&w);
}
END_TEST

/* reference.py's 10-class fine-tune: the class count comes from the file,
 * and the head is the file's, bias included. */
START_TEST(test_reference_fine_tune_reports_10_classes)
{
    resnet18_weights w;
    check_reference("ft10/weights.safetensors", &w);
    ck_assert_int_eq(w.classes, 10);
    size_t len = 0, n;
    uint8_t *bytes = testutil_read_file(testutil_ref_path("ft10/weights.safetensors"), &len);
    ck_assert(bytes != NULL);
    float *fb = ref_tensor(bytes, len, "fc.bias", &n);
    ck_assert_uint_eq(n, 10);
    ck_assert(memcmp(fb, w.fc_b, n * sizeof *fb) == 0);
    free(fb);
    free(bytes);
    weights_free(&w);
}
END_TEST

/* F16 and BF16 files equal the F32 fold up to the storage rounding. */
static void check_reduced(const char *file, double tol)
{
    resnet18_weights w32, w;
    char err[512];
    ck_assert_msg(weights_load(testutil_ref_path("weights.safetensors"), &w32, err, sizeof err) == 0, "%s", err);
    check_reference(file, &w);
    for (int i = 0; i < RESNET18_NUM_CONVS; i++) {
        const resnet18_conv_desc *d = &resnet18_convs[i];
        size_t n = (size_t)d->cout * d->k * d->k * d->cin;
        double ew = testutil_rel_l2(w.conv[i].w, w32.conv[i].w, n);
        double eb = testutil_rel_l2(w.conv[i].b, w32.conv[i].b, (size_t)d->cout);
        ck_assert_msg(ew < tol && ew > 0, "%s: %s weight rel L2 %g", file, d->name, ew);
        ck_assert_msg(eb < tol, "%s: %s bias rel L2 %g", file, d->bn, eb);
    }
    ck_assert_int_eq(w.classes, w32.classes);
    double e = testutil_rel_l2(w.fc_w, w32.fc_w, (size_t)w.classes * RESNET18_FEATURES);
    ck_assert_msg(e < tol && e > 0, "%s: fc rel L2 %g", file, e);
    weights_free(&w);
    weights_free(&w32);
}

START_TEST(test_reference_f16_equals_f32_within_rounding)
{
    check_reduced("weights-f16.safetensors", 0x1p-10);
}
END_TEST

START_TEST(test_reference_bf16_equals_f32_within_rounding)
{
    check_reduced("weights-bf16.safetensors", 0x1p-7);
}
END_TEST

int main(void)
{
    /* The torchvision files exist only when reference.py could run; without
     * them this program skips (77), or fails under
     * RESNETD_REQUIRE_REFERENCE=1 (CI). */
    testutil_require_reference();
    Suite *s = suite_create("weights_reference");
    TCase *tc = tcase_create("reference");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_reference_f32_loads_and_folds);
    tcase_add_test(tc, test_reference_fine_tune_reports_10_classes);
    tcase_add_test(tc, test_reference_f16_equals_f32_within_rounding);
    tcase_add_test(tc, test_reference_bf16_equals_f32_within_rounding);
    suite_add_tcase(s, tc);
    return testutil_run(s);
}
