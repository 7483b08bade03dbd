/* The HTTP/1.1 connection layer: an acceptor thread, worker threads on
 * level-triggered epoll, and each connection's state machine:
 *
 *   HEAD -> (BODY) -> WAIT -> WRITE -> HEAD (kept alive) or LINGER -> closed
 *
 * HEAD reads until a complete head (httpparse.h), BODY feeds the body to
 * the handler as it arrives (Content-Length or chunked; nothing buffered
 * here past the read buffer), WAIT is the handler's turn (out of epoll,
 * until http_respond from a wake), WRITE sends the answer, LINGER half-
 * closes and drains what the client still sends, so a client whose body
 * was refused unread gets the answer instead of a reset.
 *
 * Handler callbacks only mark what to do (answer, drop); drive() does it
 * once the callback has returned, so callbacks never nest. */
#define _GNU_SOURCE   /* accept4 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include "daemon/conn.h"
#include "daemon/http.h"
#include "daemon/log.h"
#include "model/clock.h"

#define READ_BUFFER_START 16384     /* grown up to conn_memory for a large head */
#define SCAN_INTERVAL_US 200000     /* slow clients outlive their bound by at most this */
#define LINGER_US 2000000           /* draining a refused body before closing */
#define HEADER_MAX 768              /* our answer's header block */

typedef enum { ST_HEAD, ST_BODY, ST_WAIT, ST_WRITE, ST_LINGER } conn_state;

typedef struct worker worker;

struct http_conn {
    http_conn *prev, *next;     /* the worker's connections */
    http_conn *wake_next;       /* the worker's wake list (under its mutex) */
    int woken;                  /* on the wake list (under its mutex) */
    worker *w;
    int fd;
    conn_state state;
    uint32_t events;            /* epoll interest; 0: not in epoll */
    int drop;                   /* close after the current step */
    int eof;                    /* the client's sending side ended */

    char *buf;                  /* read buffer: [off, len) unconsumed */
    size_t off, len, cap;
    http_scan scan;             /* the head being read, relative to off */

    void *req;                  /* the handler's, from request() to done() */
    int in_request;             /* between request() and done(): answerable */
    int head_only;              /* HEAD: the answer has no body */
    int keep_alive;
    int chunked;
    uint64_t body_left;         /* Content-Length bytes still to read */
    http_chunked ch;

    conn_phase phase;           /* for conn_judge */
    uint64_t since_us;          /* the phase's start */
    uint64_t body_bytes;
    uint64_t last_io_us;

    char hdr[HEADER_MAX];       /* the answer being written */
    size_t hdr_len, hdr_off;
    char *body;
    size_t body_len, body_off;
    int close_after;
};

struct worker {
    http_server *s;
    pthread_t thread;
    int ep, wakefd;
    pthread_mutex_t mu;         /* guards inbox, wake list, stop */
    int *inbox;                 /* accepted sockets not yet taken */
    int ninbox, capinbox;
    http_conn *wake_head;
    int stop;
    http_conn *conns;           /* the worker's own: no lock */
    atomic_long nconns;
    char date[40];              /* the Date header's value, for date_at */
    time_t date_at;
};

struct http_server {
    http_limits l;
    http_handler h;
    int lfd, port;
    int stopfd;                 /* wakes the acceptor to stop */
    pthread_t acceptor;
    int accepting;              /* the acceptor runs (main thread only) */
    atomic_int quiesced;
    int nworkers;
    worker *w;
    atomic_long conns;
    atomic_ullong dropped_slow;
};

/* ---- small helpers ---------------------------------------------------- */

static void wake_fd(int fd)
{
    uint64_t one = 1;
    while (write(fd, &one, sizeof one) < 0 && errno == EINTR)
        ;   /* EAGAIN: the counter is already non-zero, the reader wakes */
}

static void set_events(http_conn *c, uint32_t ev)
{
    if (c->events == ev)
        return;
    struct epoll_event e = { .events = ev, .data.ptr = c };
    int op = ev == 0 ? EPOLL_CTL_DEL : c->events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD;
    if (epoll_ctl(c->w->ep, op, c->fd, &e) != 0) {
        log_warn("epoll_ctl on a client connection: %s", strerror(errno));
        c->drop = 1;
        return;
    }
    c->events = ev;
}

static void set_phase(http_conn *c, conn_phase p)
{
    c->phase = p;
    c->since_us = clock_now_us();
    c->body_bytes = 0;
}

static const char *reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return status < 500 ? "Client Error" : "Server Error";
    }
}

static const char *date_now(worker *w)
{
    time_t t = time(NULL);
    if (t != w->date_at) {
        struct tm tm;
        if (gmtime_r(&t, &tm) && strftime(w->date, sizeof w->date, "%a, %d %b %Y %H:%M:%S GMT", &tm) > 0)
            w->date_at = t;
    }
    return w->date;
}

/* ---- connections ------------------------------------------------------ */

static void end_request(http_conn *c, int delivered)
{
    void *req = c->req;
    c->in_request = 0;
    c->req = NULL;
    if (req)
        c->w->s->h.done(c->w->s->h.cls, req, delivered);
}

static void conn_free(http_conn *c)
{
    worker *w = c->w;
    end_request(c, 0);
    if (c->events)
        (void)epoll_ctl(w->ep, EPOLL_CTL_DEL, c->fd, NULL);
    if (close(c->fd) != 0)
        log_warn("closing a client connection: %s", strerror(errno));
    if (c->prev)
        c->prev->next = c->next;
    else
        w->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c->body);
    free(c->buf);
    free(c);
    atomic_fetch_sub(&w->nconns, 1);
    atomic_fetch_sub(&w->s->conns, 1);
}

static void conn_open(worker *w, int fd)
{
    http_conn *c = calloc(1, sizeof *c);
    size_t cap = w->s->l.conn_memory < READ_BUFFER_START ? w->s->l.conn_memory : READ_BUFFER_START;
    char *buf = c ? malloc(cap) : NULL;
    if (!buf) {
        log_warn("out of memory for a new connection: closed");
        free(c);
        close(fd);
        atomic_fetch_sub(&w->nconns, 1);
        atomic_fetch_sub(&w->s->conns, 1);
        return;
    }
    c->w = w;
    c->fd = fd;
    c->buf = buf;
    c->cap = cap;
    c->state = ST_HEAD;
    c->last_io_us = clock_now_us();
    set_phase(c, CONN_HEADERS);
    c->next = w->conns;
    if (w->conns)
        w->conns->prev = c;
    w->conns = c;
    set_events(c, EPOLLIN | EPOLLRDHUP);
    if (c->drop)
        conn_free(c);
}

/* ---- answering -------------------------------------------------------- */

int http_respond(http_conn *c, const http_response *r)
{
    http_server *s = c->w->s;
    if (!c->in_request || c->state == ST_WRITE || c->state == ST_LINGER) {
        free(r->body);
        log_warn("a second answer to one request was refused");
        return -1;
    }
    /* Bytes of the body still unread would be read as the next request:
     * close instead. */
    int unread = c->state == ST_HEAD || (c->state == ST_BODY);
    c->close_after = r->close || !c->keep_alive || unread || atomic_load(&s->quiesced);
    /* An interim 100 Continue not yet sent goes first. */
    size_t pend = c->hdr_len - c->hdr_off;
    memmove(c->hdr, c->hdr + c->hdr_off, pend);
    char extra[256] = "";
    size_t n = 0;
    if (r->retry_after > 0)
        n += (size_t)snprintf(extra + n, sizeof extra - n, "Retry-After: %d\r\n", r->retry_after);
    if (r->allow && n < sizeof extra)
        n += (size_t)snprintf(extra + n, sizeof extra - n, "Allow: %s\r\n", r->allow);
    if (r->extra_name && n < sizeof extra)
        n += (size_t)snprintf(extra + n, sizeof extra - n, "%s: %s\r\n", r->extra_name, r->extra_value);
    int len = snprintf(c->hdr + pend, sizeof c->hdr - pend,
                       "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s%s\r\n",
                       r->status, reason(r->status), date_now(c->w), r->content_type ? r->content_type : "text/plain",
                       r->body ? r->len : 0, n < sizeof extra ? extra : "",
                       c->close_after ? "Connection: close\r\n" : c->keep_alive ? "Connection: keep-alive\r\n" : "");
    if (len < 0 || (size_t)len >= sizeof c->hdr - pend) {
        free(r->body);
        log_error("an answer's header block does not fit in %d bytes", HEADER_MAX);
        c->drop = 1;
        return -1;
    }
    c->hdr_len = pend + (size_t)len;
    c->hdr_off = 0;
    free(c->body);
    c->body = NULL;
    c->body_len = c->body_off = 0;
    if (c->head_only)
        free(r->body);
    else if (r->body) {
        c->body = r->body;
        c->body_len = r->len;
    }
    c->state = ST_WRITE;
    set_phase(c, CONN_SERVER);
    c->last_io_us = clock_now_us();
    return 0;
}

void http_drop(http_conn *c)
{
    c->drop = 1;
}

int http_fd(const http_conn *c)
{
    return c->fd;
}

http_server *http_server_of(const http_conn *c)
{
    return c->w->s;
}

int http_worker(const http_conn *c)
{
    return (int)(c->w - c->w->s->w);
}

void http_wake(http_conn *c)
{
    worker *w = c->w;
    pthread_mutex_lock(&w->mu);
    if (!c->woken) {
        c->woken = 1;
        c->wake_next = w->wake_head;
        w->wake_head = c;
    }
    /* Under the mutex: http_stop takes it before freeing the worker, so
     * a waker is never still writing to a closed eventfd. */
    wake_fd(w->wakefd);
    pthread_mutex_unlock(&w->mu);
}

/* Sends what it can: 1 all sent, 0 the socket is full, -1 failed. */
static int flush(http_conn *c)
{
    while (c->hdr_off < c->hdr_len || c->body_off < c->body_len) {
        struct iovec iov[2];
        int n = 0;
        if (c->hdr_off < c->hdr_len)
            iov[n++] = (struct iovec){ c->hdr + c->hdr_off, c->hdr_len - c->hdr_off };
        if (c->body_off < c->body_len)
            iov[n++] = (struct iovec){ c->body + c->body_off, c->body_len - c->body_off };
        struct msghdr m = { .msg_iov = iov, .msg_iovlen = (size_t)n };
        ssize_t k = sendmsg(c->fd, &m, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        }
        c->last_io_us = clock_now_us();
        size_t sent = (size_t)k, h = c->hdr_len - c->hdr_off;
        if (sent <= h) {
            c->hdr_off += sent;
        } else {
            c->hdr_off = c->hdr_len;
            c->body_off += sent - h;
        }
    }
    return 1;
}

/* ---- reading a request ------------------------------------------------ */

/* A request the layer refuses from its head (or from its absence: a slow
 * or oversized one): the handler answers it; the connection closes after. */
static void refused_head(http_conn *c, http_head *h)
{
    http_server *s = c->w->s;
    c->keep_alive = 0;
    c->head_only = strcmp(h->method, "HEAD") == 0;
    c->in_request = 1;
    c->req = s->h.request(s->h.cls, c, h);
    if (!c->req)
        c->drop = 1;
    else if (c->state != ST_WRITE)
        c->drop = 1;   /* the handler gave no answer */
}

static void synthetic_refusal(http_conn *c, int status, const char *code, const char *message)
{
    http_head h;
    memset(&h, 0, sizeof h);
    h.method = "";
    h.path = "";
    h.minor = 1;
    h.status = status;
    h.code = code;
    snprintf(h.message, sizeof h.message, "%s", message);
    refused_head(c, &h);
}

static void begin_request(http_conn *c, size_t head_len)
{
    http_server *s = c->w->s;
    http_head h;
    http_parse_head(c->buf + c->off, head_len, s->h.unescape, &h);
    c->off += head_len;
    c->scan = (http_scan){ 0 };
    if (h.status) {
        refused_head(c, &h);
        return;
    }
    c->head_only = strcmp(h.method, "HEAD") == 0;
    c->keep_alive = h.keep_alive;
    c->chunked = h.chunked;
    c->body_left = h.content_length;
    c->ch = (http_chunked){ 0 };
    int body = c->chunked || c->body_left > 0;
    c->state = body ? ST_BODY : ST_WAIT;
    set_phase(c, body ? CONN_BODY : CONN_SERVER);
    c->in_request = 1;
    c->req = s->h.request(s->h.cls, c, &h);
    if (!c->req) {
        c->drop = 1;
        return;
    }
    if (c->state != ST_BODY && c->state != ST_WAIT)
        return;   /* answered (or dropped) from the head */
    if (body && h.expect_continue) {
        /* The client waits for this before sending the body. Sent through
         * hdr like an answer (drive flushes it), so a short write resumes
         * and a final answer follows it whole (http_respond). */
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        memcpy(c->hdr, cont, sizeof cont - 1);
        c->hdr_len = sizeof cont - 1;
        c->hdr_off = 0;
    }
    if (!body)
        s->h.body_end(s->h.cls, c, c->req);
}

static void body_complete(http_conn *c)
{
    http_server *s = c->w->s;
    c->state = ST_WAIT;
    set_phase(c, CONN_SERVER);
    s->h.body_end(s->h.cls, c, c->req);
}

/* Feeds buffered body bytes to the handler. */
static void read_body(http_conn *c)
{
    http_server *s = c->w->s;
    while (c->state == ST_BODY && !c->drop) {
        size_t avail = c->len - c->off;
        if (!c->chunked) {
            size_t take = avail < c->body_left ? avail : (size_t)c->body_left;
            if (take > 0) {
                c->off += take;
                c->body_left -= take;
                c->body_bytes += take;
                s->h.body(s->h.cls, c, c->req, c->buf + c->off - take, take);
            }
            if (c->body_left == 0 && c->state == ST_BODY && !c->drop)
                body_complete(c);
            return;
        }
        size_t used;
        const char *data, *err;
        size_t dlen = 0;
        http_chunk_result r = http_chunked_step(&c->ch, c->buf + c->off, avail, &used, &data, &dlen, &err);
        c->off += used;
        if (r == HTTP_CHUNK_DATA) {
            c->body_bytes += dlen;
            s->h.body(s->h.cls, c, c->req, data, dlen);
        } else if (r == HTTP_CHUNK_DONE) {
            body_complete(c);
        } else if (r == HTTP_CHUNK_ERROR) {
            c->keep_alive = 0;
            s->h.body_error(s->h.cls, c, c->req, 400, "bad_request", err);
            if (c->state != ST_WRITE)
                c->drop = 1;
        } else {
            return;   /* more bytes needed */
        }
    }
}

/* Parses what is buffered: heads and bodies, until more bytes are needed
 * or the handler has the request. */
static void process(http_conn *c)
{
    while (!c->drop && (c->state == ST_HEAD || c->state == ST_BODY)) {
        if (c->state == ST_BODY) {
            read_body(c);
            if (c->state == ST_BODY)
                return;
            continue;
        }
        size_t end = http_head_end(c->buf + c->off, c->len - c->off, &c->scan);
        if (end == 0)
            return;
        begin_request(c, end);
    }
}

/* Makes room in the read buffer; 0 when there is none (a head larger
 * than conn_memory). */
static int make_room(http_conn *c)
{
    if (c->off > 0) {
        memmove(c->buf, c->buf + c->off, c->len - c->off);
        c->len -= c->off;
        c->off = 0;
    }
    if (c->len < c->cap)
        return 1;
    size_t max = c->w->s->l.conn_memory;
    if (c->state != ST_HEAD || c->cap >= max)
        return 0;
    size_t cap = c->cap * 2 < max ? c->cap * 2 : max;
    char *b = realloc(c->buf, cap);
    if (!b)
        return 0;
    c->buf = b;
    c->cap = cap;
    return 1;
}

/* One read on a readable connection: the bytes read, 0 when none. */
static ssize_t on_readable(http_conn *c)
{
    if (!make_room(c)) {
        if (c->state != ST_HEAD) {
            c->drop = 1;   /* cannot happen: body bytes are consumed as they come */
            return 0;
        }
        /* No complete head in conn_memory bytes: the request line alone
         * (no line end yet) is 414, else the header fields are 431. */
        if (memchr(c->buf, '\n', c->len))
            synthetic_refusal(c, 431, "headers_too_large", "the request's header fields are larger than "
                              "connection_memory_bytes");
        else
            synthetic_refusal(c, 414, "uri_too_long", "the request line is longer than connection_memory_bytes");
        return 0;
    }
    ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            c->drop = 1;   /* reset: a request under way ends undelivered */
        return 0;
    }
    c->last_io_us = clock_now_us();
    if (n == 0) {
        c->eof = 1;
        return 0;
    }
    c->len += (size_t)n;
    return n;
}

/* Drains a lingering connection. */
static void on_linger_readable(http_conn *c)
{
    char sink[4096];
    ssize_t n = recv(c->fd, sink, sizeof sink, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        c->drop = 1;
}

/* Moves c on as far as it can go now; may free it. */
static void drive(http_conn *c)
{
    for (;;) {
        if (c->drop && c->state != ST_WAIT) {
            conn_free(c);   /* a waiting request is the pipeline's: freed after its wake */
            return;
        }
        switch (c->state) {
        case ST_HEAD:
        case ST_BODY:
            process(c);
            if (c->drop || (c->state != ST_HEAD && c->state != ST_BODY))
                continue;
            if (c->hdr_off < c->hdr_len) {   /* a 100 Continue */
                int r = flush(c);
                if (r < 0) {
                    c->drop = 1;
                    continue;
                }
                if (r == 0) {
                    set_events(c, EPOLLIN | EPOLLRDHUP | EPOLLOUT);
                    return;
                }
            }
            if (c->eof) {
                c->drop = 1;   /* ended mid-request (or idle): nothing to answer */
                continue;
            }
            set_events(c, EPOLLIN | EPOLLRDHUP);
            return;
        case ST_WAIT:
            set_events(c, 0);   /* the handler's turn: not polled, not closed */
            return;
        case ST_WRITE: {
            int r = flush(c);
            if (r < 0) {
                c->drop = 1;
                continue;
            }
            if (r == 0) {
                set_events(c, EPOLLOUT);
                return;
            }
            free(c->body);
            c->body = NULL;
            end_request(c, 1);
            if (c->close_after) {
                c->state = ST_LINGER;
                set_phase(c, CONN_SERVER);
                if (c->eof || shutdown(c->fd, SHUT_WR) != 0)
                    c->drop = 1;
                continue;
            }
            c->state = ST_HEAD;
            set_phase(c, CONN_HEADERS);
            continue;   /* a pipelined request may be buffered */
        }
        case ST_LINGER:
            set_events(c, EPOLLIN | EPOLLRDHUP);
            return;
        }
    }
}

static void on_event(http_conn *c, uint32_t ev)
{
    if (c->state == ST_LINGER) {
        on_linger_readable(c);
    } else if ((c->state == ST_HEAD || c->state == ST_BODY) && (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
        /* Several reads a turn (up to 16 buffers): a body arrives in a
         * few wake-ups, not one per buffer. */
        for (int i = 0; i < 16 && on_readable(c) > 0 && !c->drop; i++) {
            process(c);
            if (c->drop || (c->state != ST_HEAD && c->state != ST_BODY))
                break;
        }
    }
    /* ST_WRITE: drive flushes. */
    drive(c);
}

/* Has any of a request arrived (more than the empty lines a client may
 * send after a body)? */
static int request_started(const http_conn *c)
{
    for (size_t i = c->off; i < c->len; i++)
        if (c->buf[i] != '\r' && c->buf[i] != '\n')
            return 1;
    return 0;
}

/* Slow clients and stalled answers (the worker's own connections). */
static void scan(worker *w, uint64_t now)
{
    http_server *s = w->s;
    conn_limits cl = { .header_timeout_us = s->l.header_timeout_us, .min_rate = s->l.min_rate };
    http_conn *next;
    for (http_conn *c = w->conns; c; c = next) {
        next = c->next;
        if (c->state == ST_HEAD && conn_judge(&cl, CONN_HEADERS, c->since_us, 0, now) != CONN_OK) {
            atomic_fetch_add(&s->dropped_slow, 1);
            if (request_started(c))
                synthetic_refusal(c, 408, "slow_client", "the request's headers did not arrive within "
                                  "header_timeout_s");
            else
                c->drop = 1;   /* an idle connection: nothing to answer */
        } else if (c->state == ST_BODY &&
                   (conn_judge(&cl, CONN_BODY, c->since_us, c->body_bytes, now) != CONN_OK ||
                    now - c->last_io_us > s->l.idle_timeout_us)) {
            atomic_fetch_add(&s->dropped_slow, 1);
            c->keep_alive = 0;
            s->h.body_error(s->h.cls, c, c->req, 408, "slow_client",
                            "the request body arrived slower than min_body_rate (or stalled)");
            if (c->state != ST_WRITE)
                c->drop = 1;
        } else if (c->state == ST_WRITE && now - c->last_io_us > s->l.idle_timeout_us) {
            c->drop = 1;   /* the client does not read its answer */
        } else if (c->state == ST_LINGER && now - c->since_us > LINGER_US) {
            c->drop = 1;
        } else {
            continue;
        }
        drive(c);
    }
}

/* New sockets, wakes and the stop flag, under the worker's mutex. */
static int take_wakes(worker *w)
{
    uint64_t v;
    while (read(w->wakefd, &v, sizeof v) < 0 && errno == EINTR)
        ;
    pthread_mutex_lock(&w->mu);
    int nin = w->ninbox, stop = w->stop;
    int fds[64];
    if (nin > 64)
        nin = 64;   /* the rest on the next turn (the eventfd stays readable) */
    if (nin > 0) {   /* the inbox is NULL until the first connection */
        memcpy(fds, w->inbox, (size_t)nin * sizeof *fds);
        memmove(w->inbox, w->inbox + nin, (size_t)(w->ninbox - nin) * sizeof *fds);
        w->ninbox -= nin;
    }
    if (w->ninbox > 0)
        wake_fd(w->wakefd);
    http_conn *wl = w->wake_head;
    w->wake_head = NULL;
    pthread_mutex_unlock(&w->mu);
    for (int i = 0; i < nin; i++)
        conn_open(w, fds[i]);
    while (wl) {
        /* Its next is read before it may be woken (and relinked) again. */
        http_conn *c = wl;
        pthread_mutex_lock(&w->mu);
        wl = c->wake_next;
        c->woken = 0;
        pthread_mutex_unlock(&w->mu);
        if (c->state == ST_WAIT && c->req)
            w->s->h.wake(w->s->h.cls, c, c->req);
        drive(c);
    }
    return stop;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    struct epoll_event ev[128];
    uint64_t next_scan = clock_now_us() + SCAN_INTERVAL_US;
    for (;;) {
        uint64_t now = clock_now_us();
        int timeout = now >= next_scan ? 0 : (int)((next_scan - now) / 1000) + 1;
        int n = epoll_wait(w->ep, ev, 128, timeout);
        if (n < 0 && errno != EINTR) {
            /* Cannot happen with a valid epoll fd; going on without this
             * worker would strand its connections and their requests. */
            log_error("epoll_wait: %s", strerror(errno));
            abort();
        }
        int stop = 0;
        for (int i = 0; i < n; i++) {
            if (ev[i].data.ptr == NULL)
                stop = take_wakes(w);
            else
                on_event(ev[i].data.ptr, ev[i].events);
        }
        if (stop)
            break;
        now = clock_now_us();
        if (now >= next_scan) {
            scan(w, now);
            next_scan = now + SCAN_INTERVAL_US;
        }
    }
    while (w->conns)
        conn_free(w->conns);
    return NULL;
}

/* ---- accepting -------------------------------------------------------- */

static void *acceptor_main(void *arg)
{
    http_server *s = arg;
    struct pollfd p[2] = { { .fd = s->lfd, .events = POLLIN }, { .fd = s->stopfd, .events = POLLIN } };
    for (;;) {
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            log_error("poll on the listening socket: %s", strerror(errno));
            return NULL;
        }
        if (p[1].revents)
            return NULL;
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                log_warn("accept: %s; pausing 10 ms", strerror(errno));
                struct timespec ts = { 0, 10000000 };
                nanosleep(&ts, NULL);
            }
            continue;   /* EAGAIN, ECONNABORTED, EINTR... */
        }
        if (atomic_load(&s->conns) >= s->l.connection_limit) {
            close(fd);   /* at the limit: no slot, no buffer */
            continue;
        }
        int one = 1;
        if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0 && errno != EOPNOTSUPP)
            log_warn("TCP_NODELAY: %s", strerror(errno));
        worker *best = &s->w[0];
        for (int i = 1; i < s->nworkers; i++)
            if (atomic_load(&s->w[i].nconns) < atomic_load(&best->nconns))
                best = &s->w[i];
        atomic_fetch_add(&s->conns, 1);
        atomic_fetch_add(&best->nconns, 1);
        pthread_mutex_lock(&best->mu);
        if (best->ninbox == best->capinbox) {
            int cap = best->capinbox ? best->capinbox * 2 : 64;
            int *in = realloc(best->inbox, (size_t)cap * sizeof *in);
            if (!in) {
                pthread_mutex_unlock(&best->mu);
                close(fd);
                atomic_fetch_sub(&s->conns, 1);
                atomic_fetch_sub(&best->nconns, 1);
                continue;
            }
            best->inbox = in;
            best->capinbox = cap;
        }
        best->inbox[best->ninbox++] = fd;
        pthread_mutex_unlock(&best->mu);
        wake_fd(best->wakefd);
    }
}

/* ---- lifecycle -------------------------------------------------------- */

static int bind_listen(http_server *s, const struct sockaddr *addr, socklen_t addrlen, char *err, size_t errlen)
{
    s->lfd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->lfd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    /* SO_REUSEADDR (a restart binds past TIME_WAIT), never SO_REUSEPORT:
     * a second resnetd on the port must fail, not share the traffic. */
    int one = 1;
    /* [::] takes IPv6 only, as a listener on 0.0.0.0 may share the port. */
    if (addr->sa_family == AF_INET6 && setsockopt(s->lfd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) != 0) {
        snprintf(err, errlen, "IPV6_V6ONLY: %s", strerror(errno));
        close(s->lfd);
        return -1;
    }
    if (setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(s->lfd, addr, addrlen) != 0 || listen(s->lfd, s->l.backlog) != 0) {
        snprintf(err, errlen, "%s", strerror(errno));
        close(s->lfd);
        return -1;
    }
    struct sockaddr_storage got;
    socklen_t glen = sizeof got;
    if (getsockname(s->lfd, (struct sockaddr *)&got, &glen) != 0) {
        snprintf(err, errlen, "getsockname: %s", strerror(errno));
        close(s->lfd);
        return -1;
    }
    s->port = got.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&got)->sin6_port)
                                        : ntohs(((struct sockaddr_in *)&got)->sin_port);
    return 0;
}

static int worker_init(worker *w, http_server *s, char *err, size_t errlen)
{
    w->s = s;
    w->ep = epoll_create1(EPOLL_CLOEXEC);
    w->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event e = { .events = EPOLLIN, .data.ptr = NULL };
    if (w->ep < 0 || w->wakefd < 0 || epoll_ctl(w->ep, EPOLL_CTL_ADD, w->wakefd, &e) != 0) {
        snprintf(err, errlen, "epoll: %s", strerror(errno));
        if (w->ep >= 0)
            close(w->ep);
        if (w->wakefd >= 0)
            close(w->wakefd);
        return -1;
    }
    pthread_mutex_init(&w->mu, NULL);
    atomic_init(&w->nconns, 0);
    return 0;
}

static void worker_destroy(worker *w)
{
    close(w->ep);
    close(w->wakefd);
    pthread_mutex_destroy(&w->mu);
    for (int i = 0; i < w->ninbox; i++)
        close(w->inbox[i]);
    free(w->inbox);
}

http_server *http_start(const struct sockaddr *addr, socklen_t addrlen, const http_limits *l,
                        const http_handler *h, char *err, size_t errlen)
{
    http_server *s = calloc(1, sizeof *s);
    if (!s || !(s->w = calloc((size_t)l->threads, sizeof *s->w))) {
        free(s);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->l = *l;
    s->h = *h;
    atomic_init(&s->quiesced, 0);
    atomic_init(&s->conns, 0);
    atomic_init(&s->dropped_slow, 0);
    s->stopfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->stopfd < 0) {
        snprintf(err, errlen, "eventfd: %s", strerror(errno));
        goto fail_alloc;
    }
    if (bind_listen(s, addr, addrlen, err, errlen) != 0)
        goto fail_stopfd;
    for (; s->nworkers < l->threads; s->nworkers++)
        if (worker_init(&s->w[s->nworkers], s, err, errlen) != 0)
            goto fail_workers;
    int started = 0;
    for (; started < s->nworkers; started++) {
        int e = pthread_create(&s->w[started].thread, NULL, worker_main, &s->w[started]);
        if (e != 0) {
            snprintf(err, errlen, "starting an HTTP thread: %s", strerror(e));
            goto fail_threads;
        }
    }
    int e = pthread_create(&s->acceptor, NULL, acceptor_main, s);
    if (e != 0) {
        snprintf(err, errlen, "starting the acceptor: %s", strerror(e));
        goto fail_threads;
    }
    s->accepting = 1;
    return s;

fail_threads:
    for (int i = 0; i < started; i++) {
        pthread_mutex_lock(&s->w[i].mu);
        s->w[i].stop = 1;
        pthread_mutex_unlock(&s->w[i].mu);
        wake_fd(s->w[i].wakefd);
        pthread_join(s->w[i].thread, NULL);
    }
fail_workers:
    for (int i = 0; i < s->nworkers; i++)
        worker_destroy(&s->w[i]);
    close(s->lfd);
fail_stopfd:
    close(s->stopfd);
fail_alloc:
    free(s->w);
    free(s);
    return NULL;
}

int http_port(const http_server *s)
{
    return s->port;
}

long http_connections(http_server *s)
{
    return atomic_load(&s->conns);
}

unsigned long long http_dropped_slow(http_server *s)
{
    return atomic_load(&s->dropped_slow);
}

void http_quiesce(http_server *s)
{
    atomic_store(&s->quiesced, 1);
    if (!s->accepting)
        return;
    wake_fd(s->stopfd);
    pthread_join(s->acceptor, NULL);
    s->accepting = 0;
    if (close(s->lfd) != 0)
        log_warn("closing the listening socket: %s", strerror(errno));
}

void http_stop(http_server *s)
{
    if (!s)
        return;
    http_quiesce(s);
    for (int i = 0; i < s->nworkers; i++) {
        pthread_mutex_lock(&s->w[i].mu);
        s->w[i].stop = 1;
        pthread_mutex_unlock(&s->w[i].mu);
        wake_fd(s->w[i].wakefd);
    }
    for (int i = 0; i < s->nworkers; i++) {
        pthread_join(s->w[i].thread, NULL);
        worker_destroy(&s->w[i]);
    }
    close(s->stopfd);
    free(s->w);
    free(s);
}
