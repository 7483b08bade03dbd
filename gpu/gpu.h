/* The C face of gpu/: what host code may call. Only the registries
 * (engine/engine_registry.c, image/devjpeg_registry.c) and the tools include
 * this, and only under HAVE_CUDA; no CUDA header leaks out. */
#ifndef RESNETD_GPU_H
#define RESNETD_GPU_H

#include <stddef.h>
#include <stdint.h>
#include "image/devjpeg.h"
#include "engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices; 0 when there is no device or driver. */
int gpu_device_count(void);
/* Device index's PCI bus id ("0000:1B:00.0") into buf; 0, or -1. */
int gpu_pci_bus_id(int index, char *buf, size_t len);

/* Name of device `index` into buf; 0 on success. */
int gpu_device_name(int index, char *buf, size_t len);

/* The CUDA engine (gpu/engine_cuda.cu); cfg->device is CUDA and
 * cfg->device_index a valid ordinal. */
engine *engine_cuda_create(const resnet18_weights *w, const engine_config *cfg, char *err, size_t errlen);

/* --- optional extras of the CUDA engine (tools, tests, the daemon) ---- */

/* Per-op time of one forward pass. */
typedef struct gpu_layer_time {
    const char *name; /* "layer1.0.conv1", "maxpool", "fc", ... */
    const char *tile; /* convs: the tile configuration used; else NULL */
    int splits; /* convs: split-K factor (1: none); else 0 */
    double ms;
} gpu_layer_time;

/* Runs n images of slot 0's input through the forward pass op by op (not
 * from the graph), timing each op with events. Returns the number of ops
 * written to out (at most max), or -1 with err. Not for concurrent use with
 * submit on slot 0. */
int engine_cuda_layer_times(engine *e, int n, gpu_layer_time *out, int max, char *err, size_t errlen);

/* One batch of n images on slot 0, serially, timed by phase: host-to-device
 * copy, compute (the graph), device-to-host copy of the logits. */
int engine_cuda_phase_times(engine *e, int n, double *h2d_ms, double *compute_ms, double *d2h_ms, char *err,
                            size_t errlen);

/* 1 when every GPU a CUDA engine was created on takes programmatic
 * launches (compute capability 9.0 or later). */
int gpu_programmatic_launch_supported(void);

/* 1 when the graph that runs n images launches its kernels
 * programmatically (each kernel's launch and prologue under the tail of the
 * one before: gpu/kernels.cuh), 0 when not, -1 for no CUDA engine. */
int engine_cuda_programmatic(engine *e, int n);

/* Tests: after engine_wait, the last conv's output of the latest batch
 * (activations are shared by the slots) for its first n images, INT8
 * engines only, where it is FP32: out[n][7][7][512]. Returns 1 (out
 * untouched) where the graph for n images never stores it: the average
 * pool runs inside that conv (gpu/engine_cuda.cu). */
int engine_cuda_last_conv(engine *e, int n, float *out, char *err, size_t errlen);

/* Tests: after engine_wait, the FC's input of the latest batch for its
 * first n images, FP16 and INT8 engines: out[n][512] FP16 bits. */
int engine_cuda_features(engine *e, int n, uint16_t *out, char *err, size_t errlen);

/* The nvJPEG hardware decoder bound to CUDA engine e (gpu/nvjpeg_decode.cu,
 * built only with nvJPEG); image/devjpeg_registry.c calls it. exact: libjpeg-exact
 * pixels (slower). NULL with err when the device has no hardware JPEG
 * decoder. */
devjpeg *gpu_jpeg_create(engine *e, size_t arena_bytes, int checkers, int exact, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
