/* The device JPEG decoder registry: the one place that knows which device
 * decoders this build has (nvJPEG, in gpu/, when built with CUDA and
 * nvJPEG) and creates one for an engine. */
#ifndef RESNETD_DEVJPEG_REGISTRY_H
#define RESNETD_DEVJPEG_REGISTRY_H

#include <stddef.h>
#include "image/devjpeg.h"
#include "engine/engine.h"

/* The device decoder for engine e. NULL with the reason in err when there
 * is none: not a CUDA engine, built without nvJPEG, or no hardware decoder
 * on the device. arena_bytes bounds the decoded pixels held at once (0:
 * auto, what gpu_decode_memory = auto says);
 * checkers is how many threads may call check at once; exact: pixels
 * bit-exact with the CPU path (DEVJPEG_MODE_GPU_EXACT). Warms the decoder
 * up with a batch of max_batch synthetic JPEGs on every slot, so that its
 * buffers are allocated before any request. */
devjpeg *devjpeg_create(engine *e, size_t arena_bytes, int checkers, int exact, char *err, size_t errlen);

#endif
