/* Engine slots, submission and the completion thread.
 * Invariants: a slot is free, held by the batcher (acquired), or in the
 * in-flight FIFO; the completion thread alone calls engine_wait(). The
 * engine and model change only in infer_swap, with no batch being filled
 * or in flight, and are read under mu or while a batch is (which keeps a
 * swap waiting). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/pipeline/infer.h"
#include "daemon/log.h"
#include "daemon/api/metrics.h"
#include "daemon/api/stats.h"
#include "util/clock.h"

typedef struct infer_batch {
    queue_item *items; /* [max_batch] */
    int n;
    int staged; /* the device decoder filled the slot's input */
    uint64_t stage_ns; /* ... and its call took this long on the batcher */
    uint64_t submit_us;
    int failed; /* submit failed: err holds why */
    char err[256];
} infer_batch;

struct infer {
    engine *e;
    served_model *model; /* the model e computes: one reference */
    devjpeg *dj; /* the device decoder staging slots, or NULL */
    decode_route *route; /* told each stage's cost, or NULL */
    const pipeline_sink *sink;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* slot freed, batch submitted, or stopping */
    int free_slots[ENGINE_MAX_SLOTS];
    int nfree;
    int fifo[ENGINE_MAX_SLOTS]; /* submitted slots, oldest first */
    int fifo_head, fifo_count;
    int stopping;
    int filling; /* the batcher is filling a slot (infer_begin .. submit) */
    int swapping; /* infer_swap is waiting for filling and in-flight batches to end */
    infer_batch batch[ENGINE_MAX_SLOTS];
    pthread_t completer;
    atomic_int healthy;
    double images_per_s; /* EWMA; under mu */
    int metrics_id; /* metrics_engine's id for this engine's device */
};

static void complete(infer *x, int slot)
{
    infer_batch *b = &x->batch[slot];
    char err[256];
    int failed = b->failed;
    if (failed)
        snprintf(err, sizeof err, "%s", b->err);
    else if (engine_wait(x->e, slot, err, sizeof err) != 0)
        failed = 1;
    uint64_t done_us = clock_now_us();
    uint64_t infer_us = done_us - b->submit_us;
    metrics_add_batches_in_flight(-1);
    metrics_engine_in_flight(x->metrics_id, -1);

    if (failed) {
        if (atomic_exchange(&x->healthy, 0))
            log_error("engine failure, not ready until a batch succeeds: %s", err);
        for (int i = 0; i < b->n; i++)
            if (b->items[i].req)
                x->sink->fail(b->items[i].req, b->items[i].image, 500, "engine_failure", err);
        return;
    }
    if (!atomic_exchange(&x->healthy, 1))
        log_info("engine healthy again");
    metrics_observe_infer((double)infer_us / 1e6);
    metrics_observe_batch(b->n);
    int reported = 0;
    for (int i = 0; i < b->n; i++)
        reported += b->items[i].req != NULL;
    metrics_add_images(reported); /* an image dropped after staging was answered already */
    metrics_engine_batch(x->metrics_id, reported);
    /* The stage's events completed before the engine's wait returned. */
    uint64_t gpu_decode_us = 0;
    if (x->dj && b->staged) {
        double ms = devjpeg_stage_ms(x->dj, slot);
        if (ms >= 0) {
            metrics_observe_gpu_preprocess(ms / 1e3);
            gpu_decode_us = (uint64_t)(ms * 1e3 + 0.5);
        }
        /* The decoder was busy for the longer of the host's call (nvJPEG's
         * host side) and the device's work. */
        uint64_t px = 0, busy_ns = b->stage_ns > gpu_decode_us * 1000 ? b->stage_ns : gpu_decode_us * 1000;
        for (int i = 0; i < b->n; i++)
            if (b->items[i].jpeg)
                px += (uint64_t)b->items[i].w * (uint64_t)b->items[i].h;
        if (x->route && b->stage_ns > 0) { /* 0: the stage decoded CPU fallbacks too */
            decode_route_gpu(x->route, px, busy_ns);
            metrics_set_decode_cost(-1, decode_route_gpu_ps(x->route));
        }
    }
    stats_batch(b->n, gpu_decode_us * 1000, infer_us * 1000);
    for (int i = 0; i < b->n; i++) {
        if (!b->items[i].req)
            continue; /* its decode failed after staging; already answered */
        pipeline_timing t = {
            .queue_us = b->submit_us - b->items[i].enqueued_us,
            .gpu_decode_us = b->items[i].jpeg ? gpu_decode_us : 0,
            .infer_us = infer_us,
            .batch_size = b->n,
        };
        x->sink->done(b->items[i].req, b->items[i].image, x->e->logits[slot] + (size_t)i * (size_t)x->e->classes,
                      x->e->classes, x->model, &t);
    }
    pthread_mutex_lock(&x->mu);
    double rate = infer_us > 0 ? b->n * 1e6 / (double)infer_us : 0;
    x->images_per_s = x->images_per_s > 0 ? 0.8 * x->images_per_s + 0.2 * rate : rate;
    pthread_mutex_unlock(&x->mu);
}

static void *completion_main(void *arg)
{
    infer *x = arg;
    pthread_mutex_lock(&x->mu);
    for (;;) {
        while (x->fifo_count == 0 && !x->stopping)
            pthread_cond_wait(&x->cv, &x->mu);
        if (x->fifo_count == 0)
            break;
        int slot = x->fifo[x->fifo_head];
        pthread_mutex_unlock(&x->mu);
        complete(x, slot);
        pthread_mutex_lock(&x->mu);
        x->fifo_head = (x->fifo_head + 1) % ENGINE_MAX_SLOTS;
        x->fifo_count--;
        x->free_slots[x->nfree++] = slot;
        pthread_cond_broadcast(&x->cv);
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

infer *infer_create(engine *e, served_model *m, devjpeg *dj, decode_route *route, const pipeline_sink *sink, char *err,
                    size_t errlen)
{
    infer *x = calloc(1, sizeof *x);
    if (!x) {
        snprintf(err, errlen, "infer: out of memory");
        return NULL;
    }
    x->e = e;
    x->model = served_model_ref(m);
    x->dj = dj;
    x->route = route;
    char label[32];
    infer_engine_label(e, label, sizeof label);
    x->metrics_id = metrics_engine(label);
    x->sink = sink;
    atomic_init(&x->healthy, 1);
    for (int s = 0; s < e->nslots; s++) {
        x->batch[s].items = calloc((size_t)e->max_batch, sizeof(queue_item));
        if (!x->batch[s].items) {
            snprintf(err, errlen, "infer: out of memory");
            goto fail;
        }
        x->free_slots[x->nfree++] = e->nslots - 1 - s;
    }
    if (pthread_mutex_init(&x->mu, NULL) != 0) {
        snprintf(err, errlen, "infer: cannot create mutex");
        goto fail;
    }
    if (pthread_cond_init(&x->cv, NULL) != 0) {
        pthread_mutex_destroy(&x->mu);
        snprintf(err, errlen, "infer: cannot create condition variable");
        goto fail;
    }
    int rc = pthread_create(&x->completer, NULL, completion_main, x);
    if (rc != 0) {
        pthread_cond_destroy(&x->cv);
        pthread_mutex_destroy(&x->mu);
        snprintf(err, errlen, "infer: cannot start completion thread: %s", strerror(rc));
        goto fail;
    }
    return x;
fail:
    for (int s = 0; s < ENGINE_MAX_SLOTS; s++)
        free(x->batch[s].items);
    served_model_unref(x->model);
    free(x);
    return NULL;
}

int infer_acquire(infer *x)
{
    pthread_mutex_lock(&x->mu);
    while (x->nfree == 0 && !x->stopping)
        pthread_cond_wait(&x->cv, &x->mu);
    int slot = x->stopping ? -1 : x->free_slots[--x->nfree];
    pthread_mutex_unlock(&x->mu);
    return slot;
}

void infer_release(infer *x, int slot)
{
    pthread_mutex_lock(&x->mu);
    x->free_slots[x->nfree++] = slot;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

uint8_t *infer_begin(infer *x, int slot)
{
    pthread_mutex_lock(&x->mu);
    while (x->swapping)
        pthread_cond_wait(&x->cv, &x->mu);
    x->filling = 1;
    uint8_t *in = x->e->input[slot];
    pthread_mutex_unlock(&x->mu);
    return in;
}

void infer_abandon(infer *x)
{
    pthread_mutex_lock(&x->mu);
    x->filling = 0;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

int infer_swap(infer *x, engine *e, served_model *m, engine **old, char *err, size_t errlen)
{
    pthread_mutex_lock(&x->mu);
    x->swapping = 1;
    while ((x->filling || x->fifo_count > 0) && !x->stopping)
        pthread_cond_wait(&x->cv, &x->mu);
    int rc = -1;
    if (x->stopping)
        snprintf(err, errlen, "the server is stopping");
    else if (e->nslots != x->e->nslots || e->max_batch != x->e->max_batch)
        snprintf(err, errlen, "the new engine has %d slots of %d images, the running one %d of %d", e->nslots,
                 e->max_batch, x->e->nslots, x->e->max_batch);
    else if (!x->dj || devjpeg_retarget(x->dj, e, err, errlen) == 0)
        rc = 0;
    if (rc == 0) {
        *old = x->e;
        x->e = e;
        served_model_unref(x->model);
        x->model = served_model_ref(m);
    }
    x->swapping = 0;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    return rc;
}

void infer_engine_label(const engine *e, char *out, size_t len)
{
    if (e->device == ENGINE_DEVICE_CUDA)
        snprintf(out, len, "cuda:%d", e->device_index);
    else
        snprintf(out, len, "%s", engine_device_name(e->device));
}

engine *infer_engine(infer *x)
{
    pthread_mutex_lock(&x->mu);
    engine *e = x->e;
    pthread_mutex_unlock(&x->mu);
    return e;
}

served_model *infer_model(infer *x)
{
    pthread_mutex_lock(&x->mu);
    served_model *m = served_model_ref(x->model);
    pthread_mutex_unlock(&x->mu);
    return m;
}

void infer_submit(infer *x, int slot, const queue_item *items, int n, int staged, uint64_t stage_ns)
{
    infer_batch *b = &x->batch[slot];
    memcpy(b->items, items, (size_t)n * sizeof *items);
    b->n = n;
    b->staged = staged;
    b->stage_ns = stage_ns;
    b->submit_us = clock_now_us();
    for (int i = 0; i < n; i++)
        x->e->input_f32[slot][i] = items[i].f32;
    b->failed = engine_submit(x->e, slot, n, b->err, sizeof b->err) != 0;
    metrics_add_batches_in_flight(1);
    metrics_engine_in_flight(x->metrics_id, 1);
    pthread_mutex_lock(&x->mu);
    x->filling = 0;
    x->fifo[(x->fifo_head + x->fifo_count++) % ENGINE_MAX_SLOTS] = slot;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

void infer_report_failure(infer *x, const char *err)
{
    if (atomic_exchange(&x->healthy, 0))
        log_error("batch failure, not ready until a batch succeeds: %s", err);
}

int infer_healthy(infer *x)
{
    return atomic_load(&x->healthy);
}

double infer_images_per_s(infer *x)
{
    pthread_mutex_lock(&x->mu);
    double r = x->images_per_s;
    pthread_mutex_unlock(&x->mu);
    return r;
}

void infer_stop(infer *x)
{
    pthread_mutex_lock(&x->mu);
    x->stopping = 1;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    pthread_join(x->completer, NULL);
}

void infer_destroy(infer *x)
{
    if (!x)
        return;
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    for (int s = 0; s < ENGINE_MAX_SLOTS; s++)
        free(x->batch[s].items);
    served_model_unref(x->model);
    free(x);
}
