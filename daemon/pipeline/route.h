/* Where a JPEG that the GPU could decode is decoded: on the GPU, behind the
 * images already queued or being staged for it, or here on the decode thread that checked
 * it. Each path's cost is measured as the daemon runs (an exponentially
 * weighted mean of time per pixel: GPU stages by the completion threads,
 * CPU decodes by the decode threads), and an image goes to the CPU when
 * the CPU would finish it well before (route.c: CPU_MARGIN) the GPU got
 * through its backlog and it:
 * while the hardware decoder keeps up, everything goes to it; once it is
 * saturated (large photos, bursts) idle decode threads take work, so the
 * two add up, and each photo goes where it is answered first.
 *
 * The CPU's cost is kept per size class (small images cost more per pixel
 * than large ones, which the CPU decodes at a reduced DCT scale). Before a
 * path has been measured, a seed stands in: measured on an H100 host's
 * cores and its hardware decoder, so that the first saturation already
 * routes sensibly.
 *
 * Threads: any thread may record and decide at once; the means are
 * atomics (an update lost to a race costs nothing). */
#ifndef RESNETD_ROUTE_H
#define RESNETD_ROUTE_H

#include <stdatomic.h>
#include <stdint.h>

#define ROUTE_CPU_CLASSES 3 /* under 1 MP, 1-4 MP, 4 MP and over */

typedef struct decode_route {
    int ngpus; /* device decoders serving the one queue */
    atomic_uint_least64_t gpu_ps_per_px; /* one decoder's busy time per pixel, picoseconds */
    atomic_uint_least64_t cpu_ps_per_px[ROUTE_CPU_CLASSES]; /* one thread's decode time per pixel */
} decode_route;

void decode_route_init(decode_route *r, int ngpus);

/* A device stage of `pixels` compressed pixels kept its decoder busy for ns
 * (the longer of the host's call and the device's work). Stages under 4 MP
 * are not counted (route.c). */
void decode_route_gpu(decode_route *r, uint64_t pixels, uint64_t ns);

/* A CPU decode (as the decode threads do it beside the GPU) of a w x h
 * JPEG took ns on one thread. */
void decode_route_cpu(decode_route *r, int w, int h, uint64_t ns);

/* The pure decision: 1 when a w x h JPEG is answered well sooner by this thread
 * decoding it (cpu_ps per pixel) than by the GPU after backlog_px queued
 * pixels (gpu_ps per pixel, spread over ngpus decoders). */
int decode_route_cpu_sooner(uint64_t cpu_ps, uint64_t gpu_ps, int ngpus, int w, int h, uint64_t backlog_px);

/* decode_route_cpu_sooner with r's current means. */
int decode_route_to_cpu(const decode_route *r, int w, int h, uint64_t backlog_px);

/* The means, for metrics: picoseconds per pixel. */
uint64_t decode_route_gpu_ps(const decode_route *r);
uint64_t decode_route_cpu_ps(const decode_route *r, int cls);
/* The size class of a w x h image (0 .. ROUTE_CPU_CLASSES-1). */
int decode_route_class(int w, int h);

#endif
