/* The load engine of resnetd-load: worker threads, each with its own epoll
 * set and its share of keep-alive connections, sending POSTs built from the
 * in-memory corpus (iovecs over shared memory: nothing is copied per
 * request) and parsing the answers with http_response.
 *
 * Closed loop: every connection has one request outstanding and sends the
 * next as soon as the answer arrives; latency counts from the send.
 * Open loop: each thread follows its own arrival schedule (Poisson or
 * uniform, rate/threads each); a request goes out on an idle connection at
 * its intended time, or as soon as one frees up, and its latency counts from
 * the intended time, so waiting for a connection (a backed-up server) shows
 * in the percentiles instead of being omitted. The backlog is implicit: the
 * schedule's next entry is the oldest request not yet sent.
 *
 * Accounting: every sent request ends exactly once, as an HTTP answer or a
 * transport error; those still in flight when the drain times out count as
 * LOAD_ERR_DRAIN_TIMEOUT, so sent == answered always holds. Open-loop
 * requests never sent because the drain timed out count as unsent.
 * Requests whose intended time falls in the warm-up go to separate stats. */
#ifndef RESNETD_LOADGEN_H
#define RESNETD_LOADGEN_H

#include <stdint.h>
#include <sys/socket.h>
#include "client/corpus.h"
#include "client/histogram.h"

typedef enum { LOAD_CLOSED_LOOP, LOAD_OPEN_LOOP } load_mode;
typedef enum { LOAD_POISSON, LOAD_UNIFORM } load_arrival;

typedef enum {
    LOAD_ERR_CONNECT_REFUSED,
    LOAD_ERR_CONNECT, /* any other connect failure */
    LOAD_ERR_RESET, /* ECONNRESET / EPIPE */
    LOAD_ERR_CLOSED, /* the server closed before a complete answer */
    LOAD_ERR_TIMEOUT, /* no answer within the request timeout */
    LOAD_ERR_DRAIN_TIMEOUT, /* still in flight when the end-of-run drain timed out */
    LOAD_ERR_PROTOCOL, /* a malformed answer */
    LOAD_ERR_OTHER,
    LOAD_ERR_COUNT
} load_error;

const char *load_error_name(load_error e);

#define LOAD_MAX_IMAGES_PER_REQUEST 256

typedef struct {
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char host[300]; /* Host header */
    char path[1024]; /* request target, e.g. /classify?top_k=5 */
    const corpus *images;
    int multipart; /* multipart/form-data (else raw image/jpeg) */
    int images_per_request; /* multipart parts per request */
    const char *boundary; /* the corpus's part headers use it */
    load_mode mode;
    load_arrival arrival;
    int connections; /* total, split over the threads */
    int threads;
    double rate; /* open loop: requests per second, all threads */
    uint64_t seed;
    uint64_t warmup_ns;
    uint64_t duration_ns; /* measured phase length; 0 with requests */
    uint64_t requests; /* measured requests; 0 with duration_ns */
    uint64_t timeout_ns; /* per request, from its send */
    uint64_t drain_timeout_ns; /* end of run: wait this long for answers */
} load_config;

#define LOAD_STATUS_MAX 600

typedef struct {
    uint64_t sent, answered, ok; /* ok: 2xx */
    uint64_t images_ok;
    uint64_t unsent; /* open loop: scheduled, never sent */
    uint64_t status[LOAD_STATUS_MAX]; /* answers by HTTP status; [0]: out of range */
    uint64_t errors[LOAD_ERR_COUNT];
    uint64_t last_answer_ns; /* CLOCK_MONOTONIC */
    histogram latency; /* ns, 2xx only: from the intended time (open) or send (closed) */
    histogram service; /* ns, 2xx only: from the send */
} load_stats;

/* Live counters for the progress line, summed over threads. */
typedef struct {
    uint64_t sent, answered, ok, errors;
} load_progress;

typedef struct load_run load_run;

/* Starts the threads; the schedule begins at once. NULL with err set. */
load_run *load_start(const load_config *cfg, char *err, size_t errlen);

/* Start of the run and of the measured phase (after the warm-up). */
uint64_t load_start_ns(const load_run *r);
uint64_t load_measure_ns(const load_run *r);

void load_progress_get(load_run *r, load_progress *p);

/* Any thread (not a signal handler): stop scheduling, drain, finish. */
void load_stop(load_run *r);

/* Whether every thread has finished. */
int load_finished(load_run *r);

/* Joins the threads, merges their stats into warm and measured (both
 * histogram_init'ed here) and frees r. */
void load_finish(load_run *r, load_stats *warm, load_stats *measured);

#endif
