/* INT8 calibration tables: the per-tensor activation scales of one set of
 * weights, as resnetd-calibrate writes them and the INT8 engines read them,
 * and the histogram statistics that choose them.
 *
 * A table is JSON (jansson):
 *   {"format": "resnetd-int8-calibration", "version": 3,
 *    "weights_sha256": "<64 hex digits of the weights file>" | "synthetic",
 *    "method": "entropy" | "percentile" | "mse", "percentile": 99.99 (percentile only),
 *    "images": N, "histogram_bins": 2048,
 *    "scales": {"input": s, "conv1": s, "layer1.0.conv1": s, ...},
 *    "check": {"images": N, "top1_agreement": pct, "rel_l2": e},
 *    "mix": "float:layer1"}
 * There is one scale per quantised tensor (calib_tensor_name), each a
 * positive finite number written with full precision, so it reads back as
 * the same float: the value of one step, threshold / 255 for a tensor that
 * follows a ReLU (stored as u8, engine/int8.h) and threshold / 127 for the
 * others. "mix" is the precision mix: a prefix of the network (calib_mix)
 * runs in the engine's float precision (FP16 on the GPU, FP32 on the CPU)
 * and the rest at INT8. "check" is optional: what resnetd-calibrate --check
 * measured for the table (INT8 against FP32 on held-out images), which the
 * daemon reports.
 * Older tables still load. Version 1 (fully INT8, no "mix") and version 2
 * (with "mix") stored every tensor as int8, every scale threshold / 127:
 * the scales of the tensors after a ReLU are converted (s * 127 / 255, the
 * same threshold at 255 levels), and their "check" is dropped, since it
 * measured the older arithmetic. resnetd writes version 3, which a resnetd
 * too old for u8 refuses rather than misreads.
 * Tables that do not name the weights they are used with, or lack a
 * tensor, or name an unknown one, are refused. */
#ifndef RESNETD_CALIB_H
#define RESNETD_CALIB_H

#include <stddef.h>
#include <stdint.h>
#include "model/resnet18.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CALIB_FORMAT "resnetd-int8-calibration"
#define CALIB_VERSION 3 /* what resnetd writes: u8 after a ReLU, "mix" */
#define CALIB_VERSION_INT8 1 /* older: int8 everywhere, fully INT8 */
#define CALIB_VERSION_MIX 2 /* older: int8 everywhere, with "mix" */
/* Quantised tensors: 0 is the normalised input image, i >= 1 the output of
 * conv i-1. The last conv's output stays FP32 (it feeds the average pool
 * and the FC), so there is one per conv. */
#define CALIB_NTENSORS RESNET18_NUM_CONVS
#define CALIB_BINS 2048
#define CALIB_WEIGHTS_SYNTHETIC "synthetic"

typedef enum { CALIB_ENTROPY, CALIB_PERCENTILE, CALIB_MSE } calib_method;

/* Which prefix of the network runs in float: none (all INT8), the stem
 * (conv1 and its max pool), or the stem through the first block of a
 * stage (layerN.0) or the whole stage (layerN), N = 1..3: a prefix ends
 * where a block does, where one tensor is all that later convs read. The
 * prefix's last tensor (the pool's output, or the block's last conv's) is
 * quantised with its table scale, exactly as engine/int8.h quantises a
 * conv's output, and the rest runs as at INT8. Every scale is in the table
 * whatever the mix (one calibration serves every mix). In order of the
 * prefix's length. */
typedef enum {
    CALIB_MIX_INT8,
    CALIB_MIX_STEM,
    CALIB_MIX_LAYER1_0,
    CALIB_MIX_LAYER1,
    CALIB_MIX_LAYER2_0,
    CALIB_MIX_LAYER2,
    CALIB_MIX_LAYER3_0,
    CALIB_MIX_LAYER3,
    CALIB_NMIXES
} calib_mix;
/* The names, for messages. */
#define CALIB_MIX_NAMES                                                                                \
    "int8, float:stem, float:layer1.0, float:layer1, float:layer2.0, float:layer2, float:layer3.0 or " \
    "float:layer3"

/* INT8 against FP32 on held-out images, as resnetd-calibrate --check
 * measured it; images 0: never checked. */
typedef struct calib_check {
    int images;
    double agreement; /* top-1 agreement, percent */
    double rel_l2; /* the logits' relative L2 error over all images */
} calib_check;

typedef struct calib_table {
    char weights_sha256[65]; /* hex digest, or CALIB_WEIGHTS_SYNTHETIC */
    calib_method method;
    double percentile; /* CALIB_PERCENTILE: the percentile of |x| used */
    int images; /* calibration images seen */
    float scale[CALIB_NTENSORS];
    calib_check check;
    calib_mix mix;
} calib_table;

/* "input", or the name of the conv whose output tensor i is ("conv1",
 * "layer1.0.conv1", ...). */
const char *calib_tensor_name(int i);
/* 1 when tensor i follows a ReLU, so is never negative and is stored as
 * u8 (every conv output but the downsamples'); its levels: 255, else 127. */
int calib_tensor_unsigned(int i);
int calib_tensor_levels(int i);
/* The same for a conv's source or residual in resnet18.h's numbering
 * (R18_IMAGE, R18_POOL or a conv index). */
int calib_source_unsigned(int src);
const char *calib_method_name(calib_method m);
int calib_parse_method(const char *s, calib_method *m);
/* "entropy", "mse", or "percentile P" with P in the shortest form that
 * reads back as the same double. */
void calib_method_label(calib_method m, double percentile, char *out, size_t outlen);

/* "int8", "float:stem", "float:layer1.0", "float:layer1", ... (CALIB_MIX_NAMES). */
const char *calib_mix_name(calib_mix m);
int calib_parse_mix(const char *s, calib_mix *m);
/* How many convs (resnet18_convs order) a mix runs in float: 0, 1, 3, 5,
 * 8, 10, 13, 15; and the tensor at its boundary, which the INT8 part reads
 * first: R18_POOL or a conv index (resnet18.h), R18_IMAGE for
 * CALIB_MIX_INT8.
 * A value outside calib_mix: -1 convs. */
int calib_mix_float_convs(calib_mix m);
int calib_mix_boundary(calib_mix m);

/* What a table's weights_sha256 must be for w. */
const char *calib_weights_id(const resnet18_weights *w);

/* Reads and validates a table (format, version, every scale). Returns 0, or
 * -1 with a one-line message naming the file in err. */
int calib_load(const char *path, calib_table *t, char *err, size_t errlen);

/* 0 when t was made for w; else -1 and a message naming table_path and
 * weights_path. */
int calib_check_weights(const calib_table *t, const char *table_path, const resnet18_weights *w,
                        const char *weights_path, char *err, size_t errlen);

/* Writes t (replacing path atomically). */
int calib_save(const char *path, const calib_table *t, char *err, size_t errlen);

/* What an INT8 engine derives from a table (engine/int8.h), computed here
 * once so that every engine uses the same floats. Conv i of w: q [cout][K]
 * (KRSC, K = k*k*cin) and mult[c] = s_in * s_w[c]; *res_scale is the
 * residual's scale (0 without one), *out_inv 1 / the output's scale (0 for
 * the last conv, whose output stays FP32). */
void calib_conv_params(const resnet18_weights *w, const calib_table *t, int i, int8_t *q, float *mult, float *res_scale,
                       float *out_inv);
/* The quantised normalisation of each byte value of each channel, and
 * *in_inv = 1 / the input's scale (for images that come as FP32). */
void calib_input_lut(const calib_table *t, int8_t lut[3][256], float *in_inv);

/* A histogram of |x| over [0, range): CALIB_BINS equal bins. The range is
 * set by the first non-zero value and doubles (merging bin pairs) whenever
 * a larger one arrives, so one pass suffices and the result depends only
 * on the values and their order. */
typedef struct calib_hist {
    double range; /* 0 until a non-zero value is seen */
    uint64_t count[CALIB_BINS];
} calib_hist;

/* Adds n values. */
void calib_hist_add(calib_hist *h, const float *x, size_t n);

/* The scale (threshold / levels: 127 or 255, calib_tensor_levels) that a
 * method picks from h: entropy is TensorRT's search for the threshold whose
 * (levels + 1)-level quantisation of the clipped histogram has the least KL
 * divergence from it; percentile takes the upper edge of the bin where the
 * given percentile of |x| falls; mse the bin edge with the least squared
 * error of rounding below it and clipping above it, each bin's values at
 * its centre. An all-zero tensor gets scale 1. */
float calib_scale_entropy(const calib_hist *h, int levels);
float calib_scale_percentile(const calib_hist *h, double percentile, int levels);
float calib_scale_mse(const calib_hist *h, int levels);

#ifdef __cplusplus
}
#endif

#endif
