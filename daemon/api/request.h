/* One HTTP request's state, and the pure parsers for what a client sends:
 * the content type, ?top_k=, and multipart/form-data bodies.
 *
 * Lifetime: created when the HTTP layer has its head, freed only when the
 * layer ends it (http.h's done). While its images wait for a decode
 * thread, are queued or are in the engine the connection waits for a wake,
 * so it cannot end, and the request outlives the decode job and every
 * pipeline report about it (pending counts them). */
#ifndef RESNETD_REQUEST_H
#define RESNETD_REQUEST_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include "daemon/http/budget.h"
#include "daemon/pipeline/decode_pool.h"
#include "engine/topk.h"

#define REQUEST_MAX_IMAGES 64
#define REQUEST_DEFAULT_TOP_K 5 /* or all classes of a model with fewer */

typedef enum {
    REQ_BODY_RAW, /* the body is the JPEG */
    REQ_BODY_MULTIPART, /* multipart/form-data, JPEGs in field "image" */
} request_body_kind;

typedef enum {
    REQ_NEW, /* created, not yet routed */
    REQ_RECEIVING, /* reading the body */
    REQ_SUBMITTING, /* body checked, slots reserved: handed on next */
    REQ_QUEUED, /* in the decode pool or the pipeline, waiting for a wake */
    REQ_ANSWERED, /* a response is queued (or the connection is being dropped) */
} request_state;

struct v2_infer;

typedef struct request_part {
    const uint8_t *data;
    size_t len;
} request_part;

typedef struct request {
    struct http_conn *conn; /* its connection (daemon/http/http.h) */
    int fd; /* client socket, for the disconnect check */
    int route; /* server.c's route */
    uint64_t start_us;
    request_state state;
    int accepted; /* body received and handed to the pipeline */
    int inference; /* an inference request (/classify, v2 infer) past its method check */
    int status; /* HTTP status answered, 0 before */

    request_body_kind body_kind;
    int form_type; /* Content-Type application/x-www-form-urlencoded: curl -d's, whose
                                  * @FILE loses its line breaks (the decode error says so) */
    char boundary[72];
    int top_k;
    budget *budget; /* charged with cap, the body buffer's size; NULL: none */
    size_t expect; /* the announced Content-Length, 0 if none: growth stops there */
    size_t max_len; /* max_body_bytes, 0 if none: nor does growth pass it */
    uint8_t *body; /* malloc'd, grown by doubling up to max_body_bytes */
    size_t len, cap;
    size_t discarded; /* bytes past max_body_bytes dropped unread into body */
    int too_large;
    int over_budget; /* the budget refused the body's growth: 503 at its end */

    int nimages;
    request_part parts[REQUEST_MAX_IMAGES]; /* the JPEGs within body */
    int slots[REQUEST_MAX_IMAGES];
    decode_job job; /* embedded: submitting to the decode pool allocates nothing */
    uint64_t deadline_us; /* arrival (start_us) + request_timeout_ms */
    topk_entry *topk; /* [nimages][top_k], written by the completion thread */
    /* The model each image's result came from (a reference each, dropped
     * by the server when the request ends): a reload between two of its
     * batches still labels every image right. */
    struct served_model *models[REQUEST_MAX_IMAGES];
    /* Open Inference Protocol v2 requests (daemon/api/v2.h): */
    int v2_route; /* its v2_route; V2_NOT_V2 (0) for the others */
    long v2_header_len; /* Inference-Header-Content-Length, -1: none */
    struct v2_infer *v2; /* the parsed inference request, freed by the server */
    float *logits; /* v2: [nimages][classes], written by the completion thread */
    int classes;
    size_t answer_header_len; /* v2: the answer's Inference-Header-Content-Length, 0: none */
    atomic_int pending; /* images not yet reported by the pipeline */

    pthread_mutex_t mu; /* guards the fields below: reports race per image */
    int fail_status; /* first failure, 0 = none */
    const char *fail_code;
    char fail_msg[256];
    /* decode: CPU time (header checks only for GPU-decoded images);
     * queue/gpu_decode/infer: the slowest image's. */
    uint64_t decode_us, queue_us, gpu_decode_us, infer_us;
    uint64_t output_us; /* formatting the answer */
    /* For the access log (set only when there is one): */
    uint64_t bytes_in, bytes_out;
    char log_peer[64], log_method[16], log_path[192], log_id[72];
    int batch_size; /* largest batch any of its images ran in */
} request;

request *request_create(void);
void request_free(request *r);

/* Appends body bytes. The buffer grows by doubling, never past r->expect
 * while the body fits in it, and each growth is charged to r->budget
 * first: memory follows the bytes received, not what the client announced.
 * Returns 0; -1 out of memory; -2 the budget refused (nothing changed). */
int request_append(request *r, const uint8_t *data, size_t n);

/* Frees the body buffer and gives its bytes back to the budget. */
void request_drop_body(request *r);

/* Content-Type -> body kind (and the multipart boundary). Raw bodies are
 * accepted as image/jpeg, application/octet-stream, no type at all, or
 * curl's default for --data-binary (application/x-www-form-urlencoded).
 * Returns 0; -1 for another type (415); -2 for multipart without a usable
 * boundary (400). */
int request_parse_content_type(const char *ct, request_body_kind *kind, char *boundary, size_t blen);
/* 1 when ct is application/x-www-form-urlencoded (any parameters). */
int request_is_form_type(const char *ct);

/* ?top_k=: "1".."max" exactly (no sign, no leading zeros), max being the
 * model's class count; 0 or -1. */
int request_parse_top_k(const char *s, int max, int *k);

/* Splits a multipart/form-data body and collects the parts whose
 * Content-Disposition name is `field`, in order. Returns how many were
 * found (0 = none; more than max are counted but not stored), or -1 with a
 * reason in err for a malformed body. Never reads outside body[0..len). */
int request_parse_multipart(const uint8_t *body, size_t len, const char *boundary, const char *field,
                            request_part *parts, int max, char *err, size_t errlen);

/* The HTTP layer's unescape function for the path and query: %XX decoded
 * in place, except %00, which stays the three characters "%00": a NUL
 * would end the C string there, so "/healthz%00x" would route as
 * "/healthz" and "top_k=5%005" parse as 5. Returns the new length. */
size_t request_unescape(char *s);

/* Records a failure of one image (the first one wins). */
void request_fail(request *r, int status, const char *code, const char *message);

#endif
