/* The device-independent calls of the device JPEG decoder interface
 * (image/devjpeg.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "image/devjpeg.h"

preprocess_options devjpeg_cpu_options(const devjpeg *d, uint64_t max_pixels)
{
    return (preprocess_options){ .max_pixels = max_pixels, .fast = d && !d->exact };
}

int devjpeg_parse_mode(const char *s, devjpeg_mode *m)
{
    if (strcmp(s, "auto") == 0)
        *m = DEVJPEG_MODE_AUTO;
    else if (strcmp(s, "gpu") == 0)
        *m = DEVJPEG_MODE_GPU;
    else if (strcmp(s, "gpu-exact") == 0)
        *m = DEVJPEG_MODE_GPU_EXACT;
    else if (strcmp(s, "cpu") == 0)
        *m = DEVJPEG_MODE_CPU;
    else
        return -1;
    return 0;
}

void devjpeg_destroy(devjpeg *d)
{
    if (d)
        d->ops->destroy(d->ctx);
}

devjpeg_reason devjpeg_check(devjpeg *d, const uint8_t *jpeg, size_t len, const preprocess_info *info)
{
    return d->ops->check(d->ctx, jpeg, len, info);
}

int devjpeg_stage(devjpeg *d, int slot, int nhost, const uint8_t *const *jpeg, const size_t *len, const int *w,
                  const int *h, int n, devjpeg_fallback_fn fallback, void *cls, int *nfallback, char *err,
                  size_t errlen)
{
    *nfallback = 0;
    return d->ops->stage(d->ctx, slot, nhost, jpeg, len, w, h, n, fallback, cls, nfallback, err, errlen);
}

int devjpeg_retarget(devjpeg *d, engine *e, char *err, size_t errlen)
{
    if (!d->ops->retarget) {
        snprintf(err, errlen, "the %s device decoder cannot move to another engine", d->ops->name);
        return -1;
    }
    return d->ops->retarget(d->ctx, e, err, errlen);
}

double devjpeg_stage_ms(devjpeg *d, int slot)
{
    return d->ops->stage_ms ? d->ops->stage_ms(d->ctx, slot) : -1.0;
}

int devjpeg_sync(devjpeg *d, char *err, size_t errlen)
{
    return d->ops->sync ? d->ops->sync(d->ctx, err, errlen) : 0;
}

size_t devjpeg_device_memory(devjpeg *d)
{
    return d->ops->device_memory ? d->ops->device_memory(d->ctx) : 0;
}

int devjpeg_fallback_none(void *cls, int index, uint8_t *out)
{
    (void)cls;
    (void)index;
    (void)out;
    return -1;
}
