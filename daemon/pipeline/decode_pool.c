/* The decode pool: an intrusive FIFO of jobs (links live in the jobs, so
 * submitting allocates nothing) under one mutex, served by N threads that
 * each own a preprocess context for their whole life. */
#define _GNU_SOURCE /* pthread_setname_np */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/pipeline/decode_pool.h"

struct decode_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* idle threads wait here for a job */
    decode_job *head, *tail; /* waiting jobs, oldest first */
    int waiting, running;
    int refusing; /* aborted or stopping: submit cancels */
    int stopping; /* threads exit once the FIFO is empty */
    decode_pool_ops ops;
    preprocess_options options;
    int nthreads; /* started */
    pthread_t *threads; /* [nthreads] */
    preprocess_ctx **ctxs; /* [nthreads], one per thread */
};

typedef struct worker_arg {
    decode_pool *p;
    int index;
} worker_arg;

static decode_job *fifo_pop(decode_pool *p)
{
    decode_job *j = p->head;
    p->head = j->next;
    if (!p->head)
        p->tail = NULL;
    j->next = NULL;
    p->waiting--;
    return j;
}

static void *decode_main(void *arg)
{
    decode_pool *p = ((worker_arg *)arg)->p;
    preprocess_ctx *ctx = p->ctxs[((worker_arg *)arg)->index];
    free(arg);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->head && !p->stopping)
            pthread_cond_wait(&p->cv, &p->mu);
        if (!p->head)
            break;
        decode_job *j = fifo_pop(p);
        p->running++;
        pthread_mutex_unlock(&p->mu);
        p->ops.run(p->ops.cls, j, ctx);
        pthread_mutex_lock(&p->mu);
        p->running--;
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Joins the started threads and frees everything; jobs must be gone. */
static void pool_free(decode_pool *p)
{
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    for (int i = 0; p->ctxs && p->ctxs[i]; i++)
        preprocess_destroy(p->ctxs[i]);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p->ctxs);
    free(p);
}

decode_pool *decode_pool_start(int nthreads, const preprocess_options *opt, const decode_pool_ops *ops, char *err,
                               size_t errlen)
{
    decode_pool *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "decode: out of memory");
        return NULL;
    }
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p);
        snprintf(err, errlen, "decode: cannot create mutex");
        return NULL;
    }
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        snprintf(err, errlen, "decode: cannot create condition variable");
        return NULL;
    }
    p->ops = *ops;
    p->options = *opt;
    p->threads = calloc((size_t)nthreads, sizeof *p->threads);
    p->ctxs = calloc((size_t)nthreads + 1, sizeof *p->ctxs); /* NULL-terminated */
    if (!p->threads || !p->ctxs)
        goto nomem;
    for (int i = 0; i < nthreads; i++)
        if (!(p->ctxs[i] = preprocess_create(&p->options))) {
            /* Out of memory, or libjpeg refusing to start: a libjpeg.so of
             * another version than the jpeglib.h built against. */
            snprintf(err, errlen,
                     "decode: cannot create a JPEG decoder (out of memory, or a libjpeg library of "
                     "another version than resnetd was built with)");
            pool_free(p);
            return NULL;
        }
    for (int i = 0; i < nthreads; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a)
            goto nomem;
        *a = (worker_arg){ .p = p, .index = i };
        int rc = pthread_create(&p->threads[i], NULL, decode_main, a);
        if (rc != 0) {
            free(a);
            snprintf(err, errlen, "decode: cannot start thread %d of %d: %s", i + 1, nthreads, strerror(rc));
            pool_free(p);
            return NULL;
        }
        p->nthreads++;
        (void)pthread_setname_np(p->threads[i], "resnetd-decode"); /* cosmetic: top -H, tests */
    }
    return p;
nomem:
    snprintf(err, errlen, "decode: out of memory for %d decode threads", nthreads);
    pool_free(p);
    return NULL;
}

int decode_pool_submit(decode_pool *p, decode_job *job)
{
    pthread_mutex_lock(&p->mu);
    if (p->refusing) {
        pthread_mutex_unlock(&p->mu);
        p->ops.cancel(p->ops.cls, job);
        return -1;
    }
    job->next = NULL;
    if (p->tail)
        p->tail->next = job;
    else
        p->head = job;
    p->tail = job;
    p->waiting++;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

/* Takes the whole FIFO under the lock, cancels it outside (cancel resumes
 * connections and takes other locks). */
static int cancel_waiting(decode_pool *p)
{
    pthread_mutex_lock(&p->mu);
    p->refusing = 1;
    decode_job *j = p->head;
    p->head = p->tail = NULL;
    p->waiting = 0;
    pthread_mutex_unlock(&p->mu);
    int n = 0;
    while (j) {
        decode_job *next = j->next;
        j->next = NULL;
        p->ops.cancel(p->ops.cls, j);
        j = next;
        n++;
    }
    return n;
}

int decode_pool_abort(decode_pool *p)
{
    return cancel_waiting(p);
}

int decode_pool_busy(decode_pool *p)
{
    pthread_mutex_lock(&p->mu);
    int n = p->waiting + p->running;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void decode_pool_stop(decode_pool *p)
{
    if (!p)
        return;
    cancel_waiting(p);
    pool_free(p);
}

int decode_http_status(preprocess_status s)
{
    switch (s) {
    case PREP_OK: return 200;
    case PREP_ERR_EMPTY:
    case PREP_ERR_CORRUPT: return 400;
    case PREP_ERR_TOO_LARGE: return 413;
    case PREP_ERR_NOT_JPEG:
    case PREP_ERR_UNSUPPORTED: return 415;
    case PREP_ERR_STOPPED: return 504; /* the deadline; a client that left gets no answer */
    default: return 500;
    }
}
