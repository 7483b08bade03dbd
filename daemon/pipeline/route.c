/* Decode routing by measured cost: see route.h. */
#include "daemon/pipeline/route.h"

/* Seeds, picoseconds per pixel: the hardware decoder at ~12k img/s of
 * 0.58 MP; one core decoding (DCT-scaled where large) a web photo, a 2-3
 * MP one and a 12 MP one. */
#define SEED_GPU_PS 140
static const uint64_t seed_cpu_ps[ROUTE_CPU_CLASSES] = { 12000, 6000, 3000 };

/* The CPU must be this many times sooner by the means: its crop still
 * waits for the GPU stage of its batch, its decodes share cores with the
 * HTTP and pipeline threads, and the GPU's mean per pixel, taken at
 * whatever batch sizes ran, overstates what one more image adds to a
 * batch. At 1 (the means alone) the CPU took 18% of 0.58 MP photos at
 * 64-512 connections, and p99 at 64, where the GPU is far from
 * saturated, rose from 10.4 to 15 ms (H200). */
#define CPU_MARGIN 2

/* A stage of fewer pixels is no sample of the GPU's cost: its fixed cost
 * per call dominates (a small JPEG alone measured 1.18 s a megapixel on
 * an H200, and at that mean every later image looked sooner on the CPU,
 * so the GPU got none to measure again). The router matters once a
 * backlog builds, and then stages are larger; where they never reach 4 MP
 * (thumbnails, small batches) the seed stands. */
#define GPU_MIN_SAMPLE_PX 4000000u

/* New samples weigh 1/8: a few batches move the mean, one outlier does not. */
static void ewma(atomic_uint_least64_t *m, uint64_t sample)
{
    uint64_t old = atomic_load_explicit(m, memory_order_relaxed);
    uint64_t now = old - old / 8 + sample / 8;
    atomic_store_explicit(m, now ? now : 1, memory_order_relaxed);
}

void decode_route_init(decode_route *r, int ngpus)
{
    r->ngpus = ngpus > 0 ? ngpus : 1;
    atomic_init(&r->gpu_ps_per_px, SEED_GPU_PS);
    for (int c = 0; c < ROUTE_CPU_CLASSES; c++)
        atomic_init(&r->cpu_ps_per_px[c], seed_cpu_ps[c]);
}

int decode_route_class(int w, int h)
{
    uint64_t px = (uint64_t)w * (uint64_t)h;
    return px < 1000000 ? 0 : px < 4000000 ? 1 : 2;
}

void decode_route_gpu(decode_route *r, uint64_t pixels, uint64_t ns)
{
    if (pixels >= GPU_MIN_SAMPLE_PX)
        ewma(&r->gpu_ps_per_px, ns * 1000 / pixels);
}

void decode_route_cpu(decode_route *r, int w, int h, uint64_t ns)
{
    uint64_t px = (uint64_t)w * (uint64_t)h;
    if (px > 0)
        ewma(&r->cpu_ps_per_px[decode_route_class(w, h)], ns * 1000 / px);
}

int decode_route_cpu_sooner(uint64_t cpu_ps, uint64_t gpu_ps, int ngpus, int w, int h, uint64_t backlog_px)
{
    uint64_t px = (uint64_t)w * (uint64_t)h;
    /* in picoseconds: 64 MP at 1 us a pixel, twice, is 1.3e14, far inside 64 bits */
    uint64_t cpu = px * cpu_ps * CPU_MARGIN, gpu = (backlog_px + px) * gpu_ps / (uint64_t)(ngpus > 0 ? ngpus : 1);
    return cpu < gpu;
}

int decode_route_to_cpu(const decode_route *r, int w, int h, uint64_t backlog_px)
{
    return decode_route_cpu_sooner(decode_route_cpu_ps(r, decode_route_class(w, h)), decode_route_gpu_ps(r), r->ngpus,
                                   w, h, backlog_px);
}

uint64_t decode_route_gpu_ps(const decode_route *r)
{
    return atomic_load_explicit(&r->gpu_ps_per_px, memory_order_relaxed);
}

uint64_t decode_route_cpu_ps(const decode_route *r, int cls)
{
    return atomic_load_explicit(&r->cpu_ps_per_px[cls], memory_order_relaxed);
}
