/* The one inference-engine interface: CPU and CUDA engines fill it.
 *
 * An engine owns nslots slots. Each slot has an input buffer the caller fills
 * with up to max_batch preprocessed images (uint8 RGB, NHWC, 224x224x3, not
 * normalised: normalisation is the engine's first step) and an output buffer
 * of logits ([max_batch][classes] FP32). The class count is the weights'
 * (a fine-tuned head has any number); an engine keeps the one it was
 * created with, so read it from the engine, never from a constant. An
 * image may instead come as the normalised FP32 tensor torchvision's
 * transform gives ([3][224][224] CHW, as the Open Inference Protocol's FP32
 * input): the caller points input_f32[slot][i] at it and the engine takes
 * it in place of image i's uint8 pixels and their normalisation, so its
 * logits are those of that exact tensor. The caller fills a slot, calls
 * engine_submit(), and later engine_wait() on that slot; different slots may
 * be in flight at once, so a double-buffered engine overlaps them. A slot is
 * used by one thread at a time. Buffers are allocated at creation; after
 * that, submit and wait allocate nothing.
 *
 * The daemon never includes a CUDA header: engine_create() is the only place
 * that knows which engines exist. */
#ifndef RESNETD_ENGINE_H
#define RESNETD_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include "model/resnet18.h"

#define ENGINE_MAX_SLOTS 4
#define ENGINE_MAX_DEVICES 16 /* engines one daemon drives at once (cuda:all) */

typedef enum { ENGINE_DEVICE_AUTO, ENGINE_DEVICE_CPU, ENGINE_DEVICE_CUDA } engine_device;
/* INT8 (CPU and CUDA engines) needs a calibration table: see engine/int8.h for
 * its arithmetic and engine/calib.h for the table. */
typedef enum {
    ENGINE_PRECISION_DEFAULT,
    ENGINE_PRECISION_FP32,
    ENGINE_PRECISION_FP16,
    ENGINE_PRECISION_INT8
} engine_precision;

struct calib_table;

/* How the CUDA engine builds its graphs, for comparisons and tests: every
 * field ENGINE_TUNE_AUTO (0) is the engine's own choice, which is what to
 * serve with. Set from the daemon's `gpu_tuning` option, the tools'
 * --gpu-tuning, or a test's RESNETD_GPU_TUNING, all in the text form
 * engine_tuning_parse reads ("autotune=off,stem=separate"). The CPU
 * engines ignore it. */
typedef enum {
    ENGINE_TUNE_AUTO,
    ENGINE_TUNE_OFF,
    ENGINE_TUNE_ON,
    ENGINE_TUNE_LOG,
    ENGINE_TUNE_INSIDE,
    ENGINE_TUNE_SEPARATE
} engine_tune;
typedef struct engine_tuning {
    engine_tune autotune; /* AUTO: time every candidate plan at creation; OFF: the cost model's
                                pick; LOG: time them and log each time on stderr */
    engine_tune stem; /* AUTO: stem conv + max pool in one kernel where it fits; SEPARATE: two
                            (FP16; INT8 always fuses them, FP32 never) */
    engine_tune pool; /* INT8, AUTO: the average pool inside the last conv where its plan
                                allows; SEPARATE: its own kernel */
    engine_tune downsample; /* AUTO: FP16 inside the conv that adds it, INT8 where timed faster;
                                INSIDE: always inside; SEPARATE: a conv of its own */
    engine_tune pdl; /* AUTO: programmatic launches where timed faster; ON; OFF */
} engine_tuning;

typedef struct engine_config {
    engine_device device;
    int device_index; /* CUDA device ordinal */
    engine_precision precision;
    int max_batch; /* >= 1 */
    int nslots; /* 0: the engine's default */
    int threads; /* CPU engine: 0 = all cores */
    /* 1: an image's logits are the same bits at any position of any batch
     * size on every path (the CPU engines and CUDA INT8 always are; CUDA
     * FP16/FP32 then plan without split-K and one tile family per layer).
     * protocol/API.md says what holds by default. */
    int deterministic;
    /* INT8: the activation scales (caller's memory, read at create only).
     * engine_create refuses INT8 without one, or with one made for other
     * weights. */
    const struct calib_table *calib;
    engine_tuning tuning; /* zero: the engine's own choices */
} engine_config;

typedef struct engine_ops {
    const char *name; /* "cpu", "cuda" */
    /* Starts inference of the first n images in slot's input. */
    int (*submit)(void *ctx, int slot, int n, char *err, size_t errlen);
    /* Blocks until slot's inference is done; its logits are then valid. */
    int (*wait)(void *ctx, int slot, char *err, size_t errlen);
    void (*destroy)(void *ctx);
    /* Optional: bytes of device and pinned memory held, for metrics. */
    size_t (*device_memory)(void *ctx);
    size_t (*pinned_memory)(void *ctx);
} engine_ops;

typedef struct engine {
    const engine_ops *ops;
    void *ctx;
    engine_device device; /* resolved: CPU or CUDA */
    engine_precision precision; /* resolved: FP32, FP16 or INT8 */
    int device_index;
    int max_batch;
    int nslots;
    int classes; /* logits per image: the weights' class count */
    int deterministic; /* resolved: 1 when an image's logits are the same bits
                                * at any batch position and size (engine_config) */
    uint8_t *input[ENGINE_MAX_SLOTS]; /* [max_batch][224][224][3] */
    /* [max_batch] per slot, all NULL at creation: non-NULL input_f32[s][i]
     * is image i as a [3][224][224] FP32 tensor, already normalised (the
     * caller's memory, valid until wait returns); NULL: image i is in
     * input[s]. The caller sets the first n entries before each submit. */
    const float **input_f32[ENGINE_MAX_SLOTS];
    float *logits[ENGINE_MAX_SLOTS]; /* [max_batch][classes] */
} engine;

int engine_submit(engine *e, int slot, int n, char *err, size_t errlen);
int engine_wait(engine *e, int slot, char *err, size_t errlen);
void engine_destroy(engine *e);

/* One full batch of mid-grey images on slot 0: touches every buffer the
 * engine will use, so the first request (after start-up or a reload) does
 * not pay for it. */
int engine_warm_up(engine *e, char *err, size_t errlen);

/* Convenience for tools and tests: copies n images into slot 0, runs them,
 * and copies the logits out (n * e->classes floats). */
int engine_infer(engine *e, const uint8_t *images, int n, float *logits, char *err, size_t errlen);

/* Device and pinned host memory the engine holds (0 where it has none). */
size_t engine_device_memory(const engine *e);
size_t engine_pinned_memory(const engine *e);

const char *engine_device_name(engine_device d);
const char *engine_precision_name(engine_precision p);
int engine_parse_device(const char *s, engine_device *d, int *index);
/* engine_parse_device's forms, plus several CUDA devices: "cuda:all"
 * (every device: *n = 0, for the caller to count) or "cuda:0,1,3" (no
 * repeats; *n = 3). Single forms give *n = 1. */
int engine_parse_devices(const char *s, engine_device *d, int *index, int max, int *n);
int engine_parse_precision(const char *s, engine_precision *p);
/* "key=value,..." (keys autotune, stem, pool, downsample, pdl; see
 * engine_tuning) into *t, from all-AUTO; NULL or "" is all AUTO. 0, or -1
 * with err naming the bad key or value. engine_tuning_format writes the
 * non-AUTO fields back in that form ("" when all are AUTO). */
int engine_tuning_parse(const char *text, engine_tuning *t, char *err, size_t errlen);
void engine_tuning_format(const engine_tuning *t, char *out, size_t outlen);

#endif
