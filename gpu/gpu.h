/* The C face of gpu/: what host code may call. Only model/engine.c and the
 * tools include this, and only under HAVE_CUDA; no CUDA header leaks out. */
#ifndef RESNETD_GPU_H
#define RESNETD_GPU_H

#include <stddef.h>
#include "model/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices; 0 when there is no device or driver. */
int gpu_device_count(void);

/* Name of device `index` into buf; 0 on success. */
int gpu_device_name(int index, char *buf, size_t len);

/* The CUDA engine (gpu/engine_cuda.cu); cfg->device is CUDA and
 * cfg->device_index a valid ordinal. */
engine *engine_cuda_create(const resnet18_weights *w, const engine_config *cfg, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
