/* The batcher thread and its pure decision function.
 * The thread owns no images: it moves them from queue slots into an engine
 * slot, fails the ones whose deadline passed or whose client has gone, and
 * submits. Waiting happens inside queue_pop_batch, on the queue's lock. */
#define _GNU_SOURCE  /* POLLRDHUP */
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/batcher.h"
#include "daemon/infer.h"
#include "daemon/queue.h"
#include "model/resnet18.h"

batcher_decision batcher_decide(const batcher_policy *p, const batcher_state *s, uint64_t now_us)
{
    batcher_decision d = { 0, BATCHER_WAIT_FOREVER };
    if (s->queued <= 0)
        return d;
    if (s->queued >= p->max_batch) {
        d.send = p->max_batch;
        return d;
    }
    if (s->flush) {
        d.send = s->queued;
        return d;
    }
    int best = 0;
    for (int i = 0; i < p->npreferred; i++)
        if (p->preferred[i] <= s->queued && p->preferred[i] > best)
            best = p->preferred[i];
    if (best > 0) {
        d.send = best;
        return d;
    }
    uint64_t age = now_us > s->oldest_us ? now_us - s->oldest_us : 0;
    if (age >= p->max_delay_us) {
        d.send = s->queued;
        return d;
    }
    d.wait_us = p->max_delay_us - age;
    return d;
}

int batcher_retry_after_s(long queued, double images_per_s)
{
    if (!(images_per_s > 0) || queued <= 0)
        return 1;
    double s = ceil((double)queued / images_per_s);
    return s < 1 ? 1 : s > 60 ? 60 : (int)s;
}

#define MAX_EXPIRED 64

struct batcher {
    queue *q;
    infer *inf;
    batcher_policy policy;
    const pipeline_sink *sink;
    pthread_t thread;
    queue_item *batch;      /* [max_batch] */
    queue_item expired[MAX_EXPIRED];
};

/* A suspended connection does not notice its client leaving; the socket
 * does: a peer that closed reads as POLLRDHUP/POLLHUP. */
int batcher_client_gone(int fd)
{
    if (fd < 0)
        return 0;
    struct pollfd pfd = { .fd = fd, .events = POLLRDHUP };
    return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static void *batcher_main(void *arg)
{
    batcher *b = arg;
    int slot = -1;
    for (;;) {
        if (slot < 0 && (slot = infer_acquire(b->inf)) < 0)
            break;
        int n, nexpired;
        int rc = queue_pop_batch(b->q, &b->policy, b->batch, &n, b->expired, MAX_EXPIRED, &nexpired);
        for (int i = 0; i < nexpired; i++) {
            queue_release(b->q, &b->expired[i].slot, 1);
            b->sink->fail(b->expired[i].req, b->expired[i].image, 504, "timeout",
                          "the request waited in the queue past request_timeout_ms");
        }
        if (rc < 0)
            break;
        int kept = 0;
        uint8_t *input = infer_input(b->inf, slot);
        for (int i = 0; i < n; i++) {
            queue_item *it = &b->batch[i];
            if (batcher_client_gone(it->fd)) {
                queue_release(b->q, &it->slot, 1);
                b->sink->fail(it->req, it->image, 499, "client_gone", "the client closed the connection");
                continue;
            }
            memcpy(input + (size_t)kept * RESNET18_INPUT_BYTES, queue_slot(b->q, it->slot), RESNET18_INPUT_BYTES);
            queue_release(b->q, &it->slot, 1);
            b->batch[kept++] = *it;
        }
        if (kept == 0)
            continue;
        infer_submit(b->inf, slot, b->batch, kept);
        slot = -1;
    }
    if (slot >= 0)
        infer_release(b->inf, slot);
    return NULL;
}

batcher *batcher_start(queue *q, infer *inf, const batcher_policy *p, const pipeline_sink *sink,
                       char *err, size_t errlen)
{
    batcher *b = calloc(1, sizeof *b);
    if (!b || !(b->batch = calloc((size_t)p->max_batch, sizeof *b->batch))) {
        snprintf(err, errlen, "batcher: out of memory");
        free(b);
        return NULL;
    }
    b->q = q;
    b->inf = inf;
    b->policy = *p;
    b->sink = sink;
    int rc = pthread_create(&b->thread, NULL, batcher_main, b);
    if (rc != 0) {
        snprintf(err, errlen, "batcher: cannot start thread: %s", strerror(rc));
        free(b->batch);
        free(b);
        return NULL;
    }
    return b;
}

void batcher_join(batcher *b)
{
    if (!b)
        return;
    pthread_join(b->thread, NULL);
    free(b->batch);
    free(b);
}
