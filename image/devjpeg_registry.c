/* The device JPEG decoder registry (image/devjpeg_registry.h), and the
 * warm-up every device decoder gets before serving. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>
#include "config.h"
#include "image/devjpeg_registry.h"
#if defined(HAVE_CUDA) && defined(HAVE_NVJPEG)
#include "gpu/gpu.h"
#endif

#define WARM_W 1024
#define WARM_H 768

#if defined(HAVE_CUDA) && defined(HAVE_NVJPEG)
/* A photo-like synthetic JPEG (gradients and noise, 4:2:0, quality 90),
 * malloc'd into *jpeg. */
static int warm_jpeg(uint8_t **jpeg, size_t *len, char *err, size_t errlen)
{
    uint8_t *rgb = malloc((size_t)WARM_W * WARM_H * 3);
    tjhandle tj = tjInitCompress();
    unsigned char *out = NULL;
    unsigned long outlen = 0;
    int rc = -1;
    if (!rgb || !tj) {
        snprintf(err, errlen, "device JPEG warm-up: out of memory");
        goto done;
    }
    uint32_t seed = 12345;
    for (int y = 0; y < WARM_H; y++)
        for (int x = 0; x < WARM_W; x++) {
            seed = seed * 1664525u + 1013904223u;
            uint8_t *p = rgb + ((size_t)y * WARM_W + x) * 3;
            p[0] = (uint8_t)(x * 255 / WARM_W + (seed >> 28));
            p[1] = (uint8_t)(y * 255 / WARM_H + (seed >> 29));
            p[2] = (uint8_t)((x + y) & 0xff);
        }
    if (tjCompress2(tj, rgb, WARM_W, 0, WARM_H, TJPF_RGB, &out, &outlen, TJSAMP_420, 90, TJFLAG_ACCURATEDCT) != 0) {
        snprintf(err, errlen, "device JPEG warm-up: cannot encode: %s", tjGetErrorStr2(tj));
        goto done;
    }
    *jpeg = malloc(outlen);
    if (!*jpeg) {
        snprintf(err, errlen, "device JPEG warm-up: out of memory");
        goto done;
    }
    memcpy(*jpeg, out, outlen);
    *len = outlen;
    rc = 0;
done:
    tjFree(out);
    if (tj)
        tjDestroy(tj);
    free(rgb);
    return rc;
}

/* Stages a full batch on every slot and runs it through the engine, so
 * the decoder's and the engine's buffers are sized before any request. */
static int warm_up(devjpeg *d, engine *e, char *err, size_t errlen)
{
    uint8_t *jpeg = NULL;
    size_t len = 0;
    int n = e->max_batch, rc = -1;
    const uint8_t **ptrs = calloc((size_t)n, sizeof *ptrs);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    int *ws = calloc((size_t)n, sizeof *ws), *hs = calloc((size_t)n, sizeof *hs);
    if (!ptrs || !lens || !ws || !hs) {
        snprintf(err, errlen, "device JPEG warm-up: out of memory");
        goto done;
    }
    if (warm_jpeg(&jpeg, &len, err, errlen) != 0)
        goto done;
    preprocess_info info = { .w = WARM_W, .h = WARM_H, .ycc = 1 };
    if (devjpeg_check(d, jpeg, len, &info) != DEVJPEG_OK) {
        snprintf(err, errlen, "device JPEG warm-up: the device refuses a baseline 4:2:0 JPEG");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        ptrs[i] = jpeg;
        lens[i] = len;
        ws[i] = WARM_W;
        hs[i] = WARM_H;
    }
    for (int s = 0; s < e->nslots; s++) {
        int nfb = 0;
        if (devjpeg_stage(d, s, 0, ptrs, lens, ws, hs, n, devjpeg_fallback_none, NULL, &nfb, err, errlen) != 0 ||
            engine_submit(e, s, n, err, errlen) != 0 || engine_wait(e, s, err, errlen) != 0)
            goto done;
        if (nfb > 0) {
            snprintf(err, errlen, "device JPEG warm-up: the device failed on %d of %d images", nfb, n);
            goto done;
        }
    }
    rc = 0;
done:
    free(jpeg);
    free(ptrs);
    free(lens);
    free(ws);
    free(hs);
    return rc;
}

#endif

devjpeg *devjpeg_create(engine *e, size_t arena_bytes, int checkers, int exact, char *err, size_t errlen)
{
    if (e->device != ENGINE_DEVICE_CUDA) {
        snprintf(err, errlen, "GPU JPEG decoding needs the CUDA engine (the engine is %s)",
                 engine_device_name(e->device));
        return NULL;
    }
#if defined(HAVE_CUDA) && defined(HAVE_NVJPEG)
    devjpeg *d = gpu_jpeg_create(e, arena_bytes, checkers, exact, err, errlen);
    if (d)
        d->exact = exact != 0;
    if (d && warm_up(d, e, err, errlen) != 0) {
        devjpeg_destroy(d);
        return NULL;
    }
    return d;
#else
    (void)arena_bytes;
    (void)checkers;
    (void)exact;
    snprintf(err, errlen, "resnetd was built without nvJPEG");
    return NULL;
#endif
}
