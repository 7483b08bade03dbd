/* Tests daemon/api/metrics.c through its rendered text: counters and histogram
 * buckets move by exactly what was observed, histograms are cumulative with
 * +Inf == _count (also while other threads update), concurrent updates sum
 * exactly, and the families the daemon promises are always there.
 * Every check works on deltas, so tests also pass with CK_FORK=no. */
#include "daemon/api/metrics.h"
#include "engine/calib.h"
#include "tests/lib/testutil.h"

#include <check.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char *render(void)
{
    size_t len = 0;
    char *text = metrics_render(&len);
    ck_assert_ptr_nonnull(text);
    ck_assert_uint_eq(strlen(text), len);
    return text;
}

/* Value of the sample whose name-and-labels is exactly key; NAN if absent. */
static double sample(const char *text, const char *key)
{
    size_t klen = strlen(key);
    for (const char *line = text; *line;) {
        if (strncmp(line, key, klen) == 0 && line[klen] == ' ')
            return strtod(line + klen + 1, NULL);
        const char *nl = strchr(line, '\n');
        if (nl == NULL)
            break;
        line = nl + 1;
    }
    return NAN;
}

static double render_sample(const char *key)
{
    char *text = render();
    double v = sample(text, key);
    free(text);
    return v;
}

/* The buckets of histogram name never decrease and +Inf equals _count.
 * Returns the number of buckets seen, or -1 on an inconsistency. */
static int histogram_consistent(const char *text, const char *name)
{
    char prefix[128];
    snprintf(prefix, sizeof prefix, "%s_bucket{le=\"", name);
    size_t plen = strlen(prefix);
    double prev = 0, inf = NAN;
    int n = 0;
    for (const char *line = text; *line;) {
        if (strncmp(line, prefix, plen) == 0) {
            const char *sp = strchr(line, ' ');
            if (sp == NULL)
                return -1;
            double v = strtod(sp + 1, NULL);
            if (v < prev)
                return -1;
            prev = v;
            if (strncmp(line + plen, "+Inf\"}", 6) == 0)
                inf = v;
            n++;
        }
        const char *nl = strchr(line, '\n');
        if (nl == NULL)
            break;
        line = nl + 1;
    }
    char key[128];
    snprintf(key, sizeof key, "%s_count", name);
    if (isnan(inf) || inf != sample(text, key))
        return -1;
    return n;
}

START_TEST(test_every_family_has_help_and_type)
{
    char *text = render();
    static const char *const families[] = {
        "resnetd_build_info",
        "resnetd_requests_total",
        "resnetd_images_total",
        "resnetd_rejected_total",
        "resnetd_request_duration_seconds",
        "resnetd_queue_duration_seconds",
        "resnetd_decode_duration_seconds",
        "resnetd_inference_duration_seconds",
        "resnetd_batch_size",
        "resnetd_queue_depth",
        "resnetd_batches_in_flight",
        "resnetd_ready",
        "resnetd_gpu_memory_bytes",
        "resnetd_pinned_memory_bytes",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    };
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        char help[160], type[160];
        snprintf(help, sizeof help, "# HELP %s ", families[i]);
        snprintf(type, sizeof type, "# TYPE %s ", families[i]);
        ck_assert_msg(strstr(text, help) != NULL, "no HELP for %s", families[i]);
        ck_assert_msg(strstr(text, type) != NULL, "no TYPE for %s", families[i]);
    }
    ck_assert_int_eq(text[strlen(text) - 1], '\n');
    free(text);
}
END_TEST

START_TEST(test_rejected_reasons_and_fixed_codes_always_present)
{
    char *text = render();
    static const char *const reasons[] = { "queue_full", "timeout", "too_large", "bad_input", "client_gone" };
    for (size_t i = 0; i < 5; i++) {
        char key[96];
        snprintf(key, sizeof key, "resnetd_rejected_total{reason=\"%s\"}", reasons[i]);
        ck_assert_msg(!isnan(sample(text, key)), "missing %s", key);
    }
    static const int codes[] = { 200, 400, 404, 405, 413, 415, 500, 503, 504 };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        char key[96];
        snprintf(key, sizeof key, "resnetd_requests_total{code=\"%d\"}", codes[i]);
        ck_assert_msg(!isnan(sample(text, key)), "missing %s", key);
    }
    ck_assert(isnan(sample(text, "resnetd_requests_total{code=\"418\"}")));
    free(text);
}
END_TEST

START_TEST(test_counters_move_by_exactly_what_was_added)
{
    char *before = render();
    metrics_add_images(7);
    metrics_add_images(0);
    metrics_add_images(-3); /* ignored: a counter never goes down */
    metrics_reject(METRICS_REJECT_QUEUE_FULL);
    metrics_reject(METRICS_REJECT_CLIENT_GONE);
    metrics_reject(METRICS_REJECT_CLIENT_GONE);
    metrics_reject(METRICS_REJECT_COUNT); /* out of range: ignored */
    metrics_observe_request(200, 0.01);
    metrics_observe_request(503, 0.001);
    metrics_observe_request(418, 0.001); /* not in the fixed table */
    metrics_observe_request(1000, 0.001);
    char *after = render();

    ck_assert_double_eq(sample(after, "resnetd_images_total") - sample(before, "resnetd_images_total"), 7);
    ck_assert_double_eq(sample(after, "resnetd_rejected_total{reason=\"queue_full\"}") -
                            sample(before, "resnetd_rejected_total{reason=\"queue_full\"}"),
                        1);
    ck_assert_double_eq(sample(after, "resnetd_rejected_total{reason=\"client_gone\"}") -
                            sample(before, "resnetd_rejected_total{reason=\"client_gone\"}"),
                        2);
    ck_assert_double_eq(sample(after, "resnetd_rejected_total{reason=\"timeout\"}") -
                            sample(before, "resnetd_rejected_total{reason=\"timeout\"}"),
                        0);
    ck_assert_double_eq(sample(after, "resnetd_requests_total{code=\"200\"}") -
                            sample(before, "resnetd_requests_total{code=\"200\"}"),
                        1);
    ck_assert_double_eq(sample(after, "resnetd_requests_total{code=\"503\"}") -
                            sample(before, "resnetd_requests_total{code=\"503\"}"),
                        1);
    ck_assert(sample(after, "resnetd_requests_total{code=\"418\"}") >= 1);
    ck_assert(sample(after, "resnetd_requests_total{code=\"invalid\"}") >= 1);
    ck_assert_double_eq(sample(after, "resnetd_request_duration_seconds_count") -
                            sample(before, "resnetd_request_duration_seconds_count"),
                        4);
    free(before);
    free(after);
}
END_TEST

START_TEST(test_duration_histogram_buckets_are_cumulative_with_inclusive_bounds)
{
    char *before = render();
    metrics_observe_queue(0.00005); /* le=0.0001 */
    metrics_observe_queue(0.0001); /* on the bound: le is inclusive */
    metrics_observe_queue(0.003); /* le=0.005 */
    metrics_observe_queue(20); /* only +Inf */
    metrics_observe_queue(-1); /* clamped to 0 */
    metrics_observe_queue(NAN); /* clamped to 0 */
    char *after = render();

#define DELTA(key) (sample(after, key) - sample(before, key))
    ck_assert_double_eq(DELTA("resnetd_queue_duration_seconds_bucket{le=\"0.0001\"}"), 4);
    ck_assert_double_eq(DELTA("resnetd_queue_duration_seconds_bucket{le=\"0.0025\"}"), 4);
    ck_assert_double_eq(DELTA("resnetd_queue_duration_seconds_bucket{le=\"0.005\"}"), 5);
    ck_assert_double_eq(DELTA("resnetd_queue_duration_seconds_bucket{le=\"10\"}"), 5);
    ck_assert_double_eq(DELTA("resnetd_queue_duration_seconds_bucket{le=\"+Inf\"}"), 6);
    ck_assert_double_eq(DELTA("resnetd_queue_duration_seconds_count"), 6);
    ck_assert_double_eq_tol(DELTA("resnetd_queue_duration_seconds_sum"), 0.00005 + 0.0001 + 0.003 + 20, 1e-9);
    /* The other stage histograms did not move. */
    ck_assert_double_eq(DELTA("resnetd_decode_duration_seconds_count"), 0);
    ck_assert_double_eq(DELTA("resnetd_inference_duration_seconds_count"), 0);
#undef DELTA
    ck_assert_int_eq(histogram_consistent(after, "resnetd_queue_duration_seconds"), 17);
    ck_assert_int_eq(histogram_consistent(after, "resnetd_request_duration_seconds"), 17);
    free(before);
    free(after);
}
END_TEST

START_TEST(test_batch_size_histogram_counts_sizes)
{
    char *before = render();
    metrics_observe_batch(1);
    metrics_observe_batch(3);
    metrics_observe_batch(512);
    metrics_observe_batch(513);
    metrics_observe_batch(0); /* not a batch: ignored */
    char *after = render();
#define DELTA(key) (sample(after, key) - sample(before, key))
    ck_assert_double_eq(DELTA("resnetd_batch_size_bucket{le=\"1\"}"), 1);
    ck_assert_double_eq(DELTA("resnetd_batch_size_bucket{le=\"2\"}"), 1);
    ck_assert_double_eq(DELTA("resnetd_batch_size_bucket{le=\"4\"}"), 2);
    ck_assert_double_eq(DELTA("resnetd_batch_size_bucket{le=\"512\"}"), 3);
    ck_assert_double_eq(DELTA("resnetd_batch_size_bucket{le=\"+Inf\"}"), 4);
    ck_assert_double_eq(DELTA("resnetd_batch_size_sum"), 1 + 3 + 512 + 513);
    ck_assert_double_eq(DELTA("resnetd_batch_size_count"), 4);
#undef DELTA
    ck_assert_int_eq(histogram_consistent(after, "resnetd_batch_size"), 11);
    free(before);
    free(after);
}
END_TEST

START_TEST(test_gauges_report_last_value)
{
    metrics_set_queue_depth(42);
    double in_flight = render_sample("resnetd_batches_in_flight");
    metrics_add_batches_in_flight(2);
    metrics_add_batches_in_flight(-1);
    metrics_set_ready(5);
    metrics_set_memory((size_t)3 << 30, 4096);
    char *text = render();
    ck_assert_double_eq(sample(text, "resnetd_queue_depth"), 42);
    ck_assert_double_eq(sample(text, "resnetd_batches_in_flight"), in_flight + 1);
    ck_assert_double_eq(sample(text, "resnetd_ready"), 1);
    ck_assert_double_eq(sample(text, "resnetd_gpu_memory_bytes"), 3221225472.0);
    ck_assert_double_eq(sample(text, "resnetd_pinned_memory_bytes"), 4096);
    free(text);
    metrics_set_ready(0);
    ck_assert_double_eq(render_sample("resnetd_ready"), 0);
}
END_TEST

/* The INT8 check's gauges appear once a checked table is served, with its
 * figures, and go again when one without a check replaces it; the mix's
 * info gauge names the served table's mix whether or not it was checked,
 * and goes when the model is no longer served at INT8. */
START_TEST(test_int8_gauges_follow_the_served_table)
{
    char *text = render();
    ck_assert(isnan(sample(text, "resnetd_int8_check_images")));
    ck_assert_ptr_null(strstr(text, "resnetd_int8_mix_info"));
    free(text);
    calib_check c = { .images = 357, .agreement = 100.0 * 349 / 357, .rel_l2 = 0.0132 };
    metrics_set_int8("float:layer1", &c);
    text = render();
    ck_assert_double_eq(sample(text, "resnetd_int8_mix_info{mix=\"float:layer1\"}"), 1);
    ck_assert_double_eq(sample(text, "resnetd_int8_check_images"), 357);
    ck_assert_double_eq_tol(sample(text, "resnetd_int8_check_top1_agreement_ratio"), 349.0 / 357, 1e-6);
    ck_assert_double_eq_tol(sample(text, "resnetd_int8_check_logits_rel_l2"), 0.0132, 1e-9);
    free(text);
    metrics_set_int8("int8", &(calib_check){ 0 });
    text = render();
    ck_assert_double_eq(sample(text, "resnetd_int8_mix_info{mix=\"int8\"}"), 1);
    ck_assert_ptr_null(strstr(text, "float:layer1"));
    ck_assert(isnan(sample(text, "resnetd_int8_check_top1_agreement_ratio")));
    free(text);
    metrics_set_int8(NULL, &(calib_check){ 0 });
    text = render();
    ck_assert_ptr_null(strstr(text, "resnetd_int8_mix_info"));
    free(text);
}
END_TEST

START_TEST(test_build_info_escapes_label_values)
{
    metrics_init("1.2\"x\\y\nz", "cuda:0", NULL);
    char *text = render();
    ck_assert_double_eq(sample(text, "resnetd_build_info{version=\"1.2\\\"x\\\\y\\nz\",device=\"cuda:0\","
                                     "precision=\"unknown\"}"),
                        1);
    free(text);
    metrics_init("0.1.0", "cpu", "fp32");
    ck_assert_double_eq(render_sample("resnetd_build_info{version=\"0.1.0\",device=\"cpu\",precision=\"fp32\"}"), 1);
}
END_TEST

START_TEST(test_process_metrics_follow_the_process)
{
    double fds = render_sample("process_open_fds");
    ck_assert(fds >= 3);
    int fd = open("/dev/null", O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_double_eq(render_sample("process_open_fds"), fds + 1);
    ck_assert_int_eq(close(fd), 0);

    char *text = render();
    ck_assert(sample(text, "process_max_fds") >= fds);
    ck_assert(sample(text, "process_resident_memory_bytes") > 1 << 16);
    ck_assert(sample(text, "process_virtual_memory_bytes") >= sample(text, "process_resident_memory_bytes"));
    ck_assert(sample(text, "process_cpu_seconds_total") >= 0);
    double start = sample(text, "process_start_time_seconds");
    double now = (double)time(NULL);
    ck_assert_msg(start <= now + 2 && start > now - 3600, "start %f now %f", start, now);
    free(text);
}
END_TEST

/* --- concurrency ----------------------------------------------------------- */

enum { N_WRITERS = 4, N_ITER = 100000 };
static atomic_int writers_done;
static atomic_int render_inconsistencies;
static atomic_int renders;

static void *writer(void *arg)
{
    int id = (int)(long)arg;
    for (int i = 0; i < N_ITER; i++) {
        metrics_add_images(1);
        metrics_reject(METRICS_REJECT_TIMEOUT);
        metrics_observe_request(id % 2 ? 200 : 400, 0.0001 * (i % 50));
        metrics_observe_batch(1 + i % 64);
        metrics_observe_infer(0.002);
    }
    atomic_fetch_add(&writers_done, 1);
    return NULL;
}

/* Scrapes while the writers run: every snapshot must be self-consistent. */
static void *scraper(void *arg)
{
    (void)arg;
    while (atomic_load(&writers_done) < N_WRITERS) {
        size_t len;
        char *text = metrics_render(&len);
        if (text == NULL || histogram_consistent(text, "resnetd_batch_size") != 11 ||
            histogram_consistent(text, "resnetd_request_duration_seconds") != 17 ||
            histogram_consistent(text, "resnetd_inference_duration_seconds") != 17)
            atomic_fetch_add(&render_inconsistencies, 1);
        atomic_fetch_add(&renders, 1);
        free(text);
    }
    return NULL;
}

START_TEST(test_concurrent_updates_sum_exactly_and_scrapes_stay_consistent)
{
    char *before = render();
    pthread_t w[N_WRITERS], s;
    atomic_store(&writers_done, 0);
    ck_assert_int_eq(pthread_create(&s, NULL, scraper, NULL), 0);
    for (long i = 0; i < N_WRITERS; i++)
        ck_assert_int_eq(pthread_create(&w[i], NULL, writer, (void *)i), 0);
    for (int i = 0; i < N_WRITERS; i++)
        ck_assert_int_eq(pthread_join(w[i], NULL), 0);
    ck_assert_int_eq(pthread_join(s, NULL), 0);
    char *after = render();

    const double total = (double)N_WRITERS * N_ITER;
    long batch_sum_per_writer = 0;
    for (int i = 0; i < N_ITER; i++)
        batch_sum_per_writer += 1 + i % 64;
#define DELTA(key) (sample(after, key) - sample(before, key))
    ck_assert_double_eq(DELTA("resnetd_images_total"), total);
    ck_assert_double_eq(DELTA("resnetd_rejected_total{reason=\"timeout\"}"), total);
    ck_assert_double_eq(DELTA("resnetd_requests_total{code=\"200\"}"), total / 2);
    ck_assert_double_eq(DELTA("resnetd_requests_total{code=\"400\"}"), total / 2);
    ck_assert_double_eq(DELTA("resnetd_request_duration_seconds_count"), total);
    ck_assert_double_eq(DELTA("resnetd_batch_size_count"), total);
    ck_assert_double_eq(DELTA("resnetd_batch_size_sum"), (double)batch_sum_per_writer * N_WRITERS);
    ck_assert_double_eq(DELTA("resnetd_inference_duration_seconds_bucket{le=\"0.0025\"}"), total);
    ck_assert_double_eq(DELTA("resnetd_inference_duration_seconds_bucket{le=\"0.001\"}"), 0);
    ck_assert_double_eq_tol(DELTA("resnetd_inference_duration_seconds_sum"), total * 0.002, 1e-6);
#undef DELTA
    ck_assert_int_eq(atomic_load(&render_inconsistencies), 0);
    ck_assert_int_gt(atomic_load(&renders), 0);
    free(before);
    free(after);
}
END_TEST

static Suite *metrics_suite(void)
{
    Suite *s = suite_create("metrics");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_every_family_has_help_and_type);
    tcase_add_test(tc, test_int8_gauges_follow_the_served_table);
    tcase_add_test(tc, test_rejected_reasons_and_fixed_codes_always_present);
    tcase_add_test(tc, test_counters_move_by_exactly_what_was_added);
    tcase_add_test(tc, test_duration_histogram_buckets_are_cumulative_with_inclusive_bounds);
    tcase_add_test(tc, test_batch_size_histogram_counts_sizes);
    tcase_add_test(tc, test_gauges_report_last_value);
    tcase_add_test(tc, test_build_info_escapes_label_values);
    tcase_add_test(tc, test_process_metrics_follow_the_process);
    tcase_add_test(tc, test_concurrent_updates_sum_exactly_and_scrapes_stay_consistent);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    metrics_init("0.1.0", "cpu", "fp32");
    return testutil_run(metrics_suite());
}
