/* The CPU engines (FP32 and INT8) and what only they offer: calibration's
 * view of every activation, and hooks for tests and benchmark records.
 * Everything else goes through engine/engine.h. */
#ifndef RESNETD_ENGINE_CPU_H
#define RESNETD_ENGINE_CPU_H

#include "engine/engine.h"

/* Calibration: on a CPU engine at FP32, fn sees every activation tensor
 * that INT8 quantises, as soon as it is computed, on the submitting
 * thread: tensor 0 is the normalised image, tensor i >= 1 the output of
 * conv i-1 (engine/calib.h numbers them the same way); data is NHWC
 * [n][h + 2 pad][h + 2 pad][c] with a zero border of pad pixels. fn NULL
 * stops observing. Returns -1 (with err) on any other engine. */
typedef void engine_observer_fn(void *ctx, int tensor, const float *data, int n, int h, int c, int pad);
int engine_cpu_observe(engine *e, engine_observer_fn *fn, void *ctx, char *err, size_t errlen);

/* The CPU INT8 engine's float prefix (engine/calib.h's mix): runs slot's
 * n images through normalisation and the first nconvs convs (1..19; the
 * max pool after conv 0) as a full FP32 pass computes them, then hands fn
 * the prefix's last tensor as an observer sees it: the pool's output when
 * nconvs is 1, else conv nconvs-1's; `tensor` is nconvs, the calibration
 * number of the scale it takes. Returns -1 (with err) on any other engine
 * or bad arguments. */
int engine_cpu_forward_prefix(engine *e, int slot, int n, int nconvs, engine_observer_fn *fn, void *ctx, char *err,
                              size_t errlen);

/* Tests: the CPU INT8 engine's last conv output (FP32, NHWC
 * [n][7][7][512]) of its latest batch; NULL for any other engine. */
const float *engine_cpu_int8_last_conv(engine *e);

/* The CPU INT8 engine's GEMM tile ("amx", "vnni", "avx2" or "generic":
 * the CPU's, or RESNETD_CPU_INT8_GEMM's), for logs and benchmark records;
 * NULL for any other engine. */
const char *engine_cpu_int8_tile(const engine *e);

/* The CPU engine (engine/engine_cpu.c); engine_create makes one for
 * device cpu. */
engine *engine_cpu_create(const resnet18_weights *w, const engine_config *cfg, char *err, size_t errlen);
/* The CPU engine at INT8 (engine/engine_cpu_int8.c); engine_cpu_create
 * hands INT8 configurations to it. */
engine *engine_cpu_int8_create(const resnet18_weights *w, const engine_config *cfg, char *err, size_t errlen);

#endif
