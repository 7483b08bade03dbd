/* NVML through dlopen: see gputel.h. The few NVML entry points used are
 * declared here with NVML's ABI (nvml.h: stable since driver 384). */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include "daemon/api/gputel.h"
#include "engine/engine.h"
#include "engine/engine_registry.h"

typedef int nvml_return; /* nvmlReturn_t; 0: NVML_SUCCESS */
typedef struct nvml_device *nvml_device; /* nvmlDevice_t */
typedef struct {
    unsigned int gpu, memory;
} nvml_utilization; /* percent */
typedef struct {
    unsigned long long total, free, used;
} nvml_memory; /* bytes */

static struct {
    void *lib;
    nvml_return (*init)(void);
    nvml_return (*shutdown)(void);
    nvml_return (*by_pci)(const char *, nvml_device *);
    nvml_return (*utilization)(nvml_device, nvml_utilization *);
    nvml_return (*power)(nvml_device, unsigned int *); /* mW */
    nvml_return (*energy)(nvml_device, unsigned long long *); /* mJ since the driver loaded */
    nvml_return (*memory)(nvml_device, nvml_memory *);
    int n;
    nvml_device dev[METRICS_MAX_GPUS];
    char label[METRICS_MAX_GPUS][16];
} nv;

static int load(void **fn, const char *name)
{
    *fn = dlsym(nv.lib, name);
    return *fn ? 0 : -1;
}

int gputel_open(const int *cuda, int n)
{
    if (!(nv.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)))
        return 0;
    if (load((void **)&nv.init, "nvmlInit_v2") || load((void **)&nv.shutdown, "nvmlShutdown") ||
        load((void **)&nv.by_pci, "nvmlDeviceGetHandleByPciBusId_v2") ||
        load((void **)&nv.utilization, "nvmlDeviceGetUtilizationRates") ||
        load((void **)&nv.power, "nvmlDeviceGetPowerUsage") ||
        load((void **)&nv.energy, "nvmlDeviceGetTotalEnergyConsumption") ||
        load((void **)&nv.memory, "nvmlDeviceGetMemoryInfo") || nv.init() != 0) {
        dlclose(nv.lib);
        memset(&nv, 0, sizeof nv);
        return 0;
    }
    for (int i = 0; i < n && nv.n < METRICS_MAX_GPUS; i++) {
        char bus[32];
        if (engine_cuda_pci_bus_id(cuda[i], bus, sizeof bus) != 0 || nv.by_pci(bus, &nv.dev[nv.n]) != 0)
            continue;
        snprintf(nv.label[nv.n], sizeof nv.label[nv.n], "%d", cuda[i]);
        nv.n++;
    }
    if (nv.n == 0)
        gputel_close();
    return nv.n;
}

int gputel_read(metrics_gpu_reading *out, int max)
{
    int k = 0;
    for (int i = 0; i < nv.n && k < max; i++) {
        metrics_gpu_reading *r = &out[k];
        nvml_utilization u;
        unsigned int mw;
        unsigned long long mj;
        nvml_memory m;
        memset(r, 0, sizeof *r);
        snprintf(r->gpu, sizeof r->gpu, "%s", nv.label[i]);
        r->utilization = nv.utilization(nv.dev[i], &u) == 0 ? u.gpu / 100.0 : -1;
        r->power_watts = nv.power(nv.dev[i], &mw) == 0 ? mw / 1000.0 : -1;
        r->energy_joules = nv.energy(nv.dev[i], &mj) == 0 ? (double)mj / 1000.0 : -1;
        if (nv.memory(nv.dev[i], &m) == 0) {
            r->memory_used_bytes = (double)m.used;
            r->memory_total_bytes = (double)m.total;
        } else {
            r->memory_used_bytes = r->memory_total_bytes = -1;
        }
        k++;
    }
    return k;
}

void gputel_close(void)
{
    if (!nv.lib)
        return;
    nv.shutdown();
    dlclose(nv.lib);
    memset(&nv, 0, sizeof nv);
}
