/* Admission (admit.h): the acceptor thread, its pending table and the
 * per-address counts.
 *
 * The thread's epoll set holds the listening socket, an eventfd (stop,
 * quiesce, a slot came free) and the connections still waiting for their
 * first bytes. A connection moves: accepted -> waiting (no byte yet) ->
 * ready (its first bytes are HTTP; out of the epoll set) -> handed over.
 * Both lists are in arrival order, so their heads are the oldest: the
 * timeouts and the eviction of a full table look at the heads only.
 *
 * The address table is preallocated (every connection holds one entry at
 * most), so accepting allocates nothing. */
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
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>
#include "daemon/http/admit.h"
#include "daemon/log.h"
#include "util/clock.h"

#define PRESSURE_TIMEOUT_US 1000000 /* the first byte (and the head, http.c) under pressure */
#define SLOT_WAIT_US 1000000 /* a request waits this long for a slot, then 503 */
#define RETRY_AFTER_S 1
#define ACCEPT_BATCH 256 /* accepts per wake-up: the other events get their turn */
#define PEEK_BYTES 512 /* of the first bytes checked */
#define TICK_MS 100 /* timeouts are checked this often while any wait */

enum { PEND_SPARE, PEND_WAITING, PEND_READY };

typedef struct pend {
    int fd;
    int state; /* which list it is on */
    admit_client *cl;
    uint64_t since_us; /* accepted; once ready, when its bytes came */
    struct sockaddr_storage addr;
    socklen_t alen;
    struct pend *prev, *next;
} pend;

typedef struct plist {
    pend *head, *tail;
    long n;
} plist;

struct admit_client {
    unsigned char key[17]; /* the family's byte, then the address */
    int klen;
    long count;
    admit_client *next;
};

struct admit {
    admit_limits l;
    admit_ops ops;
    int lfd, ep, wake, reserve;
    pthread_t thread;
    int running;
    atomic_int stop, quiesce, listening;
    pend *slots;
    plist spare, waiting, ready; /* the thread's only */
    atomic_long pending; /* waiting + ready, for other threads */
    atomic_long evicting; /* evicted, not yet closed */
    atomic_int wanted; /* requests wait for a slot: a close wakes the thread */
    uint64_t logged_us; /* the last accept error logged */

    pthread_mutex_t mu; /* the address table */
    admit_client **buckets;
    size_t nbuckets;
    admit_client *cpool, *cspare;

    atomic_ullong refused_limit, refused_client, refused_fds, evicted, first_byte_timeout, not_http;
};

/* ---- lists and addresses ---------------------------------------------------- */

static void list_push(plist *l, pend *p, int state)
{
    p->state = state;
    p->next = NULL;
    p->prev = l->tail;
    if (l->tail)
        l->tail->next = p;
    else
        l->head = p;
    l->tail = p;
    l->n++;
}

static void list_remove(plist *l, pend *p)
{
    if (p->prev)
        p->prev->next = p->next;
    else
        l->head = p->next;
    if (p->next)
        p->next->prev = p->prev;
    else
        l->tail = p->prev;
    p->prev = p->next = NULL;
    l->n--;
}

/* An IPv4 address, or an IPv6 /64: one host has a whole /64 to dial
 * from. An IPv4 client of an IPv6 listener is its IPv4 address. */
static int client_key(const struct sockaddr *addr, unsigned char key[17])
{
    if (addr->sa_family == AF_INET) {
        key[0] = 4;
        memcpy(key + 1, &((const struct sockaddr_in *)addr)->sin_addr, 4);
        return 5;
    }
    if (addr->sa_family == AF_INET6) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)addr)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a6)) {
            key[0] = 4;
            memcpy(key + 1, a6->s6_addr + 12, 4);
            return 5;
        }
        key[0] = 6;
        memcpy(key + 1, a6->s6_addr, 8);
        return 9;
    }
    key[0] = 0;
    return 1;
}

static admit_client **bucket(admit *a, const unsigned char *key, int klen)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (int i = 0; i < klen; i++)
        h = (h ^ key[i]) * 16777619u;
    return &a->buckets[h & (a->nbuckets - 1)];
}

static admit_client *client_find(admit *a, const unsigned char *key, int klen)
{
    for (admit_client *c = *bucket(a, key, klen); c; c = c->next)
        if (c->klen == klen && memcmp(c->key, key, (size_t)klen) == 0)
            return c;
    return NULL;
}

/* One more connection from addr; NULL if the table is full, or the
 * address has client_limit already (*over set). */
static admit_client *client_acquire(admit *a, const struct sockaddr *addr, int *over)
{
    *over = 0;
    unsigned char key[17];
    int klen = client_key(addr, key);
    pthread_mutex_lock(&a->mu);
    admit_client *c = client_find(a, key, klen);
    if (!c && (c = a->cspare) != NULL) {
        a->cspare = c->next;
        memcpy(c->key, key, (size_t)klen);
        c->klen = klen;
        c->count = 0;
        admit_client **b = bucket(a, key, klen);
        c->next = *b;
        *b = c;
    }
    if (c && a->l.client_limit > 0 && c->count >= a->l.client_limit) {
        *over = 1;
        c = NULL; /* it holds others: not freed */
    } else if (c) {
        c->count++;
    }
    pthread_mutex_unlock(&a->mu);
    return c;
}

static void client_release(admit *a, admit_client *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&a->mu);
    if (--c->count == 0) {
        admit_client **b = bucket(a, c->key, c->klen);
        while (*b != c)
            b = &(*b)->next;
        *b = c->next;
        c->next = a->cspare;
        a->cspare = c;
    }
    pthread_mutex_unlock(&a->mu);
}

admit_client *admit_client_of(admit *a, const struct sockaddr *addr)
{
    unsigned char key[17];
    int klen = client_key(addr, key);
    pthread_mutex_lock(&a->mu);
    admit_client *c = client_find(a, key, klen);
    pthread_mutex_unlock(&a->mu);
    return c;
}

/* ---- answers ------------------------------------------------------------------ */

size_t admit_error_answer(char *buf, size_t cap, int status, const char *code, const char *message, int v2,
                          int retry_after)
{
    char body[640], retry[40] = "";
    int bl = v2 ? snprintf(body, sizeof body, "{\"error\":\"%s\"}\n", message)
                : snprintf(body, sizeof body, "{\"error\":{\"status\":%d,\"code\":\"%s\",\"message\":\"%s\"}}\n",
                           status, code, message);
    if (bl < 0 || (size_t)bl >= sizeof body)
        return 0;
    if (retry_after > 0)
        snprintf(retry, sizeof retry, "Retry-After: %d\r\n", retry_after);
    const char *reason = MHD_get_reason_phrase_for((unsigned)status);
    int n = snprintf(buf, cap,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s"
                     "Connection: close\r\n\r\n%s",
                     status, reason && *reason ? reason : "Error", bl, retry, body);
    return n < 0 || (size_t)n >= cap ? 0 : (size_t)n;
}

int admit_send(int fd, const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t k = send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        buf += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Closes after the answer: our FIN first, then what the client sent is
 * read (as much as is there), so that the close does not reset the
 * connection and discard the answer at the client. */
static void close_after_answer(int fd)
{
    char sink[4096];
    shutdown(fd, SHUT_WR);
    for (int i = 0; i < 16 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++)
        ;
    close(fd);
}

/* Answers (when it can be read: plain HTTP, or plain bytes on an HTTPS
 * listener) and closes fd. */
static void refuse(admit *a, int fd, int plain, int status, const char *code, const char *message,
                   atomic_ullong *counter)
{
    if (counter)
        atomic_fetch_add(counter, 1); /* before the client can see the answer */
    if (plain) {
        char buf[1024];
        size_t n = admit_error_answer(buf, sizeof buf, status, code, message, 0, status == 503 ? RETRY_AFTER_S : 0);
        if (n > 0)
            (void)admit_send(fd, buf, n);
    }
    close_after_answer(fd);
    (void)a;
}

/* Frees p's slot; its fd is closed here unless handed on (fd < 0). */
static void pend_free(admit *a, plist *from, pend *p)
{
    list_remove(from, p);
    if (p->fd >= 0)
        close(p->fd);
    client_release(a, p->cl);
    p->fd = -1;
    p->cl = NULL;
    list_push(&a->spare, p, PEND_SPARE);
    atomic_fetch_sub(&a->pending, 1);
}

/* ---- the first bytes ------------------------------------------------------------ */

static int tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* NULL when b[0..n) can begin an HTTP/1.x request (or a TLS handshake on
 * an HTTPS listener), else why not. Only the head is looked at: a small
 * request's body may follow in the same bytes. */
static const char *not_http(const unsigned char *b, size_t n, int tls)
{
    if (tls)
        return b[0] == 0x16 ? NULL : "this port speaks HTTPS: use https://";
    if (b[0] == 0x16)
        return "a TLS handshake on a plain HTTP port: use http://";
    size_t i = 0;
    while (i + 1 < n && b[i] == '\r' && b[i + 1] == '\n') /* empty lines before a request are allowed */
        i += 2;
    size_t method = i;
    for (; i < n && b[i] != ' '; i++)
        if (!tchar(b[i]))
            return "these bytes are not an HTTP/1.x request (no method at the start)";
    if (i < n && i == method)
        return "these bytes are not an HTTP/1.x request (no method at the start)";
    for (size_t j = method; j < n; j++) {
        if (j + 3 < n && memcmp(b + j, "\r\n\r\n", 4) == 0)
            break;
        if (b[j] == '\r' && j + 1 < n && b[j + 1] != '\n')
            return "a bare CR (not followed by LF) in the request head";
        if (b[j] == '\0')
            return "a NUL byte in the request head";
    }
    return NULL;
}

/* ---- the thread ------------------------------------------------------------------ */

int admit_pressure(admit *a)
{
    return atomic_load(&a->pending) * 2 >= a->l.pending_limit ||
           a->ops.open(a->ops.cls) * 4 >= a->l.connection_limit * 3;
}

static void take(admit *a, int fd, const struct sockaddr_storage *addr, socklen_t alen)
{
    int plain = !a->l.tls, over;
    admit_client *cl = client_acquire(a, (const struct sockaddr *)addr, &over);
    if (over) {
        refuse(a, fd, plain, 503, "client_connection_limit",
               "this address has client_connection_limit connections open or opening; retry later", &a->refused_client);
        return;
    }
    if (!cl) {
        refuse(a, fd, plain, 503, "connection_limit", "too many connections; retry later", &a->refused_limit);
        return;
    }
    if (!a->spare.head && a->waiting.head) { /* the table is full: its oldest silent one goes */
        atomic_fetch_add(&a->evicted, 1); /* counted before the client can see the close */
        pend_free(a, &a->waiting, a->waiting.head);
    }
    pend *p = a->spare.head;
    if (!p) { /* full of requests waiting for a slot */
        client_release(a, cl);
        refuse(a, fd, plain, 503, "connection_limit", "too many connections; retry later", &a->refused_limit);
        return;
    }
    list_remove(&a->spare, p);
    p->fd = fd;
    p->cl = cl;
    p->since_us = clock_now_us();
    memcpy(&p->addr, addr, alen);
    p->alen = alen;
    list_push(&a->waiting, p, PEND_WAITING);
    atomic_fetch_add(&a->pending, 1);
    struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.ptr = p };
    if (epoll_ctl(a->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
        log_error("epoll_ctl: %s", strerror(errno));
        pend_free(a, &a->waiting, p);
    }
}

static void accept_all(admit *a)
{
    for (int i = 0; i < ACCEPT_BATCH && a->lfd >= 0; i++) {
        struct sockaddr_storage addr;
        socklen_t alen = sizeof addr;
        int fd = accept4(a->lfd, (struct sockaddr *)&addr, &alen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            take(a, fd, &addr, alen);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
            continue;
        if (errno == EMFILE || errno == ENFILE) {
            /* Out of descriptors: the spare one lets this client hear why;
             * without it the listening socket would wake the thread again
             * at once, so it pauses. */
            if (a->reserve >= 0) {
                close(a->reserve);
                a->reserve = -1;
                fd = accept4(a->lfd, (struct sockaddr *)&addr, &alen, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd >= 0)
                    refuse(a, fd, !a->l.tls, 503, "no_descriptors",
                           "the server is out of file descriptors; retry later", &a->refused_fds);
                a->reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
            } else {
                usleep(10000);
                a->reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
            }
        } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
            /* ENOBUFS, ENOMEM: the listening socket stays readable, so
             * the thread would spin; it pauses, and logs once a second. */
            uint64_t now = clock_now_us();
            if (now - a->logged_us >= 1000000) {
                log_error("accept: %s", strerror(errno));
                a->logged_us = now;
            }
            usleep(10000);
        }
        return;
    }
}

static void readable(admit *a, pend *p)
{
    unsigned char b[PEEK_BYTES];
    ssize_t n = recv(p->fd, b, sizeof b, MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0) { /* closed before a byte: nothing to answer */
        pend_free(a, &a->waiting, p);
        return;
    }
    const char *why = not_http(b, (size_t)n, a->l.tls);
    if (why) {
        int fd = p->fd;
        p->fd = -1;
        pend_free(a, &a->waiting, p);
        refuse(a, fd, 1, 400, "not_http", why, &a->not_http);
        return;
    }
    if (epoll_ctl(a->ep, EPOLL_CTL_DEL, p->fd, NULL) != 0)
        log_error("epoll_ctl: %s", strerror(errno));
    list_remove(&a->waiting, p);
    p->since_us = clock_now_us();
    list_push(&a->ready, p, PEND_READY);
}

static void expire(admit *a, uint64_t now)
{
    uint64_t first = a->l.header_timeout_us;
    if (admit_pressure(a) && first > PRESSURE_TIMEOUT_US)
        first = PRESSURE_TIMEOUT_US;
    while (a->waiting.head && now - a->waiting.head->since_us >= first) {
        atomic_fetch_add(&a->first_byte_timeout, 1);
        pend_free(a, &a->waiting, a->waiting.head);
    }
    while (a->ready.head && now - a->ready.head->since_us >= SLOT_WAIT_US) {
        pend *p = a->ready.head;
        int fd = p->fd;
        p->fd = -1;
        pend_free(a, &a->ready, p);
        refuse(a, fd, !a->l.tls, 503, "connection_limit", "too many connections; retry later", &a->refused_limit);
    }
}

static void hand_over_ready(admit *a)
{
    while (a->ready.head && a->ops.open(a->ops.cls) < a->l.connection_limit) {
        pend *p = a->ready.head;
        int fd = p->fd;
        admit_client *cl = p->cl;
        struct sockaddr_storage addr = p->addr;
        socklen_t alen = p->alen;
        p->fd = -1;
        p->cl = NULL; /* the connection keeps its count until admit_closed */
        pend_free(a, &a->ready, p);
        if (a->ops.hand_over(a->ops.cls, fd, (struct sockaddr *)&addr, alen) != 0)
            client_release(a, cl);
    }
    if (a->ready.head) {
        long want = a->ready.n - atomic_load(&a->evicting);
        if (want > 0)
            atomic_fetch_add(&a->evicted, (unsigned long long)a->ops.evict(a->ops.cls, want));
    }
    atomic_store(&a->wanted, a->ready.head != NULL);
}

static void *admit_main(void *arg)
{
    admit *a = arg;
    struct epoll_event ev[64];
    while (!atomic_load(&a->stop)) {
        if (atomic_load(&a->quiesce) && a->lfd >= 0) {
            epoll_ctl(a->ep, EPOLL_CTL_DEL, a->lfd, NULL);
            close(a->lfd);
            a->lfd = -1;
            atomic_store(&a->listening, 0);
        }
        int n = epoll_wait(a->ep, ev, 64, a->waiting.n + a->ready.n > 0 ? TICK_MS : -1);
        if (n < 0 && errno != EINTR) {
            log_error("epoll_wait: %s", strerror(errno));
            usleep(10000);
        }
        for (int i = 0; i < n; i++) {
            void *tag = ev[i].data.ptr;
            if (tag == &a->lfd) {
                accept_all(a);
            } else if (tag == &a->wake) {
                uint64_t v;
                if (read(a->wake, &v, sizeof v) < 0 && errno != EAGAIN)
                    log_error("eventfd: %s", strerror(errno));
            } else {
                pend *p = tag;
                if (p->state == PEND_WAITING) /* not freed or moved earlier in this batch */
                    readable(a, p);
            }
        }
        expire(a, clock_now_us());
        hand_over_ready(a);
    }
    return NULL;
}

static void wake(admit *a)
{
    uint64_t one = 1;
    if (write(a->wake, &one, sizeof one) < 0 && errno != EAGAIN)
        log_error("eventfd: %s", strerror(errno));
}

void admit_evicting(admit *a)
{
    atomic_fetch_add(&a->evicting, 1);
}

void admit_closed(admit *a, admit_client *cl, int evicted)
{
    client_release(a, cl);
    if (evicted)
        atomic_fetch_sub(&a->evicting, 1);
    if (atomic_load(&a->wanted))
        wake(a);
}

/* ---- start and stop -------------------------------------------------------------- */

int admit_start(admit **slot, int lfd, const admit_limits *l, const admit_ops *ops, char *err, size_t errlen)
{
    admit *a = calloc(1, sizeof *a);
    *slot = NULL;
    if (!a) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    a->l = *l;
    if (a->l.pending_limit < 1)
        a->l.pending_limit = a->l.connection_limit;
    a->ops = *ops;
    a->lfd = lfd;
    a->ep = a->wake = a->reserve = -1;
    /* Every connection, pending or open (evicted ones until closed), holds
     * one entry at most. */
    size_t nclients = (size_t)a->l.connection_limit * 2 + (size_t)a->l.pending_limit + 64;
    a->nbuckets = 64;
    while (a->nbuckets < nclients * 2)
        a->nbuckets *= 2;
    a->slots = calloc((size_t)a->l.pending_limit, sizeof *a->slots);
    a->cpool = calloc(nclients, sizeof *a->cpool);
    a->buckets = calloc(a->nbuckets, sizeof *a->buckets);
    if (!a->slots || !a->cpool || !a->buckets || pthread_mutex_init(&a->mu, NULL) != 0) {
        snprintf(err, errlen, "out of memory for %ld pending connections", a->l.pending_limit);
        free(a->slots);
        free(a->cpool);
        free(a->buckets);
        free(a);
        return -1;
    }
    for (long i = 0; i < a->l.pending_limit; i++) {
        a->slots[i].fd = -1;
        list_push(&a->spare, &a->slots[i], PEND_SPARE);
    }
    for (size_t i = 0; i < nclients; i++) {
        a->cpool[i].next = a->cspare;
        a->cspare = &a->cpool[i];
    }
    a->ep = epoll_create1(EPOLL_CLOEXEC);
    a->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    a->reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
    struct epoll_event le = { .events = EPOLLIN, .data.ptr = &a->lfd };
    struct epoll_event we = { .events = EPOLLIN, .data.ptr = &a->wake };
    if (a->ep < 0 || a->wake < 0 || a->reserve < 0 || epoll_ctl(a->ep, EPOLL_CTL_ADD, lfd, &le) != 0 ||
        epoll_ctl(a->ep, EPOLL_CTL_ADD, a->wake, &we) != 0) {
        snprintf(err, errlen, "the acceptor's epoll set: %s", strerror(errno));
        a->lfd = -1; /* the caller's still */
        admit_free(a);
        return -1;
    }
    atomic_store(&a->listening, 1);
    *slot = a;
    if (pthread_create(&a->thread, NULL, admit_main, a) != 0) {
        snprintf(err, errlen, "cannot start the acceptor thread");
        *slot = NULL;
        a->lfd = -1;
        admit_free(a);
        return -1;
    }
    a->running = 1;
    return 0;
}

void admit_quiesce(admit *a)
{
    atomic_store(&a->quiesce, 1);
    wake(a);
    /* Closed when this returns, as a caller expects of a listening socket. */
    for (int i = 0; i < 1000 && atomic_load(&a->listening); i++)
        usleep(1000);
}

void admit_stop(admit *a)
{
    if (!a)
        return;
    if (a->running) {
        atomic_store(&a->stop, 1);
        wake(a);
        pthread_join(a->thread, NULL);
        a->running = 0;
    }
    while (a->waiting.head)
        pend_free(a, &a->waiting, a->waiting.head);
    while (a->ready.head) { /* they sent a request: it is answered */
        pend *p = a->ready.head;
        int fd = p->fd;
        p->fd = -1;
        pend_free(a, &a->ready, p);
        refuse(a, fd, !a->l.tls, 503, "shutting_down", "the server is shutting down", NULL);
    }
    if (a->lfd >= 0)
        close(a->lfd);
    a->lfd = -1;
    atomic_store(&a->listening, 0);
}

void admit_free(admit *a)
{
    if (!a)
        return;
    admit_stop(a);
    if (a->ep >= 0)
        close(a->ep);
    if (a->wake >= 0)
        close(a->wake);
    if (a->reserve >= 0)
        close(a->reserve);
    pthread_mutex_destroy(&a->mu);
    free(a->slots);
    free(a->cpool);
    free(a->buckets);
    free(a);
}

void admit_counters_get(admit *a, admit_counters *out)
{
    out->refused_limit = atomic_load(&a->refused_limit);
    out->refused_client = atomic_load(&a->refused_client);
    out->refused_fds = atomic_load(&a->refused_fds);
    out->evicted = atomic_load(&a->evicted);
    out->first_byte_timeout = atomic_load(&a->first_byte_timeout);
    out->not_http = atomic_load(&a->not_http);
    out->pending = atomic_load(&a->pending);
}
