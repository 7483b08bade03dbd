/* The HTTP front end: routes, limits, the classify flow and the pipeline
 * callbacks, as the HTTP layer's handler (daemon/http.h).
 *
 * Every request the layer reads a head of comes to on_request, also the
 * ones it refuses itself (malformed, too large, too slow): those are
 * answered there in the API's JSON, so every answer has the API's form and
 * every request is counted in on_done with the status it got.
 *
 * A POST /classify takes three steps:
 *   1. on_request: route, method, ?top_k, Content-Type and Content-Length
 *      are checked; a bad request is answered without reading the body;
 *   2. on_body: chunks appended up to max_body_bytes (chunked bodies are
 *      counted as they arrive), each growth of the buffer charged to the
 *      body memory budget;
 *   3. on_body_end: queue slots are reserved and the request goes to the
 *      decode stage (daemon/decode.h), which decodes the images into the
 *      slots (or leaves them compressed for the GPU) and pushes them to the
 *      batcher's queue; when the last image is reported (or
 *      decoding failed) the connection is woken and on_wake answers.
 * POST /v2/models/resnet18[/versions/1]/infer (the Open Inference Protocol,
 * daemon/v2.h) takes the same three steps: its body is parsed at step 3,
 * on the HTTP thread (its limits bound the work), and its images take the
 * same decode stage, queue and batcher; pixel and FP32 tensors are resized
 * or passed on there instead of decoded. Errors on /v2 paths have the
 * protocol's {"error": "..."} body.
 *
 * HTTP threads never decode: a connection stays on one thread, and
 * decoding there left threads idle while others had a backlog. Every
 * request is freed in on_done, which also counts it. */
#include <config.h>  /* autoconf's (PACKAGE_VERSION), not daemon/config.h */
#include <errno.h>
#include <jansson.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>
#include "daemon/accesslog.h"
#include "daemon/batcher.h"
#include "daemon/http.h"
#include "daemon/decode.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "daemon/server.h"
#include "daemon/stats.h"
#include "daemon/v2.h"
#include "model/clock.h"
#include "model/utf8.h"

enum {
    ROUTE_CLASSIFY, ROUTE_HEALTHZ, ROUTE_READYZ, ROUTE_METRICS, ROUTE_MODEL,
    ROUTE_V2_SERVER, ROUTE_V2_LIVE, ROUTE_V2_READY, ROUTE_V2_MODEL, ROUTE_V2_MODEL_READY, ROUTE_V2_INFER,
    ROUTE_V2_CONFIG, ROUTE_V2_STATS, ROUTE_V2_STATS_ALL,
    ROUTE_LOAD, ROUTE_INDEX,
};

static const struct {
    const char *path;
    const char *allow;      /* methods, as the Allow header lists them */
} routes[] = {
    [ROUTE_CLASSIFY] = { "/classify", "POST" },
    [ROUTE_HEALTHZ] = { "/healthz", "GET, HEAD" },
    [ROUTE_READYZ] = { "/readyz", "GET, HEAD" },
    [ROUTE_METRICS] = { "/metrics", "GET, HEAD" },
    [ROUTE_MODEL] = { "/v1/models/resnet18", "GET, HEAD" },
    /* v2 paths are matched by v2_route_of; these name them in messages. */
    [ROUTE_V2_SERVER] = { "/v2", "GET, HEAD" },
    [ROUTE_V2_LIVE] = { "/v2/health/live", "GET, HEAD" },
    [ROUTE_V2_READY] = { "/v2/health/ready", "GET, HEAD" },
    [ROUTE_V2_MODEL] = { "/v2/models/resnet18", "GET, HEAD" },
    [ROUTE_V2_MODEL_READY] = { "/v2/models/resnet18/ready", "GET, HEAD" },
    [ROUTE_V2_INFER] = { "/v2/models/resnet18/infer", "POST" },
    [ROUTE_V2_CONFIG] = { "/v2/models/resnet18/config", "GET, HEAD" },
    [ROUTE_V2_STATS] = { "/v2/models/resnet18/stats", "GET, HEAD" },
    [ROUTE_V2_STATS_ALL] = { "/v2/models/stats", "GET, HEAD" },
    [ROUTE_LOAD] = { "/v2/repository/models/resnet18/load", "POST" },
    [ROUTE_INDEX] = { "/v2/repository/index", "POST" },
};

/* Routes that take a body (POST), the others being GETs. */
static int takes_body(int route)
{
    return route == ROUTE_CLASSIFY || route == ROUTE_V2_INFER || route == ROUTE_LOAD || route == ROUTE_INDEX;
}

struct server {
    http_server *http;
    const response_service *svc;
    queue *q;
    infer *const *inf;      /* one per engine (device = cuda:all: one per GPU) */
    int ninf;
    reloader *reload;
    decode_stage *decode;
    budget *bodies;
    long max_body_bytes;
    long max_pixels;
    long request_timeout_ms;
    accesslog *alog;        /* or NULL */
    atomic_ullong request_ids;
    int port;
    atomic_int warm;
    atomic_int draining;
    atomic_long active;
    atomic_long suspended;  /* requests whose images are in the pipeline */
};

/* ---- answering ---------------------------------------------------------- */

static const char oom_body[] =
    "{\"error\":{\"status\":500,\"code\":\"internal\",\"message\":\"out of memory\"}}";

/* Answers r with body (malloc'd JSON or text, the layer's from here; NULL
 * after an allocation failure: a 500) and records its status. */
static int send_body(server *s, request *r, http_conn *c, int status, char *body, size_t len, const char *ctype,
                     int retry_after, const char *allow, int close_conn)
{
    if (!body) {
        status = 500;
        ctype = "application/json";
        len = sizeof oom_body - 1;
        body = strdup(oom_body);   /* NULL again: the 500 goes without a body */
    }
    char hl[32];
    if (body && r->answer_header_len > 0)
        snprintf(hl, sizeof hl, "%zu", r->answer_header_len);
    http_response resp = {
        .status = status,
        .body = body,
        .len = body ? len : 0,
        .content_type = ctype,
        .retry_after = retry_after,
        .allow = allow,
        .extra_name = body && r->answer_header_len > 0 ? "Inference-Header-Content-Length" : NULL,
        .extra_value = hl,
        .close = close_conn || atomic_load(&s->draining),
    };
    r->state = REQ_ANSWERED;
    r->status = status;
    r->bytes_out = resp.len;
    return http_respond(c, &resp);
}

static metrics_reject_reason reject_reason(int status, const char *code)
{
    if (status == 413)
        return METRICS_REJECT_TOO_LARGE;
    if (status == 504)
        return METRICS_REJECT_TIMEOUT;
    if (status == 503 && strcmp(code, "queue_full") == 0)
        return METRICS_REJECT_QUEUE_FULL;
    if (status == 503 && strcmp(code, "memory_full") == 0)
        return METRICS_REJECT_MEMORY_FULL;
    if (status == 408)
        return METRICS_REJECT_SLOW_CLIENT;
    if (status >= 400 && status < 500)
        return METRICS_REJECT_BAD_INPUT;
    if (status == 501 || status == 505)
        return METRICS_REJECT_BAD_INPUT;
    return METRICS_REJECT_COUNT;   /* not a rejection: 500, 503 while draining */
}

static int send_error(server *s, request *r, http_conn *c, int status,
                                  const char *code, const char *message, int retry_after, const char *allow,
                                  int close_conn)
{
    metrics_reject_reason why = reject_reason(status, code);
    if (why != METRICS_REJECT_COUNT)
        metrics_reject(why);
    size_t len = 0;
    char *body = r->v2_route != V2_NOT_V2 ? v2_response_error(message, &len)
                                          : response_error(status, code, message, &len);
    return send_body(s, r, c, status, body, len, "application/json", retry_after, allow, close_conn);
}

/* Images one request may carry: 64, or fewer when the queue holds fewer. */
static int max_images(server *s)
{
    return REQUEST_MAX_IMAGES < queue_capacity(s->q) ? REQUEST_MAX_IMAGES : queue_capacity(s->q);
}

/* The served model's class count now (a reload may change it): what a
 * request is sized for when it arrives. */
static int classes(server *s)
{
    served_model *m = infer_model(s->inf[0]);
    int n = m->classes;
    served_model_unref(m);
    return n;
}

static int retry_after(server *s)
{
    double rate = 0;
    for (int i = 0; i < s->ninf; i++)
        rate += infer_images_per_s(s->inf[i]);
    return batch_retry_after_s(queue_depth(s->q), rate);
}

/* ---- pipeline callbacks (batcher and completion threads) ---------------- */

static void image_reported(request *r)
{
    if (atomic_fetch_sub(&r->pending, 1) == 1)
        http_wake(r->conn);
}

static void sink_done(void *req, int image, const float *logits, int classes, served_model *model,
                      const pipeline_timing *t)
{
    request *r = req;
    if (r->logits ? classes != r->classes : r->top_k > classes) {
        /* The request was sized (top_k, v2 outputs) for the model it arrived
         * under; a reload to one with other classes has replaced it since. */
        request_fail(r, 503, "model_changed", "the model changed while this request waited; retry");
        image_reported(r);
        return;
    }
    r->models[image] = served_model_ref(model);
    if (r->logits)
        memcpy(r->logits + (size_t)image * (size_t)r->classes, logits, (size_t)r->classes * sizeof *logits);
    else
        topk_softmax(logits, classes, r->top_k, r->topk + (size_t)image * (size_t)r->top_k);
    metrics_observe_queue((double)t->queue_us / 1e6);
    pthread_mutex_lock(&r->mu);
    if (t->queue_us > r->queue_us)
        r->queue_us = t->queue_us;
    if (t->gpu_decode_us > r->gpu_decode_us)
        r->gpu_decode_us = t->gpu_decode_us;
    if (t->infer_us > r->infer_us)
        r->infer_us = t->infer_us;
    if (t->batch_size > r->batch_size)
        r->batch_size = t->batch_size;
    pthread_mutex_unlock(&r->mu);
    image_reported(r);
}

static void sink_fail(void *req, int image, int status, const char *code, const char *message)
{
    (void)image;
    request *r = req;
    request_fail(r, status, code, message);
    image_reported(r);
}

const pipeline_sink server_sink = { .done = sink_done, .fail = sink_fail };

/* ---- POST /classify ----------------------------------------------------- */

static const char memory_full_msg[] =
    "the request bodies being received fill the server's body memory (body_memory_bytes); retry later";

/* What every body route checks from the headers. */
static int body_begin(server *s, request *r, http_conn *c, const http_head *h)
{
    /* Refuse an announced oversize body before reading any of it, and one
     * the body memory cannot hold now. Nothing is reserved: the buffer
     * grows (and is charged) as the bytes arrive. */
    const char *cl = http_header(h, "Content-Length");
    if (cl) {
        errno = 0;
        char *end;
        unsigned long long n = strtoull(cl, &end, 10);
        if (errno == ERANGE || n > (unsigned long long)s->max_body_bytes) {
            char msg[128];
            snprintf(msg, sizeof msg, "request body of %s bytes is over the limit of %ld", cl, s->max_body_bytes);
            return send_error(s, r, c, 413, "too_large", msg, 0, NULL, 1);
        }
        if (budget_used(s->bodies) + n > budget_cap(s->bodies))
            return send_error(s, r, c, 503, "memory_full", memory_full_msg, 1, NULL, 1);
        r->expect = (size_t)n;
    }
    return 0;
}

static int classify_begin(server *s, request *r, http_conn *c, const http_head *h)
{
    if (atomic_load(&s->draining))
        return send_error(s, r, c, 503, "shutting_down", "the server is shutting down", 1, NULL, 1);

    /* An unknown parameter is a mistake (?topk=1) the client should hear of. */
    for (int i = 0; i < h->nargs; i++)
        if (strcmp(h->args[i].name, "top_k") != 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "unknown query parameter '%.64s' (/classify takes top_k)", h->args[i].name);
            return send_error(s, r, c, 400, "bad_parameter", msg, 0, NULL, 1);
        }
    const int nclasses = classes(s);
    const char *k = http_arg(h, "top_k");
    if (k && request_parse_top_k(k, nclasses, &r->top_k) != 0) {
        char msg[128];
        snprintf(msg, sizeof msg, "top_k must be a whole number from 1 to %d (the model's classes)", nclasses);
        return send_error(s, r, c, 400, "bad_parameter", msg, 0, NULL, 1);
    }
    if (!k && r->top_k > nclasses)
        r->top_k = nclasses;

    const char *ct = http_header(h, "Content-Type");
    int rc = request_parse_content_type(ct, &r->body_kind, r->boundary, sizeof r->boundary);
    r->form_type = request_is_form_type(ct);
    if (rc == -1) {
        char msg[256];
        snprintf(msg, sizeof msg, "content type '%.100s' is not image/jpeg or multipart/form-data", ct);
        return send_error(s, r, c, 415, "unsupported_media_type", msg, 0, NULL, 1);
    }
    if (rc == -2)
        return send_error(s, r, c, 400, "invalid_multipart", "multipart/form-data without a valid boundary",
                          0, NULL, 1);
    return body_begin(s, r, c, h);
}

/* POST .../infer's headers: the v2 body is JSON, optionally followed by
 * binary tensor data (Inference-Header-Content-Length says where). */
static int v2_begin(server *s, request *r, http_conn *c, const http_head *h)
{
    if (atomic_load(&s->draining))
        return send_error(s, r, c, 503, "shutting_down", "the server is shutting down", 1, NULL, 1);
    /* The body's framing is the protocol's (JSON, then binary tensors when
     * Inference-Header-Content-Length says so), not the content type's; curl
     * -d's application/x-www-form-urlencoded is taken as JSON too, so a
     * plain `curl -d '{...}'` works, and anything not JSON gets the parser's
     * 400. */
    const char *ct = http_header(h, "Content-Type");
    if (ct && strncasecmp(ct, "application/json", 16) != 0 && strncasecmp(ct, "application/octet-stream", 24) != 0 &&
        strncasecmp(ct, "application/x-www-form-urlencoded", 33) != 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "content type '%.100s' is not application/json or application/octet-stream", ct);
        return send_error(s, r, c, 415, "unsupported_media_type", msg, 0, NULL, 1);
    }
    const char *hl = http_header(h, "Inference-Header-Content-Length");
    for (int i = 0; hl && i < h->nheaders; i++)
        if (strcasecmp(h->headers[i].name, "Inference-Header-Content-Length") == 0 &&
            strcmp(h->headers[i].value, hl) != 0)
            /* Two framings of one body: refused, as two Content-Lengths are. */
            return send_error(s, r, c, 400, "bad_request", "more than one Inference-Header-Content-Length", 0,
                              NULL, 1);
    if (hl && (r->v2_header_len = v2_parse_header_length(hl, (size_t)s->max_body_bytes)) < 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "Inference-Header-Content-Length '%.60s' is not a length up to max_body_bytes", hl);
        return send_error(s, r, c, 400, "bad_request", msg, 0, NULL, 1);
    }
    return body_begin(s, r, c, h);
}


static int classify_body(server *s, request *r, const char *data, size_t n)
{
    if (r->too_large || r->over_budget) {
        /* A body past the limit or the budget: drop the rest unread, but
         * only up to another max_body_bytes before giving up on the
         * connection. */
        r->discarded += n;
        return r->discarded > (size_t)s->max_body_bytes * 2 ? -1 : 0;
    }
    if (r->len + n > (size_t)s->max_body_bytes) {
        r->too_large = 1;
        r->discarded = r->len + n;
        request_drop_body(r);
        return 0;
    }
    int rc = request_append(r, (const uint8_t *)data, n);
    if (rc == -2) {
        r->over_budget = 1;
        r->discarded = r->len + n;
        request_drop_body(r);
        return 0;
    }
    if (rc != 0) {
        log_error("out of memory for a request body of %zu bytes", r->len + n);
        return -1;
    }
    return 0;
}

/* The body's checks that need no parsing: over the limit, over the
 * budget, empty. Answers and returns 1 when one fails. */
static int refuse_body(server *s, request *r, http_conn *c, int *rc)
{
    char msg[128];
    if (r->too_large) {
        snprintf(msg, sizeof msg, "request body is over the limit of %ld bytes", s->max_body_bytes);
        *rc = send_error(s, r, c, 413, "too_large", msg, 0, NULL, 1);
    } else if (r->over_budget) {   /* its body was dropped: checked before the empty body */
        *rc = send_error(s, r, c, 503, "memory_full", memory_full_msg, 1, NULL, 0);
    } else if (r->len == 0) {
        *rc = send_error(s, r, c, 400, "empty_body", r->v2_route != V2_NOT_V2
                         ? "the request body is empty; send the inference request JSON"
                         : "the request body is empty; send the JPEG bytes", 0, NULL, 0);
    } else {
        return 0;
    }
    return 1;
}

/* Reserves the request's n queue slots (or 503) and readies it for the
 * decode stage. */
static int submit_images(server *s, request *r, http_conn *c, int n)
{
    if (queue_reserve(s->q, n, r->slots) != 0)
        return send_error(s, r, c, 503, "queue_full", "the queue is full; retry later", retry_after(s), NULL, 0);

    r->nimages = n;
    r->accepted = 1;
    r->state = REQ_SUBMITTING;
    r->deadline_us = r->start_us + (uint64_t)s->request_timeout_ms * 1000u;
    r->job.owner = r;
    return 0;
}

static int classify_submit(server *s, request *r, http_conn *c)
{
    char msg[384], why[256];
    int rc;
    if (refuse_body(s, r, c, &rc))
        return rc;
    int n;
    if (r->body_kind == REQ_BODY_RAW) {
        r->parts[0].data = r->body;
        r->parts[0].len = r->len;
        n = 1;
    } else {
        n = request_parse_multipart(r->body, r->len, r->boundary, "image", r->parts, REQUEST_MAX_IMAGES,
                                    why, sizeof why);
        if (n < 0)
            return send_error(s, r, c, 400, "invalid_multipart", why, 0, NULL, 0);
        if (n == 0)
            return send_error(s, r, c, 400, "missing_image", "multipart request has no 'image' field",
                              0, NULL, 0);
    }
    if (n > max_images(s)) {
        snprintf(msg, sizeof msg, "%d images in one request; the limit is %d", n, max_images(s));
        return send_error(s, r, c, 413, "too_many_images", msg, 0, NULL, 0);
    }
    for (int i = 0; i < n; i++)
        if (r->parts[i].len == 0) {
            snprintf(msg, sizeof msg, "image %d is empty", i);
            return send_error(s, r, c, 400, "empty_body", msg, 0, NULL, 0);
        }
    r->topk = malloc((size_t)n * (size_t)r->top_k * sizeof *r->topk);
    if (!r->topk)
        return send_body(s, r, c, 500, NULL, 0, NULL, 0, NULL, 0);
    return submit_images(s, r, c, n);
}


/* A complete v2 inference request: parsed here, then queued like a
 * /classify request's images. */
static int v2_submit(server *s, request *r, http_conn *c)
{
    int rc;
    if (refuse_body(s, r, c, &rc))
        return rc;
    char msg[384];
    const char *code = "bad_request";
    /* Read once: a reload may change it, and the classification count
     * parsed against it must bound the answer's top-k. */
    r->classes = classes(s);
    v2_limits lim = {
        .max_images = max_images(s),
        .max_pixels = (uint64_t)s->max_pixels,
        .classes = r->classes,
    };
    if (!(r->v2 = calloc(1, sizeof *r->v2)))
        return send_body(s, r, c, 500, NULL, 0, NULL, 0, NULL, 0);
    int status = v2_parse_infer(r->body, r->len, r->v2_header_len, &lim, s->bodies, r->v2, r->parts, &code, msg,
                                sizeof msg);
    if (status != 0)
        return send_error(s, r, c, status, code, msg, status == 503 ? 1 : 0, NULL, 0);
    int n = r->v2->n;
    if (r->v2->kind == V2_IN_JPEG)
        for (int i = 0; i < n; i++)
            if (r->parts[i].len == 0) {
                snprintf(msg, sizeof msg, "input 'jpeg': element %d is empty", i);
                return send_error(s, r, c, 400, "empty_body", msg, 0, NULL, 0);
            }
    r->logits = malloc((size_t)n * (size_t)r->classes * sizeof *r->logits);
    if (!r->logits)
        return send_body(s, r, c, 500, NULL, 0, NULL, 0, NULL, 0);
    return submit_images(s, r, c, n);
}


/* The connection waits (the HTTP layer's turn is over) until the decode
 * stage or the pipeline wakes it; a refused request (drain timeout) is
 * failed 503 by the stage. */
static void classify_suspend(server *s, request *r, http_conn *c)
{
    r->state = REQ_QUEUED;
    atomic_fetch_add(&s->suspended, 1);
    decode_stage_submit(s->decode, r, http_worker(c));
}

static int classify_answer(server *s, request *r, http_conn *c)
{
    atomic_fetch_sub(&s->suspended, 1);
    r->state = REQ_ANSWERED;   /* out of the pipeline, even if queuing the answer fails */
    if (r->fail_status == 499) {
        /* The client left while queued: nothing to send; close. */
        r->state = REQ_ANSWERED;
        r->status = 499;
        metrics_reject(METRICS_REJECT_CLIENT_GONE);
        http_drop(c);
        return -1;
    }
    if (r->fail_status) {
        int ra = r->fail_status == 503 ? retry_after(s) : 0;
        return send_error(s, r, c, r->fail_status, r->fail_code, r->fail_msg, ra, NULL, 0);
    }
    size_t len = 0;
    uint64_t t0 = clock_now_us();
    if (r->v2) {
        const labels *labs[REQUEST_MAX_IMAGES];
        for (int i = 0; i < r->nimages; i++)
            labs[i] = &r->models[i]->lab;   /* each image's: a reload may fall between its batches */
        char *body = v2_response_infer(r->v2, r->logits, r->classes, labs, &len, &r->answer_header_len);
        r->output_us = clock_now_us() - t0;
        return send_body(s, r, c, 200, body, len, r->answer_header_len ? "application/octet-stream"
                                                                        : "application/json", 0, NULL, 0);
    }
    char *body = response_classify(s->svc, r, t0 - r->start_us, &len);
    r->output_us = clock_now_us() - t0;
    return send_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
}

/* ---- GET endpoints ------------------------------------------------------ */

/* A failing engine fails its batches: the server is not ready until each
 * engine has run a batch again, so a balancer sends traffic elsewhere. */
static int all_healthy(server *s)
{
    for (int i = 0; i < s->ninf; i++)
        if (!infer_healthy(s->inf[i]))
            return 0;
    return 1;
}

static int is_ready(server *s, const char **why)
{
    if (atomic_load(&s->draining))
        *why = "draining";
    else if (!atomic_load(&s->warm))
        *why = "warming up";
    else if (!all_healthy(s))
        *why = "the engine failed its last batch";
    else
        return 1;
    return 0;
}

/* A probe's 200: an empty body, as the protocol's health endpoints answer. */
static int send_empty(server *s, request *r, http_conn *c)
{
    return send_body(s, r, c, 200, strdup(""), 0, "text/plain", 0, NULL, 0);
}

static int answer_get(server *s, request *r, http_conn *c)
{
    size_t len = 0;
    const char *why;
    char *body;
    switch (r->route) {
    case ROUTE_V2_SERVER:
        body = v2_response_server(PACKAGE_VERSION, &len);
        return send_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
    case ROUTE_V2_LIVE:
        return send_empty(s, r, c);
    case ROUTE_V2_READY:
    case ROUTE_V2_MODEL_READY:
        if (!is_ready(s, &why)) {
            char msg[128];
            snprintf(msg, sizeof msg, "not ready: %s", why);
            return send_error(s, r, c, 503, "not_ready", msg, 1, NULL, 0);
        }
        return send_empty(s, r, c);
    case ROUTE_V2_CONFIG: {
        int pref[64], gpus[ENGINE_MAX_DEVICES], ngpus = 0;
        char perr[160];
        int npref = config_preferred_sizes(s->svc->preferred_batch_sizes, pref, 64, perr, sizeof perr);
        if (npref < 0)   /* checked at start-up */
            npref = 0;
        int gpu = strcmp(s->svc->device, "cuda") == 0;
        for (const char *p = s->svc->engines; gpu && p && (p = strstr(p, "cuda:")) && ngpus < ENGINE_MAX_DEVICES;) {
            p += 5;
            gpus[ngpus++] = atoi(p);
        }
        char backend[64];
        snprintf(backend, sizeof backend, "resnetd_%s", s->svc->device);
        body = v2_response_config(classes(s), s->svc->max_batch_size, pref, npref, s->svc->max_queue_delay_us, backend,
                                  gpu, gpus, ngpus, &len);
        return send_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
    }
    case ROUTE_V2_STATS:
    case ROUTE_V2_STATS_ALL:
        body = stats_render(V2_MODEL_NAME, V2_MODEL_VERSION, &len);
        return send_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
    case ROUTE_V2_MODEL: {
        char platform[64];
        snprintf(platform, sizeof platform, "resnetd_%s", s->svc->device);
        body = v2_response_model(classes(s), platform, &len);
        return send_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
    }
    case ROUTE_HEALTHZ:
        body = response_status("ok", &len);
        return send_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
    case ROUTE_READYZ:
        if (!is_ready(s, &why)) {
            char msg[128];
            snprintf(msg, sizeof msg, "not ready: %s", why);
            return send_error(s, r, c, 503, "not_ready", msg, 1, NULL, 0);
        }
        body = response_status("ready", &len);
        return send_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
    case ROUTE_METRICS: {
        metrics_set_ready(is_ready(s, &why));
        /* Through c: s->http is not set yet for a request that arrives
         * while http_start returns. */
        metrics_set_connections(http_connections(http_server_of(c)), http_dropped_slow(http_server_of(c)));
        http_counters hc;
        http_counters_get(http_server_of(c), &hc);
        metrics_set_admission(&(metrics_admission){
            .refused_limit = hc.refused_limit, .refused_client = hc.refused_client, .refused_fds = hc.refused_fds,
            .evicted = hc.evicted, .not_http = hc.not_http, .incomplete_head = hc.incomplete_head,
            .first_byte_timeout = hc.first_byte_timeout, .pending = hc.pending });
        metrics_set_body_memory(budget_used(s->bodies), budget_cap(s->bodies));
        body = metrics_render(&len);
        return send_body(s, r, c, 200, body, len, "text/plain; version=0.0.4; charset=utf-8", 0, NULL, 0);
    }
    default: {
        served_model *m = infer_model(s->inf[0]);
        body = response_model(s->svc, m, &len);
        served_model_unref(m);
        return send_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
    }
    }
}

/* ---- POST /v2/repository/models/resnet18/load --------------------------- */

/* The Open Inference Protocol's model repository extension: reloads the
 * weights and labels the configuration names (reload.h). Like a classify
 * request the connection is suspended one call after the body ends and
 * resumed by the reloader's answer; errors are the protocol's
 * {"error": "..."}. */

#define LOAD_MAX_BODY 65536

/* Past 64 KiB the rest is read and dropped, and answered 413 at the end. */
static int load_body(request *r, const char *data, size_t n)
{
    if (r->too_large || r->over_budget)
        return 0;
    int rc = r->len + n > LOAD_MAX_BODY ? -1 : request_append(r, (const uint8_t *)data, n);
    if (rc == -2)
        r->over_budget = 1;
    else if (rc != 0)
        r->too_large = 1;
    return 0;
}

/* The body is empty, or a JSON object whose "parameters", if any, are
 * empty: resnetd loads the files its configuration names, never others. */
static int load_check(server *s, request *r, http_conn *c)
{
    char why[256];
    if (r->too_large)
        return send_error(s, r, c, 413, "too_large", "the load request's body is larger than 64 KiB", 0, NULL, 0);
    if (r->over_budget)
        return send_error(s, r, c, 503, "memory_full", memory_full_msg, retry_after(s), NULL, 0);
    if (reload_parse_request(r->body, r->len, why, sizeof why) != 0)
        return send_error(s, r, c, 400, "bad_request", why, 0, NULL, 0);
    request_drop_body(r);
    if (atomic_load(&s->draining))
        return send_error(s, r, c, 503, "shutting_down", "the server is shutting down", 1, NULL, 0);
    if (!atomic_load(&s->warm))   /* the engines are still being warmed up */
        return send_error(s, r, c, 503, "not_ready", "the server is starting; load once it is ready", 1, NULL, 0);
    r->state = REQ_SUBMITTING;
    return 0;
}

/* On the reloader thread, with the connection suspended: a failed load
 * is the request's 400, a refused one (stopping, too many waiting) 503. */
static void load_done(void *cls, int rc, const char *message)
{
    request *r = cls;
    if (rc != 0) {
        r->fail_status = rc == RELOAD_REFUSED ? 503 : 400;
        snprintf(r->fail_msg, sizeof r->fail_msg, "%s", message);
    }
    http_wake(r->conn);
}

static void load_suspend(server *s, request *r)
{
    r->state = REQ_QUEUED;
    atomic_fetch_add(&s->suspended, 1);
    if (reloader_request(s->reload, load_done, r) != 0)
        load_done(r, RELOAD_REFUSED, "a reload is refused now: the server is stopping, or 64 load requests are waiting");
}

static int load_answer(server *s, request *r, http_conn *c)
{
    atomic_fetch_sub(&s->suspended, 1);
    r->state = REQ_ANSWERED;
    if (r->fail_status)
        return send_error(s, r, c, r->fail_status, r->fail_status == 503 ? "shutting_down" : "load_failed",
                          r->fail_msg, r->fail_status == 503 ? retry_after(s) : 0, NULL, 0);
    char *empty = calloc(1, 1);
    return send_body(s, r, c, 200, empty, 0, "application/json", 0, NULL, 0);
}

/* ---- POST /v2/repository/index ------------------------------------------ */

/* The repository extension's index: the one model and its state. The body
 * is empty or a JSON object whose "ready", if true, lists only ready
 * models (Triton's request). */
static int index_answer(server *s, request *r, http_conn *c)
{
    const char *why;
    int only_ready = 0;
    if (r->too_large)
        return send_error(s, r, c, 413, "too_large", "the index request's body is larger than 64 KiB", 0, NULL, 0);
    if (r->over_budget)
        return send_error(s, r, c, 503, "memory_full", memory_full_msg, retry_after(s), NULL, 0);
    if (r->len > 0) {
        json_error_t jerr;
        json_t *j = json_loadb((const char *)r->body, r->len, 0, &jerr);
        if (!json_is_object(j)) {
            json_decref(j);
            return send_error(s, r, c, 400, "bad_request", "the index request's body must be a JSON object", 0,
                              NULL, 0);
        }
        only_ready = json_is_true(json_object_get(j, "ready"));
        json_decref(j);
    }
    request_drop_body(r);
    int ready = is_ready(s, &why);
    size_t len = 0;
    char *body = only_ready && !ready ? strdup("[]\n") : v2_response_index(ready, &len);
    if (body && len == 0)
        len = strlen(body);
    r->state = REQ_ANSWERED;
    return send_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
}

/* ---- the HTTP layer's callbacks ----------------------------------------- */

/* Does the request announce a body? */
static int has_body(const http_head *h)
{
    return h->chunked || h->content_length > 0;
}

static int route(server *s, request *r, http_conn *c, const http_head *h)
{
    const char *url = h->path, *method = h->method;
    r->state = REQ_RECEIVING;
    r->v2_route = v2_route_of(url);   /* before any answer: /v2 errors have the protocol's body */
    r->route = -1;
    for (int i = 0; i < ROUTE_V2_SERVER; i++)
        if (strcmp(url, routes[i].path) == 0)
            r->route = i;
    /* The repository extension's load and index: under /v2 but not model paths. */
    if (strcmp(url, routes[ROUTE_LOAD].path) == 0)
        r->route = ROUTE_LOAD;
    if (strcmp(url, routes[ROUTE_INDEX].path) == 0)
        r->route = ROUTE_INDEX;
    static const int v2_routes[] = {
        [V2_SERVER_META] = ROUTE_V2_SERVER, [V2_LIVE] = ROUTE_V2_LIVE, [V2_READY] = ROUTE_V2_READY,
        [V2_MODEL_META] = ROUTE_V2_MODEL, [V2_MODEL_READY] = ROUTE_V2_MODEL_READY, [V2_INFER] = ROUTE_V2_INFER,
        [V2_MODEL_CONFIG] = ROUTE_V2_CONFIG, [V2_MODEL_STATS] = ROUTE_V2_STATS, [V2_STATS] = ROUTE_V2_STATS_ALL,
    };
    switch (r->v2_route) {
    case V2_NOT_V2:
        break;
    case V2_UNKNOWN_MODEL: {
        char msg[200];
        snprintf(msg, sizeof msg, "unknown model or version: %.120s (this server has " V2_MODEL_NAME " version "
                 V2_MODEL_VERSION ")", url);
        return send_error(s, r, c, 404, "not_found", msg, 0, NULL, has_body(h));
    }
    case V2_UNKNOWN_PATH:
        break;   /* 404 below, unless it is the load or the index */
    default:
        r->route = v2_routes[r->v2_route];
    }
    if (r->route < 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "no such path: %.120s", url);
        return send_error(s, r, c, 404, "not_found", msg, 0, NULL, has_body(h));
    }
    int is_post = strcmp(method, "POST") == 0;
    int is_get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    if (takes_body(r->route) ? !is_post : !is_get) {
        char msg[160];
        snprintf(msg, sizeof msg, "%.20s is not allowed on %s; use %s", method, routes[r->route].path,
                 routes[r->route].allow);
        return send_error(s, r, c, 405, "method_not_allowed", msg, 0, routes[r->route].allow,
                          is_post || has_body(h));
    }
    if (!takes_body(r->route) && has_body(h)) {
        /* Answered unread, so a GET never costs body memory. */
        char msg[160];
        snprintf(msg, sizeof msg, "%s takes no request body", routes[r->route].path);
        return send_error(s, r, c, 413, "too_large", msg, 0, NULL, 1);
    }
    if (!takes_body(r->route))
        return answer_get(s, r, c);
    if (r->route == ROUTE_LOAD || r->route == ROUTE_INDEX)
        return 0;   /* a load's or an index's body is read as it comes */
    r->inference = 1;   /* counted in Triton's statistics, whatever its outcome */
    return r->route == ROUTE_CLASSIFY ? classify_begin(s, r, c, h) : v2_begin(s, r, c, h);
}

static request *new_request(server *s, http_conn *c)
{
    request *r = request_create();
    if (!r)
        return NULL;
    r->conn = c;
    r->route = -1;   /* until route() names one: a refused head has none */
    r->fd = http_fd(c);
    r->budget = s->bodies;
    r->max_len = (size_t)s->max_body_bytes;
    r->start_us = clock_now_us();
    return r;
}

/* What the access log needs of a request that is gone by its end. */
static void log_begin(server *s, request *r, const http_head *h)
{
    struct sockaddr_storage a = { 0 };
    socklen_t alen = sizeof a;
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (getpeername(r->fd, (struct sockaddr *)&a, &alen) == 0) {
        if (a.ss_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)&a)->sin_addr, host, sizeof host);
            port = ntohs(((struct sockaddr_in *)&a)->sin_port);
        } else if (a.ss_family == AF_INET6) {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&a)->sin6_addr, host, sizeof host);
            port = ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
        }
    }
    snprintf(r->log_peer, sizeof r->log_peer, a.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", host, port);
    /* JSON strings must be UTF-8: a decoded path or a header may not be */
    utf8_sanitize(r->log_method, sizeof r->log_method, h->method);
    utf8_sanitize(r->log_path, sizeof r->log_path, h->path);
    const char *id = http_header(h, "X-Request-Id");
    if (id && *id)
        utf8_sanitize(r->log_id, sizeof r->log_id, id);
    else
        snprintf(r->log_id, sizeof r->log_id, "resnetd-%llu", atomic_fetch_add(&s->request_ids, 1) + 1);
}

/* A request's head: from here on the drain waits for it. */
static void *on_request(void *cls, http_conn *c, const http_head *h)
{
    server *s = cls;
    request *r = new_request(s, c);
    if (!r)
        return NULL;
    atomic_fetch_add(&s->active, 1);
    if (s->alog)
        log_begin(s, r, h);
    if (h->status) {   /* refused by the HTTP layer: answered unread */
        r->state = REQ_RECEIVING;
        r->v2_route = v2_route_of(h->path);
        send_error(s, r, c, h->status, h->code, h->message, 0, NULL, 1);
        return r;
    }
    route(s, r, c, h);
    return r;
}

static void on_body(void *cls, http_conn *c, void *req, const char *data, size_t n)
{
    server *s = cls;
    request *r = req;
    r->bytes_in += n;
    if (r->state != REQ_RECEIVING || !takes_body(r->route))
        return;
    int small = r->route == ROUTE_LOAD || r->route == ROUTE_INDEX;
    if ((small ? load_body(r, data, n) : classify_body(s, r, data, n)) != 0) {
        http_drop(c);
    } else if (r->too_large) {
        /* Answered now, not after the rest, which may never come: the
         * connection closes after the answer. */
        int rc;
        if (!small)
            refuse_body(s, r, c, &rc);
        else
            send_error(s, r, c, 413, "too_large", r->route == ROUTE_LOAD
                       ? "the load request's body is larger than 64 KiB"
                       : "the index request's body is larger than 64 KiB", 0, NULL, 1);
    }
}

/* The body is complete: checked, and handed to the decode stage or the
 * reloader, whose wake answers it. */
static void on_body_end(void *cls, http_conn *c, void *req)
{
    server *s = cls;
    request *r = req;
    if (r->state != REQ_RECEIVING)
        return;
    if (r->route == ROUTE_CLASSIFY)
        classify_submit(s, r, c);
    else if (r->route == ROUTE_V2_INFER)
        v2_submit(s, r, c);
    else if (r->route == ROUTE_LOAD)
        load_check(s, r, c);
    else if (r->route == ROUTE_INDEX)
        index_answer(s, r, c);
    if (r->state == REQ_SUBMITTING && r->route == ROUTE_LOAD)
        load_suspend(s, r);
    else if (r->state == REQ_SUBMITTING)
        classify_suspend(s, r, c);
}

/* Woken by a decode thread, the pipeline or the reloader: the answer. */
static void on_wake(void *cls, http_conn *c, void *req)
{
    server *s = cls;
    request *r = req;
    if (r->state != REQ_QUEUED)
        return;
    if (r->route == ROUTE_LOAD)
        load_answer(s, r, c);
    else
        classify_answer(s, r, c);
}

/* Every request ends here, once: counted, and freed. */
static void on_done(void *cls, void *req, http_end how)
{
    server *s = cls;
    request *r = req;
    int code = r->status, delivered = how == HTTP_END_DELIVERED;
    if (how == HTTP_END_SLOW && code == 0) {
        /* Closed for its rate: a 408 the client would not have read. */
        metrics_reject(METRICS_REJECT_SLOW_CLIENT);
        code = 408;
    } else if (how == HTTP_END_INCOMPLETE && code == 0) {
        /* The client ended its side mid-request; the layer answered. */
        metrics_reject(METRICS_REJECT_BAD_INPUT);
        code = 400;
        delivered = 1;
    } else if (code == 0 || (code == 200 && !delivered)) {
        /* The client went away before its answer (or while sending). */
        metrics_reject(METRICS_REJECT_CLIENT_GONE);
        code = 499;
    }
    uint64_t total_us = clock_now_us() - r->start_us;
    metrics_observe_request(code, (double)total_us / 1e6);
    if (r->inference)
        stats_request(code == 200, total_us * 1000, r->nimages, r->queue_us * 1000,
                      (r->decode_us + r->gpu_decode_us) * 1000, r->infer_us * 1000, r->output_us * 1000);
    if (s->alog) {
        accesslog_entry e = { .peer = r->log_peer, .method = r->log_method, .path = r->log_path, .status = code,
                              .bytes_in = r->bytes_in, .bytes_out = delivered ? r->bytes_out : 0,
                              .images = code == 200 ? r->nimages : 0, .latency_ms = (double)total_us / 1e3,
                              .id = r->log_id };
        accesslog_write(s->alog, &e);
    }
    atomic_fetch_sub(&s->active, 1);
    /* Slots reserved but never handed on; a request still counted as
     * waiting in the pipeline (the HTTP layer stopping). */
    if (r->state == REQ_SUBMITTING && r->route != ROUTE_LOAD)   /* /classify and v2 infer reserve slots */
        queue_release(s->q, r->slots, r->nimages);
    else if (r->state == REQ_QUEUED)
        atomic_fetch_sub(&s->suspended, 1);
    for (int i = 0; i < r->nimages; i++)
        served_model_unref(r->models[i]);
    if (r->v2) {
        v2_infer_free(r->v2);
        free(r->v2);
    }
    free(r->logits);
    request_free(r);
}

/* ---- lifecycle ---------------------------------------------------------- */

server *server_start(const config *cfg, const response_service *svc, queue *q, infer *const *inf, int ninf,
                     reloader *reload, devjpeg *dj, decode_route *route, budget *bodies, const http_tls *tls,
                     char *err, size_t errlen)
{
    char host[256];
    int port;
    if (config_parse_listen(cfg->listen, host, sizeof host, &port, err, errlen) != 0)
        return NULL;
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE };
    struct addrinfo *ai;
    int gai = getaddrinfo(host, NULL, &hints, &ai);
    if (gai != 0) {
        snprintf(err, errlen, "listen: cannot resolve '%s': %s", host, gai_strerror(gai));
        return NULL;
    }
    struct sockaddr_storage addr;
    memcpy(&addr, ai->ai_addr, ai->ai_addrlen);
    int family = ai->ai_family;
    freeaddrinfo(ai);
    if (family == AF_INET6)
        ((struct sockaddr_in6 *)&addr)->sin6_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in *)&addr)->sin_port = htons((uint16_t)port);

    server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "server: out of memory");
        return NULL;
    }
    s->svc = svc;
    s->q = q;
    s->inf = inf;
    s->ninf = ninf;
    s->reload = reload;
    s->bodies = bodies;
    s->max_body_bytes = cfg->max_body_bytes;
    s->max_pixels = cfg->max_pixels;
    s->request_timeout_ms = cfg->request_timeout_ms;
    atomic_init(&s->warm, 0);
    atomic_init(&s->draining, 0);
    atomic_init(&s->active, 0);
    atomic_init(&s->suspended, 0);
    atomic_init(&s->request_ids, 0);
    decode_stage_config dc = {
        .threads = (int)cfg->decode_threads,
        .http_threads = (int)cfg->threads,
        .max_pixels = (uint64_t)cfg->max_pixels,
        .assist_depth = cfg->cpu_decode_assist == CONFIG_AUTO ? -1 : (int)cfg->cpu_decode_assist,
        .q = q,
        .dj = dj,
        .route = route,
        .bodies = bodies,
    };
    if (!(s->decode = decode_stage_start(&dc, err, errlen))) {
        free(s);
        return NULL;
    }

    http_limits lim = {
        .threads = (int)cfg->threads,
        .connection_limit = cfg->connection_limit,
        .client_limit = cfg->client_connection_limit,
        .header_timeout_us = (uint64_t)cfg->header_timeout_s * 1000000u,
        .min_rate = (uint64_t)cfg->min_body_rate,
        .idle_timeout_us = (uint64_t)cfg->connection_timeout_s * 1000000u,
        .conn_memory = (size_t)cfg->connection_memory_bytes,
        .backlog = (int)cfg->listen_backlog,
        .tls = tls,
    };
    if (cfg->access_log[0] && !(s->alog = accesslog_open(cfg->access_log, err, errlen)))
        goto fail;
    http_handler handler = {
        .cls = s,
        .request = on_request,
        .body = on_body,
        .body_end = on_body_end,
        .wake = on_wake,
        .done = on_done,
        .unescape = request_unescape,
    };
    char why[200];
    socklen_t addrlen = family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    s->http = http_start((struct sockaddr *)&addr, addrlen, &lim, &handler, why, sizeof why);
    if (!s->http) {
        snprintf(err, errlen, "cannot listen on %s: %s", cfg->listen, why);
        goto fail;
    }
    s->port = http_port(s->http);
    return s;

fail:
    accesslog_close(s->alog);
    decode_stage_stop(s->decode);
    free(s);
    return NULL;
}

int server_port(const server *s)
{
    return s->port;
}

void server_set_warm(server *s)
{
    atomic_store(&s->warm, 1);
}

void server_begin_drain(server *s)
{
    atomic_store(&s->draining, 1);
    http_quiesce(s->http);
}

long server_active(server *s)
{
    return atomic_load(&s->active);
}

long server_suspended(server *s)
{
    return atomic_load(&s->suspended);
}

long server_decoding(server *s)
{
    return decode_stage_running(s->decode);
}

int server_cancel_decodes(server *s)
{
    return decode_stage_cancel(s->decode);
}

void server_stop(server *s)
{
    if (!s)
        return;
    /* Refuse decodes first (a late request is failed 503), so none can be
     * submitted to a stage that is gone; none is running: nothing is
     * suspended. */
    decode_stage_refuse(s->decode);
    http_stop(s->http);
    decode_stage_stop(s->decode);
    accesslog_close(s->alog);   /* after every request ended: their lines are queued */
    free(s);
}
