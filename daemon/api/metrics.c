/* Prometheus metrics for resnetd, rendered in text exposition format 0.0.4.
 *
 * Invariants:
 * - Every update on the request path is one or two relaxed atomic
 *   adds/stores on integers, with no lock, so it never waits on a scrape;
 *   only the served INT8 table's figures, set at start-up and on a reload,
 *   share a lock.
 * - A histogram stores per-bucket (non-cumulative) counts plus an overflow
 *   bucket; its _count is the sum of the buckets it just read, so every
 *   rendered histogram is self-consistent (+Inf == _count) even while other
 *   threads observe. Its _sum is a separate atomic and may lag by the
 *   observations in flight, which Prometheus tolerates.
 * - Durations are summed as integer nanoseconds, rendered as exact decimals.
 * - metrics_init() runs once, before any other thread calls in.
 * - process_* metrics come from /proc/self and getrlimit at render time; a
 *   family that cannot be read is left out rather than made up. */
#include "daemon/api/metrics.h"
#include "engine/calib.h"

#include <dirent.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free");

typedef atomic_ullong counter;

/* --- histograms ------------------------------------------------------------ */

/* 100 us .. 10 s covers a warm CPU batch as well as a request that timed out. */
static const double duration_bounds[] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
};
#define DURATION_NB (sizeof duration_bounds / sizeof duration_bounds[0])

static const double batch_bounds[] = { 1, 2, 4, 8, 16, 32, 64, 128, 256, 512 };
#define BATCH_NB (sizeof batch_bounds / sizeof batch_bounds[0])

#define HIST_MAX_BUCKETS 16

typedef struct {
    const char *name;
    const char *help;
    const double *bounds;
    int nbounds;
    int sum_is_ns; /* sum in ns (seconds) or plain units */
    counter buckets[HIST_MAX_BUCKETS + 1]; /* last one: above every bound */
    counter sum;
} histogram;

_Static_assert(DURATION_NB <= HIST_MAX_BUCKETS && BATCH_NB <= HIST_MAX_BUCKETS, "histogram bucket table too small");

static histogram hist_request = { "resnetd_request_duration_seconds",
                                  "Time from request arrival to its response, for every HTTP request.",
                                  duration_bounds,
                                  DURATION_NB,
                                  1,
                                  { 0 },
                                  0 };
static histogram hist_queue = { "resnetd_queue_duration_seconds",
                                "Time an image waited in the batch queue before its batch started.",
                                duration_bounds,
                                DURATION_NB,
                                1,
                                { 0 },
                                0 };
static histogram hist_decode = { "resnetd_decode_duration_seconds",
                                 "Time to decode one JPEG and produce its 224x224 crop.",
                                 duration_bounds,
                                 DURATION_NB,
                                 1,
                                 { 0 },
                                 0 };
static histogram hist_gpu_preprocess = {
    "resnetd_gpu_preprocess_duration_seconds",
    "GPU time to decode, resize and crop one batch's JPEGs (nvJPEG hardware decoder), per batch.",
    duration_bounds,
    DURATION_NB,
    1,
    { 0 },
    0
};
static histogram hist_infer = { "resnetd_inference_duration_seconds",
                                "Time for the engine to run one batch, submit to logits.",
                                duration_bounds,
                                DURATION_NB,
                                1,
                                { 0 },
                                0 };
static histogram hist_batch = {
    "resnetd_batch_size", "Number of images in each batch sent to the engine.", batch_bounds, BATCH_NB, 0, { 0 }, 0
};

static void hist_observe(histogram *h, double v, uint64_t sum_add)
{
    int i = 0;
    while (i < h->nbounds && v > h->bounds[i])
        i++;
    atomic_fetch_add_explicit(&h->buckets[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum, sum_add, memory_order_relaxed);
}

/* Seconds to whole nanoseconds; NaN and negatives count as 0, and the clamp
 * keeps a wild value from overflowing the sum. */
static uint64_t seconds_to_ns(double s)
{
    if (!(s > 0))
        return 0;
    if (s > 1e9)
        s = 1e9;
    return (uint64_t)(s * 1e9 + 0.5);
}

static void hist_observe_seconds(histogram *h, double s)
{
    uint64_t ns = seconds_to_ns(s);
    hist_observe(h, (double)ns / 1e9, ns);
}

/* --- counters and gauges ----------------------------------------------------- */

/* Statuses the daemon sends; always rendered, even at 0, so dashboards can
 * rate() them from the first scrape. */
static const int fixed_codes[] = { 200, 400, 404, 405, 413, 415, 500, 503, 504 };
#define N_FIXED_CODES (sizeof fixed_codes / sizeof fixed_codes[0])

/* One counter per valid HTTP status, indexed by code - 100: lock-free and
 * small (4 KiB), and any other status is rendered with its real code. */
#define CODE_MIN 100
#define CODE_MAX 599
static counter requests_by_code[CODE_MAX - CODE_MIN + 1];
static counter requests_bad_code; /* outside 100..599: a bug, but counted */

static const char *const reject_names[METRICS_REJECT_COUNT] = {
    [METRICS_REJECT_QUEUE_FULL] = "queue_full",   [METRICS_REJECT_TIMEOUT] = "timeout",
    [METRICS_REJECT_TOO_LARGE] = "too_large",     [METRICS_REJECT_BAD_INPUT] = "bad_input",
    [METRICS_REJECT_CLIENT_GONE] = "client_gone", [METRICS_REJECT_MEMORY_FULL] = "memory_full",
    [METRICS_REJECT_SLOW_CLIENT] = "slow_client",
};
static counter rejected[METRICS_REJECT_COUNT];

static const char *const backend_names[METRICS_DECODE_NBACKENDS] = {
    [METRICS_DECODE_CPU] = "cpu",
    [METRICS_DECODE_HARDWARE] = "hardware",
};
static counter decoded[METRICS_DECODE_NBACKENDS];
static counter decode_fallbacks[DEVJPEG_NREASONS];
/* The decode router's means (daemon/pipeline/route.h), picoseconds per pixel:
 * [0] one GPU decoder, [1..3] one CPU thread by size class; 0 = unset. */
#define DECODE_COSTS 4
static counter decode_cost_ps[DECODE_COSTS];
static const char *const decode_cost_labels[DECODE_COSTS] = {
    "path=\"gpu\"",
    "path=\"cpu\",size=\"under_1mp\"",
    "path=\"cpu\",size=\"1_to_4mp\"",
    "path=\"cpu\",size=\"4mp_and_over\"",
};

static counter images_total;
static atomic_llong queue_depth;
static atomic_llong batches_in_flight;
static atomic_int ready;
static atomic_llong connections_open;
static counter connections_dropped_slow;
static metrics_admission admission;
static pthread_mutex_t admission_mu = PTHREAD_MUTEX_INITIALIZER;
static counter body_memory_bytes;
static counter body_memory_limit_bytes;
static counter gpu_memory_bytes;
static counter pinned_memory_bytes;
/* Per engine (one per GPU with device = cuda:all), labelled by device. */
#define MAX_ENGINES 16
static pthread_mutex_t engines_mu = PTHREAD_MUTEX_INITIALIZER;
static char engine_label[MAX_ENGINES][32];
static atomic_int engines;
static counter engine_batches[MAX_ENGINES], engine_images[MAX_ENGINES];
static atomic_llong engine_in_flight[MAX_ENGINES];
static counter model_version;
static counter model_loaded_ms; /* unix time of the served model's load, ms */
static counter model_loads[2]; /* [0] failed, [1] ok */
/* The served INT8 table's mix and check: figures that change together (on
 * a reload), so one lock keeps a scrape from mixing two tables'. */
static pthread_mutex_t int8_lock = PTHREAD_MUTEX_INITIALIZER;
static char int8_mix[32]; /* "": not at INT8 */
static calib_check int8_check; /* images 0: no INT8 table, or one never checked */

#define LABEL_MAX 128
static char build_version[LABEL_MAX] = "unknown";
static char build_device[LABEL_MAX] = "unknown";
static char build_precision[LABEL_MAX] = "unknown";

static void copy_label(char *dst, const char *src)
{
    if (src == NULL || src[0] == '\0')
        src = "unknown";
    snprintf(dst, LABEL_MAX, "%s", src);
}

void metrics_init(const char *version, const char *device, const char *precision)
{
    copy_label(build_version, version);
    copy_label(build_device, device);
    copy_label(build_precision, precision);
}

void metrics_observe_request(int http_status, double seconds)
{
    if (http_status >= CODE_MIN && http_status <= CODE_MAX)
        atomic_fetch_add_explicit(&requests_by_code[http_status - CODE_MIN], 1, memory_order_relaxed);
    else
        atomic_fetch_add_explicit(&requests_bad_code, 1, memory_order_relaxed);
    hist_observe_seconds(&hist_request, seconds);
}

void metrics_observe_queue(double seconds)
{
    hist_observe_seconds(&hist_queue, seconds);
}
void metrics_observe_decode(double seconds)
{
    hist_observe_seconds(&hist_decode, seconds);
}
void metrics_observe_infer(double seconds)
{
    hist_observe_seconds(&hist_infer, seconds);
}
void metrics_observe_gpu_preprocess(double seconds)
{
    hist_observe_seconds(&hist_gpu_preprocess, seconds);
}

void metrics_add_decoded(metrics_decode_backend b, int n)
{
    if ((int)b >= 0 && b < METRICS_DECODE_NBACKENDS && n > 0)
        atomic_fetch_add_explicit(&decoded[b], (unsigned long long)n, memory_order_relaxed);
}

void metrics_add_decode_fallback(devjpeg_reason r, int n)
{
    if ((int)r > DEVJPEG_OK && r < DEVJPEG_NREASONS && n > 0)
        atomic_fetch_add_explicit(&decode_fallbacks[r], (unsigned long long)n, memory_order_relaxed);
}

void metrics_observe_batch(int size)
{
    if (size < 1)
        return;
    hist_observe(&hist_batch, (double)size, (uint64_t)size);
}

void metrics_add_images(int n)
{
    if (n > 0)
        atomic_fetch_add_explicit(&images_total, (unsigned long long)n, memory_order_relaxed);
}

void metrics_reject(metrics_reject_reason r)
{
    if ((int)r >= 0 && r < METRICS_REJECT_COUNT)
        atomic_fetch_add_explicit(&rejected[r], 1, memory_order_relaxed);
}

void metrics_set_queue_depth(long n)
{
    atomic_store_explicit(&queue_depth, n, memory_order_relaxed);
}

void metrics_add_batches_in_flight(int delta)
{
    atomic_fetch_add_explicit(&batches_in_flight, delta, memory_order_relaxed);
}

void metrics_set_ready(int r)
{
    atomic_store_explicit(&ready, r ? 1 : 0, memory_order_relaxed);
}

void metrics_set_connections(long open, unsigned long long dropped_slow)
{
    atomic_store_explicit(&connections_open, open, memory_order_relaxed);
    atomic_store_explicit(&connections_dropped_slow, dropped_slow, memory_order_relaxed);
}

void metrics_set_admission(const metrics_admission *a)
{
    pthread_mutex_lock(&admission_mu);
    admission = *a;
    pthread_mutex_unlock(&admission_mu);
}

static int (*gpu_probe)(metrics_gpu_reading *out, int max);

void metrics_set_gpu_probe(int (*probe)(metrics_gpu_reading *out, int max))
{
    gpu_probe = probe;
}

void metrics_set_decode_cost(int cpu_class, unsigned long long ps_per_pixel)
{
    int i = cpu_class < 0 ? 0 : 1 + cpu_class;
    if (i < DECODE_COSTS)
        atomic_store_explicit(&decode_cost_ps[i], ps_per_pixel, memory_order_relaxed);
}

void metrics_set_body_memory(size_t used, size_t cap)
{
    atomic_store_explicit(&body_memory_bytes, used, memory_order_relaxed);
    atomic_store_explicit(&body_memory_limit_bytes, cap, memory_order_relaxed);
}

int metrics_engine(const char *label)
{
    pthread_mutex_lock(&engines_mu);
    int n = atomic_load(&engines), id = -1;
    for (int i = 0; i < n && id < 0; i++)
        if (strcmp(engine_label[i], label) == 0)
            id = i;
    if (id < 0 && n < MAX_ENGINES) {
        snprintf(engine_label[n], sizeof engine_label[n], "%s", label);
        id = n;
        atomic_store(&engines, n + 1); /* published after the label is written */
    }
    pthread_mutex_unlock(&engines_mu);
    return id;
}

void metrics_engine_batch(int id, int images)
{
    if (id < 0 || id >= MAX_ENGINES)
        return;
    atomic_fetch_add_explicit(&engine_batches[id], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&engine_images[id], (unsigned long long)images, memory_order_relaxed);
}

void metrics_engine_in_flight(int id, int delta)
{
    if (id >= 0 && id < MAX_ENGINES)
        atomic_fetch_add_explicit(&engine_in_flight[id], delta, memory_order_relaxed);
}

void metrics_set_model(int version, double loaded_unix_s)
{
    atomic_store_explicit(&model_version, (unsigned long long)version, memory_order_relaxed);
    atomic_store_explicit(&model_loaded_ms, (unsigned long long)(loaded_unix_s * 1e3), memory_order_relaxed);
}

void metrics_set_int8(const char *mix, const calib_check *c)
{
    pthread_mutex_lock(&int8_lock);
    snprintf(int8_mix, sizeof int8_mix, "%s", mix ? mix : "");
    int8_check = *c;
    pthread_mutex_unlock(&int8_lock);
}

void metrics_add_model_load(int ok)
{
    atomic_fetch_add_explicit(&model_loads[ok ? 1 : 0], 1, memory_order_relaxed);
}

void metrics_set_memory(size_t gpu_bytes, size_t pinned_bytes)
{
    atomic_store_explicit(&gpu_memory_bytes, gpu_bytes, memory_order_relaxed);
    atomic_store_explicit(&pinned_memory_bytes, pinned_bytes, memory_order_relaxed);
}

/* --- rendering --------------------------------------------------------------- */

typedef struct {
    char *data;
    size_t len, cap;
    int failed; /* sticky: one allocation failure fails the whole render */
} buf;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void
buf_printf(buf *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2;
        while (cap - b->len <= (size_t)n)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (p == NULL) {
            b->failed = 1;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
}

static void render_header(buf *b, const char *name, const char *type, const char *help)
{
    buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One gauge (or counter) per GPU from its readings; unknown values left out. */
static void render_gpu_series(buf *b, const metrics_gpu_reading *r, int n, const char *name, const char *type,
                              const char *help, size_t field)
{
    int any = 0;
    for (int i = 0; i < n; i++)
        any |= *(const double *)((const char *)&r[i] + field) >= 0;
    if (!any)
        return;
    render_header(b, name, type, help);
    for (int i = 0; i < n; i++) {
        double v = *(const double *)((const char *)&r[i] + field);
        if (v >= 0)
            buf_printf(b, "%s{gpu=\"%s\"} %.15g\n", name, r[i].gpu, v);
    }
}

static unsigned long long load(counter *c)
{
    return atomic_load_explicit(c, memory_order_relaxed);
}

static void render_histogram(buf *b, histogram *h)
{
    render_header(b, h->name, "histogram", h->help);
    unsigned long long cum = 0;
    for (int i = 0; i <= h->nbounds; i++) {
        cum += load(&h->buckets[i]);
        if (i < h->nbounds)
            buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", h->name, h->bounds[i], cum);
        else
            buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", h->name, cum);
    }
    unsigned long long sum = load(&h->sum);
    if (h->sum_is_ns)
        buf_printf(b, "%s_sum %llu.%09llu\n", h->name, sum / 1000000000ull, sum % 1000000000ull);
    else
        buf_printf(b, "%s_sum %llu\n", h->name, sum);
    buf_printf(b, "%s_count %llu\n", h->name, cum);
}

/* A label value with \, " and newline escaped as the text format requires. */
static void render_label_value(buf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\')
            buf_printf(b, "\\\\");
        else if (*s == '"')
            buf_printf(b, "\\\"");
        else if (*s == '\n')
            buf_printf(b, "\\n");
        else
            buf_printf(b, "%c", *s);
    }
}

static int is_fixed_code(int code)
{
    for (size_t i = 0; i < N_FIXED_CODES; i++)
        if (fixed_codes[i] == code)
            return 1;
    return 0;
}

static void render_requests(buf *b)
{
    render_header(b, "resnetd_requests_total", "counter", "HTTP requests answered, by status code.");
    for (int code = CODE_MIN; code <= CODE_MAX; code++) {
        unsigned long long n = load(&requests_by_code[code - CODE_MIN]);
        if (n > 0 || is_fixed_code(code))
            buf_printf(b, "resnetd_requests_total{code=\"%d\"} %llu\n", code, n);
    }
    unsigned long long bad = load(&requests_bad_code);
    if (bad > 0)
        buf_printf(b, "resnetd_requests_total{code=\"invalid\"} %llu\n", bad);
}

/* Fields of /proc/self/stat the process_* metrics need (proc(5) numbering). */
typedef struct {
    unsigned long long utime, stime; /* 14, 15: clock ticks */
    unsigned long long starttime; /* 22: ticks after boot */
    unsigned long long vsize; /* 23: bytes */
    long long rss; /* 24: pages */
} proc_stat;

static int read_proc_stat(proc_stat *ps)
{
    char line[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    if (f == NULL)
        return -1;
    char *ok = fgets(line, sizeof line, f);
    fclose(f);
    if (ok == NULL)
        return -1;
    /* comm (field 2) may hold spaces and ')', so parse after the last ')'. */
    char *p = strrchr(line, ')');
    if (p == NULL)
        return -1;
    int n = sscanf(p + 1,
                   " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u" /* 3..13 */
                   " %llu %llu %*d %*d %*d %*d %*d %*d" /* 14..21 */
                   " %llu %llu %lld", /* 22..24 */
                   &ps->utime, &ps->stime, &ps->starttime, &ps->vsize, &ps->rss);
    return n == 5 ? 0 : -1;
}

static int read_boot_time(unsigned long long *btime)
{
    char line[256];
    FILE *f = fopen("/proc/stat", "r");
    if (f == NULL)
        return -1;
    int found = -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "btime %llu", btime) == 1) {
            found = 0;
            break;
        }
    fclose(f);
    return found;
}

/* Open descriptors, not counting the one opendir() itself holds. */
static long count_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return -1;
    int self = dirfd(d);
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (atoi(e->d_name) != self)
            n++;
    }
    closedir(d);
    return n;
}

static void render_process(buf *b)
{
    proc_stat ps;
    long ticks = sysconf(_SC_CLK_TCK);
    long page = sysconf(_SC_PAGESIZE);
    if (read_proc_stat(&ps) == 0 && ticks > 0 && page > 0) {
        render_header(b, "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.");
        buf_printf(b, "process_cpu_seconds_total %.2f\n", (double)(ps.utime + ps.stime) / (double)ticks);
        render_header(b, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
        buf_printf(b, "process_resident_memory_bytes %lld\n", ps.rss * (long long)page);
        render_header(b, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
        buf_printf(b, "process_virtual_memory_bytes %llu\n", ps.vsize);
        unsigned long long btime;
        if (read_boot_time(&btime) == 0) {
            render_header(b, "process_start_time_seconds", "gauge",
                          "Start time of the process since unix epoch in seconds.");
            buf_printf(b, "process_start_time_seconds %.2f\n", (double)btime + (double)ps.starttime / (double)ticks);
        }
    }
    long fds = count_open_fds();
    if (fds >= 0) {
        render_header(b, "process_open_fds", "gauge", "Number of open file descriptors.");
        buf_printf(b, "process_open_fds %ld\n", fds);
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        render_header(b, "process_max_fds", "gauge", "Maximum number of open file descriptors.");
        if (rl.rlim_cur == RLIM_INFINITY)
            buf_printf(b, "process_max_fds +Inf\n");
        else
            buf_printf(b, "process_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
    }
}

/* Images, rejections, decoders and the decode router. */
static void render_classified(buf *b)
{
    render_header(b, "resnetd_images_total", "counter", "Images classified.");
    buf_printf(b, "resnetd_images_total %llu\n", load(&images_total));

    render_header(b, "resnetd_rejected_total", "counter",
                  "Requests rejected before or instead of classification, by reason.");
    for (int r = 0; r < METRICS_REJECT_COUNT; r++)
        buf_printf(b, "resnetd_rejected_total{reason=\"%s\"} %llu\n", reject_names[r], load(&rejected[r]));

    render_header(b, "resnetd_decoded_images_total", "counter",
                  "JPEGs decoded, by decoder: cpu (libjpeg-turbo) or hardware (the GPU's nvJPEG decoder).");
    for (int i = 0; i < METRICS_DECODE_NBACKENDS; i++)
        buf_printf(b, "resnetd_decoded_images_total{backend=\"%s\"} %llu\n", backend_names[i], load(&decoded[i]));

    render_header(b, "resnetd_decode_fallbacks_total", "counter",
                  "JPEGs decoded on the CPU although GPU decoding is on, by reason.");
    for (int r = DEVJPEG_OK + 1; r < DEVJPEG_NREASONS; r++)
        buf_printf(b, "resnetd_decode_fallbacks_total{reason=\"%s\"} %llu\n", devjpeg_reason_name((devjpeg_reason)r),
                   load(&decode_fallbacks[r]));
    if (load(&decode_cost_ps[0])) { /* GPU decoding on: the router's measured costs */
        render_header(b, "resnetd_decode_cost_seconds_per_megapixel", "gauge",
                      "Measured decode time per megapixel that routes JPEGs between the GPU and the CPU: one GPU "
                      "decoder, and one CPU thread by image size.");
        for (int i = 0; i < DECODE_COSTS; i++)
            buf_printf(b, "resnetd_decode_cost_seconds_per_megapixel{%s} %.6g\n", decode_cost_labels[i],
                       (double)load(&decode_cost_ps[i]) * 1e-6);
    }
}

/* The queue, readiness, connections and admission. */
static void render_connections(buf *b)
{
    render_header(b, "resnetd_queue_depth", "gauge", "Images waiting in the batch queue.");
    buf_printf(b, "resnetd_queue_depth %lld\n", atomic_load_explicit(&queue_depth, memory_order_relaxed));
    render_header(b, "resnetd_batches_in_flight", "gauge", "Batches submitted to the engine and not yet finished.");
    buf_printf(b, "resnetd_batches_in_flight %lld\n", atomic_load_explicit(&batches_in_flight, memory_order_relaxed));
    render_header(b, "resnetd_ready", "gauge", "1 when the daemon is ready to serve (/readyz answers 200), else 0.");
    buf_printf(b, "resnetd_ready %d\n", atomic_load_explicit(&ready, memory_order_relaxed));
    render_header(b, "resnetd_connections", "gauge", "Client connections open, in any state.");
    buf_printf(b, "resnetd_connections %lld\n", atomic_load_explicit(&connections_open, memory_order_relaxed));
    render_header(b, "resnetd_slow_connections_dropped_total", "counter",
                  "Connections closed for not sending a request's headers within header_timeout_s "
                  "(idle kept-alive ones included) or a body below min_body_rate.");
    buf_printf(b, "resnetd_slow_connections_dropped_total %llu\n", load(&connections_dropped_slow));
    pthread_mutex_lock(&admission_mu);
    metrics_admission adm = admission;
    pthread_mutex_unlock(&admission_mu);
    render_header(b, "resnetd_connections_pending", "gauge",
                  "Connections accepted that wait for their first bytes or for a slot under connection_limit.");
    buf_printf(b, "resnetd_connections_pending %ld\n", adm.pending);
    render_header(b, "resnetd_connections_refused_total", "counter",
                  "Connections answered 503 and closed at admission: no slot within a second (connection_limit), "
                  "the address over client_connection_limit, or the process out of file descriptors.");
    buf_printf(b, "resnetd_connections_refused_total{reason=\"connection_limit\"} %llu\n", adm.refused_limit);
    buf_printf(b, "resnetd_connections_refused_total{reason=\"client_connection_limit\"} %llu\n", adm.refused_client);
    buf_printf(b, "resnetd_connections_refused_total{reason=\"no_descriptors\"} %llu\n", adm.refused_fds);
    render_header(b, "resnetd_connections_closed_total", "counter",
                  "Connections closed at admission: evicted (no complete head, for a waiting request or a full "
                  "table), first_byte_timeout (nothing sent; also in resnetd_slow_connections_dropped_total), "
                  "not_http (400: the first bytes were not HTTP), incomplete_head (400: the client ended its "
                  "side mid-head).");
    buf_printf(b, "resnetd_connections_closed_total{reason=\"evicted\"} %llu\n", adm.evicted);
    buf_printf(b, "resnetd_connections_closed_total{reason=\"first_byte_timeout\"} %llu\n", adm.first_byte_timeout);
    buf_printf(b, "resnetd_connections_closed_total{reason=\"not_http\"} %llu\n", adm.not_http);
    buf_printf(b, "resnetd_connections_closed_total{reason=\"incomplete_head\"} %llu\n", adm.incomplete_head);
}

/* Memory: bodies, the engine's device and pinned memory, NVML's GPUs. */
static void render_memory(buf *b)
{
    render_header(b, "resnetd_body_memory_bytes", "gauge",
                  "Memory held by request bodies being received or decoded, in bytes.");
    buf_printf(b, "resnetd_body_memory_bytes %llu\n", load(&body_memory_bytes));
    render_header(b, "resnetd_body_memory_limit_bytes", "gauge",
                  "The body memory budget (body_memory_bytes); past it requests get 503.");
    buf_printf(b, "resnetd_body_memory_limit_bytes %llu\n", load(&body_memory_limit_bytes));
    render_header(b, "resnetd_gpu_memory_bytes", "gauge", "Device memory held by the engine in bytes (0 on CPU).");
    buf_printf(b, "resnetd_gpu_memory_bytes %llu\n", load(&gpu_memory_bytes));
    if (gpu_probe) { /* NVML, where there is an NVIDIA driver (daemon/api/gputel.h) */
        metrics_gpu_reading g[METRICS_MAX_GPUS];
        int n = gpu_probe(g, METRICS_MAX_GPUS);
        render_gpu_series(b, g, n, "resnetd_gpu_utilization_ratio", "gauge",
                          "Share of the last sample period the GPU was busy, per GPU (NVML).",
                          offsetof(metrics_gpu_reading, utilization));
        render_gpu_series(b, g, n, "resnetd_gpu_power_watts", "gauge", "GPU power draw in watts (NVML).",
                          offsetof(metrics_gpu_reading, power_watts));
        render_gpu_series(b, g, n, "resnetd_gpu_energy_joules_total", "counter",
                          "GPU energy used since the driver loaded, in joules (NVML).",
                          offsetof(metrics_gpu_reading, energy_joules));
        render_gpu_series(b, g, n, "resnetd_gpu_device_memory_used_bytes", "gauge",
                          "GPU memory in use by every process, in bytes (NVML).",
                          offsetof(metrics_gpu_reading, memory_used_bytes));
        render_gpu_series(b, g, n, "resnetd_gpu_device_memory_total_bytes", "gauge",
                          "GPU memory in total, in bytes (NVML).", offsetof(metrics_gpu_reading, memory_total_bytes));
    }
    render_header(b, "resnetd_pinned_memory_bytes", "gauge",
                  "Pinned host memory held by the engine in bytes (0 on CPU).");
    buf_printf(b, "resnetd_pinned_memory_bytes %llu\n", load(&pinned_memory_bytes));
}

/* Engines and the served model. */
static void render_engines(buf *b)
{
    int ne = atomic_load(&engines);
    render_header(b, "resnetd_engine_batches_total", "counter",
                  "Batches run, by engine (its device: cpu, cuda:0, cuda:1, ...).");
    for (int i = 0; i < ne; i++)
        buf_printf(b, "resnetd_engine_batches_total{engine=\"%s\"} %llu\n", engine_label[i], load(&engine_batches[i]));
    render_header(b, "resnetd_engine_images_total", "counter", "Images classified, by engine.");
    for (int i = 0; i < ne; i++)
        buf_printf(b, "resnetd_engine_images_total{engine=\"%s\"} %llu\n", engine_label[i], load(&engine_images[i]));
    render_header(b, "resnetd_engine_batches_in_flight", "gauge", "Batches in an engine now, by engine.");
    for (int i = 0; i < ne; i++)
        buf_printf(b, "resnetd_engine_batches_in_flight{engine=\"%s\"} %lld\n", engine_label[i],
                   atomic_load_explicit(&engine_in_flight[i], memory_order_relaxed));
    render_header(b, "resnetd_model_version", "gauge",
                  "Version of the served model: 1 at start-up, +1 per successful reload.");
    buf_printf(b, "resnetd_model_version %llu\n", load(&model_version));
    render_header(b, "resnetd_model_loaded_timestamp_seconds", "gauge",
                  "Unix time when the served model's weights were loaded.");
    unsigned long long ms = load(&model_loaded_ms);
    buf_printf(b, "resnetd_model_loaded_timestamp_seconds %llu.%03llu\n", ms / 1000, ms % 1000);
    render_header(b, "resnetd_model_reloads_total", "counter",
                  "Hot reloads (SIGHUP or the repository load endpoint) by result; a failed one keeps the "
                  "running model.");
    buf_printf(b, "resnetd_model_reloads_total{result=\"ok\"} %llu\n", load(&model_loads[1]));
    buf_printf(b, "resnetd_model_reloads_total{result=\"failed\"} %llu\n", load(&model_loads[0]));
    char mix[sizeof int8_mix];
    pthread_mutex_lock(&int8_lock);
    memcpy(mix, int8_mix, sizeof mix);
    const calib_check c = int8_check;
    pthread_mutex_unlock(&int8_lock);
    if (mix[0]) {
        render_header(b, "resnetd_int8_mix_info", "gauge",
                      "Always 1 while INT8 is served; the label gives the calibration table's precision mix "
                      "(int8: every layer at INT8; float:stem .. float:layer3: the network up to there in float).");
        buf_printf(b, "resnetd_int8_mix_info{mix=\"");
        render_label_value(b, mix);
        buf_printf(b, "\"} 1\n");
    }
    if (c.images == 0)
        return;
    render_header(b, "resnetd_int8_check_top1_agreement_ratio", "gauge",
                  "Top-1 agreement of INT8 with FP32 that resnetd-calibrate --check measured for the served "
                  "calibration table, on resnetd_int8_check_images held-out images.");
    buf_printf(b, "resnetd_int8_check_top1_agreement_ratio %.9g\n", c.agreement / 100.0);
    render_header(b, "resnetd_int8_check_logits_rel_l2", "gauge",
                  "Relative L2 error of INT8's logits against FP32's in the same check.");
    buf_printf(b, "resnetd_int8_check_logits_rel_l2 %.9g\n", c.rel_l2);
    render_header(b, "resnetd_int8_check_images", "gauge", "Held-out images of that check.");
    buf_printf(b, "resnetd_int8_check_images %d\n", c.images);
}

char *metrics_render(size_t *len)
{
    buf b = { malloc(8192), 0, 8192, 0 };
    if (b.data == NULL)
        return NULL;
    b.data[0] = '\0';

    render_header(&b, "resnetd_build_info", "gauge", "Always 1; labels give the version, device and precision.");
    buf_printf(&b, "resnetd_build_info{version=\"");
    render_label_value(&b, build_version);
    buf_printf(&b, "\",device=\"");
    render_label_value(&b, build_device);
    buf_printf(&b, "\",precision=\"");
    render_label_value(&b, build_precision);
    buf_printf(&b, "\"} 1\n");

    render_requests(&b);

    render_classified(&b);
    render_histogram(&b, &hist_request);
    render_histogram(&b, &hist_queue);
    render_histogram(&b, &hist_decode);
    render_histogram(&b, &hist_gpu_preprocess);
    render_histogram(&b, &hist_infer);
    render_histogram(&b, &hist_batch);

    render_connections(&b);
    render_memory(&b);
    render_engines(&b);

    render_process(&b);

    if (b.failed) {
        free(b.data);
        return NULL;
    }
    if (len != NULL)
        *len = b.len;
    return b.data;
}
