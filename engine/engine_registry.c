/* The engine registry (engine/engine_registry.h). */
#include <stdio.h>
#include <string.h>
#include "config.h"
#include "engine/calib.h"
#include "engine/engine_cpu.h"
#include "engine/engine_registry.h"
#ifdef HAVE_CUDA
#include "gpu/gpu.h"
#endif

engine *engine_create(const resnet18_weights *w, const engine_config *cfg, char *err, size_t errlen)
{
    engine_config c = *cfg;
    if (c.max_batch < 1) {
        snprintf(err, errlen, "max batch must be at least 1 (got %d)", c.max_batch);
        return NULL;
    }
    if (w->classes < 1 || w->classes > RESNET18_MAX_CLASSES) {
        snprintf(err, errlen, "weights with %d classes (need 1 to %d)", w->classes, RESNET18_MAX_CLASSES);
        return NULL;
    }
    if (c.precision == ENGINE_PRECISION_INT8) {
        if (!c.calib) {
            snprintf(err, errlen,
                     "precision int8 needs a calibration table (--calibration FILE, or the "
                     "config key calibration; resnetd-calibrate makes one)");
            return NULL;
        }
        if (strcmp(c.calib->weights_sha256, calib_weights_id(w)) != 0) {
            snprintf(err, errlen,
                     "precision int8: the calibration table was made for weights with SHA-256 %s, "
                     "not these (%s)",
                     c.calib->weights_sha256, calib_weights_id(w));
            return NULL;
        }
    }
    if (c.device == ENGINE_DEVICE_AUTO) {
#ifdef HAVE_CUDA
        c.device = gpu_device_count() > 0 ? ENGINE_DEVICE_CUDA : ENGINE_DEVICE_CPU;
#else
        c.device = ENGINE_DEVICE_CPU;
#endif
    }
    if (c.device == ENGINE_DEVICE_CPU)
        return engine_cpu_create(w, &c, err, errlen);
#ifdef HAVE_CUDA
    int n = gpu_device_count();
    if (n == 0) {
        snprintf(err, errlen, "device cuda:%d requested but no CUDA device is usable", c.device_index);
        return NULL;
    }
    if (c.device_index < 0 || c.device_index >= n) {
        snprintf(err, errlen, "device cuda:%d requested but only %d CUDA device(s) exist", c.device_index, n);
        return NULL;
    }
    return engine_cuda_create(w, &c, err, errlen);
#else
    snprintf(err, errlen, "device cuda requested but resnetd was built without CUDA");
    return NULL;
#endif
}

int engine_cuda_device_count(void)
{
#ifdef HAVE_CUDA
    return gpu_device_count();
#else
    return 0;
#endif
}

int engine_cuda_pci_bus_id(int device, char *buf, size_t len)
{
#ifdef HAVE_CUDA
    return gpu_pci_bus_id(device, buf, len);
#else
    (void)device;
    (void)buf;
    (void)len;
    return -1;
#endif
}
