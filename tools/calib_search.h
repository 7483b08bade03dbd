/* The decision of resnetd-calibrate --target-agreement, apart from any
 * engine or image: which precision mixes to try in which order, which
 * candidate (mix and calibration method) wins, and when to stop.
 *
 * The mixes are tried fastest first, by the speed the caller measured on
 * its machine (never by an assumed order). At each mix every method is
 * scored; the first mix whose most agreeing method meets the target is
 * chosen and the search stops, since a slower mix cannot win. When no mix
 * meets it, the most agreeing candidate of all is chosen. "Most agreeing":
 * more top-1 agreements with FP32, then the smaller logits rel L2, then the
 * one tried first (the faster mix, the earlier method). */
#ifndef RESNETD_CALIB_SEARCH_H
#define RESNETD_CALIB_SEARCH_H

#include "engine/calib.h"

/* One candidate's check: INT8 against FP32 on the same held-out images. */
typedef struct calib_score {
    int agree, images; /* top-1 agreements of images */
    double rel_l2; /* the logits' relative L2 error over all images */
} calib_score;

/* Scores method (0..nmethods-1) at mix into *s; 0, or -1 to abandon the
 * search (the callee has said why). */
typedef int (*calib_search_eval)(void *ctx, calib_mix mix, int method, calib_score *s);

typedef struct calib_search_result {
    calib_mix mix;
    int method;
    calib_score score;
    int met; /* 1: the score meets the target */
    int tried; /* candidates scored */
} calib_search_result;

/* mixes[0..n) sorted fastest first by img_s[mix] (img/s per calib_mix),
 * in place; equal speeds keep their order. */
void calib_search_order(calib_mix *mixes, int n, const double img_s[CALIB_NMIXES]);

/* 1 when a is more agreeing than b (more agreements, then the smaller rel
 * L2); 0 for a tie or worse. */
int calib_search_better(const calib_score *a, const calib_score *b);

/* 1 when s's top-1 agreement, in percent, is at least target. */
int calib_search_meets(const calib_score *s, double target);

/* The search over mixes[0..nmixes) (already in speed order) and methods
 * 0..nmethods-1, scoring each candidate once with eval. Returns 0 with the
 * choice in *r, or -1 when eval failed. */
int calib_search_run(const calib_mix *mixes, int nmixes, int nmethods, double target, calib_search_eval eval, void *ctx,
                     calib_search_result *r);

#endif
