/* How the front end answers (daemon/api/answer.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/api/answer.h"
#include "daemon/pipeline/batch_policy.h"
#include "daemon/api/metrics.h"
#include "daemon/api/server_impl.h"
#include "daemon/api/v2.h"

const char answer_memory_full[] =
    "the request bodies being received fill the server's body memory (body_memory_bytes); retry later";

static const char oom_body[] = "{\"error\":{\"status\":500,\"code\":\"internal\",\"message\":\"out of memory\"}}";

/* Answers r with body (malloc'd JSON or text, the layer's from here; NULL
 * after an allocation failure: a 500) and records its status. */
int answer_body(server *s, request *r, http_conn *c, int status, char *body, size_t len, const char *ctype,
                int retry_after, const char *allow, int close_conn)
{
    if (!body) {
        status = 500;
        ctype = "application/json";
        len = sizeof oom_body - 1;
        body = strdup(oom_body); /* NULL again: the 500 goes without a body */
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
    return METRICS_REJECT_COUNT; /* not a rejection: 500, 503 while draining */
}

int answer_error(server *s, request *r, http_conn *c, int status, const char *code, const char *message,
                 int retry_after, const char *allow, int close_conn)
{
    metrics_reject_reason why = reject_reason(status, code);
    if (why != METRICS_REJECT_COUNT)
        metrics_reject(why);
    size_t len = 0;
    char *body = r->v2_route != V2_NOT_V2 ? v2_response_error(message, &len)
                                          : response_error(status, code, message, &len);
    return answer_body(s, r, c, status, body, len, "application/json", retry_after, allow, close_conn);
}

/* Images one request may carry: 64, or fewer when the queue holds fewer. */
int answer_max_images(server *s)
{
    return REQUEST_MAX_IMAGES < queue_capacity(s->q) ? REQUEST_MAX_IMAGES : queue_capacity(s->q);
}

/* The served model's class count now (a reload may change it): what a
 * request is sized for when it arrives. */
int answer_classes(server *s)
{
    served_model *m = infer_model(s->inf[0]);
    int n = m->classes;
    served_model_unref(m);
    return n;
}

int answer_retry_after(server *s)
{
    double rate = 0;
    for (int i = 0; i < s->ninf; i++)
        rate += infer_images_per_s(s->inf[i]);
    return batch_retry_after_s(queue_depth(s->q), rate);
}
