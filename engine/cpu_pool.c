/* The CPU engines' thread pool and shared engine functions (see cpu_pool.h). Completion is counted per
 * unit, so the caller never waits for a worker that the OS has not yet
 * scheduled: such a worker later finds nothing left to claim. */
#define _GNU_SOURCE /* sched_getaffinity */
#include <sched.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "engine/cpu_pool.h"

#define WORK_BITS 20
#define WORK_MASK ((1u << WORK_BITS) - 1)

typedef struct worker_arg {
    cpu_pool *pl;
    int tid;
} worker_arg;

/* Claims and runs units of the current job until none is left. */
static void pool_work(cpu_pool *pl, int tid)
{
    for (;;) {
        uint64_t w = atomic_load(&pl->work);
        unsigned next = (unsigned)(w & WORK_MASK), total = (unsigned)((w >> WORK_BITS) & WORK_MASK);
        if (next >= total)
            return;
        if (!atomic_compare_exchange_weak(&pl->work, &w, w + 1))
            continue;
        pl->fn(pl->ctx, (int)next, tid);
        if ((unsigned)atomic_fetch_add(&pl->done_units, 1) + 1 == total) {
            pthread_mutex_lock(&pl->mu);
            pthread_cond_signal(&pl->done);
            pthread_mutex_unlock(&pl->mu);
        }
    }
}

static void *pool_worker(void *p)
{
    worker_arg a = *(worker_arg *)p;
    free(p);
    cpu_pool *pl = a.pl;
    unsigned long seen = 0;
    pthread_mutex_lock(&pl->mu);
    while (!pl->stop) {
        if (pl->gen == seen) {
            pthread_cond_wait(&pl->go, &pl->mu);
            continue;
        }
        seen = pl->gen;
        pthread_mutex_unlock(&pl->mu);
        pool_work(pl, a.tid);
        pthread_mutex_lock(&pl->mu);
    }
    pthread_mutex_unlock(&pl->mu);
    return NULL;
}

void cpu_pool_run(cpu_pool *pl, cpu_pool_fn *fn, void *ctx, int nunits)
{
    if (nunits <= 0)
        return;
    pl->fn = fn;
    pl->ctx = ctx;
    atomic_store(&pl->done_units, 0);
    pl->seq++;
    atomic_store(&pl->work, (pl->seq << (2 * WORK_BITS)) | ((uint64_t)nunits << WORK_BITS));
    if (pl->nthreads > 1) {
        pthread_mutex_lock(&pl->mu);
        pl->gen++;
        pthread_cond_broadcast(&pl->go);
        pthread_mutex_unlock(&pl->mu);
    }
    pool_work(pl, 0);
    if (atomic_load(&pl->done_units) < nunits) {
        pthread_mutex_lock(&pl->mu);
        while (atomic_load(&pl->done_units) < nunits)
            pthread_cond_wait(&pl->done, &pl->mu);
        pthread_mutex_unlock(&pl->mu);
    }
}

int cpu_pool_start(cpu_pool *pl, int nthreads, char *err, size_t errlen)
{
    if (nthreads < 1 || nthreads > CPU_POOL_MAX_THREADS) {
        snprintf(err, errlen, "cpu engine: threads must be 1..%d (got %d)", CPU_POOL_MAX_THREADS, nthreads);
        return -1;
    }
    int rc = pthread_mutex_init(&pl->mu, NULL);
    if (rc == 0 && (rc = pthread_cond_init(&pl->go, NULL)) != 0)
        pthread_mutex_destroy(&pl->mu);
    if (rc == 0 && (rc = pthread_cond_init(&pl->done, NULL)) != 0) {
        pthread_cond_destroy(&pl->go);
        pthread_mutex_destroy(&pl->mu);
    }
    if (rc != 0) {
        snprintf(err, errlen, "cpu engine: pthread init: %s", strerror(rc));
        return -1;
    }
    pl->inited = 1;
    pl->nthreads = nthreads;
    for (int t = 1; t < nthreads; t++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a) {
            snprintf(err, errlen, "cpu engine: out of memory starting threads");
            return -1;
        }
        a->pl = pl;
        a->tid = t;
        rc = pthread_create(&pl->th[t], NULL, pool_worker, a);
        if (rc != 0) {
            free(a);
            snprintf(err, errlen, "cpu engine: pthread_create: %s", strerror(rc));
            return -1;
        }
        pl->started++;
    }
    return 0;
}

void cpu_pool_stop(cpu_pool *pl)
{
    if (!pl->inited)
        return;
    pthread_mutex_lock(&pl->mu);
    pl->stop = 1;
    pthread_cond_broadcast(&pl->go);
    pthread_mutex_unlock(&pl->mu);
    for (int t = 1; t <= pl->started; t++)
        pthread_join(pl->th[t], NULL);
    pthread_cond_destroy(&pl->done);
    pthread_cond_destroy(&pl->go);
    pthread_mutex_destroy(&pl->mu);
    pl->inited = 0;
}

int cpu_pool_cpu_count(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int cpu_engine_submit(pthread_mutex_t *mu, int max_batch, void (*forward)(void *e, int slot, int n), void *e, int slot,
                      int n, char *err, size_t errlen)
{
    if (n < 1 || n > max_batch) {
        snprintf(err, errlen, "batch of %d images outside 1..%d", n, max_batch);
        return -1;
    }
    pthread_mutex_lock(mu);
    forward(e, slot, n);
    pthread_mutex_unlock(mu);
    return 0;
}

int cpu_engine_wait(void *ctx, int slot, char *err, size_t errlen)
{
    (void)ctx;
    (void)slot;
    (void)err;
    (void)errlen;
    return 0;
}

size_t cpu_engine_no_device_memory(void *ctx)
{
    (void)ctx;
    return 0;
}

CPU_VECTOR_CLONES
void cpu_engine_fc(const float *f, const float *w, const float *b, int classes, int features, float *logits)
{
    enum { LANES = 16 };
    for (int k = 0; k < classes; k++) {
        const float *wk = w + (size_t)k * features;
        float part[LANES] = { 0 };
        for (int c = 0; c + LANES <= features; c += LANES)
            for (int j = 0; j < LANES; j++)
                part[j] += f[c + j] * wk[c + j];
        float s = 0.0f;
        for (int j = 0; j < LANES; j++)
            s += part[j];
        logits[k] = s + b[k];
    }
}

void *cpu_engine_alloc(size_t bytes)
{
    const size_t huge = 2u << 20;
    bytes += 64;
    void *p = NULL;
    if (bytes >= 2 * huge) {
        bytes = (bytes + huge - 1) / huge * huge;
        if (posix_memalign(&p, huge, bytes) != 0)
            return NULL;
        (void)madvise(p, bytes, MADV_HUGEPAGE); /* advisory: fine if refused */
    } else if (posix_memalign(&p, 64, bytes) != 0) {
        return NULL;
    }
    memset(p, 0, bytes);
    return p;
}

void cpu_engine_init_pub(engine *pub, const engine_ops *ops, void *ctx, engine_precision precision,
                         const resnet18_weights *w, const engine_config *cfg)
{
    pub->ops = ops;
    pub->ctx = ctx;
    pub->device = ENGINE_DEVICE_CPU;
    pub->precision = precision;
    pub->max_batch = cfg->max_batch;
    pub->nslots = cfg->nslots ? cfg->nslots : 2;
    pub->classes = w->classes;
    pub->deterministic = 1; /* per-image FC, fixed summation orders: see each engine */
}

int cpu_engine_alloc_slots(engine *pub, const char *name, char *err, size_t errlen)
{
    const size_t mb = (size_t)pub->max_batch;
    for (int s = 0; s < pub->nslots; s++) {
        pub->input[s] = cpu_engine_alloc(mb * RESNET18_INPUT_BYTES);
        pub->input_f32[s] = calloc(mb, sizeof *pub->input_f32[s]);
        pub->logits[s] = cpu_engine_alloc(mb * (size_t)pub->classes * sizeof(float));
        if (!pub->input[s] || !pub->input_f32[s] || !pub->logits[s]) {
            snprintf(err, errlen, "%s: out of memory for max batch %d", name, pub->max_batch);
            return -1;
        }
    }
    return 0;
}

void cpu_engine_free_slots(engine *pub)
{
    for (int s = 0; s < pub->nslots; s++) {
        free(pub->input[s]);
        free(pub->input_f32[s]);
        free(pub->logits[s]);
    }
}

int cpu_engine_check_memory(const engine *pub, const char *name, size_t per_image, char *err, size_t errlen)
{
    const double mb = pub->max_batch;
    const double need = mb * ((double)per_image + (double)pub->nslots * (RESNET18_INPUT_BYTES + pub->classes * 4.0));
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && need > (double)pages * page) {
        snprintf(err, errlen, "%s: max batch %d needs %.0f MiB, more than this machine's %.0f MiB", name,
                 pub->max_batch, need / 1048576.0, (double)pages * page / 1048576.0);
        return -1;
    }
    return 0;
}
