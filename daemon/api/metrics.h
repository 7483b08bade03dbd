/* Prometheus metrics for resnetd: lock-free counters, gauges and histograms
 * updated on the request path with relaxed atomics, rendered in text format
 * 0.0.4 on /metrics. Rendering takes no lock that the request path waits on. */
#ifndef RESNETD_METRICS_H
#define RESNETD_METRICS_H

#include <stddef.h>
#include "image/devjpeg.h"

typedef enum {
    METRICS_REJECT_QUEUE_FULL,
    METRICS_REJECT_TIMEOUT,
    METRICS_REJECT_TOO_LARGE,
    METRICS_REJECT_BAD_INPUT,
    METRICS_REJECT_CLIENT_GONE,
    METRICS_REJECT_MEMORY_FULL, /* the body memory budget is full */
    METRICS_REJECT_SLOW_CLIENT, /* dropped below the minimum transfer rate */
    METRICS_REJECT_COUNT
} metrics_reject_reason;

typedef enum { METRICS_DECODE_CPU, METRICS_DECODE_HARDWARE, METRICS_DECODE_NBACKENDS } metrics_decode_backend;

/* Once at start-up, before any other call. */
void metrics_init(const char *version, const char *device, const char *precision);

/* A finished HTTP request: resnetd_requests_total{code} and the
 * request-duration histogram (seconds). */
void metrics_observe_request(int http_status, double seconds);
void metrics_observe_queue(double seconds); /* per image: enqueue -> batch start */
void metrics_observe_decode(double seconds); /* per image: JPEG -> 224x224 crop */
void metrics_observe_infer(double seconds); /* per batch: submit -> logits */
void metrics_observe_gpu_preprocess(double seconds); /* per batch: device decode + resize */
void metrics_add_decoded(metrics_decode_backend b, int n); /* resnetd_decoded_images_total{backend} */
/* resnetd_decode_fallbacks_total{reason}: n images decoded on the CPU
 * although the device decoder is on. */
void metrics_add_decode_fallback(devjpeg_reason r, int n);
void metrics_observe_batch(int size); /* batch-size histogram */
void metrics_add_images(int n); /* resnetd_images_total */
void metrics_reject(metrics_reject_reason r); /* resnetd_rejected_total{reason} */
void metrics_set_queue_depth(long n);
void metrics_add_batches_in_flight(int delta);
void metrics_set_ready(int ready);
/* Open client connections, and how many were dropped as too slow. */
void metrics_set_connections(long open, unsigned long long dropped_slow);

/* What admission refused and closed (daemon/http/admit.h), and holds now. */
typedef struct metrics_admission {
    unsigned long long refused_limit, refused_client, refused_fds;
    unsigned long long evicted, not_http, incomplete_head, first_byte_timeout;
    long pending;
} metrics_admission;
void metrics_set_admission(const metrics_admission *a);
/* Bytes of request bodies buffered now, and the budget's cap. */
void metrics_set_body_memory(size_t used, size_t cap);
/* One GPU's telemetry (daemon/api/gputel.h); a value < 0 is unknown and not
 * reported. */
#define METRICS_MAX_GPUS 16
typedef struct metrics_gpu_reading {
    char gpu[16]; /* the CUDA ordinal, as the engine label's */
    double utilization; /* 0..1 of the last sample period */
    double power_watts;
    double energy_joules; /* since the driver loaded */
    double memory_used_bytes, memory_total_bytes;
} metrics_gpu_reading;

/* Where /metrics reads GPU telemetry at each render (any thread); NULL:
 * none, and no resnetd_gpu_* telemetry series are rendered. */
void metrics_set_gpu_probe(int (*probe)(metrics_gpu_reading *out, int max));

/* The decode router's mean cost (daemon/pipeline/route.h): cpu_class -1 for a GPU
 * decoder, else one CPU thread's for that size class. */
void metrics_set_decode_cost(int cpu_class, unsigned long long ps_per_pixel);
/* The id of the engine labelled label ("cpu", "cuda:1"): registered on
 * first use, the same id after (a reload's new engine on the same device);
 * -1 past 16 engines (then not counted). */
int metrics_engine(const char *label);
/* A batch of images finished on engine id. */
void metrics_engine_batch(int id, int images);
void metrics_engine_in_flight(int id, int delta);
/* The served model: its version and when it was loaded (unix seconds). */
void metrics_set_model(int version, double loaded_unix_s);
/* The served INT8 table: its precision mix ("int8", "float:layer1", ...;
 * NULL when the model is not served at INT8), rendered as
 * resnetd_int8_mix_info, and its check (resnetd-calibrate --check), whose
 * figures are rendered while c->images > 0. */
struct calib_check;
void metrics_set_int8(const char *mix, const struct calib_check *c);
/* A hot reload finished: ok 1, or 0 when it failed. */
void metrics_add_model_load(int ok);
/* Engine memory (GPU engine; 0 on CPU). */
void metrics_set_memory(size_t gpu_bytes, size_t pinned_bytes);

/* Renders everything, process_* included, into a malloc'd NUL-terminated
 * string; *len gets its length. NULL on allocation failure. */
char *metrics_render(size_t *len);

#endif
