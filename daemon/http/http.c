/* The HTTP layer (http.h) on libmicrohttpd: its epoll thread pool reads,
 * parses and frames; this file turns its access-handler calls into the
 * handler's request / body / body_end / wake / done, suspends a request
 * that waits for its answer, and closes slow clients.
 *
 * A request's calls, all on its connection's thread:
 *   first call (the head)      -> handler->request
 *   calls with body bytes      -> handler->body
 *   the first call without     -> handler->body_end
 *   the next call              -> unanswered, the connection is suspended
 *   a call after http_wake     -> handler->wake (suspended again if it did
 *                                 not answer)
 *   the request's completion   -> handler->done
 * http_wake may run before the suspension (a decode thread faster than
 * the return from body_end): the connection's mutex orders the two, and a
 * wake that comes first is taken at once instead of suspending, since
 * resuming a connection that is not suspended is undefined.
 *
 * Slow clients: libmicrohttpd has only an inactivity timeout, which a
 * byte every few seconds resets. A reaper thread judges every connection
 * a few times a second (conn.h) and shuts a slow one's socket down, which
 * libmicrohttpd sees as the client gone: the request ends undelivered.
 * It also answers and closes uploads whose client has ended its side (see
 * client_left).
 *
 * Connections come from admission (daemon/http/admit.h), which accepts on the
 * listening socket and hands them over with MHD_add_connection; this file
 * tells it how many are open and closes the ones it asks to evict.
 *
 * Answers libmicrohttpd cannot queue (it takes one only once the body has
 * ended) are written on the socket directly, plain HTTP only: an answer
 * given mid-body, and the 400 for a client that ended its side
 * mid-request. libmicrohttpd is then not writing on that connection (it
 * is reading a head or a body). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include "daemon/http/admit.h"
#include "daemon/http/conn.h"
#include "daemon/http/http.h"
#include "daemon/log.h"
#include "util/clock.h"

#define SCAN_INTERVAL_US 200000 /* slow clients outlive their bound by at most this */
#define EOF_SCANS 3 /* an abandoned upload is closed after 0.4-0.6 s */
#define PRESSURE_HEAD_US 1000000 /* under pressure a head is due within this */
#define EVICT_MIN_US 250000 /* see evictable */
#define EVICT_BATCH 32 /* evictions per call */
#define DISCARD_MAX (64u << 20) /* body bytes dropped after an answer, over HTTPS */

struct http_conn {
    http_server *s;
    struct MHD_Connection *mc;
    int fd;
    http_conn *prev, *next; /* the server's connections (under its mutex) */

    /* The request, on the connection's thread only. */
    void *req; /* the handler's, from request() to done() */
    int in_request;
    int answered, drop, body_ended, defer;
    int in_head, head_body; /* in request(); the request announced a body */
    struct MHD_Response *pending; /* answered in request() without a body: queued on the next call */
    unsigned pending_status;
    int pending_at_end; /* pending was answered mid-body (HTTPS): queued when the body ends */
    uint64_t discarded;
    int raw_sent; /* answered on the socket directly: delivered */
    int v2; /* an Open Inference Protocol path: its error form */
    uint64_t rx_base, tx_base; /* tcp_counts when the connection last waited for a head */
    admit_client *cl; /* its address's count */

    pthread_mutex_t mu; /* guards the rest: shared with http_wake and the reaper */
    int suspended, woken;
    conn_phase phase;
    uint64_t since_us, body_bytes;
    uint64_t body_len; /* the announced Content-Length; 0: none or chunked */
    int eof_scans; /* scans that saw the client's end of file, body_bytes unchanged */
    uint64_t eof_bytes;
    int slow; /* shut down by the reaper */
    int evicted; /* shut down for admission */
    int incomplete; /* the client ended its side mid-request: answered 400 */
};

struct http_server {
    http_limits l;
    http_handler h;
    struct MHD_Daemon *d;
    int lfd, port;
    admit *adm;
    atomic_long handover; /* given to libmicrohttpd, not yet started */
    atomic_ullong incomplete_head;
    atomic_int quiesced;
    atomic_int next_worker;
    pthread_mutex_t mu; /* guards conns and stop */
    pthread_cond_t cv;
    http_conn *conns;
    int stop;
    pthread_t reaper;
    int reaping;
    atomic_long nconns;
    atomic_ullong dropped_slow;
};

/* Each pool thread's index, 0 to threads - 1, given on its first call. */
static _Thread_local int worker_index = -1;

/* enter_phase with c->mu held; set_phase takes it. */
static void enter_phase(http_conn *c, conn_phase p)
{
    c->phase = p;
    c->since_us = clock_now_us();
    c->body_bytes = 0;
    c->eof_scans = 0;
}

static void set_phase(http_conn *c, conn_phase p)
{
    pthread_mutex_lock(&c->mu);
    enter_phase(c, p);
    pthread_mutex_unlock(&c->mu);
}

/* ---- answers on the socket --------------------------------------------------- */

/* Bytes the kernel has received on fd (the client's FIN counts one) and
 * bytes written to it (acknowledged or queued); -1 where it does not say. */
static int tcp_counts(int fd, uint64_t *rx, uint64_t *tx)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    int queued = 0;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received ||
        ioctl(fd, SIOCOUTQ, &queued) != 0)
        return -1;
    *rx = ti.tcpi_bytes_received;
    *tx = ti.tcpi_bytes_acked + (uint64_t)queued;
    return 0;
}

/* The client closed its side. libmicrohttpd 0.9.75 reads that end of
 * file in the middle of a body without closing the connection, which then
 * waits for the rest until the idle timeout, holding its slot. */
static int client_left(int fd)
{
    char b;
    return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* A 400 for a client that ended its side mid-request; plain HTTP only.
 * Returns 0 when written. */
static int answer_incomplete(http_conn *c, const char *message)
{
    char buf[1024];
    if (c->s->l.tls)
        return -1;
    size_t n = admit_error_answer(buf, sizeof buf, 400, "incomplete_request", message, c->v2, 0);
    return n > 0 ? admit_send(c->fd, buf, n) : -1;
}

/* r written on the socket, then our side closed: libmicrohttpd cannot
 * queue an answer while a body arrives. The body is the layer's. */
static int respond_raw(http_conn *c, const http_response *r)
{
    char head[1024], retry[40] = "", allow[160] = "", extra[320] = "";
    const char *reason = MHD_get_reason_phrase_for((unsigned)r->status);
    if (r->retry_after > 0)
        snprintf(retry, sizeof retry, "Retry-After: %d\r\n", r->retry_after);
    if (r->allow)
        snprintf(allow, sizeof allow, "Allow: %s\r\n", r->allow);
    if (r->extra_name && r->extra_value)
        snprintf(extra, sizeof extra, "%s: %s\r\n", r->extra_name, r->extra_value);
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s%s%s"
                     "Connection: close\r\n\r\n",
                     r->status, reason && *reason ? reason : "Error",
                     r->content_type ? r->content_type : "application/octet-stream", r->body ? r->len : 0, retry, allow,
                     extra);
    int rc = n > 0 && (size_t)n < sizeof head && admit_send(c->fd, head, (size_t)n) == 0 &&
                     (!r->body || admit_send(c->fd, r->body, r->len) == 0)
                 ? 0
                 : -1;
    free(r->body);
    shutdown(c->fd, SHUT_WR);
    c->answered = 1;
    c->drop = rc != 0;
    pthread_mutex_lock(&c->mu);
    c->raw_sent = rc == 0; /* the body is still read (and dropped), then the connection closes */
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- the head ----------------------------------------------------------- */

const char *http_header(const http_head *h, const char *name)
{
    for (int i = 0; i < h->nheaders; i++)
        if (strcasecmp(h->headers[i].name, name) == 0)
            return h->headers[i].value;
    return NULL;
}

const char *http_arg(const http_head *h, const char *key)
{
    for (int i = 0; i < h->nargs; i++)
        if (strcmp(h->args[i].name, key) == 0)
            return h->args[i].value;
    return NULL;
}

/* libmicrohttpd keeps a value's trailing whitespace, which HTTP says is
 * not part of it: such a value is copied, trimmed, into the head. */
static enum MHD_Result add_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    http_head *h = cls;
    if (h->nheaders == HTTP_MAX_HEADERS)
        return MHD_YES;
    if (!value)
        value = "";
    size_t n = strlen(value);
    if (n > 0 && (value[n - 1] == ' ' || value[n - 1] == '\t')) {
        while (n > 0 && (value[n - 1] == ' ' || value[n - 1] == '\t'))
            n--;
        if (h->trimmed_len + n + 1 > sizeof h->trimmed)
            return MHD_YES; /* past what a head can hold: left out */
        char *t = h->trimmed + h->trimmed_len;
        memcpy(t, value, n);
        t[n] = '\0';
        h->trimmed_len += n + 1;
        value = t;
    }
    h->headers[h->nheaders++] = (http_field){ key, value };
    return MHD_YES;
}

static enum MHD_Result add_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    http_head *h = cls;
    if (h->nargs < HTTP_MAX_ARGS)
        h->args[h->nargs++] = (http_field){ key, value ? value : "" };
    return MHD_YES;
}

static int all_digits(const char *v)
{
    if (!*v)
        return 0;
    for (; *v; v++)
        if (*v < '0' || *v > '9')
            return 0;
    return 1;
}

/* The body's framing from the headers, refusing what libmicrohttpd lets
 * through but two parsers could read differently (RFC 9112 6.3, 11.2), or
 * that it would read to the connection's end. */
static void read_framing(http_head *h)
{
    int ncl = 0, nte = 0;
    const char *te = NULL, *cl = NULL, *expect = NULL;
    for (int i = 0; i < h->nheaders; i++) {
        if (strcasecmp(h->headers[i].name, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
            ncl++;
            cl = h->headers[i].value;
        } else if (strcasecmp(h->headers[i].name, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
            nte++;
            te = h->headers[i].value;
        } else if (strcasecmp(h->headers[i].name, MHD_HTTP_HEADER_EXPECT) == 0) {
            expect = h->headers[i].value;
        }
    }
    h->chunked = te && strcasestr(te, "chunked") != NULL;
    if (cl && !h->chunked)
        h->content_length = strtoull(cl, NULL, 10);
    h->status = 400;
    h->code = "bad_request";
    if (ncl > 1)
        h->message = "more than one Content-Length";
    else if (nte > 1)
        h->message = "more than one Transfer-Encoding";
    else if (cl && te)
        h->message = "Content-Length beside Transfer-Encoding";
    else if (cl && !all_digits(cl))
        h->message = "Content-Length is not a number";
    else if (te && strcasecmp(te, "chunked") != 0) {
        h->status = 501;
        h->code = "not_implemented";
        h->message = "transfer codings other than chunked are not implemented";
    } else if (expect && strcasecmp(expect, "100-continue") != 0) {
        h->status = 417;
        h->code = "expectation_failed";
        h->message = "the only expectation supported is 100-continue";
    } else {
        h->status = 0;
        h->code = NULL;
    }
}

static void read_head(struct MHD_Connection *mc, const char *url, const char *method, const char *version, http_head *h)
{
    memset(h, 0, sizeof *h);
    h->method = method;
    h->path = url;
    h->minor = strcmp(version, MHD_HTTP_VERSION_1_0) == 0 ? 0 : 1;
    MHD_get_connection_values(mc, MHD_HEADER_KIND, add_header, h);
    MHD_get_connection_values(mc, MHD_GET_ARGUMENT_KIND, add_arg, h);
    read_framing(h);
}

/* ---- the request's calls -------------------------------------------------- */

/* After the handler's wake: its answer, or another wait. */
static enum MHD_Result after_wait(http_conn *c)
{
    if (c->drop)
        return MHD_NO;
    if (c->answered)
        return MHD_YES;
    pthread_mutex_lock(&c->mu);
    int woken = c->woken;
    c->woken = 0;
    if (!woken) {
        c->suspended = 1;
        c->phase = CONN_SERVER;
        MHD_suspend_connection(c->mc);
    }
    pthread_mutex_unlock(&c->mu);
    if (woken) {
        c->s->h.wake(c->s->h.cls, c, c->req);
        return after_wait(c);
    }
    return MHD_YES;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                 const char *version, const char *upload_data, size_t *upload_size, void **ctx)
{
    http_server *s = cls;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    http_conn *c = ci ? ci->socket_context : NULL;
    if (!c)
        return MHD_NO;
    if (worker_index < 0)
        worker_index = atomic_fetch_add(&s->next_worker, 1) % s->l.threads;
    if (!*ctx) {
        *ctx = c;
        c->answered = c->drop = c->body_ended = 0;
        c->pending_at_end = 0;
        c->discarded = 0;
        c->v2 = strncmp(url, "/v2", 3) == 0;
        http_head h;
        read_head(mc, url, method, version, &h);
        pthread_mutex_lock(&c->mu);
        c->woken = 0;
        c->raw_sent = 0;
        enter_phase(c, CONN_BODY);
        c->body_len = h.content_length;
        pthread_mutex_unlock(&c->mu);
        c->in_head = 1;
        /* A refused head's answer goes at once: its body is not read. */
        c->head_body = h.chunked || h.content_length > 0 || h.status != 0;
        c->req = s->h.request(s->h.cls, c, &h);
        c->in_head = 0;
        if (!c->req)
            return MHD_NO;
        c->in_request = 1;
        return c->drop ? MHD_NO : MHD_YES;
    }
    if (*upload_size > 0 && (c->raw_sent || (c->pending && c->pending_at_end))) {
        /* Answered mid-body: the rest is read and dropped, DISCARD_MAX at
         * most; closing at once would reset the connection under the
         * client's upload, which can lose the answer at its end. */
        size_t n = *upload_size;
        *upload_size = 0;
        pthread_mutex_lock(&c->mu);
        c->body_bytes += n;
        pthread_mutex_unlock(&c->mu);
        c->discarded += n;
        return c->discarded > DISCARD_MAX ? MHD_NO : MHD_YES;
    }
    if (c->raw_sent) /* its body has ended: the answer went, the connection closes */
        return MHD_NO;
    if (c->pending) {
        struct MHD_Response *resp = c->pending;
        c->pending = NULL;
        c->body_ended = 1;
        enum MHD_Result ok = MHD_queue_response(mc, c->pending_status, resp);
        MHD_destroy_response(resp);
        return ok;
    }
    if (*upload_size > 0) {
        size_t n = *upload_size;
        *upload_size = 0;
        pthread_mutex_lock(&c->mu);
        c->body_bytes += n;
        pthread_mutex_unlock(&c->mu);
        if (!c->answered)
            s->h.body(s->h.cls, c, c->req, upload_data, n);
        return c->drop ? MHD_NO : MHD_YES;
    }
    if (!c->body_ended) {
        c->body_ended = 1;
        if (!c->answered)
            s->h.body_end(s->h.cls, c, c->req);
        if (c->drop || c->answered)
            return after_wait(c);
        /* Suspended in this call, the request would still be in a state
         * where libmicrohttpd reads on resuming: a client that half-closed
         * after its request (shutdown(SHUT_WR)) was then closed unanswered.
         * The call after this one comes with the request complete. */
        c->defer = 1;
        return MHD_YES;
    }
    if (c->defer) {
        c->defer = 0;
        return after_wait(c);
    }
    /* Resumed by http_wake. */
    pthread_mutex_lock(&c->mu);
    int woken = c->woken;
    c->woken = 0;
    pthread_mutex_unlock(&c->mu);
    if (woken && !c->answered)
        s->h.wake(s->h.cls, c, c->req);
    return after_wait(c);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **ctx, enum MHD_RequestTerminationCode toe)
{
    (void)mc;
    http_server *s = cls;
    http_conn *c = *ctx;
    *ctx = NULL;
    if (!c)
        return;
    if (c->pending) { /* the connection closed before the next call */
        MHD_destroy_response(c->pending);
        c->pending = NULL;
    }
    if (!c->in_request)
        return;
    c->in_request = 0;
    void *req = c->req;
    c->req = NULL;
    pthread_mutex_lock(&c->mu);
    int slow = c->slow;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !slow && !c->incomplete && !c->answered &&
        c->phase == CONN_BODY && client_left(c->fd) &&
        answer_incomplete(c, "the client ended its side before the request body was complete") == 0)
        c->incomplete = 1;
    int incomplete = c->incomplete;
    c->incomplete = 0;
    pthread_mutex_unlock(&c->mu);
    set_phase(c, CONN_HEADERS);
    if (tcp_counts(c->fd, &c->rx_base, &c->tx_base) != 0)
        c->rx_base = UINT64_MAX;
    s->h.done(s->h.cls, req,
              toe == MHD_REQUEST_TERMINATED_COMPLETED_OK || c->raw_sent ? HTTP_END_DELIVERED
              : incomplete                                              ? HTTP_END_INCOMPLETE
              : slow                                                    ? HTTP_END_SLOW
                                                                        : HTTP_END_GONE);
}

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode toe)
{
    http_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        http_conn *c = calloc(1, sizeof *c);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!c || !ci || pthread_mutex_init(&c->mu, NULL) != 0) {
            atomic_fetch_sub(&s->handover, 1);
            free(c);
            *socket_ctx = NULL; /* its requests are refused: on_access closes it */
            const union MHD_ConnectionInfo *ai = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
            if (ai && ai->client_addr)
                admit_closed(s->adm, admit_client_of(s->adm, ai->client_addr), 0);
            return;
        }
        c->s = s;
        c->mc = mc;
        c->fd = ci->connect_fd;
        c->phase = CONN_HEADERS;
        c->since_us = clock_now_us();
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        c->cl = ai && ai->client_addr ? admit_client_of(s->adm, ai->client_addr) : NULL;
        pthread_mutex_lock(&s->mu);
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        pthread_mutex_unlock(&s->mu);
        atomic_fetch_add(&s->nconns, 1);
        atomic_fetch_sub(&s->handover, 1); /* after: open_conns never reads one too few */
        *socket_ctx = c;
        return;
    }
    http_conn *c = *socket_ctx;
    if (!c)
        return;
    /* A client that ended its side in the middle of a head: a 400 unless
     * something was written since (libmicrohttpd's own refusals). */
    pthread_mutex_lock(&c->mu);
    int unanswered = c->phase == CONN_HEADERS && !c->slow && !c->evicted && !c->in_request;
    int evicted = c->evicted;
    pthread_mutex_unlock(&c->mu);
    uint64_t rx, tx;
    if (unanswered && !s->l.tls && c->rx_base != UINT64_MAX && tcp_counts(c->fd, &rx, &tx) == 0 &&
        rx >= c->rx_base + 2 && tx == c->tx_base && client_left(c->fd)) {
        c->v2 = 0;
        atomic_fetch_add(&s->incomplete_head, 1); /* before the client can read the answer */
        (void)answer_incomplete(c, "the client ended its side before the request head was complete");
    }
    /* Still open here (libmicrohttpd closes the socket later), so the
     * reaper, under the same mutex, never shuts down a reused fd. */
    pthread_mutex_lock(&s->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_sub(&s->nconns, 1);
    admit_closed(s->adm, c->cl, evicted);
    if (c->pending)
        MHD_destroy_response(c->pending);
    pthread_mutex_destroy(&c->mu);
    free(c);
    *socket_ctx = NULL;
}

static size_t on_unescape(void *cls, struct MHD_Connection *mc, char *str)
{
    (void)mc;
    http_server *s = cls;
    return s->h.unescape(str);
}

/* ---- slow clients ---------------------------------------------------------- */

static void *reaper_main(void *arg)
{
    http_server *s = arg;
    conn_limits lim = { .header_timeout_us = s->l.header_timeout_us, .min_rate = s->l.min_rate };
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        uint64_t now = clock_now_us();
        lim.header_timeout_us = s->l.header_timeout_us;
        if (admit_pressure(s->adm) && lim.header_timeout_us > PRESSURE_HEAD_US)
            lim.header_timeout_us = PRESSURE_HEAD_US;
        for (http_conn *c = s->conns; c; c = c->next) {
            pthread_mutex_lock(&c->mu);
            if (!c->slow && !c->evicted && !c->suspended &&
                conn_judge(&lim, c->phase, c->since_us, c->body_bytes, now) != CONN_OK) {
                c->slow = 1;
                atomic_fetch_add(&s->dropped_slow, 1); /* before the client can see the close */
                shutdown(c->fd, SHUT_RDWR);
            } else if (!c->slow && !c->evicted && !c->suspended && c->phase == CONN_BODY &&
                       (c->body_bytes < c->body_len || c->raw_sent) && client_left(c->fd)) {
                /* The client may have sent it all and half-closed, and
                 * libmicrohttpd not yet handed over what it read: only a
                 * body that stopped growing for EOF_SCANS scans is cut.
                 * Shut down both ways, the socket hangs up, which
                 * libmicrohttpd does act on. */
                if (c->eof_scans == 0 || c->eof_bytes != c->body_bytes) {
                    c->eof_scans = 0;
                    c->eof_bytes = c->body_bytes;
                }
                if (++c->eof_scans >= EOF_SCANS) {
                    if (!c->raw_sent &&
                        answer_incomplete(c, "the client ended its side before the request body was complete") == 0)
                        c->incomplete = 1;
                    shutdown(c->fd, SHUT_RDWR);
                }
            }
            pthread_mutex_unlock(&c->mu);
        }
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += SCAN_INTERVAL_US * 1000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->cv, &s->mu, &until);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- admission's callbacks ------------------------------------------------------ */

static long open_conns(void *cls)
{
    http_server *s = cls;
    return atomic_load(&s->nconns) + atomic_load(&s->handover);
}

static int hand_over(void *cls, int fd, const struct sockaddr *addr, socklen_t alen)
{
    http_server *s = cls;
    atomic_fetch_add(&s->handover, 1);
    if (MHD_add_connection(s->d, fd, addr, alen) != MHD_YES) { /* it closed fd */
        atomic_fetch_sub(&s->handover, 1);
        return -1;
    }
    return 0;
}

/* Waiting for a head for EVICT_MIN_US: a connection handed over just now
 * has its request in flight (in libmicrohttpd's buffer, or one round trip
 * away), and closing it would cost a client its answer. */
static int evictable(const http_conn *c, uint64_t now)
{
    return c->phase == CONN_HEADERS && !c->slow && !c->evicted && !c->suspended && now - c->since_us >= EVICT_MIN_US;
}

static long evict(void *cls, long n)
{
    http_server *s = cls;
    http_conn *pick[EVICT_BATCH];
    uint64_t picked_since[EVICT_BATCH];
    long k = 0, done = 0;
    if (n > EVICT_BATCH)
        n = EVICT_BATCH; /* the rest on the acceptor's next turn */
    uint64_t now = clock_now_us();
    pthread_mutex_lock(&s->mu);
    /* One pass keeps the n oldest, sorted by insertion. */
    for (http_conn *c = s->conns; c; c = c->next) {
        pthread_mutex_lock(&c->mu);
        int ok = evictable(c, now);
        uint64_t since = c->since_us;
        pthread_mutex_unlock(&c->mu);
        if (!ok || (k == n && since >= picked_since[k - 1]))
            continue;
        long i = k < n ? k++ : k - 1;
        for (; i > 0 && picked_since[i - 1] > since; i--) {
            pick[i] = pick[i - 1];
            picked_since[i] = picked_since[i - 1];
        }
        pick[i] = c;
        picked_since[i] = since;
    }
    for (long i = 0; i < k; i++) {
        http_conn *c = pick[i];
        pthread_mutex_lock(&c->mu);
        if (evictable(c, now)) { /* its head may have come meanwhile */
            c->evicted = 1;
            admit_evicting(s->adm); /* before its close can report */
            shutdown(c->fd, SHUT_RDWR);
            done++;
        }
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return done;
}

/* ---- the API --------------------------------------------------------------- */

static int listen_on(const struct sockaddr *addr, socklen_t addrlen, int backlog, char *err, size_t errlen)
{
    int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), one = 1;
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 || bind(fd, addr, addrlen) != 0 ||
        listen(fd, backlog) != 0) {
        snprintf(err, errlen, "%s", strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static int bound_port(int fd)
{
    struct sockaddr_storage a;
    socklen_t alen = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &alen) != 0)
        return -1;
    if (a.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&a)->sin_port);
    if (a.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
    return -1;
}

http_server *http_start(const struct sockaddr *addr, socklen_t addrlen, const http_limits *l, const http_handler *h,
                        char *err, size_t errlen)
{
    http_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->l = *l;
    if (s->l.threads < 1)
        s->l.threads = 1;
    s->h = *h;
    s->lfd = -1;
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        snprintf(err, errlen, "cannot create a mutex");
        free(s);
        return NULL;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    s->lfd = listen_on(addr, addrlen, l->backlog, err, errlen);
    if (s->lfd < 0)
        goto fail;
    s->port = bound_port(s->lfd);
    unsigned idle_s = (unsigned)((l->idle_timeout_us + 999999) / 1000000);
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC | MHD_USE_TURBO |
                     MHD_USE_NO_LISTEN_SOCKET | (l->tls ? MHD_USE_TLS : 0);
    /* Admission keeps to connection_limit. libmicrohttpd's own limit is
     * split between its threads, each of which must be able to hold them
     * all: past it a connection handed over would be closed unanswered,
     * its counts never released. */
    unsigned mhd_limit = (unsigned)((l->connection_limit + 64) * s->l.threads);
    if (l->tls && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
        snprintf(err, errlen, "HTTPS: this libmicrohttpd was built without TLS");
        goto fail;
    }
    /* Without TLS the option list ends where the certificate's begin. */
    const char *cert = l->tls ? l->tls->cert_pem : "", *key = l->tls ? l->tls->key_pem : "";
    s->d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_access, s, MHD_OPTION_STRICT_FOR_CLIENT, 1, MHD_OPTION_THREAD_POOL_SIZE,
        (unsigned)(s->l.threads > 1 ? s->l.threads : 0), MHD_OPTION_CONNECTION_LIMIT, mhd_limit,
        MHD_OPTION_CONNECTION_TIMEOUT, idle_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, l->conn_memory,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_UNESCAPE_CALLBACK, on_unescape, s, l->tls ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, cert,
        MHD_OPTION_HTTPS_MEM_KEY, key, MHD_OPTION_END);
    if (!s->d) {
        snprintf(err, errlen, "libmicrohttpd could not start on the socket%s",
                 l->tls ? " (is the key the certificate's, both PEM, the key unencrypted?)" : "");
        goto fail;
    }
    admit_limits al = { .connection_limit = l->connection_limit,
                        .client_limit = l->client_limit,
                        .pending_limit = l->pending_limit > 0 ? l->pending_limit : l->connection_limit,
                        .header_timeout_us = l->header_timeout_us,
                        .tls = l->tls != NULL };
    admit_ops ops = { .cls = s, .open = open_conns, .hand_over = hand_over, .evict = evict };
    if (admit_start(&s->adm, s->lfd, &al, &ops, err, errlen) != 0)
        goto fail;
    s->lfd = -1; /* admission's */
    if (pthread_create(&s->reaper, NULL, reaper_main, s) != 0) {
        snprintf(err, errlen, "cannot start the slow-client thread");
        goto fail;
    }
    s->reaping = 1;
    return s;
fail:
    http_stop(s);
    return NULL;
}

int http_port(const http_server *s)
{
    return s->port;
}

int http_respond(http_conn *c, const http_response *r)
{
    int mid_body = !c->in_head && !c->body_ended;
    if (mid_body && !c->s->l.tls)
        return respond_raw(c, r);
    struct MHD_Response *resp = r->body ? MHD_create_response_from_buffer_with_free_callback(r->len, r->body, free)
                                        : MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    c->answered = 1;
    if (!resp) {
        free(r->body);
        c->drop = 1;
        return -1;
    }
    char num[24];
    int ok = 1;
    if (r->content_type)
        ok &= MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->content_type) == MHD_YES;
    if (r->retry_after > 0) {
        snprintf(num, sizeof num, "%d", r->retry_after);
        ok &= MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, num) == MHD_YES;
    }
    if (r->allow)
        ok &= MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->allow) == MHD_YES;
    if (r->extra_name && r->extra_value)
        ok &= MHD_add_response_header(resp, r->extra_name, r->extra_value) == MHD_YES;
    if (r->close || atomic_load(&c->s->quiesced))
        ok &= MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close") == MHD_YES;
    if (ok && c->in_head && !c->head_body) {
        /* Queued in the head's call, libmicrohttpd would take the answer
         * for one given before the body and close the connection. */
        c->pending = resp;
        c->pending_status = (unsigned)r->status;
        set_phase(c, CONN_SERVER);
        return 0;
    }
    if (ok && mid_body) { /* HTTPS: libmicrohttpd queues it once the body has ended */
        c->pending = resp;
        c->pending_status = (unsigned)r->status;
        c->pending_at_end = 1;
        return 0;
    }
    if (!ok || MHD_queue_response(c->mc, (unsigned)r->status, resp) != MHD_YES) {
        MHD_destroy_response(resp);
        c->drop = 1;
        return -1;
    }
    MHD_destroy_response(resp);
    set_phase(c, CONN_SERVER);
    return 0;
}

void http_drop(http_conn *c)
{
    c->drop = 1;
}

void http_wake(http_conn *c)
{
    pthread_mutex_lock(&c->mu);
    c->woken = 1;
    if (c->suspended) {
        c->suspended = 0;
        MHD_resume_connection(c->mc);
    }
    pthread_mutex_unlock(&c->mu);
}

int http_fd(const http_conn *c)
{
    return c->fd;
}

http_server *http_server_of(const http_conn *c)
{
    return c->s;
}

int http_worker(const http_conn *c)
{
    (void)c;
    return worker_index < 0 ? 0 : worker_index;
}

long http_connections(http_server *s)
{
    return atomic_load(&s->nconns);
}

unsigned long long http_dropped_slow(http_server *s)
{
    admit_counters a = { 0 };
    if (s->adm)
        admit_counters_get(s->adm, &a);
    return atomic_load(&s->dropped_slow) + a.first_byte_timeout;
}

void http_counters_get(http_server *s, http_counters *out)
{
    admit_counters a = { 0 };
    if (s->adm)
        admit_counters_get(s->adm, &a);
    *out = (http_counters){ .refused_limit = a.refused_limit,
                            .refused_client = a.refused_client,
                            .refused_fds = a.refused_fds,
                            .evicted = a.evicted,
                            .first_byte_timeout = a.first_byte_timeout,
                            .not_http = a.not_http,
                            .incomplete_head = atomic_load(&s->incomplete_head),
                            .pending = a.pending };
}

void http_quiesce(http_server *s)
{
    if (atomic_exchange(&s->quiesced, 1))
        return;
    admit_quiesce(s->adm);
}

void http_stop(http_server *s)
{
    if (!s)
        return;
    if (s->reaping) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->reaper, NULL);
    }
    if (s->adm)
        admit_stop(s->adm); /* before libmicrohttpd: nothing is handed over after */
    if (s->d)
        MHD_stop_daemon(s->d); /* its connections' closes still reach admission */
    admit_free(s->adm);
    if (s->lfd >= 0)
        close(s->lfd);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
