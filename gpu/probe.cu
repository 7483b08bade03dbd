// Device discovery, used by --device auto: how many CUDA devices are usable.
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
