/* The images resnetd-calibrate reads: directories of JPEGs (the
 * calibration images and the held-out ones), and the held-out check set,
 * which keeps the CPU FP32 engine's logits of every held-out image so
 * that any number of INT8 candidates are compared with one FP32 pass.
 *
 * A directory's JPEGs (*.jpg, *.jpeg) are read in strcmp order of their
 * names and preprocessed as the daemon does (image/preprocess.h). Every
 * function that fails prints why on stderr, prefixed "resnetd-calibrate:",
 * and returns -1 (or NULL). */
#ifndef RESNETD_CALIB_IMAGES_H
#define RESNETD_CALIB_IMAGES_H

#include <stddef.h>
#include <stdint.h>
#include "engine/engine.h"
#include "image/preprocess.h"

/* The JPEG file names of dir, sorted (malloc'd, for jpegdir_free); *n
 * gets the count, which may be 0. */
char **jpegdir_list(const char *dir, int *n);
void jpegdir_free(char **files, int n);

/* Preprocesses JPEGs files[*next..] of dir into dst (up to max images),
 * advancing *next. Returns the count. */
int jpegdir_load(preprocess_ctx *pp, const char *dir, char **files, int nfiles, int *next, uint8_t *dst, int max);

/* 0 when the logits of n images, files[0..n) of dir, are all finite; else
 * -1 after naming the first that is not and why: the FP32 engine's (int8
 * 0: the weights overflow) or the INT8 engine's where FP32's are finite
 * (int8 1: its FC takes FP16 features). A table or a check from such
 * logits would mean nothing. */
int jpegdir_logits_finite(const float *logits, int n, int classes, const char *dir, char *const *files, int int8);

/* The held-out images and their FP32 logits. */
typedef struct heldout {
    const char *dir;
    char **files;
    int n, classes;
    float *ref; /* [n][classes]: the FP32 engine's logits */
    uint8_t *pixels; /* [n][RESNET18_INPUT_BYTES] where they fit in HELDOUT_CACHE_BYTES, else
                        NULL: decoded again for each comparison */
} heldout;

/* The held-out pixels stay in memory up to this size (about 7,000 images),
 * so that a search decodes them once. */
#define HELDOUT_CACHE_BYTES ((size_t)1 << 30)

/* Reads dir's JPEGs (at least one) into *h and runs the FP32 engine f32
 * on them. 0, or -1 (*h then needs heldout_free all the same). */
int heldout_open(engine *f32, preprocess_ctx *pp, const char *dir, heldout *h);
void heldout_free(heldout *h);

/* An engine's logits against h's FP32 ones (tests/engine/int8_agreement.py
 * computes the same from resnetd-classify's output). */
typedef struct heldout_result {
    int images, agree; /* top-1 agreements */
    double agreement; /* percent */
    double rel_l2; /* the logits' relative L2 error over all images */
    double median, max; /* per image */
} heldout_result;

/* Runs the INT8 engine e on every held-out image and scores it. 0, or -1. */
int heldout_measure(const heldout *h, preprocess_ctx *pp, engine *e, heldout_result *r);

#endif
