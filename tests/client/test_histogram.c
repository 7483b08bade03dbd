/* Tests for client/histogram.c: bucket arithmetic, and quantiles within the
 * promised 0.4% (so within the 1% resnetd-load promises) of the exact
 * quantiles of known distributions, computed by sorting the samples. */
#include <math.h>
#include <stdlib.h>
#include "client/histogram.h"
#include "tests/lib/testutil.h"

#define N_SAMPLES 200000
#define MAX_REL_ERR (1.0 / 256 + 1e-9) /* half a bucket over its lower bound */

static uint64_t rng_state = 88172645463325252ull;

static double uniform01(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return ((double)(rng_state >> 11) + 0.5) * 0x1.0p-53;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Records v[0..n) and checks quantiles against the sorted samples. */
static void check_quantiles(uint64_t *v, size_t n)
{
    histogram *h = malloc(sizeof *h);
    ck_assert_ptr_nonnull(h);
    histogram_init(h);
    for (size_t i = 0; i < n; i++)
        histogram_record(h, v[i]);
    qsort(v, n, sizeof *v, cmp_u64);
    static const double qs[] = { 0.0001, 0.01, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 0.9999 };
    for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++) {
        size_t rank = (size_t)ceil(qs[i] * (double)n);
        uint64_t exact = v[rank - 1];
        uint64_t got = histogram_quantile(h, qs[i]);
        double rel = fabs((double)got - (double)exact) / (double)exact;
        ck_assert_msg(rel <= MAX_REL_ERR, "q=%g: histogram %llu, exact %llu, relative error %.5f", qs[i],
                      (unsigned long long)got, (unsigned long long)exact, rel);
    }
    ck_assert_uint_eq(histogram_quantile(h, 0.0), v[0]);
    ck_assert_uint_eq(histogram_quantile(h, 1.0), v[n - 1]);
    ck_assert_uint_eq(h->min, v[0]);
    ck_assert_uint_eq(h->max, v[n - 1]);
    free(h);
}

START_TEST(test_values_below_256_are_exact)
{
    histogram h;
    histogram_init(&h);
    for (uint64_t v = 0; v < 256; v++)
        histogram_record(&h, v);
    for (uint64_t k = 1; k <= 256; k++)
        ck_assert_uint_eq(histogram_quantile(&h, (double)k / 256), k - 1);
}
END_TEST

START_TEST(test_buckets_contain_their_values_and_are_narrow)
{
    uint64_t probes[4000];
    size_t n = 0;
    for (int e = 0; e < 64; e++) {
        uint64_t p = 1ull << e;
        probes[n++] = p;
        probes[n++] = p - 1;
        probes[n++] = p + 1;
    }
    probes[n++] = UINT64_MAX;
    while (n < sizeof probes / sizeof probes[0])
        probes[n++] = (uint64_t)(uniform01() * 0x1.0p63) >> (unsigned)(uniform01() * 60);
    for (size_t i = 0; i < n; i++) {
        unsigned b = histogram_bucket(probes[i]);
        uint64_t lo, hi;
        ck_assert_uint_lt(b, HISTOGRAM_BUCKETS);
        histogram_bucket_range(b, &lo, &hi);
        ck_assert_msg(lo <= probes[i] && probes[i] <= hi, "%llu not in bucket %u [%llu, %llu]",
                      (unsigned long long)probes[i], b, (unsigned long long)lo, (unsigned long long)hi);
        if (lo >= 256)
            ck_assert_msg((double)(hi - lo + 1) <= (double)lo / 128, "bucket %u too wide", b);
    }
    /* consecutive buckets tile the line with no gap or overlap */
    uint64_t prev_hi, lo, hi;
    histogram_bucket_range(0, &lo, &prev_hi);
    for (unsigned b = 1; b < HISTOGRAM_BUCKETS; b++) {
        histogram_bucket_range(b, &lo, &hi);
        ck_assert_uint_eq(lo, prev_hi + 1);
        prev_hi = hi;
    }
    ck_assert_uint_eq(prev_hi, UINT64_MAX);
}
END_TEST

START_TEST(test_uniform_latencies_within_0_4_percent)
{
    static uint64_t v[N_SAMPLES];
    for (size_t i = 0; i < N_SAMPLES; i++)
        v[i] = 100000 + (uint64_t)(uniform01() * 50e6); /* 0.1 .. 50 ms in ns */
    check_quantiles(v, N_SAMPLES);
}
END_TEST

START_TEST(test_exponential_latencies_within_0_4_percent)
{
    static uint64_t v[N_SAMPLES];
    for (size_t i = 0; i < N_SAMPLES; i++)
        v[i] = 1 + (uint64_t)(-log(uniform01()) * 2e6); /* mean 2 ms */
    check_quantiles(v, N_SAMPLES);
}
END_TEST

START_TEST(test_heavy_tailed_latencies_within_0_4_percent)
{
    static uint64_t v[N_SAMPLES];
    for (size_t i = 0; i < N_SAMPLES; i++) {
        /* log-normal body plus a 1% tail of multi-second stalls */
        double z = sqrt(-2 * log(uniform01())) * cos(2 * M_PI * uniform01());
        double x = exp(log(5e6) + 1.2 * z);
        if (uniform01() < 0.01)
            x = 1e9 + uniform01() * 9e9;
        v[i] = (uint64_t)x + 1;
    }
    check_quantiles(v, N_SAMPLES);
}
END_TEST

START_TEST(test_min_max_mean_are_exact)
{
    histogram h;
    histogram_init(&h);
    histogram_record(&h, 1234567);
    histogram_record(&h, 7654321);
    histogram_record(&h, 3000000);
    ck_assert_uint_eq(h.min, 1234567);
    ck_assert_uint_eq(h.max, 7654321);
    ck_assert_uint_eq(h.total, 3);
    ck_assert_double_eq_tol(histogram_mean(&h), (1234567.0 + 7654321.0 + 3000000.0) / 3, 1e-6);
    ck_assert_uint_eq(histogram_quantile(&h, 0.999), 7654321); /* clamped to the exact max */
}
END_TEST

START_TEST(test_merge_equals_recording_into_one)
{
    histogram *a = malloc(sizeof *a), *b = malloc(sizeof *b), *all = malloc(sizeof *all);
    ck_assert(a && b && all);
    histogram_init(a);
    histogram_init(b);
    histogram_init(all);
    for (int i = 0; i < 10000; i++) {
        uint64_t v = (uint64_t)(uniform01() * 1e9);
        histogram_record(i % 3 ? a : b, v);
        histogram_record(all, v);
    }
    histogram_merge(a, b);
    ck_assert_uint_eq(a->total, all->total);
    ck_assert_uint_eq(a->min, all->min);
    ck_assert_uint_eq(a->max, all->max);
    for (unsigned i = 0; i < HISTOGRAM_BUCKETS; i++)
        ck_assert_uint_eq(a->counts[i], all->counts[i]);
    free(a);
    free(b);
    free(all);
}
END_TEST

START_TEST(test_empty_histogram_reports_zero)
{
    histogram h;
    histogram_init(&h);
    ck_assert_uint_eq(histogram_quantile(&h, 0.5), 0);
    ck_assert_double_eq(histogram_mean(&h), 0.0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("histogram");
    TCase *tc = tcase_create("histogram");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_values_below_256_are_exact);
    tcase_add_test(tc, test_buckets_contain_their_values_and_are_narrow);
    tcase_add_test(tc, test_uniform_latencies_within_0_4_percent);
    tcase_add_test(tc, test_exponential_latencies_within_0_4_percent);
    tcase_add_test(tc, test_heavy_tailed_latencies_within_0_4_percent);
    tcase_add_test(tc, test_min_max_mean_are_exact);
    tcase_add_test(tc, test_merge_equals_recording_into_one);
    tcase_add_test(tc, test_empty_histogram_reports_zero);
    suite_add_tcase(s, tc);
    return testutil_run(s);
}
