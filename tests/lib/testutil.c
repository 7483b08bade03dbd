/* Shared helpers for the Check test programs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "tests/lib/testutil.h"

static const char *ref_dir;

const char *testutil_require_reference(void)
{
    if (ref_dir)
        return ref_dir;
    const char *d = getenv("RESNETD_REF_DIR");
    const char *req = getenv("RESNETD_REQUIRE_REFERENCE");
    int required = req && strcmp(req, "1") == 0;
    char stamp[4096];
    struct stat st;
    snprintf(stamp, sizeof stamp, "%s/weights.safetensors", d ? d : "");
    if (!d || stat(stamp, &st) != 0) {
        fprintf(stderr, "reference data missing (%s): run tests/reference.py with torch installed\n",
                d ? d : "RESNETD_REF_DIR unset");
        exit(required ? 1 : 77);
    }
    ref_dir = d;
    return d;
}

const char *testutil_ref_path(const char *name)
{
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", testutil_require_reference(), name);
    return buf;
}

uint8_t *testutil_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    uint8_t *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) != NULL) {
            if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
                free(buf);
                buf = NULL;
            } else {
                buf[n] = 0;
                *len = (size_t)n;
            }
        }
    }
    fclose(f);
    return buf;
}

uint32_t testutil_rand_u32(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (uint32_t)(*state >> 16);
}

float testutil_rand_float(uint64_t *state, float a)
{
    return a * ((float)(testutil_rand_u32(state) & 0xffffff) / 8388608.0f - 1.0f);
}

float *testutil_rand_array(uint64_t *state, size_t n, float a)
{
    float *p = malloc(n * sizeof *p);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++)
        p[i] = testutil_rand_float(state, a);
    return p;
}

int8_t testutil_rand_s8(uint64_t *state)
{
    return (int8_t)((int)(testutil_rand_u32(state) % 255) - 127);
}

float testutil_int8_epilogue(int32_t acc, float mult, float bias, const int8_t *res, int res_u8, float res_scale,
                             int relu)
{
    float v = (float)acc * mult;
    v = v + bias;
    if (res)
        v = v + (float)(res_u8 ? (int)*(const uint8_t *)res : (int)*res) * res_scale;
    if (relu && v < 0.0f)
        v = 0.0f;
    return v;
}

double testutil_rel_l2_d(const float *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

float testutil_half_bits(uint16_t h)
{
    const int e = (h >> 10) & 31, m = h & 1023;
    const float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);
    return h & 0x8000 ? -v : v;
}

double testutil_rel_l2(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The mean of the per-image rel L2 of got against want; *worst, *at: the
 * largest and its image. */
static double mean_rel_l2(const float *got, const float *want, int n, int classes, double *worst, int *at)
{
    double sum = 0;
    *worst = -1;
    for (int i = 0; i < n; i++) {
        double rel = testutil_rel_l2(got + (size_t)i * classes, want + (size_t)i * classes, (size_t)classes);
        sum += rel;
        if (rel > *worst) {
            *worst = rel;
            *at = i;
        }
    }
    return sum / n;
}

/* How much nearer got must be to its own reference than to any other. */
#define NEAREST_MARGIN 3.0

void testutil_expect_nearest(const float *got, const float *const *ref, const char *const *names, int nref, int own,
                             int n, int classes, double tol_mean, double tol_image, const char *what)
{
    enum { MAX_REFS = 16 };
    ck_assert(nref >= 2 && nref <= MAX_REFS && own >= 0 && own < nref && n >= 1);
    double mean[MAX_REFS], worst = 0, w;
    int near = -1, at = 0, a;
    for (int r = 0; r < nref; r++) {
        mean[r] = mean_rel_l2(got, ref[r], n, classes, r == own ? &worst : &w, r == own ? &at : &a);
        if (r != own && (near < 0 || mean[r] < mean[near]))
            near = r;
    }
    fprintf(stderr, "%s: mean rel L2 %.3g against %s (image %d %.3g), the nearest other %s %.3g\n", what, mean[own],
            names[own], at, worst, names[near], mean[near]);
    ck_assert_msg(mean[own] <= tol_mean, "%s: mean rel L2 %.3g against %s > %.3g (%s: %.3g)", what, mean[own],
                  names[own], tol_mean, names[near], mean[near]);
    ck_assert_msg(worst <= tol_image, "%s: image %d rel L2 %.3g against %s > %.3g", what, at, worst, names[own],
                  tol_image);
    ck_assert_msg(mean[near] > NEAREST_MARGIN * mean[own],
                  "%s: %s (mean rel L2 %.3g) is not %gx further than %s (%.3g): no telling them apart", what,
                  names[near], mean[near], NEAREST_MARGIN, names[own], mean[own]);
}

const char *testutil_mix_logits(const char *mix, int fp16)
{
    static char name[128];
    if (strcmp(mix, "int8") == 0) {
        snprintf(name, sizeof name, "int8/random_logits.npy");
    } else {
        char file_mix[64];
        snprintf(file_mix, sizeof file_mix, "%s", mix);
        for (char *c = file_mix; *c; c++)
            *c = *c == ':' ? '_' : *c;
        snprintf(name, sizeof name, "int8/random_logits_%s%s.npy", file_mix, fp16 ? "_fp16" : "");
    }
    return name;
}

void testutil_topk(const float *v, int n, int k, int *idx)
{
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            int used = 0;
            for (int m = 0; m < j; m++)
                used |= idx[m] == i;
            if (!used && (best < 0 || v[i] > v[best]))
                best = i;
        }
        idx[j] = best;
    }
}

int testutil_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
