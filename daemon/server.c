/* libmicrohttpd front end: routes, limits, the classify flow and the
 * pipeline callbacks.
 *
 * A POST /classify goes through the access handler three times:
 *   1. headers: route, method, ?top_k, Content-Type and Content-Length are
 *      checked; a bad request is answered here without reading the body;
 *   2. body chunks: appended up to max_body_bytes (chunked bodies are
 *      counted as they arrive);
 *   3. end of body: queue slots are reserved, the connection is suspended
 *      and the request goes to the decode pool, whose threads decode the
 *      images into the slots and push them to the batcher's queue; when the
 *      last image is reported (or decoding failed) the connection resumes
 *      and a final call answers.
 * HTTP threads never decode: libmicrohttpd gives each thread its own set of
 * connections, unevenly, and decoding there left threads idle while others
 * had a backlog. Every request is freed in on_completed, which also counts
 * it. */
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "daemon/batcher.h"
#include "daemon/decode.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "daemon/server.h"
#include "model/clock.h"
#include "model/resnet18.h"

enum { ROUTE_CLASSIFY, ROUTE_HEALTHZ, ROUTE_READYZ, ROUTE_METRICS, ROUTE_MODEL };

static const struct {
    const char *path;
    const char *allow;      /* methods, as the Allow header lists them */
} routes[] = {
    [ROUTE_CLASSIFY] = { "/classify", "POST" },
    [ROUTE_HEALTHZ] = { "/healthz", "GET, HEAD" },
    [ROUTE_READYZ] = { "/readyz", "GET, HEAD" },
    [ROUTE_METRICS] = { "/metrics", "GET, HEAD" },
    [ROUTE_MODEL] = { "/v1/models/resnet18", "GET, HEAD" },
};
#define NROUTES ((int)(sizeof routes / sizeof routes[0]))

struct server {
    struct MHD_Daemon *d;
    const response_service *svc;
    queue *q;
    infer *inf;
    decode_pool *decoders;
    long max_body_bytes;
    long request_timeout_ms;
    int port;
    atomic_int warm;
    atomic_int draining;
    atomic_long active;
    atomic_long suspended;  /* requests whose images are in the pipeline */
};

/* ---- answering ---------------------------------------------------------- */

static const char oom_body[] =
    "{\"error\":{\"status\":500,\"code\":\"internal\",\"message\":\"out of memory\"}}";

/* Queues one response and records its status; body is malloc'd JSON (or
 * text) that libmicrohttpd frees, or NULL after an allocation failure. */
static enum MHD_Result send_body(server *s, request *r, struct MHD_Connection *c, int status, char *body,
                                 size_t len, const char *ctype, int retry_after, const char *allow,
                                 int close_conn)
{
    struct MHD_Response *resp;
    if (body) {
        resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
        if (!resp)
            free(body);
    } else {
        status = 500;
        ctype = "application/json";
        resp = MHD_create_response_from_buffer(sizeof oom_body - 1, (void *)oom_body, MHD_RESPMEM_PERSISTENT);
    }
    if (!resp)
        return MHD_NO;
    int ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype) == MHD_YES;
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry_after);
        ok = ok && MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, ra) == MHD_YES;
    }
    if (allow)
        ok = ok && MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow) == MHD_YES;
    if (close_conn || atomic_load(&s->draining))
        ok = ok && MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close") == MHD_YES;
    enum MHD_Result rc = ok ? MHD_queue_response(c, (unsigned)status, resp) : MHD_NO;
    MHD_destroy_response(resp);
    r->state = REQ_ANSWERED;
    r->status = status;
    return rc;
}

static metrics_reject_reason reject_reason(int status, const char *code)
{
    if (status == 413)
        return METRICS_REJECT_TOO_LARGE;
    if (status == 504)
        return METRICS_REJECT_TIMEOUT;
    if (status == 503 && strcmp(code, "queue_full") == 0)
        return METRICS_REJECT_QUEUE_FULL;
    if (status == 400 || status == 404 || status == 405 || status == 415)
        return METRICS_REJECT_BAD_INPUT;
    return METRICS_REJECT_COUNT;   /* not a rejection: 500, 503 while draining */
}

static enum MHD_Result send_error(server *s, request *r, struct MHD_Connection *c, int status,
                                  const char *code, const char *message, int retry_after, const char *allow,
                                  int close_conn)
{
    metrics_reject_reason why = reject_reason(status, code);
    if (why != METRICS_REJECT_COUNT)
        metrics_reject(why);
    size_t len = 0;
    char *body = response_error(status, code, message, &len);
    return send_body(s, r, c, status, body, len, "application/json", retry_after, allow, close_conn);
}

static int retry_after(server *s)
{
    return batcher_retry_after_s(queue_depth(s->q), infer_images_per_s(s->inf));
}

/* ---- pipeline callbacks (batcher and completion threads) ---------------- */

static void image_reported(request *r)
{
    if (atomic_fetch_sub(&r->pending, 1) == 1)
        MHD_resume_connection(r->conn);
}

static void sink_done(void *req, int image, const float *logits, const pipeline_timing *t)
{
    request *r = req;
    topk_softmax(logits, RESNET18_CLASSES, r->top_k, r->topk + (size_t)image * (size_t)r->top_k);
    metrics_observe_queue((double)t->queue_us / 1e6);
    pthread_mutex_lock(&r->mu);
    if (t->queue_us > r->queue_us)
        r->queue_us = t->queue_us;
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

static enum MHD_Result classify_begin(server *s, request *r, struct MHD_Connection *c)
{
    if (atomic_load(&s->draining))
        return send_error(s, r, c, 503, "shutting_down", "the server is shutting down", 1, NULL, 1);

    const char *k = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "top_k");
    if (k && request_parse_top_k(k, &r->top_k) != 0)
        return send_error(s, r, c, 400, "bad_parameter", "top_k must be a whole number from 1 to 1000",
                          0, NULL, 1);

    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    int rc = request_parse_content_type(ct, &r->body_kind, r->boundary, sizeof r->boundary);
    if (rc == -1) {
        char msg[256];
        snprintf(msg, sizeof msg, "content type '%.100s' is not image/jpeg or multipart/form-data", ct);
        return send_error(s, r, c, 415, "unsupported_media_type", msg, 0, NULL, 1);
    }
    if (rc == -2)
        return send_error(s, r, c, 400, "invalid_multipart", "multipart/form-data without a valid boundary",
                          0, NULL, 1);

    /* Refuse an announced oversize body before reading any of it. */
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        errno = 0;
        char *end;
        unsigned long long n = strtoull(cl, &end, 10);
        if (errno == ERANGE || n > (unsigned long long)s->max_body_bytes) {
            char msg[128];
            snprintf(msg, sizeof msg, "request body of %s bytes is over the limit of %ld", cl, s->max_body_bytes);
            return send_error(s, r, c, 413, "too_large", msg, 0, NULL, 1);
        }
        if (n > 0 && request_reserve(r, (size_t)n) != 0)
            return send_body(s, r, c, 500, NULL, 0, NULL, 0, NULL, 1);
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    r->fd = ci ? ci->connect_fd : -1;
    return MHD_YES;
}

static enum MHD_Result classify_body(server *s, request *r, const char *data, size_t n)
{
    if (r->too_large) {
        /* A chunked body past the limit: drop the rest unread, but only up
         * to another max_body_bytes before giving up on the connection. */
        r->discarded += n;
        return r->discarded > (size_t)s->max_body_bytes * 2 ? MHD_NO : MHD_YES;
    }
    if (r->len + n > (size_t)s->max_body_bytes) {
        r->too_large = 1;
        r->discarded = r->len + n;
        free(r->body);
        r->body = NULL;
        r->len = r->cap = 0;
        return MHD_YES;
    }
    if (request_append(r, (const uint8_t *)data, n) != 0) {
        log_error("out of memory for a request body of %zu bytes", r->len + n);
        return MHD_NO;
    }
    return MHD_YES;
}

/* Hands a complete body to the decode pool: everything that needs no
 * decoding is checked here, the request's slots are reserved (or 503), and
 * the connection is suspended until the pipeline has reported every image
 * (or the decode failed). */
static enum MHD_Result classify_submit(server *s, request *r, struct MHD_Connection *c)
{
    char msg[384], why[256];
    if (r->too_large) {
        snprintf(msg, sizeof msg, "request body is over the limit of %ld bytes", s->max_body_bytes);
        return send_error(s, r, c, 413, "too_large", msg, 0, NULL, 1);
    }
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
    if (n > REQUEST_MAX_IMAGES || n > queue_capacity(s->q)) {
        snprintf(msg, sizeof msg, "%d images in one request; the limit is %d", n,
                 REQUEST_MAX_IMAGES < queue_capacity(s->q) ? REQUEST_MAX_IMAGES : queue_capacity(s->q));
        return send_error(s, r, c, 413, "too_many_images", msg, 0, NULL, 0);
    }
    for (int i = 0; i < n; i++)
        if (r->parts[i].len == 0) {
            if (r->body_kind == REQ_BODY_RAW)
                snprintf(msg, sizeof msg, "the request body is empty; send the JPEG bytes");
            else
                snprintf(msg, sizeof msg, "image %d is empty", i);
            return send_error(s, r, c, 400, "empty_body", msg, 0, NULL, 0);
        }
    r->topk = malloc((size_t)n * (size_t)r->top_k * sizeof *r->topk);
    if (!r->topk)
        return send_body(s, r, c, 500, NULL, 0, NULL, 0, NULL, 0);
    if (queue_reserve(s->q, n, r->slots) != 0)
        return send_error(s, r, c, 503, "queue_full", "the queue is full; retry later", retry_after(s), NULL, 0);

    r->nimages = n;
    r->accepted = 1;
    r->state = REQ_QUEUED;
    r->deadline_us = clock_now_us() + (uint64_t)s->request_timeout_ms * 1000u;
    r->job.owner = r;
    atomic_fetch_add(&s->suspended, 1);
    /* Suspend before a decode thread can see the job, so the resume that
     * answers it always follows this suspend. A refused job (drain timeout)
     * is answered 503 through decode_cancel. */
    MHD_suspend_connection(c);
    (void)decode_pool_submit(s->decoders, &r->job);
    return MHD_YES;
}

/* On a decode thread, with the connection suspended: a failure releases
 * the slots, records the answer and resumes the connection. */
static void decode_failed(server *s, request *r, int status, const char *code, const char *message)
{
    queue_release(s->q, r->slots, r->nimages);
    request_fail(r, status, code, message);
    MHD_resume_connection(r->conn);
}

/* The decode pool's run: decodes every image of r into its slot and pushes
 * them to the batcher's queue, or answers the request. */
static void decode_run(void *cls, decode_job *job, preprocess_ctx *ctx)
{
    server *s = cls;
    request *r = job->owner;
    char msg[384], why[256];
    if (batcher_client_gone(r->fd)) {
        decode_failed(s, r, 499, "client_gone", "the client closed the connection");
        return;
    }
    if (clock_now_us() >= r->deadline_us) {
        decode_failed(s, r, 504, "timeout", "the request waited for a decoder past request_timeout_ms");
        return;
    }
    int n = r->nimages;
    for (int i = 0; i < n; i++) {
        uint64_t t0 = clock_now_us();
        preprocess_status st = preprocess_jpeg(ctx, r->parts[i].data, r->parts[i].len,
                                               queue_slot(s->q, r->slots[i]), why, sizeof why);
        uint64_t dt = clock_now_us() - t0;
        r->decode_us += dt;
        if (st != PREP_OK) {
            if (n > 1)
                snprintf(msg, sizeof msg, "image %d: %s", i, why);
            else
                snprintf(msg, sizeof msg, "%s", why);
            decode_failed(s, r, decode_http_status(st), preprocess_status_code(st), msg);
            return;
        }
        metrics_observe_decode((double)dt / 1e6);
    }
    /* The crops are in the slots: the body is no longer needed. */
    free(r->body);
    r->body = NULL;
    r->len = r->cap = 0;

    queue_item items[REQUEST_MAX_IMAGES];
    uint64_t now = clock_now_us();
    for (int i = 0; i < n; i++)
        items[i] = (queue_item){
            .req = r, .image = i, .slot = r->slots[i], .fd = r->fd,
            .enqueued_us = now, .deadline_us = now + (uint64_t)s->request_timeout_ms * 1000u,
        };
    atomic_store(&r->pending, n);
    queue_push(s->q, items, n);
}

/* A job the pool will not run (drain timeout, or submitted after it). */
static void decode_cancel(void *cls, decode_job *job)
{
    decode_failed(cls, job->owner, 503, "shutting_down", "the server stopped before this request ran");
}

static enum MHD_Result classify_answer(server *s, request *r, struct MHD_Connection *c)
{
    atomic_fetch_sub(&s->suspended, 1);
    if (r->fail_status == 499) {
        /* The client left while queued: nothing to send; close. */
        r->state = REQ_ANSWERED;
        r->status = 499;
        metrics_reject(METRICS_REJECT_CLIENT_GONE);
        return MHD_NO;
    }
    if (r->fail_status) {
        int ra = r->fail_status == 503 ? retry_after(s) : 0;
        return send_error(s, r, c, r->fail_status, r->fail_code, r->fail_msg, ra, NULL, 0);
    }
    size_t len = 0;
    char *body = response_classify(s->svc, r, clock_now_us() - r->start_us, &len);
    return send_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
}

/* ---- GET endpoints ------------------------------------------------------ */

static int is_ready(server *s, const char **why)
{
    if (atomic_load(&s->draining))
        *why = "draining";
    else if (!atomic_load(&s->warm))
        *why = "warming up";
    else if (!infer_healthy(s->inf))
        *why = "the engine failed its last batch";
    else
        return 1;
    return 0;
}

static enum MHD_Result answer_get(server *s, request *r, struct MHD_Connection *c)
{
    size_t len = 0;
    const char *why;
    char *body;
    switch (r->route) {
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
        body = metrics_render(&len);
        return send_body(s, r, c, 200, body, len, "text/plain; version=0.0.4; charset=utf-8", 0, NULL, 0);
    }
    default:
        body = response_model(s->svc, &len);
        return send_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
    }
}

/* ---- libmicrohttpd callbacks -------------------------------------------- */

static enum MHD_Result route(server *s, request *r, struct MHD_Connection *c, const char *url,
                             const char *method)
{
    r->route = -1;
    for (int i = 0; i < NROUTES; i++)
        if (strcmp(url, routes[i].path) == 0)
            r->route = i;
    if (r->route < 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "no such path: %.120s", url);
        return send_error(s, r, c, 404, "not_found", msg, 0, NULL, 0);
    }
    int is_post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    int is_get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    if (r->route == ROUTE_CLASSIFY ? !is_post : !is_get) {
        char msg[160];
        snprintf(msg, sizeof msg, "%.20s is not allowed on %s; use %s", method, routes[r->route].path,
                 routes[r->route].allow);
        return send_error(s, r, c, 405, "method_not_allowed", msg, 0, routes[r->route].allow, is_post);
    }
    /* GETs are answered on the next call, once the request is complete:
     * libmicrohttpd closes any connection answered from this first call. */
    return r->route == ROUTE_CLASSIFY ? classify_begin(s, r, c) : MHD_YES;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload_data, size_t *upload_data_size,
                                 void **con_cls)
{
    (void)version;
    server *s = cls;
    request *r = *con_cls;
    if (!r) {
        r = request_create();
        if (!r)
            return MHD_NO;
        r->conn = c;
        r->start_us = clock_now_us();
        *con_cls = r;
        atomic_fetch_add(&s->active, 1);
        return route(s, r, c, url, method);
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        return r->state == REQ_RECEIVING ? classify_body(s, r, upload_data, n) : MHD_YES;
    }
    if (r->state == REQ_RECEIVING)
        return r->route == ROUTE_CLASSIFY ? classify_submit(s, r, c) : answer_get(s, r, c);
    if (r->state == REQ_QUEUED)
        return classify_answer(s, r, c);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)c;
    server *s = cls;
    request *r = *con_cls;
    if (!r)
        return;
    *con_cls = NULL;
    int code = r->status;
    /* Never answered, or an answer that could not be delivered: the
     * client went away (499 already counted itself). */
    if (code == 0 || (code == 200 && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)) {
        metrics_reject(METRICS_REJECT_CLIENT_GONE);
        code = 499;
    }
    metrics_observe_request(code, (double)(clock_now_us() - r->start_us) / 1e6);
    request_free(r);
    atomic_fetch_sub(&s->active, 1);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    log_warn("libmicrohttpd: %s", msg);
}

/* ---- lifecycle ---------------------------------------------------------- */

server *server_start(const config *cfg, const response_service *svc, queue *q, infer *inf,
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
    s->max_body_bytes = cfg->max_body_bytes;
    s->request_timeout_ms = cfg->request_timeout_ms;
    atomic_init(&s->warm, 0);
    atomic_init(&s->draining, 0);
    atomic_init(&s->active, 0);
    atomic_init(&s->suspended, 0);
    decode_pool_ops ops = { .cls = s, .run = decode_run, .cancel = decode_cancel };
    s->decoders = decode_pool_start((int)cfg->decode_threads, (uint64_t)cfg->max_pixels, &ops, err, errlen);
    if (!s->decoders) {
        free(s);
        return NULL;
    }

    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG | (family == AF_INET6 ? MHD_USE_IPv6 : 0);
    s->d = MHD_start_daemon(flags, 0, NULL, NULL, on_access, s,
                            MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                            /* 0: one thread, no pool (MHD warns about a pool of 1) */
                            MHD_OPTION_THREAD_POOL_SIZE, cfg->threads > 1 ? (unsigned)cfg->threads : 0u,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->connection_limit,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->connection_timeout_s,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)cfg->connection_memory_bytes,
                            MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)cfg->listen_backlog,
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_END);
    if (!s->d) {
        snprintf(err, errlen, "cannot listen on %s (in use, or not a local address?)", cfg->listen);
        decode_pool_stop(s->decoders);
        free(s);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : port;
    return s;
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
    MHD_socket fd = MHD_quiesce_daemon(s->d);
    if (fd != MHD_INVALID_SOCKET && close(fd) != 0)
        log_warn("closing the listening socket: %s", strerror(errno));
}

long server_active(server *s)
{
    return atomic_load(&s->active);
}

long server_suspended(server *s)
{
    return atomic_load(&s->suspended);
}

int server_cancel_decodes(server *s)
{
    return decode_pool_abort(s->decoders);
}

void server_stop(server *s)
{
    if (!s)
        return;
    /* Refuse decode jobs first (a late one is answered 503), so none can
     * be submitted to a pool that is gone; none is running: nothing is
     * suspended. */
    decode_pool_abort(s->decoders);
    MHD_stop_daemon(s->d);
    decode_pool_stop(s->decoders);
    free(s);
}
