// What other gpu/ files may ask of the CUDA engine beyond gpu/gpu.h: calls
// with CUDA types, so they stay out of the C headers.
#ifndef RESNETD_GPU_ENGINE_CUDA_CUH
#define RESNETD_GPU_ENGINE_CUDA_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include "engine/engine.h"

// The slot's device input, [max_batch][224][224][3] uint8; NULL when e is
// not a CUDA engine or slot is out of range.
uint8_t *engine_cuda_device_input(engine *e, int slot);

// Someone else (the GPU JPEG decoder) has written the slot's device input:
// the next submit on the slot waits for `ready` and reads the device input
// as it is then, instead of copying the host input. 0, or -1 when e is not
// a CUDA engine.
int engine_cuda_input_staged(engine *e, int slot, cudaEvent_t ready);

#endif
