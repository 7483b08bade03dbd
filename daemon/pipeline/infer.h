/* The engine side of the pipeline: several batches in flight at once.
 *
 * The engine has nslots slots. The batcher acquires a free slot, copies a
 * batch into its input buffer and submits it; a completion thread waits on
 * submitted slots in submission order, hands each image's logits to the
 * pipeline sink and frees the slot. So while the completion thread waits on
 * slot i-1 the batcher can already fill and submit slot i, which is what a
 * double-buffered GPU engine needs; the CPU engine simply has fewer slots. */
#ifndef RESNETD_INFER_H
#define RESNETD_INFER_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/pipeline/pipeline.h"
#include "daemon/pipeline/served_model.h"
#include "daemon/pipeline/route.h"
#include "image/devjpeg.h"
#include "engine/engine.h"

typedef struct infer infer;

/* m: the model e computes (infer takes a reference); dj: the device
 * decoder that stages slots (for its timings), or NULL; route: told what
 * each stage cost, or NULL. */
infer *infer_create(engine *e, served_model *m, devjpeg *dj, decode_route *route, const pipeline_sink *sink, char *err,
                    size_t errlen);

/* Blocks until an engine slot is free; -1 once infer_stop() has begun. */
int infer_acquire(infer *x);
/* Returns an acquired slot unused. */
void infer_release(infer *x, int slot);
/* The batcher is about to fill an acquired slot: returns its input buffer
 * ([max_batch][224][224][3] uint8), after waiting for a swap under way.
 * Ends with infer_submit, or infer_abandon when nothing is left to run. */
uint8_t *infer_begin(infer *x, int slot);
void infer_abandon(infer *x);

/* Hot reload: makes e (computing m) the engine from the next batch on,
 * once no batch is being filled or in flight (batches keep queueing
 * meanwhile), moving the device decoder along; *old gets the engine it
 * replaced, for the caller to destroy. e must have the same slots and max
 * batch. 0, or -1 with err (nothing changed). */
int infer_swap(infer *x, engine *e, served_model *m, engine **old, char *err, size_t errlen);

/* "cpu" or "cuda:N": the engine's label in metrics and metadata. */
void infer_engine_label(const engine *e, char *out, size_t len);

/* The engine now in use (main destroys it at exit). */
engine *infer_engine(infer *x);
/* The model now served: a new reference, for the caller to drop. */
served_model *infer_model(infer *x);

/* Submits the first n images of the slot; items[i] describes image i (an
 * item with req == NULL is run but not reported; one with f32 is given to
 * the engine as that FP32 tensor instead of the slot's pixels). staged: the device
 * decoder filled the slot's input (devjpeg_stage), in a call of stage_ns
 * (0: unknown, or it also decoded CPU fallbacks: no sample of its cost).
 * Outcomes arrive through the sink from the completion thread. */
void infer_submit(infer *x, int slot, const queue_item *items, int n, int staged, uint64_t stage_ns);

/* A batch failed before it reached the engine (the device JPEG decoder):
 * logged, and not healthy until a batch succeeds, as for engine failures. */
void infer_report_failure(infer *x, const char *err);

/* 1 until a batch fails; back to 1 after the next batch succeeds. */
int infer_healthy(infer *x);
/* Recent throughput, for Retry-After (0 before the first batch). */
double infer_images_per_s(infer *x);

/* Waits for batches in flight, then stops the completion thread. */
void infer_stop(infer *x);
void infer_destroy(infer *x);

#endif
