// Device discovery, used by --device auto: how many CUDA devices are usable;
// and a device's PCI bus id, by which NVML (daemon/api/gputel.c) finds it.
// A missing driver or no device is not an error here, just zero devices.
#include <cuda_runtime.h>
#include <stdio.h>
#include "gpu/gpu.h"

extern "C" int gpu_device_count(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();  // clear the sticky "no device" error
        return 0;
    }
    return n;
}

extern "C" int gpu_device_name(int index, char *buf, size_t len)
{
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    snprintf(buf, len, "%s", prop.name);
    return 0;
}

extern "C" int gpu_pci_bus_id(int index, char *buf, size_t len)
{
    if (cudaDeviceGetPCIBusId(buf, (int)len, index) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return 0;
}
