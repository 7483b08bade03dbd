/* The access log's buffer and writer thread: see accesslog.h. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "daemon/http/accesslog.h"

#define BUF_BYTES (1u << 20)

struct accesslog {
    int fd;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *buf, *out; /* [BUF_BYTES] each: filled by requests; being written */
    size_t len;
    unsigned long long dropped; /* lines not queued since the last report */
    int stopping;
    pthread_t writer;
};

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* a full disk: the lines are lost, the daemon serves on */
        p += w;
        n -= (size_t)w;
    }
}

static void *writer_main(void *arg)
{
    accesslog *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (a->len == 0 && !a->stopping)
            pthread_cond_wait(&a->cv, &a->mu);
        /* Swap the buffers: requests fill the other while this one is written. */
        char *full = a->buf;
        size_t n = a->len;
        a->buf = a->out;
        a->out = full;
        a->len = 0;
        int stop = a->stopping;
        pthread_mutex_unlock(&a->mu);
        write_all(a->fd, a->out, n);
        if (stop)
            return NULL;
        pthread_mutex_lock(&a->mu);
    }
}

accesslog *accesslog_open(const char *path, char *err, size_t errlen)
{
    accesslog *a = calloc(1, sizeof *a);
    if (!a || !(a->buf = malloc(BUF_BYTES)) || !(a->out = malloc(BUF_BYTES))) {
        snprintf(err, errlen, "access log: out of memory");
        goto fail_mem;
    }
    a->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (a->fd < 0) {
        snprintf(err, errlen, "access log %s: %s", path, strerror(errno));
        goto fail_mem;
    }
    if (pthread_mutex_init(&a->mu, NULL) != 0 || pthread_cond_init(&a->cv, NULL) != 0) {
        snprintf(err, errlen, "access log: cannot create a lock");
        close(a->fd);
        goto fail_mem;
    }
    int rc = pthread_create(&a->writer, NULL, writer_main, a);
    if (rc != 0) {
        snprintf(err, errlen, "access log: cannot start its writer: %s", strerror(rc));
        pthread_mutex_destroy(&a->mu);
        pthread_cond_destroy(&a->cv);
        close(a->fd);
        goto fail_mem;
    }
    return a;
fail_mem:
    if (a) {
        free(a->buf);
        free(a->out);
    }
    free(a);
    return NULL;
}

/* Appends a line (and, first, the count of lines dropped before it). */
static void queue_line(accesslog *a, const char *line, size_t n)
{
    char note[64];
    size_t nn = 0;
    pthread_mutex_lock(&a->mu);
    if (a->dropped > 0)
        nn = (size_t)snprintf(note, sizeof note, "{\"dropped\":%llu}\n", a->dropped);
    if (a->len + nn + n > BUF_BYTES) {
        a->dropped++;
    } else {
        memcpy(a->buf + a->len, note, nn);
        memcpy(a->buf + a->len + nn, line, n);
        a->len += nn + n;
        a->dropped = 0;
        pthread_cond_signal(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
}

void accesslog_write(accesslog *a, const accesslog_entry *e)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[64];
    snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
             tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ts.tv_nsec / 1000000) % 1000);
    json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:i, s:I, s:I, s:i, s:f, s:s}", "time", when, "peer", e->peer, "method",
                          e->method, "path", e->path, "status", e->status, "bytes_in", (json_int_t)e->bytes_in,
                          "bytes_out", (json_int_t)e->bytes_out, "images", e->images, "latency_ms", e->latency_ms, "id",
                          e->id);
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
    json_decref(j);
    if (!s) {
        pthread_mutex_lock(&a->mu);
        a->dropped++;
        pthread_mutex_unlock(&a->mu);
        return;
    }
    size_t n = strlen(s);
    s[n] = '\n'; /* json_dumps leaves room: the terminator becomes the newline */
    queue_line(a, s, n + 1);
    free(s);
}

void accesslog_close(accesslog *a)
{
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    a->stopping = 1;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->writer, NULL);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    close(a->fd);
    free(a->buf);
    free(a->out);
    free(a);
}
