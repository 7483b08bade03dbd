/* JSON bodies (jansson): classification results, errors, model metadata.
 * Every function returns a malloc'd NUL-terminated string that libmicrohttpd
 * frees (MHD_RESPMEM_MUST_FREE), or NULL when out of memory. */
#ifndef RESNETD_RESPONSE_H
#define RESNETD_RESPONSE_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/request.h"
#include "model/labels.h"

/* What the service is, for every 200 answer and /v1/models/resnet18. */
typedef struct response_service {
    const char *device;         /* "cpu", "cuda" */
    int device_index;
    const char *precision;      /* "fp32", "fp16" */
    const char *decode;         /* where JPEGs are decoded: "gpu", "cpu" */
    int synthetic;              /* --weights synthetic */
    int classes;                /* the model's: logits per image, top_k's bound */
    const labels *labels;       /* labels->count == classes */
    const char *labels_path;
    const char *weights_path;
    const char *weights_sha256;
    int max_batch_size;
    long max_queue_delay_us;
    const char *preferred_batch_sizes;
    int queue_capacity;
    long request_timeout_ms;
    long max_body_bytes;
    long max_pixels;
} response_service;

/* {"model":..,"results":[{"predictions":[..]}],"batch_size":..,"timings_us":{..}} */
char *response_classify(const response_service *svc, const request *r, uint64_t total_us, size_t *len);

/* {"error":{"status":..,"code":..,"message":..}} */
char *response_error(int status, const char *code, const char *message, size_t *len);

char *response_model(const response_service *svc, size_t *len);

/* {"status":"ok"} style bodies for the probes. */
char *response_status(const char *status, size_t *len);

#endif
