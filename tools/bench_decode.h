/* resnetd-bench's decode part: preprocess_jpeg over every JPEG of a
 * directory with N threads (one preprocess context each), img/s the median
 * over passes; or, with gpu, the device decoder (nvJPEG's hardware decode,
 * resize and crop into a CUDA engine slot, stage after stage as the batcher
 * runs it) on the files the hardware takes, with the CPU beside it on the
 * rest and the mixed ceiling of both. */
#ifndef RESNETD_BENCH_DECODE_H
#define RESNETD_BENCH_DECODE_H

#include <stddef.h>
#include "image/devjpeg.h"
#include "engine/engine.h"

typedef struct bench_decode_opts {
    const char *dir; /* the JPEGs */
    int threads; /* CPU decode threads */
    int gpu, exact; /* --decode gpu / gpu-exact */
    int batch; /* gpu: images per stage */
    long memory_mib; /* gpu: the arena; 0: the daemon's auto */
    int iters; /* passes (at least 3) */
    engine_config ecfg; /* gpu: the CUDA engine whose slots are filled */
} bench_decode_opts;

typedef struct decode_result {
    int files;
    int failed; /* files skipped because they do not decode */
    int refused; /* gpu: files the hardware refuses (decoded on the CPU by the daemon) */
    int refused_by[DEVJPEG_NREASONS];
    int images; /* gpu: images per timed pass */
    int threads;
    double img_per_s; /* median over passes */
    /* gpu: the CPU beside it (threads, the daemon's decode options in this
     * mode) on the files the hardware takes and on those it refuses, and
     * the mixed ceiling: the most img/s of this corpus both can decode */
    double cpu_accepted_img_per_s, cpu_refused_img_per_s, mixed_img_per_s;
} decode_result;

int bench_decode(const bench_decode_opts *o, decode_result *r, char *err, size_t errlen);

#endif
