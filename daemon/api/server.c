/* The HTTP front end's routing and the HTTP layer's handler (daemon/http/http.h);
 * the inference flow is daemon/api/classify.c, the other endpoints
 * daemon/api/endpoints.c, and every answer goes through daemon/api/answer.c.
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
 *      decode stage (daemon/pipeline/decode.h), which decodes the images into the
 *      slots (or leaves them compressed for the GPU) and pushes them to the
 *      batcher's queue; when the last image is reported (or
 *      decoding failed) the connection is woken and on_wake answers.
 * POST /v2/models/resnet18[/versions/1]/infer (the Open Inference Protocol,
 * daemon/api/v2.h) takes the same three steps: its body is parsed at step 3,
 * on the HTTP thread (its limits bound the work), and its images take the
 * same decode stage, queue and batcher; pixel and FP32 tensors are resized
 * or passed on there instead of decoded. Errors on /v2 paths have the
 * protocol's {"error": "..."} body.
 *
 * HTTP threads never decode: a connection stays on one thread, and
 * decoding there left threads idle while others had a backlog. Every
 * request is freed in on_done, which also counts it. */
#include <config.h> /* autoconf's (PACKAGE_VERSION), not daemon/config_table.h */
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
#include "daemon/http/accesslog.h"
#include "daemon/api/answer.h"
#include "daemon/pipeline/batcher.h"
#include "daemon/api/classify.h"
#include "daemon/http/http.h"
#include "daemon/pipeline/decode.h"
#include "daemon/api/endpoints.h"
#include "daemon/log.h"
#include "daemon/api/metrics.h"
#include "daemon/api/server.h"
#include "daemon/api/server_impl.h"
#include "daemon/api/stats.h"
#include "daemon/api/v2.h"
#include "util/clock.h"
#include "util/utf8.h"

static const struct {
    const char *path;
    const char *allow; /* methods, as the Allow header lists them */
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
    r->v2_route = v2_route_of(url); /* before any answer: /v2 errors have the protocol's body */
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
        [V2_SERVER_META] = ROUTE_V2_SERVER,
        [V2_LIVE] = ROUTE_V2_LIVE,
        [V2_READY] = ROUTE_V2_READY,
        [V2_MODEL_META] = ROUTE_V2_MODEL,
        [V2_MODEL_READY] = ROUTE_V2_MODEL_READY,
        [V2_INFER] = ROUTE_V2_INFER,
        [V2_MODEL_CONFIG] = ROUTE_V2_CONFIG,
        [V2_MODEL_STATS] = ROUTE_V2_STATS,
        [V2_STATS] = ROUTE_V2_STATS_ALL,
    };
    switch (r->v2_route) {
    case V2_NOT_V2: break;
    case V2_UNKNOWN_MODEL: {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "unknown model or version: %.120s (this server has " V2_MODEL_NAME " version " V2_MODEL_VERSION ")",
                 url);
        return answer_error(s, r, c, 404, "not_found", msg, 0, NULL, has_body(h));
    }
    case V2_UNKNOWN_PATH: break; /* 404 below, unless it is the load or the index */
    default: r->route = v2_routes[r->v2_route];
    }
    if (r->route < 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "no such path: %.120s", url);
        return answer_error(s, r, c, 404, "not_found", msg, 0, NULL, has_body(h));
    }
    int is_post = strcmp(method, "POST") == 0;
    int is_get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    if (takes_body(r->route) ? !is_post : !is_get) {
        char msg[160];
        snprintf(msg, sizeof msg, "%.20s is not allowed on %s; use %s", method, routes[r->route].path,
                 routes[r->route].allow);
        return answer_error(s, r, c, 405, "method_not_allowed", msg, 0, routes[r->route].allow, is_post || has_body(h));
    }
    if (!takes_body(r->route) && has_body(h)) {
        /* Answered unread, so a GET never costs body memory. */
        char msg[160];
        snprintf(msg, sizeof msg, "%s takes no request body", routes[r->route].path);
        return answer_error(s, r, c, 413, "too_large", msg, 0, NULL, 1);
    }
    if (!takes_body(r->route))
        return endpoint_get(s, r, c);
    if (r->route == ROUTE_LOAD || r->route == ROUTE_INDEX)
        return 0; /* a load's or an index's body is read as it comes */
    r->inference = 1; /* counted in Triton's statistics, whatever its outcome */
    return r->route == ROUTE_CLASSIFY ? classify_begin(s, r, c, h) : classify_v2_begin(s, r, c, h);
}

static request *new_request(server *s, http_conn *c)
{
    request *r = request_create();
    if (!r)
        return NULL;
    r->conn = c;
    r->route = -1; /* until route() names one: a refused head has none */
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
    if (h->status) { /* refused by the HTTP layer: answered unread */
        r->state = REQ_RECEIVING;
        r->v2_route = v2_route_of(h->path);
        answer_error(s, r, c, h->status, h->code, h->message, 0, NULL, 1);
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
    if ((small ? endpoint_load_body(r, data, n) : classify_body(s, r, data, n)) != 0) {
        http_drop(c);
    } else if (r->too_large) {
        /* Answered now, not after the rest, which may never come: the
         * connection closes after the answer. */
        int rc;
        if (!small)
            classify_refuse_body(s, r, c, &rc);
        else
            answer_error(s, r, c, 413, "too_large",
                         r->route == ROUTE_LOAD ? "the load request's body is larger than 64 KiB"
                                                : "the index request's body is larger than 64 KiB",
                         0, NULL, 1);
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
        classify_v2_submit(s, r, c);
    else if (r->route == ROUTE_LOAD)
        endpoint_load_check(s, r, c);
    else if (r->route == ROUTE_INDEX)
        endpoint_index_answer(s, r, c);
    if (r->state == REQ_SUBMITTING && r->route == ROUTE_LOAD)
        endpoint_load_suspend(s, r);
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
        endpoint_load_answer(s, r, c);
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
        accesslog_entry e = { .peer = r->log_peer,
                              .method = r->log_method,
                              .path = r->log_path,
                              .status = code,
                              .bytes_in = r->bytes_in,
                              .bytes_out = delivered ? r->bytes_out : 0,
                              .images = code == 200 ? r->nimages : 0,
                              .latency_ms = (double)total_us / 1e3,
                              .id = r->log_id };
        accesslog_write(s->alog, &e);
    }
    atomic_fetch_sub(&s->active, 1);
    /* Slots reserved but never handed on; a request still counted as
     * waiting in the pipeline (the HTTP layer stopping). */
    if (r->state == REQ_SUBMITTING && r->route != ROUTE_LOAD) /* /classify and v2 infer reserve slots */
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
                     reloader *reload, devjpeg *dj, decode_route *route, budget *bodies, const http_tls *tls, char *err,
                     size_t errlen)
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
    accesslog_close(s->alog); /* after every request ended: their lines are queued */
    free(s);
}
