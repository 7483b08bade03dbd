/* The Open Inference Protocol v2 (KServe v2, Triton's HTTP/REST API) for
 * the one model served: its paths, the inference request parser (JSON
 * tensors and the binary tensor data extension) and the JSON bodies it
 * answers with. Pure: no HTTP layer and no pipeline; daemon/api/server.c
 * routes, daemon/api/classify.c queues and answers, daemon/api/endpoints.c serves
 * the GETs.
 *
 * The model takes exactly one input per request, one of three:
 *   "input"  FP32  [N,3,224,224]  normalised, as torchvision's transform gives
 *   "pixels" UINT8 [N,H,W,3]      RGB, resized and cropped as decoded JPEGs are
 *   "jpeg"   BYTES [N] or [N,1]   JPEG files, decoded as /classify decodes them
 * and has two outputs, "logits" and "probabilities" (their softmax), both
 * FP32 [N,classes]; either can be asked for through the classification
 * extension instead ("score:index:label" strings, top K).
 *
 * Ownership: a parsed v2_infer points into the request body (binary data
 * and JPEGs there are not copied) and owns what it converted from JSON;
 * every byte it owns is charged to the body memory budget until
 * v2_infer_free. */
#ifndef RESNETD_V2_H
#define RESNETD_V2_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/http/budget.h"
#include "daemon/api/request.h"
#include "model/labels.h"

#define V2_MODEL_NAME "resnet18"
#define V2_MODEL_VERSION "1"

typedef enum {
    V2_NOT_V2, /* not under /v2 */
    V2_SERVER_META, /* /v2 */
    V2_LIVE, /* /v2/health/live */
    V2_READY, /* /v2/health/ready */
    V2_MODEL_META, /* /v2/models/resnet18[/versions/1] */
    V2_MODEL_READY, /* .../ready */
    V2_INFER, /* .../infer */
    V2_MODEL_CONFIG, /* .../config: Triton's model configuration */
    V2_MODEL_STATS, /* .../stats: Triton's statistics extension */
    V2_STATS, /* /v2/models/stats: the same, every model */
    V2_UNKNOWN_MODEL, /* a model or version that is not served: 404 */
    V2_UNKNOWN_PATH, /* anything else under /v2: 404 */
} v2_route;

/* Which v2 endpoint url names. */
v2_route v2_route_of(const char *url);

typedef enum { V2_IN_TENSOR, V2_IN_PIXELS, V2_IN_JPEG } v2_input_kind;
typedef enum { V2_OUT_LOGITS, V2_OUT_PROBABILITIES, V2_NOUTPUTS } v2_output_kind;

typedef struct v2_output {
    v2_output_kind kind;
    int binary; /* answered as binary data, not a JSON array */
    int classification; /* top K as "score:index:label"; 0: the FP32 tensor */
} v2_output;

typedef struct v2_limits {
    int max_images; /* N above this: 413 */
    uint64_t max_pixels; /* H*W above this: 413 */
    int classes; /* the model's class count (classification clamps to it) */
} v2_limits;

typedef struct v2_infer {
    char *id; /* the request's "id", echoed; NULL if none */
    v2_input_kind kind;
    int n; /* images */
    int h, w; /* V2_IN_PIXELS: every image's size */
    const uint8_t *pixels; /* V2_IN_PIXELS: [n][h][w][3] */
    float *tensor; /* V2_IN_TENSOR: [n][3][224][224], owned (aligned) */
    uint8_t *owned; /* pixels or JPEG bytes converted from JSON */
    int noutputs;
    v2_output outputs[V2_NOUTPUTS];
    budget *budget;
    size_t charged; /* bytes of owned and tensor charged to budget */
} v2_infer;

/* Parses an inference request body. header_len is the
 * Inference-Header-Content-Length (the JSON's length; binary data follows),
 * or -1 without one (the whole body is JSON). JPEGs go to parts[0..n)
 * (room for lim->max_images). While parsing, the JSON tree's estimated size
 * is charged to b too. Returns 0, or an HTTP status (400, 413, 503) with a
 * stable code ("bad_request", "too_large", "too_many_images",
 * "memory_full", "internal") and a message; v is then empty. */
int v2_parse_infer(const uint8_t *body, size_t len, long header_len, const v2_limits *lim, budget *b, v2_infer *v,
                   request_part *parts, const char **code, char *err, size_t errlen);

/* Frees what v owns and gives its bytes back to the budget. */
void v2_infer_free(v2_infer *v);

/* Inference-Header-Content-Length: "0".."max" decimal, no sign; -1 if bad. */
long v2_parse_header_length(const char *s, size_t max);

/* The bodies below are malloc'd, NUL-terminated JSON (NULL: out of memory). */

/* {"error":"message"}, the message made valid UTF-8. */
char *v2_response_error(const char *message, size_t *len);

/* {"name":"resnetd","version":..,"extensions":[..]} */
char *v2_response_server(const char *version, size_t *len);

/* Triton's model configuration (GET .../config), as its JSON: the inputs
 * and outputs without the batch dimension, dynamic batching (preferred
 * sizes, the queue delay) and one instance group on the GPUs given (gpu) or
 * the CPU. */
char *v2_response_config(int classes, int max_batch, const int *preferred, int npreferred, long max_queue_delay_us,
                         const char *backend, int gpu, const int *gpus, int ngpus, size_t *len);

/* The repository index (POST /v2/repository/index): the one model and
 * whether it is ready. */
char *v2_response_index(int ready, size_t *len);

/* {"name":"resnetd",..,"inputs":[..],"outputs":[..]} with classes in the
 * output shapes. */
char *v2_response_model(int classes, const char *platform, size_t *len);

/* The inference response for v's n images, logits[n][classes], labs[i]
 * image i's labels (NULL: none): the JSON document, then each binary
 * output's bytes in output order. *json_len is the JSON's length when any
 * output is binary (the Inference-Header-Content-Length to send), else 0. */
char *v2_response_infer(const v2_infer *v, const float *logits, int classes, const labels *const *labs, size_t *len,
                        size_t *json_len);

#endif
