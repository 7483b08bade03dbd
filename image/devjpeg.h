/* Device JPEG decoding: compressed JPEGs -> preprocessed crops written
 * straight into an engine slot's device input, with no pixels through the
 * host. One backend today: nvJPEG's hardware decoder plus the PIL-exact
 * resize on the GPU (gpu/nvjpeg_decode.cu). As with engines, a backend
 * fills an ops table and devjpeg_create() alone knows which exist.
 *
 * Flow in the daemon: a decode thread checks a JPEG's header on the CPU
 * (preprocess_header: the same 4xx answers as the CPU path) and asks
 * devjpeg_check() whether the device can decode it; if so, the compressed
 * bytes go to the queue instead of a decoded crop. The batcher puts the
 * batch's CPU-decoded crops first in the engine slot's host input
 * (positions 0..nhost-1) and calls devjpeg_stage(), which uploads those and
 * decodes the compressed images into positions nhost.. on the device; the
 * engine's next submit on that slot starts from the device input.
 *
 * Fidelity: the resize, crop and normalisation are bit-exact with the CPU
 * path on the same decoded pixels. In fast mode the hardware's chroma
 * upsampling differs from libjpeg's, so 4:2:0 and 4:2:2 pixels differ by a
 * few levels at colour edges; exact mode upsamples and converts the
 * hardware's Y/Cb/Cr planes as libjpeg does and matches the CPU path bit
 * for bit, at a fraction of the speed (protocol/API.md has the figures).
 *
 * Threads: check from any thread; stage from one thread at a time on a slot
 * it holds (the batcher), stage_ms after that slot's engine_wait. */
#ifndef RESNETD_DEVJPEG_H
#define RESNETD_DEVJPEG_H

#include <stddef.h>
#include <stdint.h>
#include "engine/engine.h"
#include "image/preprocess.h"

#ifdef __cplusplus
extern "C" { /* also included by the CUDA sources */
#endif

/* Why an image is decoded on the CPU instead. */
typedef enum {
    DEVJPEG_OK = 0,
    DEVJPEG_UNSUPPORTED, /* the hardware refuses the stream: progressive, arithmetic, 12-bit... */
    DEVJPEG_TOO_LARGE, /* over the device path's size limits */
    DEVJPEG_NO_EOI, /* no EOI marker at the end: possibly truncated, which the CPU reports */
    DEVJPEG_BUSY, /* every header parser in use (more checking threads than parsers) */
    DEVJPEG_DEVICE_ERROR, /* the device decode failed (stage's per-image fallback) */
    DEVJPEG_SATURATED, /* not a failure: the device decoder had a backlog and a CPU was free */
    DEVJPEG_NREASONS
} devjpeg_reason;

/* Stage calls this for an image the device failed to decode: decode image
 * `index` on the CPU into out (224x224x3 HWC); 0, or -1 when the CPU
 * cannot either (the caller answers that image; its crop is unused). */
typedef int (*devjpeg_fallback_fn)(void *cls, int index, uint8_t *out);
/* A fallback that decodes nothing (-1), for callers whose images are known
 * to decode: the warm-up, the benchmark. */
int devjpeg_fallback_none(void *cls, int index, uint8_t *out);

typedef struct devjpeg_ops {
    const char *name;
    /* DEVJPEG_OK when the device can decode this JPEG, whose header the
     * CPU already read (info), else a reason. */
    devjpeg_reason (*check)(void *ctx, const uint8_t *jpeg, size_t len, const preprocess_info *info);
    /* See devjpeg_stage. */
    int (*stage)(void *ctx, int slot, int nhost, const uint8_t *const *jpeg, const size_t *len, const int *w,
                 const int *h, int n, devjpeg_fallback_fn fallback, void *cls, int *nfallback, char *err,
                 size_t errlen);
    /* Optional: milliseconds the device spent staging slot's last batch;
     * -1 when unknown. */
    double (*stage_ms)(void *ctx, int slot);
    /* Optional: waits until every stage so far has finished on the device
     * (benchmarks and tests; the daemon relies on the engine's wait). */
    int (*sync)(void *ctx, char *err, size_t errlen);
    /* Optional: device bytes held. */
    size_t (*device_memory)(void *ctx);
    void (*destroy)(void *ctx);
    /* Optional: see devjpeg_retarget. */
    int (*retarget)(void *ctx, engine *e, char *err, size_t errlen);
} devjpeg_ops;

typedef struct devjpeg {
    const devjpeg_ops *ops;
    void *ctx;
    /* Pixels bit-exact with the CPU path (gpu-exact). Otherwise (gpu) the
     * CPU decodes beside the device in preprocess's fast mode too: large
     * photos at a DCT scale, devjpeg_cpu_options. */
    int exact;
} devjpeg;

/* The preprocess options of the CPU decodes that serve beside device d
 * (the decode threads' fallbacks and assists, the batcher's): fast (DCT
 * scaling) unless d is NULL (decode = cpu) or exact. */
preprocess_options devjpeg_cpu_options(const devjpeg *d, uint64_t max_pixels);

typedef enum { DEVJPEG_MODE_AUTO, DEVJPEG_MODE_GPU, DEVJPEG_MODE_GPU_EXACT, DEVJPEG_MODE_CPU } devjpeg_mode;

int devjpeg_parse_mode(const char *s, devjpeg_mode *m);

void devjpeg_destroy(devjpeg *d);

devjpeg_reason devjpeg_check(devjpeg *d, const uint8_t *jpeg, size_t len, const preprocess_info *info);

/* Fills slot's device input for a batch of nhost + n images: uploads
 * positions 0..nhost-1 of the slot's host input (CPU-decoded crops) and
 * decodes jpeg[0..n) (each w[i] x h[i], checked) into positions nhost..
 * Images the device fails on go through fallback, one by one; *nfallback
 * counts them. Then the engine's next submit on the slot uses the device
 * input. 0, or -1 with err on a device error (the batch cannot run). */
int devjpeg_stage(devjpeg *d, int slot, int nhost, const uint8_t *const *jpeg, const size_t *len, const int *w,
                  const int *h, int n, devjpeg_fallback_fn fallback, void *cls, int *nfallback, char *err,
                  size_t errlen);

/* Stages into engine e from now on (a hot reload's new engine): e must be
 * on the same device with the same slots and max batch, and neither engine
 * may have a batch staged or in flight. 0, or -1 with err. */
int devjpeg_retarget(devjpeg *d, engine *e, char *err, size_t errlen);

double devjpeg_stage_ms(devjpeg *d, int slot);
int devjpeg_sync(devjpeg *d, char *err, size_t errlen);
size_t devjpeg_device_memory(devjpeg *d);

/* Stable short name of a reason, for metrics labels ("unsupported", ...);
 * inline so that the metrics module needs no decoder code. */
static inline const char *devjpeg_reason_name(devjpeg_reason r)
{
    switch (r) {
    case DEVJPEG_OK: return "ok";
    case DEVJPEG_UNSUPPORTED: return "unsupported";
    case DEVJPEG_TOO_LARGE: return "too_large";
    case DEVJPEG_NO_EOI: return "no_eoi";
    case DEVJPEG_BUSY: return "busy";
    case DEVJPEG_DEVICE_ERROR: return "device_error";
    case DEVJPEG_SATURATED: return "gpu_saturated";
    case DEVJPEG_NREASONS: break;
    }
    return "unknown";
}

#ifdef __cplusplus
}
#endif

#endif
