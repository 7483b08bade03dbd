/* What resnetd-classify, resnetd-bench and resnetd-calibrate share: the
 * engine options (--device, --precision), loading the weights and the INT8
 * calibration table they name (each error printed as "PROG: why"), and the
 * median of timings. */
#ifndef RESNETD_TOOLOPT_H
#define RESNETD_TOOLOPT_H

#include "engine/calib.h"
#include "engine/engine.h"
#include "model/resnet18.h"

/* --device cpu|cuda|cuda:N|auto into c; 0, or -1 after saying why. */
int toolopt_device(const char *prog, const char *arg, engine_config *c);

/* --precision fp32|fp16|int8 into c; 0, or -1 after saying why. */
int toolopt_precision(const char *prog, const char *arg, engine_config *c);

/* --gpu-tuning LIST (engine_tuning_parse's text) into c; 0, or -1 after
 * saying why. */
int toolopt_tuning(const char *prog, const char *arg, engine_config *c);

/* The weights at path ("synthetic": the seeded synthetic ones) into w; 0,
 * or -1 after saying why. */
int toolopt_load_weights(const char *prog, const char *path, resnet18_weights *w);

/* The calibration table at path into t, checked against w (loaded from
 * weights_path); 0, or -1 after saying why. */
int toolopt_load_calibration(const char *prog, const char *path, const resnet18_weights *w, const char *weights_path,
                             calib_table *t);

/* The median of v[0..n-1] (sorts v). */
double toolopt_median(double *v, int n);

#endif
