/* Bounded FIFO of decoded images over a fixed pool of image slots.
 * Invariants: free slots + reserved slots + queued items = capacity; the
 * item ring never holds more than capacity entries. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "daemon/api/metrics.h"
#include "daemon/pipeline/queue.h"
#include "util/clock.h"
#include "model/resnet18.h"

struct queue {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* batcher waits here; CLOCK_MONOTONIC */
    int capacity;
    uint8_t *pixels; /* [capacity][RESNET18_INPUT_BYTES] */
    int *free_slots; /* stack of free slot indices */
    int nfree;
    queue_item *ring; /* [capacity] FIFO */
    int head, count;
    uint64_t jpeg_px; /* pixels of the still-compressed items queued */
    uint64_t staging_px; /* ... and of those a device decoder is staging */
    int flush, stopped;
};

queue *queue_create(int capacity, char *err, size_t errlen)
{
    queue *q = calloc(1, sizeof *q);
    if (!q)
        goto nomem;
    q->capacity = capacity;
    q->pixels = malloc((size_t)capacity * RESNET18_INPUT_BYTES);
    q->free_slots = malloc((size_t)capacity * sizeof *q->free_slots);
    q->ring = malloc((size_t)capacity * sizeof *q->ring);
    if (!q->pixels || !q->free_slots || !q->ring)
        goto nomem;
    /* Touch every slot now: preallocated means resident from start-up, so
     * memory use does not creep up the first time the queue fills. (Not
     * zero: the compiler may turn malloc + memset 0 into a lazy calloc.) */
    memset(q->pixels, 128, (size_t)capacity * RESNET18_INPUT_BYTES);
    for (int i = 0; i < capacity; i++)
        q->free_slots[i] = capacity - 1 - i;
    q->nfree = capacity;

    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0 || pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 ||
        pthread_cond_init(&q->cv, &ca) != 0) {
        snprintf(err, errlen, "queue: cannot create condition variable");
        goto fail;
    }
    pthread_condattr_destroy(&ca);
    if (pthread_mutex_init(&q->mu, NULL) != 0) {
        pthread_cond_destroy(&q->cv);
        snprintf(err, errlen, "queue: cannot create mutex");
        goto fail;
    }
    return q;
nomem:
    snprintf(err, errlen, "queue: out of memory for %d image slots", capacity);
fail:
    if (q) {
        free(q->pixels);
        free(q->free_slots);
        free(q->ring);
        free(q);
    }
    return NULL;
}

void queue_destroy(queue *q)
{
    if (!q)
        return;
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q->pixels);
    free(q->free_slots);
    free(q->ring);
    free(q);
}

int queue_capacity(const queue *q)
{
    return q->capacity;
}

uint8_t *queue_slot(queue *q, int slot)
{
    return q->pixels + (size_t)slot * RESNET18_INPUT_BYTES;
}

int queue_reserve(queue *q, int n, int *slots)
{
    pthread_mutex_lock(&q->mu);
    if (n > q->nfree) {
        pthread_mutex_unlock(&q->mu);
        return -1;
    }
    for (int i = 0; i < n; i++)
        slots[i] = q->free_slots[--q->nfree];
    pthread_mutex_unlock(&q->mu);
    return 0;
}

void queue_release(queue *q, const int *slots, int n)
{
    pthread_mutex_lock(&q->mu);
    for (int i = 0; i < n; i++)
        q->free_slots[q->nfree++] = slots[i];
    pthread_mutex_unlock(&q->mu);
}

void queue_push(queue *q, const queue_item *items, int n)
{
    pthread_mutex_lock(&q->mu);
    for (int i = 0; i < n; i++) {
        q->ring[(q->head + q->count++) % q->capacity] = items[i];
        if (items[i].jpeg)
            q->jpeg_px += (uint64_t)items[i].w * (uint64_t)items[i].h;
    }
    long depth = q->count;
    pthread_cond_broadcast(&q->cv); /* one batcher per engine may be waiting */
    pthread_mutex_unlock(&q->mu);
    metrics_set_queue_depth(depth);
}

int queue_depth(queue *q)
{
    pthread_mutex_lock(&q->mu);
    int n = q->count;
    pthread_mutex_unlock(&q->mu);
    return n;
}

uint64_t queue_jpeg_pixels(queue *q)
{
    pthread_mutex_lock(&q->mu);
    uint64_t px = q->jpeg_px + q->staging_px;
    pthread_mutex_unlock(&q->mu);
    return px;
}

void queue_staging(queue *q, uint64_t px, int begin)
{
    pthread_mutex_lock(&q->mu);
    if (begin)
        q->staging_px += px;
    else
        q->staging_px -= px;
    pthread_mutex_unlock(&q->mu);
}

static queue_item pop_front(queue *q)
{
    queue_item it = q->ring[q->head];
    if (it.jpeg)
        q->jpeg_px -= (uint64_t)it.w * (uint64_t)it.h;
    q->head = (q->head + 1) % q->capacity;
    q->count--;
    return it;
}

static void wait_until(queue *q, uint64_t wait_us)
{
    if (wait_us == BATCH_WAIT_FOREVER) {
        pthread_cond_wait(&q->cv, &q->mu);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (wait_us % 1000000u) * 1000u;
    ts.tv_sec += (time_t)(wait_us / 1000000u + ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    pthread_cond_timedwait(&q->cv, &q->mu, &ts);
}

int queue_pop_batch(queue *q, const batch_policy *p, queue_item *batch, int *nbatch, queue_item *expired,
                    int max_expired, int *nexpired)
{
    *nbatch = 0;
    *nexpired = 0;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        uint64_t now = clock_now_us();
        /* Deadlines are enqueue time + a fixed timeout, so the head expires first. */
        while (q->count > 0 && q->ring[q->head].deadline_us <= now && *nexpired < max_expired)
            expired[(*nexpired)++] = pop_front(q);
        if (*nexpired > 0)
            break;
        if (q->count == 0 && q->stopped) {
            pthread_mutex_unlock(&q->mu);
            return -1;
        }
        batch_state s = {
            .queued = q->count,
            .oldest_us = q->count ? q->ring[q->head].enqueued_us : 0,
            .flush = q->flush || q->stopped,
        };
        batch_decision d = batch_decide(p, &s, now);
        if (d.send > 0) {
            for (int i = 0; i < d.send; i++)
                batch[i] = pop_front(q);
            *nbatch = d.send;
            break;
        }
        uint64_t wait = d.wait_us;
        if (q->count > 0 && q->ring[q->head].deadline_us - now < wait)
            wait = q->ring[q->head].deadline_us - now;
        wait_until(q, wait);
    }
    long depth = q->count;
    pthread_mutex_unlock(&q->mu);
    metrics_set_queue_depth(depth);
    return 0;
}

void queue_set_flush(queue *q, int on)
{
    pthread_mutex_lock(&q->mu);
    q->flush = on;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

int queue_take_all(queue *q, queue_item *out, int max)
{
    pthread_mutex_lock(&q->mu);
    int n = 0;
    while (q->count > 0 && n < max)
        out[n++] = pop_front(q);
    long depth = q->count;
    pthread_mutex_unlock(&q->mu);
    metrics_set_queue_depth(depth);
    return n;
}

void queue_stop(queue *q)
{
    pthread_mutex_lock(&q->mu);
    q->stopped = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}
