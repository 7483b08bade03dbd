/* The engine registry: the one place that knows which engines this build
 * has (the CPU engines always; the CUDA engine in gpu/ when built with
 * CUDA) and creates the one a configuration asks for. */
#ifndef RESNETD_ENGINE_REGISTRY_H
#define RESNETD_ENGINE_REGISTRY_H

#include <stddef.h>
#include "engine/engine.h"

/* Creates the engine cfg asks for (AUTO: CUDA when a device is present,
 * else CPU). Returns NULL with a message in err. */
engine *engine_create(const resnet18_weights *w, const engine_config *cfg, char *err, size_t errlen);

/* CUDA devices usable (0 without CUDA or a device). */
int engine_cuda_device_count(void);
/* CUDA device's PCI bus id into buf (for NVML); 0, or -1 (no CUDA). */
int engine_cuda_pci_bus_id(int device, char *buf, size_t len);

#endif
