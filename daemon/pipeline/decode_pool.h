/* The decode pool: N threads that decode JPEGs straight into queue slots.
 *
 * The HTTP workers only parse; once a request's body is complete they hand
 * it here as a decode_job embedded in the request (nothing is allocated per
 * request), and a FIFO spreads the jobs over every decode thread, whatever
 * HTTP thread owns the connection. Each decode thread owns one preprocess
 * context (TurboJPEG handle and scratch that grows to the largest image,
 * then is reused), created when the thread starts.
 *
 * The pool only schedules: what a job does (decode, push to the queue,
 * answer) is the owner's run callback. Jobs waiting in the FIFO are bounded
 * by the queue's image slots, which a request reserves before it submits. */
#ifndef RESNETD_DECODE_POOL_H
#define RESNETD_DECODE_POOL_H

#include <stddef.h>
#include <stdint.h>
#include "image/preprocess.h"

typedef struct decode_job {
    struct decode_job *next; /* the FIFO link, the pool's while the job waits */
    void *owner; /* the caller's request */
} decode_job;

typedef struct decode_pool_ops {
    void *cls;
    /* On a decode thread: do the job with this thread's context. */
    void (*run)(void *cls, decode_job *job, preprocess_ctx *ctx);
    /* The job will never run (the pool was aborted or stopped): answer it.
     * Called from whichever thread aborts, stops or submits. */
    void (*cancel)(void *cls, decode_job *job);
} decode_pool_ops;

typedef struct decode_pool decode_pool;

/* Starts nthreads decode threads, each with a preprocess context of opt
 * (start-up: errors name the reason). */
decode_pool *decode_pool_start(int nthreads, const preprocess_options *opt, const decode_pool_ops *ops, char *err,
                               size_t errlen);

/* Queues a job for the next free decode thread. After decode_pool_abort or
 * decode_pool_stop it cancels the job instead (ops->cancel, on this
 * thread) and returns -1. */
int decode_pool_submit(decode_pool *p, decode_job *job);

/* Drain timeout: refuses new jobs and cancels every waiting one; jobs
 * already running finish. Returns how many were cancelled. */
int decode_pool_abort(decode_pool *p);

/* Jobs waiting or running. */
int decode_pool_busy(decode_pool *p);

/* Cancels whatever still waits, joins the threads, frees the pool. */
void decode_pool_stop(decode_pool *p);

/* The HTTP status for a decode failure: 400 corrupt/empty, 413 too many
 * pixels or over the work budget, 415 not a JPEG or an unsupported one,
 * 504 stopped (the deadline), 500 out of memory. */
int decode_http_status(preprocess_status s);

#endif
