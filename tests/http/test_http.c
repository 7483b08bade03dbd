/* Tests daemon/http/http.c (the HTTP layer on libmicrohttpd) on loopback
 * sockets with a small handler: the head as the handler sees it (path and
 * query decoded, headers), keep-alive and pipelining, 100-continue, HEAD,
 * answers from another thread (also a wake before the wait), the
 * refusals libmicrohttpd answers itself (status, connection closed, the
 * handler never called), slow clients closed, the connection limit, and
 * done() once per request. */
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "daemon/http/http.h"
#include "daemon/api/request.h"
#include "tests/lib/testutil.h"

/* ---- the layer on loopback ----------------------------------------------- */

typedef struct ctx {
    atomic_int requests, dones, delivered, slow;
    pthread_mutex_t mu;
    http_conn *later; /* /later: answered from another thread */
} ctx;

typedef struct req {
    ctx *x;
    char path[64];
    char seen[256]; /* /echo: the head as the handler saw it */
    size_t body;
} req;

static void answer(http_conn *c, int status, const char *text, int close_conn)
{
    http_response r = {
        .status = status, .body = strdup(text), .len = strlen(text), .content_type = "text/plain", .close = close_conn
    };
    ck_assert_ptr_nonnull(r.body);
    http_respond(c, &r);
}

static void *on_request(void *cls, http_conn *c, const http_head *h)
{
    ctx *x = cls;
    req *r = calloc(1, sizeof *r);
    ck_assert_ptr_nonnull(r);
    r->x = x;
    snprintf(r->path, sizeof r->path, "%s", h->path);
    atomic_fetch_add(&x->requests, 1);
    if (h->status) {
        char msg[160];
        snprintf(msg, sizeof msg, "refused %d %s: %s", h->status, h->code, h->message);
        answer(c, h->status, msg, 1);
    } else if (strcmp(h->path, "/echo me") == 0) {
        const char *k = http_arg(h, "top_k"), *a = http_arg(h, "a"), *xh = http_header(h, "x-thing");
        snprintf(r->seen, sizeof r->seen, "%s %s 1.%d top_k=%s a=%s x-thing=%s nargs=%d chunked=%d cl=%llu", h->method,
                 h->path, h->minor, k ? k : "-", a ? a : "-", xh ? xh : "-", h->nargs, h->chunked,
                 (unsigned long long)h->content_length);
    } else if (strcmp(h->path, "/early") == 0) {
        answer(c, 413, "early", 1); /* before reading the body */
    } else if (strcmp(h->path, "/later") == 0) {
        pthread_mutex_lock(&x->mu);
        x->later = c;
        pthread_mutex_unlock(&x->mu);
    }
    return r;
}

static void on_body(void *cls, http_conn *c, void *rq, const char *data, size_t n)
{
    (void)cls;
    (void)c;
    (void)data;
    ((req *)rq)->body += n;
}

static void on_body_end(void *cls, http_conn *c, void *rq)
{
    (void)cls;
    req *r = rq;
    if (strcmp(r->path, "/later") == 0)
        return; /* the test thread wakes it */
    if (strcmp(r->path, "/soon") == 0) {
        http_wake(c); /* a wake before the layer starts waiting */
        return;
    }
    char msg[400];
    snprintf(msg, sizeof msg, "%s %zu%s%s", r->path, r->body, r->seen[0] ? " " : "", r->seen);
    answer(c, 200, msg, 0);
}

static void on_wake(void *cls, http_conn *c, void *rq)
{
    (void)cls;
    req *r = rq;
    char msg[96];
    snprintf(msg, sizeof msg, "woken %zu", r->body);
    answer(c, 200, msg, 0);
}

static void on_done(void *cls, void *rq, http_end how)
{
    ctx *x = cls;
    atomic_fetch_add(&x->dones, 1);
    if (how == HTTP_END_SLOW)
        atomic_fetch_add(&x->slow, 1);
    if (how == HTTP_END_DELIVERED)
        atomic_fetch_add(&x->delivered, 1);
    free(rq);
}

static ctx X;
static http_server *srv;

static void start(uint64_t header_timeout_us, long limit, size_t conn_memory)
{
    memset(&X, 0, sizeof X);
    pthread_mutex_init(&X.mu, NULL);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    http_limits l = { .threads = 2,
                      .connection_limit = limit,
                      .header_timeout_us = header_timeout_us,
                      .min_rate = 1000,
                      .idle_timeout_us = 5000000,
                      .conn_memory = conn_memory,
                      .backlog = 64 };
    http_handler h = { .cls = &X,
                       .request = on_request,
                       .body = on_body,
                       .body_end = on_body_end,
                       .wake = on_wake,
                       .done = on_done,
                       .unescape = request_unescape };
    char err[256];
    srv = http_start((struct sockaddr *)&a, sizeof a, &l, &h, err, sizeof err);
    ck_assert_msg(srv != NULL, "%s", err);
}

static void stop(void)
{
    http_stop(srv);
    /* Every request the layer took was ended once. */
    ck_assert_int_eq(atomic_load(&X.dones), atomic_load(&X.requests));
    pthread_mutex_destroy(&X.mu);
}

static int dial(void)
{
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                             .sin_port = htons((uint16_t)http_port(srv)) };
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void put(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        ck_assert_int_gt(k, 0);
        s += k;
        n -= (size_t)k;
    }
}

static void puts_(int fd, const char *s)
{
    put(fd, s, strlen(s));
}

/* Reads until want answers are complete (by Content-Length; want < 0:
 * all that comes), the peer closes, or limit_ms; returns the bytes
 * (static) and sets *closed (1: closed, 2: reset). */
static char rbuf[1 << 20];
static const char *get(int fd, int want, int limit_ms, int *closed)
{
    size_t n = 0;
    *closed = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int got = 0;
        const char *p = rbuf;
        rbuf[n] = '\0';
        for (;;) {
            const char *e = strstr(p, "\r\n\r\n");
            if (!e)
                break;
            const char *cl = strstr(p, "Content-Length: ");
            if (strncmp(p, "HTTP/1.1 100", 12) == 0) {
                p = e + 4;
                continue;
            }
            size_t len = cl && cl < e ? strtoul(cl + 16, NULL, 10) : 0;
            if ((size_t)(e + 4 - rbuf) + len > n)
                break;
            got++;
            p = e + 4 + len;
        }
        if (want >= 0 && got >= want)
            return rbuf;
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        int left = limit_ms - (int)((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
        struct pollfd pf = { .fd = fd, .events = POLLIN };
        if (left <= 0 || poll(&pf, 1, left) != 1)
            return rbuf;
        ssize_t k = recv(fd, rbuf + n, sizeof rbuf - 1 - n, 0);
        if (k <= 0) {
            *closed = k == 0 ? 1 : 2; /* 2: reset */
            rbuf[n] = '\0';
            return rbuf;
        }
        n += (size_t)k;
    }
}

static int count(const char *hay, const char *needle)
{
    int k = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        k++;
    return k;
}

START_TEST(the_head_reaches_the_handler_decoded)
{
    start(5000000, 100, 65536);
    int fd = dial(), closed;
    puts_(fd, "POST /echo%20me?top_k=3&a=b+c%21 HTTP/1.1\r\nHost: x\r\nX-Thing:  v w \r\n"
              "Content-Length: 2\r\n\r\nhi");
    const char *r = get(fd, 1, 5000, &closed);
    ck_assert_msg(strstr(r, "/echo me 2 POST /echo me 1.1 top_k=3 a=b c! x-thing=v w nargs=2 chunked=0 cl=2"), "%s", r);
    puts_(fd, "POST /echo%20me HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
              "2\r\nab\r\n1\r\nc\r\n0\r\n\r\n");
    r = get(fd, 1, 5000, &closed);
    ck_assert_msg(strstr(r, "/echo me 3 POST /echo me 1.1 top_k=- a=- x-thing=- nargs=0 chunked=1 cl=0"), "%s", r);
    close(fd);
    stop();
    ck_assert_int_eq(atomic_load(&X.delivered), 2);
}
END_TEST

START_TEST(keep_alive_pipelining_continue_and_head)
{
    start(5000000, 100, 65536);
    int fd = dial(), closed;
    puts_(fd, "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
              "POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
              "GET /c HTTP/1.1\r\nHost: x\r\n\r\n");
    const char *r = get(fd, 3, 5000, &closed);
    ck_assert_msg(strstr(r, "/a 5") && strstr(r, "/b 3") && strstr(r, "/c 0"), "%s", r);
    ck_assert(strstr(r, "/a 5") < strstr(r, "/b 3") && strstr(r, "/b 3") < strstr(r, "/c 0"));
    ck_assert_int_eq(count(r, "Connection: close"), 0);
    ck_assert_int_eq(closed, 0);
    /* 100-continue before the body; then HEAD: headers only. */
    puts_(fd, "POST /d HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n");
    r = get(fd, -1, 300, &closed);
    ck_assert_msg(strcmp(r, "HTTP/1.1 100 Continue\r\n\r\n") == 0, "%s", r);
    puts_(fd, "abcd");
    r = get(fd, 1, 5000, &closed);
    ck_assert_msg(strstr(r, "/d 4"), "%s", r);
    puts_(fd, "HEAD /e HTTP/1.1\r\nHost: x\r\n\r\n");
    r = get(fd, -1, 500, &closed);
    ck_assert_msg(strstr(r, "Content-Length: 4\r\n") && !strstr(r, "/e 0"), "%s", r);
    /* An HTTP/1.0 client without keep-alive: answered, then closed. */
    puts_(fd, "GET /f HTTP/1.0\r\n\r\n");
    r = get(fd, 2, 5000, &closed);
    ck_assert_msg(strstr(r, "/f 0") && strstr(r, "Connection: close"), "%s", r);
    get(fd, 99, 2000, &closed);
    ck_assert_int_eq(closed, 1);
    close(fd);
    /* Once quiesced, a kept-alive connection closes after its answer. */
    fd = dial();
    puts_(fd, "GET /g HTTP/1.1\r\nHost: x\r\n\r\n");
    r = get(fd, 1, 5000, &closed);
    ck_assert_msg(strstr(r, "/g 0") && !strstr(r, "Connection: close"), "%s", r);
    http_quiesce(srv);
    puts_(fd, "GET /h HTTP/1.1\r\nHost: x\r\n\r\n");
    r = get(fd, 1, 5000, &closed);
    ck_assert_msg(strstr(r, "/h 0") && strstr(r, "Connection: close"), "%s", r);
    close(fd);
    stop();
    ck_assert_int_eq(atomic_load(&X.delivered), 8);
}
END_TEST

START_TEST(answers_come_from_other_threads)
{
    start(5000000, 100, 65536);
    int fd = dial(), closed;
    puts_(fd, "POST /later HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nxyz");
    http_conn *c = NULL;
    for (int i = 0; i < 500 && !c; i++) {
        pthread_mutex_lock(&X.mu);
        c = X.later;
        pthread_mutex_unlock(&X.mu);
        usleep(2000);
    }
    ck_assert_ptr_nonnull(c);
    usleep(50000);
    ck_assert_str_eq(get(fd, 1, 100, &closed), ""); /* held until woken */
    http_wake(c);
    const char *r = get(fd, 1, 5000, &closed);
    ck_assert_msg(strstr(r, "woken 3"), "%s", r);
    /* Woken from inside body_end, before the layer suspends it. */
    puts_(fd, "POST /soon HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab");
    r = get(fd, 1, 5000, &closed);
    ck_assert_msg(strstr(r, "woken 2"), "%s", r);
    close(fd);
    stop();
}
END_TEST

START_TEST(refusals_libmicrohttpd_answers)
{
    start(5000000, 100, 16384);
    int closed;
    struct {
        const char *what;
        int status;
    } cases[] = {
        { "GET /x HTTP/2.0\r\nHost: x\r\n\r\n", 505 },
        { "GET /x HTTP/1.1\r\n\r\n", 400 },
        { "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", 400 },
        /* Refused by the layer, answered by the handler. */
        { "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nhello", 501 },
        { "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501 },
        { "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 10\r\n\r\nhello", 400 },
        { "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
          "5\r\nhello\r\n0\r\n\r\n",
          400 },
        { "POST /x HTTP/1.1\r\nHost: x\r\nExpect: bananas\r\nContent-Length: 5\r\n\r\nhello", 417 },
        { "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"
          "0\r\n\r\n",
          400 },
    };
    int by_layer = 6;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int fd = dial();
        puts_(fd, cases[i].what);
        const char *r = get(fd, 1, 5000, &closed);
        char want[32];
        snprintf(want, sizeof want, "HTTP/1.1 %d ", cases[i].status);
        ck_assert_msg(strncmp(r, want, strlen(want)) == 0 && strstr(r, "Connection: close"), "%s -> %s", cases[i].what,
                      r);
        ck_assert_msg((strstr(r, "refused ") != NULL) == (i >= sizeof cases / sizeof cases[0] - (size_t)by_layer),
                      "%s -> %s", cases[i].what, r);
        close(fd);
    }
    /* A request line longer than the connection's memory: 414; header
     * fields too large: 431. */
    static char big[40000];
    memset(big, 'a', sizeof big - 1);
    int fd = dial();
    puts_(fd, "GET /");
    put(fd, big, 20000);
    const char *r = get(fd, 1, 5000, &closed);
    ck_assert_msg(strncmp(r, "HTTP/1.1 414 ", 13) == 0, "%.200s", r);
    close(fd);
    fd = dial();
    puts_(fd, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: ");
    put(fd, big, 20000);
    r = get(fd, 1, 5000, &closed);
    ck_assert_msg(strncmp(r, "HTTP/1.1 431 ", 13) == 0, "%.200s", r);
    close(fd);
    /* Answered before its body: the answer arrives, and the connection
     * closes (libmicrohttpd does not drain the rest: it may reset). */
    fd = dial();
    puts_(fd, "POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: 30000\r\n\r\n");
    put(fd, big, 30000);
    r = get(fd, 1, 5000, &closed);
    ck_assert_msg(strncmp(r, "HTTP/1.1 413 ", 13) == 0 && strstr(r, "early"), "%.200s", r);
    get(fd, 99, 3000, &closed);
    ck_assert_int_ne(closed, 0);
    close(fd);
    stop();
}
END_TEST

START_TEST(slow_and_idle_clients_and_the_limit)
{
    start(300000, 3, 65536);
    int closed;
    int idle = dial(), slow = dial(), body = dial();
    puts_(slow, "GET /slow HTTP/1.1\r\nHo");
    puts_(body, "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nab");
    /* A fourth that sends nothing waits outside the limit, and is closed
     * at its first-byte timeout without an answer. */
    int over = dial();
    const char *o = get(over, 1, 2000, &closed);
    ck_assert_msg(closed == 1 && o[0] == '\0', "%s", o);
    close(over);
    /* Slow clients are closed without an answer (they would not read it). */
    const char *r = get(slow, 1, 3000, &closed);
    ck_assert_msg(closed && r[0] == '\0', "%s", r);
    close(slow);
    /* The body's grace is header_timeout; then 1000 bytes/s are due. */
    r = get(body, 1, 4000, &closed);
    ck_assert_msg(closed && r[0] == '\0', "%s", r);
    close(body);
    r = get(idle, 1, 3000, &closed);
    ck_assert_msg(closed && r[0] == '\0', "%s", r); /* nothing to answer */
    close(idle);
    /* Each of the four was closed as slow, silent (a first-byte timeout)
     * or evicted (the oldest silent one when the table of three filled),
     * and counted; the last count may trail the last close. */
    http_counters hc;
    for (int i = 0; i < 100; i++) {
        http_counters_get(srv, &hc);
        if (http_dropped_slow(srv) + hc.evicted >= 4)
            break;
        usleep(10000);
    }
    ck_assert_msg(http_dropped_slow(srv) + hc.evicted >= 4, "dropped_slow %llu, first_byte_timeout %llu, evicted %llu",
                  http_dropped_slow(srv), hc.first_byte_timeout, hc.evicted);
    /* A client that resets mid-body: its request ends, undelivered. It
     * dials once the server has let the three go: before, it was over the
     * limit and closed at once when the server had not yet seen idle's close
     * (distcheck, 2026-11-24: requests stayed 2). */
    for (int i = 0; i < 200 && http_connections(srv) > 0; i++)
        usleep(10000);
    int reset = dial();
    puts_(reset, "POST /r HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nab");
    /* Reset only once the server has the request: a reset before it reads
     * the head discards the bytes, and there is no request to end (a fixed
     * 100 ms sleep lost that race under distcheck's load). */
    for (int i = 0; i < 500 && atomic_load(&X.requests) < 2; i++)
        usleep(10000);
    ck_assert_int_eq(atomic_load(&X.requests), 2);
    usleep(20000); /* and its first body bytes */
    struct linger lg = { 1, 0 };
    ck_assert_int_eq(setsockopt(reset, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
    close(reset);
    for (int i = 0; i < 200 && http_connections(srv) > 0; i++)
        usleep(10000);
    ck_assert_int_eq(http_connections(srv), 0);
    stop();
    ck_assert_int_eq(atomic_load(&X.requests), 2); /* body (closed), reset: the slow head never came */
    ck_assert_int_eq(atomic_load(&X.delivered), 0);
    ck_assert_int_eq(atomic_load(&X.slow), 1); /* body; the reset one is gone */
}
END_TEST

static Suite *http_suite(void)
{
    Suite *s = suite_create("http");
    TCase *l = tcase_create("layer");
    tcase_add_test(l, the_head_reaches_the_handler_decoded);
    tcase_add_test(l, keep_alive_pipelining_continue_and_head);
    tcase_add_test(l, answers_come_from_other_threads);
    tcase_add_test(l, refusals_libmicrohttpd_answers);
    tcase_add_test(l, slow_and_idle_clients_and_the_limit);
    tcase_set_timeout(l, 60);
    suite_add_tcase(s, l);
    return s;
}

int main(void)
{
    return testutil_run(http_suite());
}
