/* The CPU engines' shared base: a small thread pool, the engine-interface
 * functions they share (submit computes under the lock, wait has nothing to
 * do, no device memory), and their common set-up (the public fields, the
 * slots, the memory check, aligned buffers). A job is a count of independent units that the
 * pool threads claim one at a time; the thread that runs the job works as
 * thread 0 beside nthreads-1 workers, which sleep between jobs.
 * One job at a time: cpu_pool_run is called by one thread (the engine's
 * submitter, under the engine's own lock). Starting the pool allocates;
 * running a job allocates nothing. */
#ifndef RESNETD_CPU_POOL_H
#define RESNETD_CPU_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include "engine/engine.h"
#include "model/resnet18.h"

#define CPU_POOL_MAX_THREADS 256

/* Runs unit `unit` of the current job on pool thread tid (0: the caller). */
typedef void cpu_pool_fn(void *ctx, int unit, int tid);

typedef struct cpu_pool {
    int nthreads; /* including the caller */
    pthread_t th[CPU_POOL_MAX_THREADS];
    int started; /* worker threads running (nthreads - 1 when complete) */
    int inited; /* mutex and conditions initialised */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned long gen; /* under mu: bumped per job to wake sleeping workers */
    int stop;
    cpu_pool_fn *fn; /* the current job; stable while any unit of it runs */
    void *ctx;
    /* (job number << 40) | (units << 20) | next unit: claiming a unit is one
     * compare-and-swap that also proves the job is still the current one. */
    _Atomic uint64_t work;
    atomic_int done_units;
    uint64_t seq; /* jobs published */
} cpu_pool;

/* Starts nthreads-1 workers (1..CPU_POOL_MAX_THREADS). pl must be zeroed.
 * On failure cpu_pool_stop still must be called. */
int cpu_pool_start(cpu_pool *pl, int nthreads, char *err, size_t errlen);
/* Runs units 0..nunits-1 (fewer than 2^20) of fn and returns when all are done. */
void cpu_pool_run(cpu_pool *pl, cpu_pool_fn *fn, void *ctx, int nunits);
/* Joins the workers; safe on a zeroed or partly started pool. */
void cpu_pool_stop(cpu_pool *pl);

/* CPUs this process may run on. */
int cpu_pool_cpu_count(void);

/* Splits [0, total) into nparts near-equal parts; part i is [*lo, *hi). */
static inline void cpu_pool_split(int total, int nparts, int i, int *lo, int *hi)
{
    *lo = (int)((long)total * i / nparts);
    *hi = (int)((long)total * (i + 1) / nparts);
}

/* The engine interface of both CPU engines: a batch is computed inside
 * submit, under the engine's lock mu (its buffers serve every slot), so
 * wait has nothing left to do. cpu_engine_submit checks n against
 * 1..max_batch, then runs forward(e, slot, n). */
int cpu_engine_submit(pthread_mutex_t *mu, int max_batch, void (*forward)(void *e, int slot, int n), void *e, int slot,
                      int n, char *err, size_t errlen);
int cpu_engine_wait(void *ctx, int slot, char *err, size_t errlen);
/* Their device and pinned memory: none. */
size_t cpu_engine_no_device_memory(void *ctx);

/* Zeroed, 64-byte aligned (aligned vector loads rely on it), with 64 bytes of
 * slack; buffers of 4 MiB or more ask for transparent huge pages (the GEMMs
 * walk weights and activations in strides that would often miss the TLB).
 * Free with free(). */
void *cpu_engine_alloc(size_t bytes);

/* The public fields every CPU engine sets the same way (slots: cfg's, or 2),
 * its slots' buffers (uint8 input, FP32 input pointers, FP32 logits), and
 * their release; name prefixes errors ("cpu engine"). */
void cpu_engine_init_pub(engine *pub, const engine_ops *ops, void *ctx, engine_precision precision,
                         const resnet18_weights *w, const engine_config *cfg);
int cpu_engine_alloc_slots(engine *pub, const char *name, char *err, size_t errlen);
void cpu_engine_free_slots(engine *pub);

/* Every buffer is touched at create: refuses a max batch whose buffers
 * (per_image bytes each, plus the slots') outgrow the machine's memory,
 * rather than be killed for it later. */
int cpu_engine_check_memory(const engine *pub, const char *name, size_t per_image, char *err, size_t errlen);

/* GCC's function multi-versioning: the widest vector ISA is picked at load
 * time, the loops are plain C either way. With -ffp-contract=off every
 * clone does the same float operations, so the results are the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CPU_VECTOR_CLONES \
    __attribute__((target_clones("arch=icelake-server", "arch=skylake-avx512", "avx2", "default")))
#else
#define CPU_VECTOR_CLONES
#endif

/* The FC of one image: logits[k] = (sum over 16 lanes of lane j's partial
 * sum of f[c] * w[k][c], c = j, j + 16, ...) + b[k]; features is
 * RESNET18_FEATURES long. The order is fixed and per image, so an image's
 * logits do not depend on the batch it came in (a GEMM's would: its sums
 * depend on where a row falls in its tiles). Both CPU engines use it. */
void cpu_engine_fc(const float *f, const float *w, const float *b, int classes, int features, float *logits);

#endif
