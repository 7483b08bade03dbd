/* The load engine (see loadgen.h). Each worker thread owns its connections,
 * its epoll set and its stats outright; the only shared state is the
 * closed-loop request budget (-n), the stop flag and the progress counters,
 * all atomics. Level-triggered epoll: one sendmsg and usually one read per
 * request, EPOLLOUT only while a body is partly written. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include "client/http_response.h"
#include "client/loadgen.h"
#include "util/clock.h"

#define READ_BUF (64 * 1024)
#define SCAN_NS 10000000u /* timeouts and back-offs are checked every 10 ms */
#define CONNECT_BACKOFF_NS 100000000u /* a connection that failed to connect rests 100 ms */

enum { SOCK_NONE, SOCK_CONNECTING, SOCK_CONNECTED };

typedef struct {
    int fd;
    int sock; /* SOCK_* */
    uint32_t events; /* what epoll watches for fd */
    int has_req;
    int warm; /* the request belongs to the warm-up */
    int backoff; /* resting after a failed connect: not on the idle stack */
    int write_failed; /* the peer reset or closed while the body was going out */
    int images;
    uint64_t intended_ns, sent_ns, deadline_ns, rest_until_ns;
    struct iovec *iov; /* 2 + 3 * images_per_request entries */
    int iov_n, iov_i;
    char head[2048]; /* request header, then (multipart) the closing delimiter */
    http_response resp;
} lconn;

typedef struct {
    struct load_run *run;
    int index;
    pthread_t tid;
    int epfd;
    lconn *conns;
    int nconns;
    int *idle; /* stack of idle connection indices (LIFO keeps few hot) */
    int nidle;
    int inflight;
    size_t next_image;
    uint64_t rng;
    /* open loop: the schedule; next_ns is the oldest request not yet sent */
    double next_ns; /* relative to run start */
    double gap_ns; /* mean gap between this thread's arrivals */
    int sched_done; /* no more entries */
    uint64_t sched_end_ns; /* when the schedule ends (expected, with -n) */
    uint64_t quota; /* -n: measured entries still to schedule */
    load_stats *warm, *meas;
    _Atomic uint64_t p_sent, p_answered, p_ok, p_errors;
    _Atomic int finished;
    char *rbuf;
} worker;

struct load_run {
    load_config cfg;
    uint64_t start_ns, measure_ns, end_ns; /* end_ns: UINT64_MAX with -n */
    _Atomic int64_t tickets; /* closed loop -n: measured requests left */
    _Atomic int stop;
    worker *workers;
    int started; /* threads created */
};

static const char *const error_names[LOAD_ERR_COUNT] = {
    [LOAD_ERR_CONNECT_REFUSED] = "connect_refused",
    [LOAD_ERR_CONNECT] = "connect_failed",
    [LOAD_ERR_RESET] = "reset",
    [LOAD_ERR_CLOSED] = "closed",
    [LOAD_ERR_TIMEOUT] = "timeout",
    [LOAD_ERR_DRAIN_TIMEOUT] = "drain_timeout",
    [LOAD_ERR_PROTOCOL] = "protocol",
    [LOAD_ERR_OTHER] = "other",
};

const char *load_error_name(load_error e)
{
    return (unsigned)e < LOAD_ERR_COUNT ? error_names[e] : "unknown";
}

/* xorshift64*: per-thread, seeded from the config seed and thread index. */
static double rng_uniform(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (double)((*s * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
}

static double next_gap(worker *w)
{
    if (w->run->cfg.arrival == LOAD_UNIFORM)
        return w->gap_ns;
    return -log1p(-rng_uniform(&w->rng)) * w->gap_ns; /* exponential, mean gap_ns */
}

static void set_events(worker *w, lconn *c, uint32_t ev)
{
    if (c->events == ev)
        return;
    struct epoll_event e = { .events = ev, .data.u32 = (uint32_t)(c - w->conns) };
    if (epoll_ctl(w->epfd, EPOLL_CTL_MOD, c->fd, &e) == 0)
        c->events = ev;
}

static void sock_close(worker *w, lconn *c)
{
    if (c->fd >= 0) {
        epoll_ctl(w->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    c->fd = -1;
    c->sock = SOCK_NONE;
    c->events = 0;
}

static void progress_publish(worker *w)
{
    const load_stats *a = w->warm, *b = w->meas;
    uint64_t errors = 0;
    for (int i = 0; i < LOAD_ERR_COUNT; i++)
        errors += a->errors[i] + b->errors[i];
    atomic_store_explicit(&w->p_sent, a->sent + b->sent, memory_order_relaxed);
    atomic_store_explicit(&w->p_answered, a->answered + b->answered, memory_order_relaxed);
    atomic_store_explicit(&w->p_ok, a->ok + b->ok, memory_order_relaxed);
    atomic_store_explicit(&w->p_errors, errors, memory_order_relaxed);
}

/* The request on c has ended (answer or error): account, free c. */
static void request_end(worker *w, lconn *c, int status, load_error err)
{
    load_stats *s = c->warm ? w->warm : w->meas;
    uint64_t now = clock_now_ns();
    s->answered++;
    s->last_answer_ns = now;
    if (status > 0) {
        s->status[status < LOAD_STATUS_MAX ? status : 0]++;
        if (status >= 200 && status < 300) {
            s->ok++;
            s->images_ok += (uint64_t)c->images;
            histogram_record(&s->latency, now - c->intended_ns);
            histogram_record(&s->service, now - c->sent_ns);
        }
    } else {
        s->errors[err]++;
    }
    c->has_req = 0;
    w->inflight--;
    if (status <= 0 || c->resp.close || c->iov_i < c->iov_n)
        sock_close(w, c);
    if (status <= 0 && (err == LOAD_ERR_CONNECT_REFUSED || err == LOAD_ERR_CONNECT)) {
        c->backoff = 1;
        c->rest_until_ns = now + CONNECT_BACKOFF_NS;
    } else {
        w->idle[w->nidle++] = (int)(c - w->conns);
    }
    progress_publish(w);
}

static void conn_write(worker *w, lconn *c)
{
    while (c->iov_i < c->iov_n && !c->write_failed) {
        struct msghdr m = { .msg_iov = c->iov + c->iov_i, .msg_iovlen = (size_t)(c->iov_n - c->iov_i) };
        ssize_t n = sendmsg(c->fd, &m, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                set_events(w, c, EPOLLIN | EPOLLOUT);
                return;
            }
            if (errno == ECONNRESET || errno == EPIPE) {
                /* the server may have answered early (413) and closed: stop
                 * writing and let the read side find the answer or the error */
                c->write_failed = 1;
                set_events(w, c, EPOLLIN);
                return;
            }
            request_end(w, c, 0, LOAD_ERR_OTHER);
            return;
        }
        size_t left = (size_t)n;
        while (left > 0 && left >= c->iov[c->iov_i].iov_len)
            left -= c->iov[c->iov_i++].iov_len;
        if (left > 0) {
            c->iov[c->iov_i].iov_base = (char *)c->iov[c->iov_i].iov_base + left;
            c->iov[c->iov_i].iov_len -= left;
        }
    }
    set_events(w, c, EPOLLIN);
}

/* Starts a non-blocking connect; 0 or an errno. */
static int conn_open(worker *w, lconn *c)
{
    const load_config *cfg = &w->run->cfg;
    int fd = socket(cfg->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return errno;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int rc = connect(fd, (const struct sockaddr *)&cfg->addr, cfg->addrlen);
    if (rc != 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        return e;
    }
    struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT, .data.u32 = (uint32_t)(c - w->conns) };
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        int e = errno;
        close(fd);
        return e;
    }
    c->fd = fd;
    c->events = ev.events;
    c->sock = rc == 0 ? SOCK_CONNECTED : SOCK_CONNECTING;
    return 0;
}

/* Builds the request for the next images into c's iovecs. */
static void build_request(worker *w, lconn *c)
{
    const load_config *cfg = &w->run->cfg;
    const corpus *cp = cfg->images;
    int k = cfg->multipart ? cfg->images_per_request : 1;
    size_t body = 0;
    int n = 1;
    if (!cfg->multipart) {
        const corpus_image *im = &cp->images[w->next_image];
        w->next_image = (w->next_image + 1) % cp->n;
        c->iov[n++] = (struct iovec){ .iov_base = im->data, .iov_len = im->len };
        body = im->len;
    } else {
        for (int i = 0; i < k; i++) {
            const corpus_image *im = &cp->images[w->next_image];
            w->next_image = (w->next_image + 1) % cp->n;
            c->iov[n++] = (struct iovec){ .iov_base = im->part_head, .iov_len = im->part_head_len };
            c->iov[n++] = (struct iovec){ .iov_base = im->data, .iov_len = im->len };
            c->iov[n++] = (struct iovec){ .iov_base = (void *)"\r\n", .iov_len = 2 };
            body += im->part_head_len + im->len + 2;
        }
        /* the closing delimiter lives in head's tail, after the header */
    }
    int hl;
    if (cfg->multipart) {
        size_t closing = strlen(cfg->boundary) + 6; /* "--" B "--\r\n" */
        body += closing;
        hl = snprintf(c->head, sizeof c->head,
                      "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: multipart/form-data; boundary=%s\r\n"
                      "Content-Length: %zu\r\n\r\n",
                      cfg->path, cfg->host, cfg->boundary, body);
        int tail = snprintf(c->head + hl + 1, sizeof c->head - (size_t)hl - 1, "--%s--\r\n", cfg->boundary);
        c->iov[n++] = (struct iovec){ .iov_base = c->head + hl + 1, .iov_len = (size_t)tail };
    } else {
        hl = snprintf(c->head, sizeof c->head,
                      "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: image/jpeg\r\nContent-Length: %zu\r\n\r\n",
                      cfg->path, cfg->host, body);
    }
    c->iov[0] = (struct iovec){ .iov_base = c->head, .iov_len = (size_t)hl };
    c->iov_n = n;
    c->iov_i = 0;
    c->images = k;
}

static void dispatch(worker *w, lconn *c, uint64_t intended_ns, uint64_t now, int warm)
{
    load_stats *s = warm ? w->warm : w->meas;
    build_request(w, c);
    c->has_req = 1;
    c->write_failed = 0;
    c->warm = warm;
    c->intended_ns = intended_ns;
    c->sent_ns = now;
    c->deadline_ns = now + w->run->cfg.timeout_ns;
    http_response_init(&c->resp, 0);
    s->sent++;
    w->inflight++;
    if (c->sock == SOCK_NONE) {
        int e = conn_open(w, c);
        if (e != 0) {
            request_end(w, c, 0, e == ECONNREFUSED ? LOAD_ERR_CONNECT_REFUSED : LOAD_ERR_CONNECT);
            return;
        }
    }
    if (c->sock == SOCK_CONNECTED)
        conn_write(w, c);
    progress_publish(w);
}

static void conn_connected(worker *w, lconn *c)
{
    int e = 0;
    socklen_t len = sizeof e;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0)
        e = errno;
    if (e != 0) {
        if (c->has_req)
            request_end(w, c, 0, e == ECONNREFUSED ? LOAD_ERR_CONNECT_REFUSED : LOAD_ERR_CONNECT);
        else
            sock_close(w, c);
        return;
    }
    c->sock = SOCK_CONNECTED;
    if (c->has_req)
        conn_write(w, c);
    else
        set_events(w, c, EPOLLIN);
}

static void conn_read(worker *w, lconn *c)
{
    for (;;) {
        ssize_t n = read(c->fd, w->rbuf, READ_BUF);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n < 0) {
            if (c->has_req)
                request_end(w, c, 0, errno == ECONNRESET ? LOAD_ERR_RESET : LOAD_ERR_OTHER);
            else
                sock_close(w, c);
            return;
        }
        if (n == 0) {
            if (!c->has_req)
                sock_close(w, c);
            else if (http_response_eof(&c->resp) == HTTP_RESPONSE_DONE)
                request_end(w, c, c->resp.status, 0);
            else
                request_end(w, c, 0, LOAD_ERR_CLOSED);
            return;
        }
        if (!c->has_req) { /* bytes nobody asked for: the connection is unusable */
            sock_close(w, c);
            return;
        }
        size_t used;
        http_response_result r = http_response_feed(&c->resp, w->rbuf, (size_t)n, &used);
        if (r == HTTP_RESPONSE_ERROR) {
            request_end(w, c, 0, LOAD_ERR_PROTOCOL);
            return;
        }
        if (r == HTTP_RESPONSE_DONE) {
            if (used < (size_t)n)
                c->resp.close = 1; /* more than one answer: do not trust the stream */
            request_end(w, c, c->resp.status, 0);
            return;
        }
        if (n < READ_BUF)
            return;
    }
}

static void scan(worker *w, uint64_t now)
{
    for (int i = 0; i < w->nconns; i++) {
        lconn *c = &w->conns[i];
        if (c->has_req && now >= c->deadline_ns)
            request_end(w, c, 0, LOAD_ERR_TIMEOUT);
        else if (c->backoff && now >= c->rest_until_ns) {
            c->backoff = 0;
            w->idle[w->nidle++] = i;
        }
    }
}

/* Open loop: moves past the current schedule entry. */
static void sched_advance(worker *w)
{
    load_run *r = w->run;
    w->next_ns += next_gap(w);
    uint64_t t = r->start_ns + (uint64_t)w->next_ns;
    if (t >= r->end_ns || (r->cfg.requests && t >= r->measure_ns && w->quota == 0))
        w->sched_done = 1;
}

/* Open loop: takes the oldest entry (and a quota unit if it is measured). */
static void sched_take(worker *w, uint64_t *intended, int *warm)
{
    load_run *r = w->run;
    *intended = r->start_ns + (uint64_t)w->next_ns;
    *warm = *intended < r->measure_ns;
    if (r->cfg.requests && !*warm)
        w->quota--;
    sched_advance(w);
}

/* Closed loop: whether another request may start now, and its phase. */
static int closed_may_send(worker *w, uint64_t now, int *warm)
{
    load_run *r = w->run;
    if (now >= r->end_ns)
        return 0;
    *warm = now < r->measure_ns;
    if (*warm || !r->cfg.requests)
        return 1;
    return atomic_fetch_sub_explicit(&r->tickets, 1, memory_order_relaxed) > 0;
}

static void issue(worker *w, uint64_t now, int stopping)
{
    load_run *r = w->run;
    /* each idle connection once: a request that fails at once frees its
     * connection again, and `now` must move on before it is reused */
    for (int budget = w->nidle; budget > 0 && w->nidle > 0; budget--) {
        uint64_t intended = now;
        int warm;
        if (r->cfg.mode == LOAD_CLOSED_LOOP) {
            if (stopping || !closed_may_send(w, now, &warm))
                return;
        } else {
            if (w->sched_done || r->start_ns + (uint64_t)w->next_ns > now)
                return;
            sched_take(w, &intended, &warm);
        }
        lconn *c = &w->conns[w->idle[--w->nidle]];
        dispatch(w, c, intended, now, warm);
    }
}

/* Open loop: the rest of the schedule (backlog included) will not be sent. */
static void write_off_schedule(worker *w)
{
    if (w->run->cfg.mode != LOAD_OPEN_LOOP)
        return;
    while (!w->sched_done) {
        uint64_t intended;
        int warm;
        sched_take(w, &intended, &warm);
        (warm ? w->warm : w->meas)->unsent++;
    }
}

/* The drain timed out: what is still in flight ends here. */
static void write_off_inflight(worker *w)
{
    for (int i = 0; i < w->nconns; i++)
        if (w->conns[i].has_req)
            request_end(w, &w->conns[i], 0, LOAD_ERR_DRAIN_TIMEOUT);
}

static int wait_events(worker *w, struct epoll_event *evs, int max, uint64_t now, uint64_t wake)
{
    static _Atomic int no_pwait2;
    uint64_t d = wake > now ? wake - now : 0;
    if (!atomic_load_explicit(&no_pwait2, memory_order_relaxed)) {
        struct timespec ts = { .tv_sec = (time_t)(d / 1000000000u), .tv_nsec = (long)(d % 1000000000u) };
        int n = epoll_pwait2(w->epfd, evs, max, &ts, NULL);
        if (n >= 0 || errno != ENOSYS)
            return n;
        atomic_store_explicit(&no_pwait2, 1, memory_order_relaxed);
    }
    return epoll_wait(w->epfd, evs, max, (int)((d + 999999) / 1000000));
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    load_run *r = w->run;
    int open_loop = r->cfg.mode == LOAD_OPEN_LOOP;
    uint64_t next_scan = 0, drain_deadline = UINT64_MAX;
    int stopping = 0;
    struct epoll_event evs[256];
    for (;;) {
        uint64_t now = clock_now_ns();
        if (!stopping && atomic_load_explicit(&r->stop, memory_order_relaxed)) {
            stopping = 1;
            write_off_schedule(w); /* stop means now: the backlog is not sent */
        }
        if (!stopping) {
            /* open loop: past the schedule's end the backlog is still sent,
             * within the drain timeout */
            if (open_loop)
                stopping = w->sched_done || now >= w->sched_end_ns;
            else
                stopping = now >= r->end_ns || (r->cfg.requests && now >= r->measure_ns &&
                                                atomic_load_explicit(&r->tickets, memory_order_relaxed) <= 0);
        }
        if (stopping && drain_deadline == UINT64_MAX)
            drain_deadline = now + r->cfg.drain_timeout_ns;
        if (now >= next_scan) {
            scan(w, now);
            next_scan = now + SCAN_NS;
        }
        issue(w, now, stopping);
        if (stopping && w->inflight == 0 && (!open_loop || w->sched_done))
            break;
        if (now >= drain_deadline) {
            write_off_schedule(w);
            write_off_inflight(w);
            break;
        }
        uint64_t wake = next_scan < drain_deadline ? next_scan : drain_deadline;
        if (open_loop && !w->sched_done && w->nidle > 0) {
            uint64_t due = r->start_ns + (uint64_t)w->next_ns;
            if (due < wake)
                wake = due;
        }
        if (!open_loop && !stopping && r->end_ns < wake)
            wake = r->end_ns;
        int n = wait_events(w, evs, 256, now, wake);
        if (n < 0 && errno != EINTR) {
            fprintf(stderr, "resnetd-load: epoll: %s\n", strerror(errno));
            atomic_store(&r->stop, 1);
            n = 0;
        }
        for (int i = 0; i < n; i++) {
            lconn *c = &w->conns[evs[i].data.u32];
            if (c->fd < 0)
                continue;
            if (c->sock == SOCK_CONNECTING) {
                conn_connected(w, c);
                continue;
            }
            /* read first: an early answer (413) may be waiting behind a reset */
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
                conn_read(w, c);
            if (c->fd >= 0 && (evs[i].events & EPOLLOUT) && c->has_req && c->iov_i < c->iov_n)
                conn_write(w, c);
        }
    }
    for (int i = 0; i < w->nconns; i++)
        sock_close(w, &w->conns[i]);
    progress_publish(w);
    atomic_store(&w->finished, 1);
    return NULL;
}

static void worker_free(worker *w)
{
    if (w->conns) {
        for (int i = 0; i < w->nconns; i++)
            free(w->conns[i].iov);
        free(w->conns);
    }
    free(w->idle);
    free(w->rbuf);
    free(w->warm);
    free(w->meas);
    if (w->epfd >= 0)
        close(w->epfd);
}

static int worker_init(load_run *r, worker *w, int index, char *err, size_t errlen)
{
    const load_config *cfg = &r->cfg;
    memset(w, 0, sizeof *w);
    w->run = r;
    w->index = index;
    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    w->nconns = cfg->connections / cfg->threads + (index < cfg->connections % cfg->threads);
    w->conns = calloc((size_t)w->nconns, sizeof *w->conns);
    w->idle = calloc((size_t)w->nconns, sizeof *w->idle);
    w->rbuf = malloc(READ_BUF);
    w->warm = malloc(sizeof *w->warm);
    w->meas = malloc(sizeof *w->meas);
    if (w->epfd < 0 || !w->conns || !w->idle || !w->rbuf || !w->warm || !w->meas) {
        snprintf(err, errlen, "out of memory or descriptors");
        return -1;
    }
    memset(w->warm, 0, sizeof *w->warm);
    memset(w->meas, 0, sizeof *w->meas);
    histogram_init(&w->warm->latency);
    histogram_init(&w->warm->service);
    histogram_init(&w->meas->latency);
    histogram_init(&w->meas->service);
    int niov = 2 + 3 * (cfg->multipart ? cfg->images_per_request : 1);
    for (int i = 0; i < w->nconns; i++) {
        lconn *c = &w->conns[i];
        c->fd = -1;
        if ((c->iov = calloc((size_t)niov, sizeof *c->iov)) == NULL) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        w->idle[w->nidle++] = w->nconns - 1 - i; /* connection 0 on top */
    }
    /* spread the threads over the corpus so they do not send the same images in step */
    w->next_image = (size_t)index * cfg->images->n / (size_t)cfg->threads;
    w->rng = (cfg->seed + 1) * 0x9E3779B97F4A7C15ull + (uint64_t)index * 0xD1B54A32D192ED03ull;
    if (w->rng == 0)
        w->rng = 1;
    if (cfg->mode == LOAD_OPEN_LOOP) {
        w->gap_ns = 1e9 * cfg->threads / cfg->rate;
        w->quota = cfg->requests / (uint64_t)cfg->threads + ((uint64_t)index < cfg->requests % (uint64_t)cfg->threads);
        /* uniform: threads interleave, 1/rate apart; Poisson: first arrival after one gap */
        w->next_ns = cfg->arrival == LOAD_UNIFORM ? 1e9 * index / cfg->rate : next_gap(w);
        w->sched_end_ns = cfg->requests ? r->measure_ns + (uint64_t)(1e9 * (double)cfg->requests / cfg->rate)
                                        : r->end_ns;
        uint64_t t = r->start_ns + (uint64_t)w->next_ns;
        w->sched_done = t >= r->end_ns || (cfg->requests && t >= r->measure_ns && w->quota == 0);
    }
    return 0;
}

load_run *load_start(const load_config *cfg, char *err, size_t errlen)
{
    if (cfg->threads < 1 || cfg->connections < cfg->threads || !cfg->images || cfg->images->n == 0 ||
        (cfg->mode == LOAD_OPEN_LOOP && !(cfg->rate > 0)) || (!cfg->duration_ns == !cfg->requests) ||
        cfg->images_per_request < 1 || cfg->images_per_request > LOAD_MAX_IMAGES_PER_REQUEST) {
        snprintf(err, errlen, "invalid load configuration");
        return NULL;
    }
    load_run *r = calloc(1, sizeof *r);
    if (!r || !(r->workers = calloc((size_t)cfg->threads, sizeof *r->workers))) {
        free(r);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->cfg = *cfg;
    r->start_ns = clock_now_ns();
    r->measure_ns = r->start_ns + cfg->warmup_ns;
    r->end_ns = cfg->duration_ns ? r->measure_ns + cfg->duration_ns : UINT64_MAX;
    atomic_init(&r->tickets, (int64_t)cfg->requests);
    atomic_init(&r->stop, 0);
    for (int i = 0; i < cfg->threads; i++)
        r->workers[i].epfd = -1;
    for (int i = 0; i < cfg->threads; i++)
        if (worker_init(r, &r->workers[i], i, err, errlen) != 0)
            goto err;
    for (int i = 0; i < cfg->threads; i++) {
        int e = pthread_create(&r->workers[i].tid, NULL, worker_main, &r->workers[i]);
        if (e != 0) {
            snprintf(err, errlen, "pthread_create: %s", strerror(e));
            atomic_store(&r->stop, 1);
            goto err;
        }
        r->started++;
    }
    return r;
err:
    for (int i = 0; i < r->started; i++)
        pthread_join(r->workers[i].tid, NULL);
    for (int i = 0; i < cfg->threads; i++)
        worker_free(&r->workers[i]);
    free(r->workers);
    free(r);
    return NULL;
}

uint64_t load_start_ns(const load_run *r)
{
    return r->start_ns;
}

uint64_t load_measure_ns(const load_run *r)
{
    return r->measure_ns;
}

void load_progress_get(load_run *r, load_progress *p)
{
    memset(p, 0, sizeof *p);
    for (int i = 0; i < r->cfg.threads; i++) {
        worker *w = &r->workers[i];
        p->sent += atomic_load_explicit(&w->p_sent, memory_order_relaxed);
        p->answered += atomic_load_explicit(&w->p_answered, memory_order_relaxed);
        p->ok += atomic_load_explicit(&w->p_ok, memory_order_relaxed);
        p->errors += atomic_load_explicit(&w->p_errors, memory_order_relaxed);
    }
}

void load_stop(load_run *r)
{
    atomic_store(&r->stop, 1);
}

int load_finished(load_run *r)
{
    for (int i = 0; i < r->cfg.threads; i++)
        if (!atomic_load(&r->workers[i].finished))
            return 0;
    return 1;
}

static void stats_merge(load_stats *dst, const load_stats *src)
{
    dst->sent += src->sent;
    dst->answered += src->answered;
    dst->ok += src->ok;
    dst->images_ok += src->images_ok;
    dst->unsent += src->unsent;
    for (int i = 0; i < LOAD_STATUS_MAX; i++)
        dst->status[i] += src->status[i];
    for (int i = 0; i < LOAD_ERR_COUNT; i++)
        dst->errors[i] += src->errors[i];
    if (src->last_answer_ns > dst->last_answer_ns)
        dst->last_answer_ns = src->last_answer_ns;
    histogram_merge(&dst->latency, &src->latency);
    histogram_merge(&dst->service, &src->service);
}

void load_finish(load_run *r, load_stats *warm, load_stats *measured)
{
    memset(warm, 0, sizeof *warm);
    memset(measured, 0, sizeof *measured);
    histogram_init(&warm->latency);
    histogram_init(&warm->service);
    histogram_init(&measured->latency);
    histogram_init(&measured->service);
    for (int i = 0; i < r->cfg.threads; i++) {
        pthread_join(r->workers[i].tid, NULL);
        stats_merge(warm, r->workers[i].warm);
        stats_merge(measured, r->workers[i].meas);
        worker_free(&r->workers[i]);
    }
    free(r->workers);
    free(r);
}
