/* The connection table (a doubly linked list under one mutex) and the
 * reaper thread that scans it a few times a second. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include "daemon/conn.h"
#include "daemon/log.h"
#include "model/clock.h"

/* How often the reaper looks: a slow client outlives its bound by at most
 * this much. */
#define REAP_INTERVAL_MS 200

struct conn {
    conn *prev, *next;
    int fd;
    conn_phase phase;
    uint64_t since_us;
    uint64_t body_bytes;
    int dropped;
};

struct conn_table {
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* the reaper sleeps here; stop wakes it */
    conn *head;
    long count;
    unsigned long long dropped_total;
    conn_limits limits;
    int stopping;
    pthread_t reaper;
};

conn_verdict conn_judge(const conn_limits *l, conn_phase phase, uint64_t since_us, uint64_t body_bytes,
                        uint64_t now_us)
{
    uint64_t elapsed = now_us > since_us ? now_us - since_us : 0;
    if (phase == CONN_HEADERS)
        return elapsed > l->header_timeout_us ? CONN_SLOW_HEADERS : CONN_OK;
    if (phase == CONN_BODY && l->min_rate > 0 && elapsed > l->header_timeout_us &&
        body_bytes < l->min_rate * (elapsed / 1000) / 1000)
        return CONN_SLOW_BODY;
    return CONN_OK;
}

static void reap(conn_table *t, uint64_t now)
{
    for (conn *c = t->head; c; c = c->next) {
        if (c->dropped || conn_judge(&t->limits, c->phase, c->since_us, c->body_bytes, now) == CONN_OK)
            continue;
        c->dropped = 1;
        t->dropped_total++;
        /* ENOTCONN: the client already went; libmicrohttpd will notice. */
        if (shutdown(c->fd, SHUT_RDWR) != 0 && errno != ENOTCONN)
            log_warn("dropping a slow connection: shutdown: %s", strerror(errno));
    }
}

static void *reaper_main(void *arg)
{
    conn_table *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += REAP_INTERVAL_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&t->cv, &t->mu, &ts);
        if (!t->stopping)
            reap(t, clock_now_us());
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

conn_table *conn_table_start(const conn_limits *l, char *err, size_t errlen)
{
    int rc = 0, have_mu = 0, have_cv = 0;
    conn_table *t = calloc(1, sizeof *t);
    if (!t)
        goto err;
    t->limits = *l;
    if ((rc = pthread_mutex_init(&t->mu, NULL)) != 0)
        goto err;
    have_mu = 1;
    if ((rc = pthread_cond_init(&t->cv, NULL)) != 0)
        goto err;
    have_cv = 1;
    if ((rc = pthread_create(&t->reaper, NULL, reaper_main, t)) != 0)
        goto err;
    return t;
err:
    snprintf(err, errlen, "connections: cannot start the slow-client reaper: %s",
             rc ? strerror(rc) : "out of memory");
    if (have_cv)
        pthread_cond_destroy(&t->cv);
    if (have_mu)
        pthread_mutex_destroy(&t->mu);
    free(t);
    return NULL;
}

void conn_table_stop(conn_table *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->stopping = 1;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->reaper, NULL);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

conn *conn_open(conn_table *t, int fd)
{
    conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->fd = fd;
    c->phase = CONN_HEADERS;
    c->since_us = clock_now_us();
    pthread_mutex_lock(&t->mu);
    c->next = t->head;
    if (t->head)
        t->head->prev = c;
    t->head = c;
    t->count++;
    pthread_mutex_unlock(&t->mu);
    return c;
}

void conn_close(conn_table *t, conn *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&t->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        t->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    t->count--;
    pthread_mutex_unlock(&t->mu);
    free(c);
}

void conn_set_phase(conn_table *t, conn *c, conn_phase p)
{
    if (!c)
        return;
    uint64_t now = clock_now_us();
    pthread_mutex_lock(&t->mu);
    c->phase = p;
    c->since_us = now;
    c->body_bytes = 0;
    pthread_mutex_unlock(&t->mu);
}

void conn_add_body(conn_table *t, conn *c, size_t n)
{
    if (!c)
        return;
    pthread_mutex_lock(&t->mu);
    c->body_bytes += n;
    pthread_mutex_unlock(&t->mu);
}

int conn_dropped(conn_table *t, conn *c)
{
    if (!c)
        return 0;
    pthread_mutex_lock(&t->mu);
    int d = c->dropped;
    pthread_mutex_unlock(&t->mu);
    return d;
}

long conn_count(conn_table *t)
{
    pthread_mutex_lock(&t->mu);
    long n = t->count;
    pthread_mutex_unlock(&t->mu);
    return n;
}

unsigned long long conn_dropped_total(conn_table *t)
{
    pthread_mutex_lock(&t->mu);
    unsigned long long n = t->dropped_total;
    pthread_mutex_unlock(&t->mu);
    return n;
}
