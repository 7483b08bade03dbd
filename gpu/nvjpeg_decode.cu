// The nvJPEG hardware decoder as a device JPEG decoder (image/devjpeg.h):
// batches of compressed JPEGs -> decoded planes in a device arena (nvJPEG's
// hardware backend, batched) -> PIL-exact resize + crop (gpu/resize.cu),
// straight into the CUDA engine slot's device input.
//
// Two modes, measured on an H100 with the 0.58 MP corpus:
// - fast (decode = gpu): the hardware's planar RGB (NVJPEG_OUTPUT_RGB),
//   12.0k img/s with the rebuild below. Its chroma upsampling replicates
//   samples where libjpeg's "fancy" upsampling interpolates (4:2:0, 4:2:2
//   and 4:4:0 pixels then differed from the CPU path's by up to ~30 levels
//   at colour edges), so a kernel
//   first rebuilds Y, Cb, Cr from the RGB (gpu/chroma_rebuild.h) and the
//   resize upsamples them as libjpeg does: the same pixels but in a few
//   clamped ones.
// - exact (decode = gpu-exact): the raw Y, Cb, Cr planes
//   (NVJPEG_OUTPUT_YUV), upsampled and converted on the GPU as libjpeg-turbo
//   does: bit-exact with the CPU path on every test JPEG, but nvJPEG's
//   hardware backend produces planar YUV at only ~2.6k img/s (its host
//   side, 99.7% of the time inside nvjpegDecodeBatched).
//
// Ordering. Each engine slot has its own stream, nvJPEG state, pinned job
// table and arena (half of gpu_decode_memory with two slots), and a slot's
// device work runs on its stream in stage order. With one stream for both
// slots the hardware decode of the next batch queued behind this batch's
// rebuild and resize kernels; on two it overlaps them. The batcher stages a slot
// only once the engine has finished that slot's previous batch (infer's
// completion thread frees it after engine_wait), so nothing the slot holds
// is still in use and no host synchronisation is needed. Stream order
// alone did not protect an arena on an H100: when the chunks of a batch
// shared one arena with only stream order between a chunk's resize and the
// next chunk's hardware decode, the result came out wrong under
// compute-sanitizer (slow kernels), so an arena is never written while a
// resize may still read it without an explicit wait. The stage ends with an
// event that the engine's next submit on the slot waits for.
//
// Chunks. A batch whose decoded pixels exceed the slot's arena is decoded in
// chunks that each fit, the host waiting for one chunk's resize before the
// next chunk's decode reuses the arena (only such oversized batches ever
// wait). Images larger than the arena, or whose resize needs more taps
// than the kernel holds, never get here (check refuses them and the CPU
// decodes them).
//
// Failures. nvJPEG reports a failed batched decode for the whole batch: the
// chunk is then decoded again one image at a time, and an image that still
// fails is decoded by the caller's CPU fallback and uploaded.
//
// Header checks (check) run on the daemon's decode threads, each borrowing
// one of a fixed set of nvJPEG stream parsers.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <nvjpeg.h>
#include "gpu/cuda_check.cuh"
#include "gpu/engine_cuda.cuh"
#include "gpu/gpu.h"
#include "gpu/kernels.cuh"
#include "image/preprocess.h"

#define ARENA_ALIGN 256
// nvJPEG grows its internal buffers (the compressed bytes of a call) to the
// largest batch seen; padding makes a larger one later reuse them instead of
// reallocating. An eighth of the arena: what a full arena's JPEGs at about
// 3 bits per pixel take.
#define NVJPEG_MIN_DEVICE_PADDING ((size_t)64 << 20)
#define NVJPEG_MIN_PINNED_PADDING ((size_t)16 << 20)
#define NVJPEG_PADDING_SHARE 8
// gpu_decode_memory = auto. The hardware decoder's throughput grows with the
// images per call (an H200, 12 MP photos: 490 img/s at 8, 630 at 32, 840 at
// 96, 850 at 128; 2-3 MP: 2.3k, 3.2k, 3.7k, 3.8k), so the arena should hold
// a whole batch of large photos: 4G a slot takes 110 of 12 MP. Small GPUs
// give up at most an eighth of their memory.
#define ARENA_AUTO_BYTES ((size_t)8 << 30)
#define ARENA_AUTO_SHARE 8

static const char *nvjpeg_status_name(nvjpegStatus_t s)
{
    switch (s) {
    case NVJPEG_STATUS_SUCCESS: return "success";
    case NVJPEG_STATUS_NOT_INITIALIZED: return "not initialized";
    case NVJPEG_STATUS_INVALID_PARAMETER: return "invalid parameter";
    case NVJPEG_STATUS_BAD_JPEG: return "bad JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED: return "JPEG not supported";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE: return "allocator failure";
    case NVJPEG_STATUS_EXECUTION_FAILED: return "execution failed";
    case NVJPEG_STATUS_ARCH_MISMATCH: return "no hardware decoder on this device";
    case NVJPEG_STATUS_INTERNAL_ERROR: return "internal error";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED: return "implementation not supported";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM: return "incomplete bitstream";
    }
    return "unknown status";
}

#define NVJPEG_TRY(call)                                                                               \
    do {                                                                                               \
        nvjpegStatus_t s_ = (call);                                                                    \
        if (s_ != NVJPEG_STATUS_SUCCESS) {                                                             \
            snprintf(err, errlen, "%s:%d: %s: %s", __FILE__, __LINE__, #call, nvjpeg_status_name(s_)); \
            goto fail;                                                                                 \
        }                                                                                              \
    } while (0)

typedef struct nvj_slot {
    nvjpegJpegState_t state;
    uint8_t *arena;  // decoded planar RGB of one chunk
    cudaEvent_t chunk;  // after a chunk's resize, when another chunk follows
    resize_job *h_jobs, *d_jobs;  // [max_batch]: pinned, and its device copy
    nvjpegImage_t *outs;  // [max_batch] host
    cudaEvent_t start, staged;  // around the slot's last stage (timed)
    int timed;  // start and staged recorded by the last stage
    cudaStream_t stream;  // the slot's device work, in stage order
} nvj_slot;

typedef struct nvj_decoder {
    devjpeg pub;
    engine *e;
    int dev, max_batch;
    nvjpegHandle_t handle;
    size_t arena_bytes, device_bytes;  // arena_bytes: per slot
    int exact;  // YUV planes + libjpeg's upsampling, else the hardware's RGB
    nvjpegOutputFormat_t format;
    nvj_slot slot[ENGINE_MAX_SLOTS];
    uint8_t *failed;  // [max_batch], stage's scratch
    pthread_mutex_t parsers_mu;
    int parsers_init;
    nvjpegJpegStream_t *parsers;  // the free ones are parsers[0..nfree)
    int nparsers, nfree;
} nvj_decoder;

/* ---- check: on the decode threads ---------------------------------------- */

static nvjpegJpegStream_t parser_take(nvj_decoder *d)
{
    nvjpegJpegStream_t p = NULL;
    pthread_mutex_lock(&d->parsers_mu);
    if (d->nfree > 0)
        p = d->parsers[--d->nfree];
    pthread_mutex_unlock(&d->parsers_mu);
    return p;
}

static void parser_give(nvj_decoder *d, nvjpegJpegStream_t p)
{
    pthread_mutex_lock(&d->parsers_mu);
    d->parsers[d->nfree++] = p;
    pthread_mutex_unlock(&d->parsers_mu);
}

static size_t decoded_bytes(int w, int h)
{
    return ((size_t)w * (size_t)h * 3 + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
}

// Luma samples per chroma sample across and down for the layouts the
// device path takes; 0 for any other.
static int css_factors(nvjpegChromaSubsampling_t css, int *hs, int *vs)
{
    switch (css) {
    case NVJPEG_CSS_444:
        *hs = 1;
        *vs = 1;
        return 1;
    case NVJPEG_CSS_422:
        *hs = 2;
        *vs = 1;
        return 1;
    case NVJPEG_CSS_420:
        *hs = 2;
        *vs = 2;
        return 1;
    case NVJPEG_CSS_440:
        *hs = 1;
        *vs = 2;
        return 1;
    case NVJPEG_CSS_411:
        *hs = 4;
        *vs = 1;
        return 1;
    case NVJPEG_CSS_410:
        *hs = 4;
        *vs = 2;
        return 1;
    case NVJPEG_CSS_GRAY:
        *hs = 1;
        *vs = 1;
        return 1;
    default: return 0;
    }
}

// The stream parser's view of the JPEG must be what layout() assumes: the
// frame size the CPU read, a layout with known factors whose chroma planes
// have the subsampled size libjpeg gives them, and hardware support.
static int stream_ok(nvj_decoder *d, nvjpegJpegStream_t p, const uint8_t *jpeg, size_t len, int w, int h)
{
    unsigned int pw = 0, ph = 0;
    int unsupported = 1, hs, vs;
    nvjpegChromaSubsampling_t css = NVJPEG_CSS_UNKNOWN;
    if (nvjpegJpegStreamParseHeader(d->handle, jpeg, len, p) != NVJPEG_STATUS_SUCCESS ||
        nvjpegJpegStreamGetFrameDimensions(p, &pw, &ph) != NVJPEG_STATUS_SUCCESS || (int)pw != w || (int)ph != h ||
        nvjpegJpegStreamGetChromaSubsampling(p, &css) != NVJPEG_STATUS_SUCCESS || !css_factors(css, &hs, &vs))
        return 0;
    if (css != NVJPEG_CSS_GRAY)
        for (unsigned int c = 1; c < 3; c++) {
            unsigned int cw = 0, ch = 0;
            if (nvjpegJpegStreamGetComponentDimensions(p, c, &cw, &ch) != NVJPEG_STATUS_SUCCESS ||
                (int)cw != (w + hs - 1) / hs || (int)ch != (h + vs - 1) / vs)
                return 0;
        }
    // libjpeg replicates 2x-subsampled chroma under 3 samples wide where
    // the exact kernels would interpolate.
    if (d->exact && hs == 2 && (w + 1) / 2 <= 2)
        return 0;
    return nvjpegDecodeBatchedSupported(d->handle, p, &unsupported) == NVJPEG_STATUS_SUCCESS && unsupported == 0;
}

static devjpeg_reason nvj_check(void *ctx, const uint8_t *jpeg, size_t len, const preprocess_info *info)
{
    nvj_decoder *d = (nvj_decoder *)ctx;
    int w = info->w, h = info->h;
    preprocess_geom g;
    preprocess_geometry(w, h, &g);
    if (g.ksize_x > RESIZE_MAX_TAPS || g.ksize_y > RESIZE_MAX_TAPS || decoded_bytes(w, h) > d->arena_bytes)
        return DEVJPEG_TOO_LARGE;
    // Adobe RGB and CMYK JPEGs are not YCbCr; below 3 pixels libjpeg's
    // upsampling reads block padding the planes do not have.
    if (!info->ycc || (d->exact && (w < 3 || h < 3)))
        return DEVJPEG_UNSUPPORTED;
    // The hardware decodes a truncated stream without complaint; libjpeg
    // reports it. A stream that does not end in EOI (a cut-off upload, or
    // trailing bytes after EOI) goes to the CPU, which decides.
    if (len < 4 || jpeg[len - 2] != 0xFF || jpeg[len - 1] != 0xD9)
        return DEVJPEG_NO_EOI;
    nvjpegJpegStream_t p = parser_take(d);
    if (!p)
        return DEVJPEG_BUSY;
    devjpeg_reason r = stream_ok(d, p, jpeg, len, w, h) ? DEVJPEG_OK : DEVJPEG_UNSUPPORTED;
    parser_give(d, p);
    return r;
}

/* ---- stage: on the batcher thread ---------------------------------------- */

// Lays image (w x h) out at base as the hardware writes it: fast mode,
// three w x h RGB planes, whose replicated chroma the rebuild kernel turns
// back into Y, Cb, Cr before the resize; exact mode (NVJPEG_OUTPUT_YUV), Y,
// then Cb and Cr at their subsampled size (grey gets unused chroma planes
// too). Fills its output descriptor and the plane half of its job; returns
// the bytes used, at most decoded_bytes(w, h). Check accepted only layouts
// with known factors; anything else is laid out as 4:4:4 and its crop is
// whatever the decode gives, as with any image the device got wrong.
static size_t layout(nvj_decoder *d, const uint8_t *jpeg, size_t len, int w, int h, uint8_t *base, nvjpegImage_t *out,
                     resize_job *j)
{
    int nc = 0, widths[NVJPEG_MAX_COMPONENT] = { 0 }, heights[NVJPEG_MAX_COMPONENT] = { 0 }, hs = 1, vs = 1;
    nvjpegChromaSubsampling_t css = NVJPEG_CSS_UNKNOWN;
    if (nvjpegGetImageInfo(d->handle, jpeg, len, &nc, &css, widths, heights) != NVJPEG_STATUS_SUCCESS ||
        !css_factors(css, &hs, &vs))
        css = NVJPEG_CSS_444;
    size_t luma = (size_t)w * h;
    if (!d->exact) {
        resize_job_rebuilt(j, base, w, h, hs, vs);
        for (int c = 0; c < 3; c++) {
            out->channel[c] = base + c * luma;
            out->pitch[c] = (size_t)w;
        }
        return (3 * luma + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    }
    int cw = (w + hs - 1) / hs, ch = (h + vs - 1) / vs;
    size_t chroma = (size_t)cw * ch;
    out->channel[0] = base;
    out->pitch[0] = (size_t)w;
    out->channel[1] = base + luma;
    out->pitch[1] = (size_t)cw;
    out->channel[2] = base + luma + chroma;
    out->pitch[2] = (size_t)cw;
    resize_job_planes(j, css == NVJPEG_CSS_GRAY ? RESIZE_SRC_GRAY : RESIZE_SRC_YCC, hs, vs, base, w, h, out->channel[1],
                      out->channel[2], cw, ch, cw, 1);
    return ((luma + 2 * chroma) + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
}

// Decodes images [i0, i0+m) of the batch into the arena (laid out as
// jobs[] says) with one batched call; on failure, one image at a time,
// marking those that still fail.
static int decode_chunk(nvj_decoder *d, nvj_slot *sl, const uint8_t *const *jpeg, const size_t *len, int i0, int m,
                        char *err, size_t errlen)
{
    NVJPEG_TRY(nvjpegDecodeBatchedInitialize(d->handle, sl->state, m, 1, d->format));
    if (nvjpegDecodeBatched(d->handle, sl->state, jpeg + i0, len + i0, sl->outs + i0, sl->stream) ==
        NVJPEG_STATUS_SUCCESS)
        return 0;
    NVJPEG_TRY(nvjpegDecodeBatchedInitialize(d->handle, sl->state, 1, 1, d->format));
    for (int i = i0; i < i0 + m; i++)
        if (nvjpegDecodeBatched(d->handle, sl->state, jpeg + i, len + i, sl->outs + i, sl->stream) !=
            NVJPEG_STATUS_SUCCESS) {
            d->failed[i] = 1;
            // A failed batch leaves the state to be reset.
            NVJPEG_TRY(nvjpegDecodeBatchedInitialize(d->handle, sl->state, 1, 1, d->format));
        }
    return 0;
fail:
    return -1;
}

static int nvj_stage(void *ctx, int s, int nhost, const uint8_t *const *jpeg, const size_t *len, const int *w,
                     const int *h, int n, devjpeg_fallback_fn fallback, void *cls, int *nfallback, char *err,
                     size_t errlen)
{
    nvj_decoder *d = (nvj_decoder *)ctx;
    nvj_slot *sl = &d->slot[s];
    uint8_t *d_in = engine_cuda_device_input(d->e, s);
    uint8_t *h_in = d->e->input[s];
    if (!d_in || nhost < 0 || n < 0 || nhost + n > d->max_batch) {
        snprintf(err, errlen, "device JPEG stage: bad slot %d or batch %d + %d", s, nhost, n);
        return -1;
    }
    CUDA_TRY(cudaSetDevice(d->dev));
    // The slot's state and job table must be idle before they are reused.
    // In the daemon the engine has waited for this slot's last batch, so the
    // event is complete and this returns at once; it guards other callers
    // (the benchmark stages back to back).
    if (sl->timed)
        CUDA_TRY(cudaEventSynchronize(sl->staged));
    sl->timed = 0;
    CUDA_TRY(cudaEventRecord(sl->start, sl->stream));
    if (nhost > 0)
        CUDA_TRY(cudaMemcpyAsync(d_in, h_in, (size_t)nhost * RESNET18_INPUT_BYTES, cudaMemcpyHostToDevice, sl->stream));
    memset(d->failed, 0, (size_t)n);
    for (int i0 = 0; i0 < n;) {
        size_t off = 0;
        int m = 0;
        for (int i = i0; i < n && off + decoded_bytes(w[i], h[i]) <= d->arena_bytes; i++, m++) {
            resize_job *j = &sl->h_jobs[i];
            preprocess_geom g;
            preprocess_geometry(w[i], h[i], &g);
            off += layout(d, jpeg[i], len[i], w[i], h[i], sl->arena + off, &sl->outs[i], j);
            j->rw = g.rw;
            j->rh = g.rh;
            j->left = g.left;
            j->top = g.top;
            j->dst = d_in + (size_t)(nhost + i) * RESNET18_INPUT_BYTES;
        }
        if (m == 0) {
            snprintf(err, errlen, "device JPEG stage: a %dx%d image does not fit the arena", w[i0], h[i0]);
            goto fail;
        }
        if (i0 > 0)  // the previous chunk's resize must be done with the arena
            CUDA_TRY(cudaEventSynchronize(sl->chunk));
        if (decode_chunk(d, sl, jpeg, len, i0, m, err, errlen) != 0)
            goto fail;
        CUDA_TRY(cudaMemcpyAsync(sl->d_jobs + i0, sl->h_jobs + i0, (size_t)m * sizeof(resize_job),
                                 cudaMemcpyHostToDevice, sl->stream));
        CUDA_TRY(chroma_rebuild_launch(sl->d_jobs + i0, m, sl->stream));
        CUDA_TRY(resize_crop_launch(sl->d_jobs + i0, m, sl->stream));
        i0 += m;
        if (i0 < n)
            CUDA_TRY(cudaEventRecord(sl->chunk, sl->stream));
    }
    // A failed image's crop above was made from whatever the arena held;
    // the CPU's crop, uploaded after it in stream order, replaces it.
    for (int i = 0; i < n; i++) {
        if (!d->failed[i])
            continue;
        ++*nfallback;
        uint8_t *host = h_in + (size_t)(nhost + i) * RESNET18_INPUT_BYTES;
        if (fallback(cls, i, host) == 0)
            CUDA_TRY(cudaMemcpyAsync(d_in + (size_t)(nhost + i) * RESNET18_INPUT_BYTES, host, RESNET18_INPUT_BYTES,
                                     cudaMemcpyHostToDevice, sl->stream));
    }
    CUDA_TRY(cudaEventRecord(sl->staged, sl->stream));
    if (engine_cuda_input_staged(d->e, s, sl->staged) != 0) {
        snprintf(err, errlen, "device JPEG stage: the engine is not a CUDA engine");
        goto fail;
    }
    sl->timed = 1;
    return 0;
fail:
    // The batch is answered (and its bodies freed) when this returns: let
    // the work already queued, which may still read them, finish first.
    cudaStreamSynchronize(sl->stream);
    return -1;
}

// After the engine's wait on the slot both events have completed, so this
// never blocks.
static double nvj_stage_ms(void *ctx, int s)
{
    nvj_decoder *d = (nvj_decoder *)ctx;
    float ms = -1.0f;
    if (s < 0 || s >= d->e->nslots || !d->slot[s].timed ||
        cudaEventElapsedTime(&ms, d->slot[s].start, d->slot[s].staged) != cudaSuccess)
        return -1.0;
    return ms;
}

static int nvj_sync(void *ctx, char *err, size_t errlen)
{
    nvj_decoder *d = (nvj_decoder *)ctx;
    CUDA_TRY(cudaSetDevice(d->dev));
    for (int s = 0; s < d->e->nslots; s++)
        CUDA_TRY(cudaStreamSynchronize(d->slot[s].stream));
    return 0;
fail:
    return -1;
}

static size_t nvj_device_memory(void *ctx)
{
    return ((nvj_decoder *)ctx)->device_bytes;
}

static void nvj_destroy(void *ctx)
{
    nvj_decoder *d = (nvj_decoder *)ctx;
    if (!d)
        return;
    cudaSetDevice(d->dev);
    for (int s = 0; s < ENGINE_MAX_SLOTS; s++)
        if (d->slot[s].stream)
            cudaStreamSynchronize(d->slot[s].stream);
    for (int s = 0; s < ENGINE_MAX_SLOTS; s++) {
        nvj_slot *sl = &d->slot[s];
        if (sl->state)  // before its stream: the state may hold stream-ordered memory
            nvjpegJpegStateDestroy(sl->state);
        if (sl->stream)
            cudaStreamDestroy(sl->stream);
        cudaFreeHost(sl->h_jobs);
        cudaFree(sl->d_jobs);
        free(sl->outs);
        if (sl->start)
            cudaEventDestroy(sl->start);
        if (sl->staged)
            cudaEventDestroy(sl->staged);
        if (sl->chunk)
            cudaEventDestroy(sl->chunk);
        cudaFree(sl->arena);
    }
    for (int i = 0; i < d->nfree; i++)
        nvjpegJpegStreamDestroy(d->parsers[i]);
    free(d->parsers);
    if (d->parsers_init)
        pthread_mutex_destroy(&d->parsers_mu);
    if (d->handle)
        nvjpegDestroy(d->handle);
    free(d->failed);
    free(d);
}

// The slots' states, arenas and job tables are sized by the slot count and
// max batch, not tied to the engine's buffers, which stage looks up anew.
static int nvj_retarget(void *ctx, engine *e, char *err, size_t errlen)
{
    nvj_decoder *d = (nvj_decoder *)ctx;
    if (e->device != ENGINE_DEVICE_CUDA || e->device_index != d->dev || e->nslots != d->e->nslots ||
        e->max_batch != d->max_batch) {
        snprintf(err, errlen,
                 "the GPU JPEG decoder serves cuda:%d with %d slots of %d images; the new engine "
                 "differs",
                 d->dev, d->e->nslots, d->max_batch);
        return -1;
    }
    d->e = e;
    return 0;
}

static const devjpeg_ops nvj_ops = {
    "nvjpeg-hardware", nvj_check, nvj_stage, nvj_stage_ms, nvj_sync, nvj_device_memory, nvj_destroy, nvj_retarget,
};

extern "C" devjpeg *gpu_jpeg_create(engine *e, size_t arena_bytes, int checkers, int exact, char *err, size_t errlen)
{
    nvj_decoder *d = (nvj_decoder *)calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, errlen, "out of memory creating the GPU JPEG decoder");
        return NULL;
    }
    d->pub.ops = &nvj_ops;
    d->pub.ctx = d;
    d->e = e;
    d->dev = e->device_index;
    d->max_batch = e->max_batch;
    d->exact = exact;
    d->format = exact ? NVJPEG_OUTPUT_YUV : NVJPEG_OUTPUT_RGB;
    size_t nb = (size_t)e->max_batch;
    if (checkers < 1)
        checkers = 1;
    if (pthread_mutex_init(&d->parsers_mu, NULL) != 0) {
        snprintf(err, errlen, "GPU JPEG decoder: cannot create a mutex");
        goto fail;
    }
    d->parsers_init = 1;
    CUDA_TRY(cudaSetDevice(d->dev));
    if (arena_bytes == 0) {
        size_t free_b = 0, total_b = 0;
        CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
        arena_bytes = total_b / ARENA_AUTO_SHARE < ARENA_AUTO_BYTES ? total_b / ARENA_AUTO_SHARE : ARENA_AUTO_BYTES;
    }
    d->arena_bytes = arena_bytes / (size_t)e->nslots / ARENA_ALIGN * ARENA_ALIGN;
    {
        nvjpegStatus_t st = nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, NULL, NULL, 0, &d->handle);
        if (st != NVJPEG_STATUS_SUCCESS) {
            d->handle = NULL;
            snprintf(err, errlen, "nvJPEG hardware decoder unavailable on cuda:%d: %s", d->dev, nvjpeg_status_name(st));
            goto fail;
        }
    }
    {
        size_t pad = d->arena_bytes / NVJPEG_PADDING_SHARE;
        NVJPEG_TRY(
            nvjpegSetDeviceMemoryPadding(pad > NVJPEG_MIN_DEVICE_PADDING ? pad : NVJPEG_MIN_DEVICE_PADDING, d->handle));
        NVJPEG_TRY(
            nvjpegSetPinnedMemoryPadding(pad > NVJPEG_MIN_PINNED_PADDING ? pad : NVJPEG_MIN_PINNED_PADDING, d->handle));
    }
    d->failed = (uint8_t *)calloc(nb, 1);
    d->parsers = (nvjpegJpegStream_t *)calloc((size_t)checkers, sizeof *d->parsers);
    if (!d->failed || !d->parsers) {
        snprintf(err, errlen, "out of memory creating the GPU JPEG decoder");
        goto fail;
    }
    for (; d->nfree < checkers; d->nfree++)
        NVJPEG_TRY(nvjpegJpegStreamCreate(d->handle, &d->parsers[d->nfree]));
    d->nparsers = checkers;
    for (int s = 0; s < e->nslots; s++) {
        nvj_slot *sl = &d->slot[s];
        CUDA_TRY(cudaStreamCreateWithFlags(&sl->stream, cudaStreamNonBlocking));
        NVJPEG_TRY(nvjpegJpegStateCreate(d->handle, &sl->state));
        CUDA_TRY(cudaMalloc((void **)&sl->arena, d->arena_bytes));
        d->device_bytes += d->arena_bytes;
        CUDA_TRY(cudaEventCreateWithFlags(&sl->chunk, cudaEventDisableTiming | cudaEventBlockingSync));
        CUDA_TRY(cudaHostAlloc((void **)&sl->h_jobs, nb * sizeof(resize_job), cudaHostAllocDefault));
        CUDA_TRY(cudaMalloc((void **)&sl->d_jobs, nb * sizeof(resize_job)));
        d->device_bytes += nb * sizeof(resize_job);
        CUDA_TRY(cudaEventCreate(&sl->start));
        CUDA_TRY(cudaEventCreate(&sl->staged));
        sl->outs = (nvjpegImage_t *)calloc(nb, sizeof *sl->outs);
        if (!sl->outs) {
            snprintf(err, errlen, "out of memory creating the GPU JPEG decoder");
            goto fail;
        }
    }
    return &d->pub;
fail:
    nvj_destroy(d);
    return NULL;
}
