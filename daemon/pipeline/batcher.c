/* The batcher thread.
 * The thread owns no images: it moves them from queue slots into an engine
 * slot (or, for still-compressed JPEGs, has the device decoder decode them
 * into it), fails the ones whose deadline passed or whose client has gone,
 * and submits. Waiting happens inside queue_pop_batch, on the queue's lock. */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/pipeline/batcher.h"
#include "daemon/pipeline/decode_pool.h"
#include "daemon/pipeline/infer.h"
#include "daemon/log.h"
#include "daemon/api/metrics.h"
#include "daemon/pipeline/queue.h"
#include "util/clock.h"
#include "model/resnet18.h"

#define MAX_EXPIRED 64

struct batcher {
    queue *q;
    infer *inf;
    batch_policy policy;
    const pipeline_sink *sink;
    pthread_t thread;
    queue_item *batch; /* [max_batch] */
    queue_item expired[MAX_EXPIRED];
    /* With a device decoder: the batch's compressed images and their
     * pointers in the form devjpeg_stage takes, and a CPU decoder for the
     * images the device fails on. */
    devjpeg *dj;
    queue_item *compressed; /* [max_batch] */
    const uint8_t **jpeg;
    size_t *jpeg_len;
    int *w, *h;
    preprocess_ctx *prep;
};

/* A suspended connection does not notice its client leaving; the socket
 * does, if the client is gone for good: a reset reads as POLLERR/POLLHUP.
 * An end of the client's stream alone (POLLRDHUP) is not that: a client
 * that shut down its sending side (shutdown(SHUT_WR), as some do after the
 * request) still reads the answer, and a clean close() looks the same from
 * here. Those are answered; an answer nobody reads fails on send. */
int batcher_client_gone(int fd)
{
    if (fd < 0)
        return 0;
    struct pollfd pfd = { .fd = fd, .events = 0 };
    return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLHUP | POLLERR | POLLNVAL));
}

static int fallback_should_stop(void *cls)
{
    const queue_item *it = cls;
    return clock_now_us() >= it->deadline_us;
}

/* devjpeg_stage's fallback: the device failed on compressed[index]; decode
 * it here, within the request's deadline (504 past it). An image the CPU
 * refuses too is answered now and dropped from the batch (req = NULL). */
static int cpu_fallback(void *cls, int index, uint8_t *out)
{
    batcher *b = cls;
    queue_item *it = &b->compressed[index];
    char why[256];
    uint64_t t0 = clock_now_us();
    preprocess_set_stop(b->prep, fallback_should_stop, it);
    preprocess_status st = preprocess_jpeg(b->prep, it->jpeg, it->jpeg_len, out, why, sizeof why);
    preprocess_set_stop(b->prep, NULL, NULL);
    if (st == PREP_OK) {
        metrics_observe_decode((double)(clock_now_us() - t0) / 1e6);
        metrics_add_decoded(METRICS_DECODE_CPU, 1);
        return 0;
    }
    if (st == PREP_ERR_STOPPED)
        b->sink->fail(it->req, it->image, 504, "timeout", "request_timeout_ms passed while decoding");
    else
        b->sink->fail(it->req, it->image, decode_http_status(st), preprocess_status_code(st), why);
    it->req = NULL;
    return -1;
}

/* Fills the engine slot with the batch in b->batch[0..n): crops already in
 * queue slots are copied to the slot's host input first, then the device
 * decoder (if any compressed images came) uploads them and decodes the
 * rest behind them. Returns how many images the slot holds (their items
 * back in b->batch, in slot order) and sets *staged; 0 when nothing is left
 * to run. */
static int fill_slot(batcher *b, int slot, int n, int *staged, uint64_t *stage_ns)
{
    int kept = 0, ncomp = 0;
    uint8_t *input = infer_begin(b->inf, slot);
    *staged = 0;
    for (int i = 0; i < n; i++) {
        queue_item *it = &b->batch[i];
        if (batcher_client_gone(it->fd)) {
            queue_release(b->q, &it->slot, 1);
            b->sink->fail(it->req, it->image, 499, "client_gone", "the client closed the connection");
            continue;
        }
        if (!it->jpeg && !it->f32) /* an FP32 image is read where it is (infer_submit) */
            memcpy(input + (size_t)kept * RESNET18_INPUT_BYTES, queue_slot(b->q, it->slot), RESNET18_INPUT_BYTES);
        queue_release(b->q, &it->slot, 1);
        if (it->jpeg)
            b->compressed[ncomp++] = *it;
        else
            b->batch[kept++] = *it;
    }
    if (ncomp == 0)
        return kept;
    uint64_t px = 0;
    for (int i = 0; i < ncomp; i++) {
        b->jpeg[i] = b->compressed[i].jpeg;
        b->jpeg_len[i] = b->compressed[i].jpeg_len;
        b->w[i] = b->compressed[i].w;
        b->h[i] = b->compressed[i].h;
        px += (uint64_t)b->w[i] * (uint64_t)b->h[i];
    }
    char err[256];
    int nfallback = 0;
    uint64_t t0 = clock_now_ns();
    queue_staging(b->q, px, 1);
    int rc = devjpeg_stage(b->dj, slot, kept, b->jpeg, b->jpeg_len, b->w, b->h, ncomp, cpu_fallback, b, &nfallback, err,
                           sizeof err);
    queue_staging(b->q, px, 0);
    /* A stage that decoded fallbacks on the CPU is no sample of the device's cost. */
    *stage_ns = nfallback > 0 ? 0 : clock_now_ns() - t0;
    if (rc != 0) {
        infer_report_failure(b->inf, err);
        for (int i = 0; i < kept; i++)
            b->sink->fail(b->batch[i].req, b->batch[i].image, 500, "engine_failure", err);
        for (int i = 0; i < ncomp; i++)
            if (b->compressed[i].req)
                b->sink->fail(b->compressed[i].req, b->compressed[i].image, 500, "engine_failure", err);
        return 0;
    }
    metrics_add_decoded(METRICS_DECODE_HARDWARE, ncomp - nfallback);
    metrics_add_decode_fallback(DEVJPEG_DEVICE_ERROR, nfallback);
    memcpy(b->batch + kept, b->compressed, (size_t)ncomp * sizeof *b->compressed);
    *staged = 1;
    return kept + ncomp;
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
        int staged;
        uint64_t stage_ns = 0;
        int kept = fill_slot(b, slot, n, &staged, &stage_ns);
        if (kept == 0) {
            infer_abandon(b->inf);
            continue;
        }
        infer_submit(b->inf, slot, b->batch, kept, staged, stage_ns);
        slot = -1;
    }
    if (slot >= 0)
        infer_release(b->inf, slot);
    return NULL;
}

static void batcher_free(batcher *b)
{
    if (!b)
        return;
    free(b->batch);
    free(b->compressed);
    free(b->jpeg);
    free(b->jpeg_len);
    free(b->w);
    free(b->h);
    preprocess_destroy(b->prep);
    free(b);
}

batcher *batcher_start(queue *q, infer *inf, const batch_policy *p, const pipeline_sink *sink, devjpeg *dj,
                       uint64_t max_pixels, char *err, size_t errlen)
{
    batcher *b = calloc(1, sizeof *b);
    if (!b || !(b->batch = calloc((size_t)p->max_batch, sizeof *b->batch)))
        goto nomem;
    if (dj) {
        size_t nb = (size_t)p->max_batch;
        preprocess_options opt = devjpeg_cpu_options(dj, max_pixels);
        b->dj = dj;
        if (!(b->compressed = calloc(nb, sizeof *b->compressed)) || !(b->jpeg = calloc(nb, sizeof *b->jpeg)) ||
            !(b->jpeg_len = calloc(nb, sizeof *b->jpeg_len)) || !(b->w = calloc(nb, sizeof *b->w)) ||
            !(b->h = calloc(nb, sizeof *b->h)) || !(b->prep = preprocess_create(&opt)))
            goto nomem;
    }
    b->q = q;
    b->inf = inf;
    b->policy = *p;
    b->sink = sink;
    int rc = pthread_create(&b->thread, NULL, batcher_main, b);
    if (rc != 0) {
        snprintf(err, errlen, "batcher: cannot start thread: %s", strerror(rc));
        batcher_free(b);
        return NULL;
    }
    return b;
nomem:
    snprintf(err, errlen, "batcher: out of memory");
    batcher_free(b);
    return NULL;
}

void batcher_join(batcher *b)
{
    if (!b)
        return;
    pthread_join(b->thread, NULL);
    batcher_free(b);
}
