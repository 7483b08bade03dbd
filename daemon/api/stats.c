/* Triton-shaped inference statistics: see stats.h. */
#include <stdatomic.h>
#include <time.h>
#include <jansson.h>
#include "daemon/api/jsonout.h"
#include "daemon/api/stats.h"

typedef struct {
    atomic_ullong count, ns;
} duration;

static duration success, fail, queue, input, infer, output;
static atomic_ullong inference_count, execution_count, last_inference_ms;
static duration batch_input[STATS_MAX_BATCH + 1], batch_infer[STATS_MAX_BATCH + 1];

static void add(duration *d, uint64_t ns)
{
    atomic_fetch_add_explicit(&d->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&d->ns, ns, memory_order_relaxed);
}

void stats_request(int ok, uint64_t total_ns, int images, uint64_t queue_ns, uint64_t input_ns, uint64_t infer_ns,
                   uint64_t output_ns)
{
    if (!ok) {
        add(&fail, total_ns);
        return;
    }
    add(&queue, queue_ns);
    add(&input, input_ns);
    add(&infer, infer_ns);
    add(&output, output_ns);
    atomic_fetch_add_explicit(&inference_count, (unsigned long long)images, memory_order_relaxed);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    atomic_store_explicit(&last_inference_ms,
                          (unsigned long long)ts.tv_sec * 1000 + (unsigned long long)ts.tv_nsec / 1000000,
                          memory_order_relaxed);
    /* Last, released: a reader that sees the success sees the rest. */
    atomic_fetch_add_explicit(&success.ns, total_ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&success.count, 1, memory_order_release);
}

void stats_batch(int size, uint64_t input_ns, uint64_t infer_ns)
{
    if (size < 1 || size > STATS_MAX_BATCH)
        return;
    atomic_fetch_add_explicit(&execution_count, 1, memory_order_relaxed);
    add(&batch_input[size], input_ns);
    add(&batch_infer[size], infer_ns);
}

static json_t *duration_json(duration *d)
{
    json_int_t count = (json_int_t)atomic_load_explicit(&d->count, memory_order_acquire);
    return json_pack("{s:I, s:I}", "count", count, "ns", (json_int_t)atomic_load(&d->ns));
}

char *stats_render(const char *name, const char *version, size_t *len)
{
    /* success first: what it counts is then in every other figure */
    json_t *succ = duration_json(&success);
    json_t *batches = json_array();
    for (int b = 1; batches && b <= STATS_MAX_BATCH; b++) {
        if (atomic_load(&batch_infer[b].count) == 0)
            continue;
        json_array_append_new(batches, json_pack("{s:i, s:o, s:o, s:{s:I, s:I}}", "batch_size", b, "compute_input",
                                                 duration_json(&batch_input[b]), "compute_infer",
                                                 duration_json(&batch_infer[b]), "compute_output", "count",
                                                 (json_int_t)atomic_load(&batch_infer[b].count), "ns", (json_int_t)0));
    }
    json_t *zero = json_pack("{s:I, s:I}", "count", (json_int_t)0, "ns", (json_int_t)0);
    json_t *model = json_pack("{s:s, s:s, s:I, s:I, s:I, s:{s:o, s:o, s:o, s:o, s:o, s:o, s:O, s:O}, s:o}", "name",
                              name, "version", version, "last_inference", (json_int_t)atomic_load(&last_inference_ms),
                              "inference_count", (json_int_t)atomic_load(&inference_count), "execution_count",
                              (json_int_t)atomic_load(&execution_count), "inference_stats", "success", succ, "fail",
                              duration_json(&fail), "queue", duration_json(&queue), "compute_input",
                              duration_json(&input), "compute_infer", duration_json(&infer), "compute_output",
                              duration_json(&output), "cache_hit", zero, "cache_miss", zero, "batch_stats", batches);
    json_decref(zero);
    return json_dump_line(json_pack("{s:[o]}", "model_stats", model), len);
}
