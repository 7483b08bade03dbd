/* POST /classify and v2 infer (daemon/api/classify.h). */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/api/answer.h"
#include "daemon/api/classify.h"
#include "daemon/pipeline/decode.h"
#include "daemon/log.h"
#include "daemon/api/metrics.h"
#include "daemon/api/server_impl.h"
#include "daemon/api/v2.h"
#include "util/clock.h"

/* ---- pipeline callbacks (batcher and completion threads) -------------- */

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

const pipeline_sink classify_sink = { .done = sink_done, .fail = sink_fail };

/* ---- POST /classify ----------------------------------------------------- */

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
            return answer_error(s, r, c, 413, "too_large", msg, 0, NULL, 1);
        }
        if (budget_used(s->bodies) + n > budget_cap(s->bodies))
            return answer_error(s, r, c, 503, "memory_full", answer_memory_full, 1, NULL, 1);
        r->expect = (size_t)n;
    }
    return 0;
}

int classify_begin(server *s, request *r, http_conn *c, const http_head *h)
{
    if (atomic_load(&s->draining))
        return answer_error(s, r, c, 503, "shutting_down", "the server is shutting down", 1, NULL, 1);

    /* An unknown parameter is a mistake (?topk=1) the client should hear of. */
    for (int i = 0; i < h->nargs; i++)
        if (strcmp(h->args[i].name, "top_k") != 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "unknown query parameter '%.64s' (/classify takes top_k)", h->args[i].name);
            return answer_error(s, r, c, 400, "bad_parameter", msg, 0, NULL, 1);
        }
    const int nclasses = answer_classes(s);
    const char *k = http_arg(h, "top_k");
    if (k && request_parse_top_k(k, nclasses, &r->top_k) != 0) {
        char msg[128];
        snprintf(msg, sizeof msg, "top_k must be a whole number from 1 to %d (the model's classes)", nclasses);
        return answer_error(s, r, c, 400, "bad_parameter", msg, 0, NULL, 1);
    }
    if (!k && r->top_k > nclasses)
        r->top_k = nclasses;

    const char *ct = http_header(h, "Content-Type");
    int rc = request_parse_content_type(ct, &r->body_kind, r->boundary, sizeof r->boundary);
    r->form_type = request_is_form_type(ct);
    if (rc == -1) {
        char msg[256];
        snprintf(msg, sizeof msg, "content type '%.100s' is not image/jpeg or multipart/form-data", ct);
        return answer_error(s, r, c, 415, "unsupported_media_type", msg, 0, NULL, 1);
    }
    if (rc == -2)
        return answer_error(s, r, c, 400, "invalid_multipart", "multipart/form-data without a valid boundary", 0, NULL,
                            1);
    return body_begin(s, r, c, h);
}

/* POST .../infer's headers: the v2 body is JSON, optionally followed by
 * binary tensor data (Inference-Header-Content-Length says where). */
int classify_v2_begin(server *s, request *r, http_conn *c, const http_head *h)
{
    if (atomic_load(&s->draining))
        return answer_error(s, r, c, 503, "shutting_down", "the server is shutting down", 1, NULL, 1);
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
        return answer_error(s, r, c, 415, "unsupported_media_type", msg, 0, NULL, 1);
    }
    const char *hl = http_header(h, "Inference-Header-Content-Length");
    for (int i = 0; hl && i < h->nheaders; i++)
        if (strcasecmp(h->headers[i].name, "Inference-Header-Content-Length") == 0 &&
            strcmp(h->headers[i].value, hl) != 0)
            /* Two framings of one body: refused, as two Content-Lengths are. */
            return answer_error(s, r, c, 400, "bad_request", "more than one Inference-Header-Content-Length", 0, NULL,
                                1);
    if (hl && (r->v2_header_len = v2_parse_header_length(hl, (size_t)s->max_body_bytes)) < 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "Inference-Header-Content-Length '%.60s' is not a length up to max_body_bytes", hl);
        return answer_error(s, r, c, 400, "bad_request", msg, 0, NULL, 1);
    }
    return body_begin(s, r, c, h);
}

int classify_body(server *s, request *r, const char *data, size_t n)
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
int classify_refuse_body(server *s, request *r, http_conn *c, int *rc)
{
    char msg[128];
    if (r->too_large) {
        snprintf(msg, sizeof msg, "request body is over the limit of %ld bytes", s->max_body_bytes);
        *rc = answer_error(s, r, c, 413, "too_large", msg, 0, NULL, 1);
    } else if (r->over_budget) { /* its body was dropped: checked before the empty body */
        *rc = answer_error(s, r, c, 503, "memory_full", answer_memory_full, 1, NULL, 0);
    } else if (r->len == 0) {
        *rc = answer_error(s, r, c, 400, "empty_body",
                           r->v2_route != V2_NOT_V2 ? "the request body is empty; send the inference request JSON"
                                                    : "the request body is empty; send the JPEG bytes",
                           0, NULL, 0);
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
        return answer_error(s, r, c, 503, "queue_full", "the queue is full; retry later", answer_retry_after(s), NULL,
                            0);

    r->nimages = n;
    r->accepted = 1;
    r->state = REQ_SUBMITTING;
    r->deadline_us = r->start_us + (uint64_t)s->request_timeout_ms * 1000u;
    r->job.owner = r;
    return 0;
}

int classify_submit(server *s, request *r, http_conn *c)
{
    char msg[384], why[256];
    int rc;
    if (classify_refuse_body(s, r, c, &rc))
        return rc;
    int n;
    if (r->body_kind == REQ_BODY_RAW) {
        r->parts[0].data = r->body;
        r->parts[0].len = r->len;
        n = 1;
    } else {
        n = request_parse_multipart(r->body, r->len, r->boundary, "image", r->parts, REQUEST_MAX_IMAGES, why,
                                    sizeof why);
        if (n < 0)
            return answer_error(s, r, c, 400, "invalid_multipart", why, 0, NULL, 0);
        if (n == 0)
            return answer_error(s, r, c, 400, "missing_image", "multipart request has no 'image' field", 0, NULL, 0);
    }
    if (n > answer_max_images(s)) {
        snprintf(msg, sizeof msg, "%d images in one request; the limit is %d", n, answer_max_images(s));
        return answer_error(s, r, c, 413, "too_many_images", msg, 0, NULL, 0);
    }
    for (int i = 0; i < n; i++)
        if (r->parts[i].len == 0) {
            snprintf(msg, sizeof msg, "image %d is empty", i);
            return answer_error(s, r, c, 400, "empty_body", msg, 0, NULL, 0);
        }
    r->topk = malloc((size_t)n * (size_t)r->top_k * sizeof *r->topk);
    if (!r->topk)
        return answer_body(s, r, c, 500, NULL, 0, NULL, 0, NULL, 0);
    return submit_images(s, r, c, n);
}

/* A complete v2 inference request: parsed here, then queued like a
 * /classify request's images. */
int classify_v2_submit(server *s, request *r, http_conn *c)
{
    int rc;
    if (classify_refuse_body(s, r, c, &rc))
        return rc;
    char msg[384];
    const char *code = "bad_request";
    /* Read once: a reload may change it, and the classification count
     * parsed against it must bound the answer's top-k. */
    r->classes = answer_classes(s);
    v2_limits lim = {
        .max_images = answer_max_images(s),
        .max_pixels = (uint64_t)s->max_pixels,
        .classes = r->classes,
    };
    if (!(r->v2 = calloc(1, sizeof *r->v2)))
        return answer_body(s, r, c, 500, NULL, 0, NULL, 0, NULL, 0);
    int status = v2_parse_infer(r->body, r->len, r->v2_header_len, &lim, s->bodies, r->v2, r->parts, &code, msg,
                                sizeof msg);
    if (status != 0)
        return answer_error(s, r, c, status, code, msg, status == 503 ? 1 : 0, NULL, 0);
    int n = r->v2->n;
    if (r->v2->kind == V2_IN_JPEG)
        for (int i = 0; i < n; i++)
            if (r->parts[i].len == 0) {
                snprintf(msg, sizeof msg, "input 'jpeg': element %d is empty", i);
                return answer_error(s, r, c, 400, "empty_body", msg, 0, NULL, 0);
            }
    r->logits = malloc((size_t)n * (size_t)r->classes * sizeof *r->logits);
    if (!r->logits)
        return answer_body(s, r, c, 500, NULL, 0, NULL, 0, NULL, 0);
    return submit_images(s, r, c, n);
}

/* The connection waits (the HTTP layer's turn is over) until the decode
 * stage or the pipeline wakes it; a refused request (drain timeout) is
 * failed 503 by the stage. */
void classify_suspend(server *s, request *r, http_conn *c)
{
    r->state = REQ_QUEUED;
    atomic_fetch_add(&s->suspended, 1);
    decode_stage_submit(s->decode, r, http_worker(c));
}

int classify_answer(server *s, request *r, http_conn *c)
{
    atomic_fetch_sub(&s->suspended, 1);
    r->state = REQ_ANSWERED; /* out of the pipeline, even if queuing the answer fails */
    if (r->fail_status == 499) {
        /* The client left while queued: nothing to send; close. */
        r->state = REQ_ANSWERED;
        r->status = 499;
        metrics_reject(METRICS_REJECT_CLIENT_GONE);
        http_drop(c);
        return -1;
    }
    if (r->fail_status) {
        int ra = r->fail_status == 503 ? answer_retry_after(s) : 0;
        return answer_error(s, r, c, r->fail_status, r->fail_code, r->fail_msg, ra, NULL, 0);
    }
    size_t len = 0;
    uint64_t t0 = clock_now_us();
    if (r->v2) {
        const labels *labs[REQUEST_MAX_IMAGES];
        for (int i = 0; i < r->nimages; i++)
            labs[i] = &r->models[i]->lab; /* each image's: a reload may fall between its batches */
        char *body = v2_response_infer(r->v2, r->logits, r->classes, labs, &len, &r->answer_header_len);
        r->output_us = clock_now_us() - t0;
        return answer_body(s, r, c, 200, body, len,
                           r->answer_header_len ? "application/octet-stream" : "application/json", 0, NULL, 0);
    }
    char *body = response_classify(s->svc, r, t0 - r->start_us, &len);
    r->output_us = clock_now_us() - t0;
    return answer_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
}
