// The CUDA engine: implements model/engine.h on one GPU.
// First landing: the entry point exists so the default CUDA build links; the
// kernels and the slot pipeline follow in the next commits.
#include <stdio.h>
#include "gpu/gpu.h"

extern "C" engine *engine_cuda_create(const resnet18_weights *w, const engine_config *cfg, char *err,
                                      size_t errlen)
{
    (void)w;
    snprintf(err, errlen, "cuda:%d: the CUDA engine is not built yet", cfg->device_index);
    return NULL;
}
