/* JSON bodies (jansson): classification results, errors, model metadata.
 * Every function returns a malloc'd NUL-terminated string that the HTTP
 * layer frees once sent (http_respond), or NULL when out of memory. */
#ifndef RESNETD_RESPONSE_H
#define RESNETD_RESPONSE_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/pipeline/served_model.h"
#include "daemon/api/request.h"

/* What the service is, for every 200 answer and /v1/models/resnet18; the
 * model itself (weights, labels) may change with a reload: served_model. */
typedef struct response_service {
    const char *device; /* "cpu", "cuda" */
    int device_index; /* the first engine's */
    const char *engines; /* every engine's device: "cpu", "cuda:0,cuda:1" */
    const char *precision; /* "fp32", "fp16" */
    const char *decode; /* where JPEGs are decoded: "gpu", "cpu" */
    int deterministic; /* the engines' logits are batch invariant (engine.deterministic) */
    int max_batch_size;
    long max_queue_delay_us;
    const char *preferred_batch_sizes;
    int queue_capacity;
    long request_timeout_ms;
    long max_body_bytes;
    long max_pixels;
} response_service;

/* {"model":..,"model_version":..,"results":[{"predictions":[..]}],"batch_size":..,"timings_us":{..}};
 * every image's labels from the model in r->models[i], which are set. */
char *response_classify(const response_service *svc, const request *r, uint64_t total_us, size_t *len);

/* {"error":{"status":..,"code":..,"message":..}} */
char *response_error(int status, const char *code, const char *message, size_t *len);

/* /v1/models/resnet18 for model m, the one served now. */
char *response_model(const response_service *svc, const served_model *m, size_t *len);

/* {"status":"ok"} style bodies for the probes. */
char *response_status(const char *status, size_t *len);

#endif
