/* Prometheus metrics for resnetd: lock-free counters, gauges and histograms
 * updated on the request path with relaxed atomics, rendered in text format
 * 0.0.4 on /metrics. Rendering takes no lock that the request path waits on. */
#ifndef RESNETD_METRICS_H
#define RESNETD_METRICS_H

#include <stddef.h>

typedef enum {
    METRICS_REJECT_QUEUE_FULL,
    METRICS_REJECT_TIMEOUT,
    METRICS_REJECT_TOO_LARGE,
    METRICS_REJECT_BAD_INPUT,
    METRICS_REJECT_CLIENT_GONE,
    METRICS_REJECT_COUNT
} metrics_reject_reason;

/* Once at start-up, before any other call. */
void metrics_init(const char *version, const char *device, const char *precision);

/* A finished HTTP request: resnetd_requests_total{code} and the
 * request-duration histogram (seconds). */
void metrics_observe_request(int http_status, double seconds);
void metrics_observe_queue(double seconds);   /* per image: enqueue -> batch start */
void metrics_observe_decode(double seconds);  /* per image: JPEG -> 224x224 crop */
void metrics_observe_infer(double seconds);   /* per batch: submit -> logits */
void metrics_observe_batch(int size);         /* batch-size histogram */
void metrics_add_images(int n);               /* resnetd_images_total */
void metrics_reject(metrics_reject_reason r); /* resnetd_rejected_total{reason} */
void metrics_set_queue_depth(long n);
void metrics_add_batches_in_flight(int delta);
void metrics_set_ready(int ready);
/* Engine memory (GPU engine; 0 on CPU). */
void metrics_set_memory(size_t gpu_bytes, size_t pinned_bytes);

/* Renders everything, process_* included, into a malloc'd NUL-terminated
 * string; *len gets its length. NULL on allocation failure. */
char *metrics_render(size_t *len);

#endif
