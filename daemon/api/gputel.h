/* GPU telemetry for /metrics from NVML, NVIDIA's management library:
 * utilisation, power, energy and memory of the GPUs the engines run on.
 * libnvidia-ml.so.1 comes with the NVIDIA driver and is loaded at start-up
 * with dlopen: the daemon neither links nor includes it, and where there is
 * no driver (CPU-only machines) nothing is reported. Devices are matched
 * by PCI bus id, which CUDA and NVML number alike whatever
 * CUDA_VISIBLE_DEVICES says. */
#ifndef RESNETD_GPUTEL_H
#define RESNETD_GPUTEL_H

#include "daemon/api/metrics.h"

/* Loads NVML and finds the n GPUs (CUDA ordinals cuda[i]); returns how
 * many it found (0: none, no NVML). Start-up only. */
int gputel_open(const int *cuda, int n);

/* metrics_gpu_probe: the found GPUs' readings now. */
int gputel_read(metrics_gpu_reading *out, int max);

void gputel_close(void);

#endif
