/* Rebuilds a JPEG's Y and subsampled Cb/Cr samples from RGB whose chroma was
 * upsampled by replication (what nvJPEG's hardware decoder returns as
 * NVJPEG_OUTPUT_RGB), so that libjpeg's "fancy" upsampling can then be
 * applied and the CPU path's pixels come back.
 *
 * Inside one chroma block (2x2 pixels for 4:2:0, 2x1 for 4:2:2, 1x2 for
 * 4:4:0, 4x1 for 4:1:1, 4x2 for 4:1:0) every pixel
 * shares Cb and Cr; R-G and B-G depend on them only, so their mean gives an
 * estimate. Each (Cb, Cr) within 1 of it is then tried: every pixel's best
 * Y, pushed through jdcolor.c's
 * fixed-point YCbCr -> RGB with its clamping, must give back the pixel, and
 * the pair with the smallest total error (then the one nearest the
 * estimate) wins. With libjpeg's conversion the
 * right pair reproduces the block exactly; clamped channels (0 or 255) are
 * kept out of the estimate but still scored.
 *
 * chroma_upsample_at then upsamples Cb/Cr planes (rebuilt ones, or the
 * decoder's own in exact mode) as libjpeg's jdsample.c does.
 *
 * Plain C, also compiled by nvcc for the kernels (gpu/resize.cu), so that a
 * CPU test (tests/image/test_chroma_rebuild.c) checks the same code against
 * libjpeg's own replicated, raw and fancy decodes. */
#ifndef RESNETD_CHROMA_REBUILD_H
#define RESNETD_CHROMA_REBUILD_H

#include <stdint.h>

#ifdef __CUDACC__
#define CHROMA_REBUILD_FN __host__ __device__ static inline
#else
#define CHROMA_REBUILD_FN static inline
#endif

#define CHROMA_REBUILD_MAX_PIXELS 8 /* 4x2 blocks: 4:1:0 */

CHROMA_REBUILD_FN int chroma_rebuild_clamp(int v)
{
    return v < 0 ? 0 : v > 255 ? 255 : v;
}

/* |v - clamp(x)| */
CHROMA_REBUILD_FN int chroma_rebuild_dist(int v, int x)
{
    int c = chroma_rebuild_clamp(x);
    return v > c ? v - c : c - v;
}

/* jdcolor.c's offsets from Y at 16 fractional bits, ONE_HALF rounding. */
CHROMA_REBUILD_FN int chroma_rebuild_r(int cr)
{
    return (91881 * (cr - 128) + 32768) >> 16;
}

CHROMA_REBUILD_FN int chroma_rebuild_g(int cb, int cr)
{
    return (-22554 * (cb - 128) + 32768 - 46802 * (cr - 128)) >> 16;
}

CHROMA_REBUILD_FN int chroma_rebuild_b(int cb)
{
    return (116130 * (cb - 128) + 32768) >> 16;
}

/* Best Y for pixel (r, g, b) given Cb, Cr; its error in *cost. */
CHROMA_REBUILD_FN int chroma_rebuild_luma(int r, int g, int b, int cb, int cr, int *cost)
{
    int orr = chroma_rebuild_r(cr), og = chroma_rebuild_g(cb, cr), ob = chroma_rebuild_b(cb);
    int sum = 0, n = 0;
    if (r > 0 && r < 255) {
        sum += r - orr;
        n++;
    }
    if (g > 0 && g < 255) {
        sum += g - og;
        n++;
    }
    if (b > 0 && b < 255) {
        sum += b - ob;
        n++;
    }
    int y0 = n ? (sum >= 0 ? (2 * sum + n) / (2 * n) : -((-2 * sum + n) / (2 * n))) : g - og;
    int best = -1, besty = 0;
    /* y0, then outwards: ties go to the nearer one; an exact Y ends it */
    for (int k = 0; k < 5 && best != 0; k++) {
        int y = chroma_rebuild_clamp(y0 + ((k + 1) / 2) * (k & 1 ? -1 : 1));
        int e = chroma_rebuild_dist(r, y + orr) + chroma_rebuild_dist(g, y + og) + chroma_rebuild_dist(b, y + ob);
        if (best < 0 || e < best) {
            best = e;
            besty = y;
        }
    }
    *cost = best;
    return besty;
}

typedef struct {
    int cost; /* total error, -1 before the first candidate */
    int cb, cr;
} chroma_rebuild_best;

/* Tries each (Cb, Cr) within 1 of the estimate (cb0, cr0) into *best: the
 * smallest error, then the nearest to the estimate. Candidates go nearest
 * first, so a candidate stops as soon as its error reaches the best one's
 * (it can no longer win) and the search as soon as one reproduces the block
 * exactly: most blocks take one candidate instead of nine. */
CHROMA_REBUILD_FN void chroma_rebuild_search(const uint8_t rgb[][3], int n, int cb0, int cr0, chroma_rebuild_best *best)
{
    /* by distance, and within one distance in (Cb, Cr) order, as ties
     * were always broken */
    static const signed char order[9][2] = { { 0, 0 },   { -1, 0 }, { 0, -1 }, { 0, 1 }, { 1, 0 },
                                             { -1, -1 }, { -1, 1 }, { 1, -1 }, { 1, 1 } };
    for (int k = 0; k < 9 && best->cost != 0; k++) {
        int cb = cb0 + order[k][0], cr = cr0 + order[k][1];
        if (cb < 0 || cb > 255 || cr < 0 || cr > 255)
            continue;
        int cost = 0, i;
        for (i = 0; i < n && (best->cost < 0 || cost < best->cost); i++) {
            int e;
            chroma_rebuild_luma(rgb[i][0], rgb[i][1], rgb[i][2], cb, cr, &e);
            cost += e;
        }
        if (i == n && (best->cost < 0 || cost < best->cost)) {
            best->cost = cost;
            best->cb = cb;
            best->cr = cr;
        }
    }
}

/* n pixels (1..CHROMA_REBUILD_MAX_PIXELS) of one chroma block, rgb[i] = {R, G, B}: their shared
 * Cb, Cr and each one's Y. */
CHROMA_REBUILD_FN void chroma_rebuild_block(const uint8_t rgb[][3], int n, uint8_t *cb_out, uint8_t *cr_out,
                                            uint8_t *y_out)
{
    int sr = 0, sb = 0, k = 0;
    for (int i = 0; i < n; i++)
        if (rgb[i][0] > 0 && rgb[i][0] < 255 && rgb[i][1] > 0 && rgb[i][1] < 255 && rgb[i][2] > 0 && rgb[i][2] < 255) {
            sr += rgb[i][0] - rgb[i][1];
            sb += rgb[i][2] - rgb[i][1];
            k++;
        }
    if (k == 0)
        for (int i = 0; i < n; i++, k++) {
            sr += rgb[i][0] - rgb[i][1];
            sb += rgb[i][2] - rgb[i][1];
        }
    /* R-G = 0.34414 Cb' + 2.11614 Cr', B-G = 2.11614 Cb' + 0.71414 Cr' */
    const float det = 0.34414f * 0.71414f - 2.11614f * 2.11614f;
    float mr = (float)sr / (float)k, mb = (float)sb / (float)k;
    float fcb = (0.71414f * mr - 2.11614f * mb) / det + 128.0f;
    float fcr = (0.34414f * mb - 2.11614f * mr) / det + 128.0f;
    int cb0 = chroma_rebuild_clamp((int)(fcb + 0.5f)), cr0 = chroma_rebuild_clamp((int)(fcr + 0.5f));
    chroma_rebuild_best best = { -1, cb0, cr0 };
    chroma_rebuild_search(rgb, n, cb0, cr0, &best);
    int bcb = best.cb, bcr = best.cr;
    for (int i = 0; i < n; i++) {
        int e;
        y_out[i] = (uint8_t)chroma_rebuild_luma(rgb[i][0], rgb[i][1], rgb[i][2], bcb, bcr, &e);
    }
    *cb_out = (uint8_t)bcb;
    *cr_out = (uint8_t)bcr;
}

/* Chroma plane c (cw x ch samples, rows cpitch bytes apart, samples cstep
 * apart), subsampled hs (1, 2, 4) across and vs (1, 2) down, at full
 * resolution pixel (x, y) after libjpeg's upsampling with
 * do_fancy_upsampling (as PIL decodes): h2v1, h2v2 and h1v2 "fancy"
 * (triangle) filters with their edge rules and rounding biases, and
 * replication (int_upsample) for 4:1:1 and 4:1:0. libjpeg replicates
 * 2x-subsampled rows under 3 samples wide too: callers keep those out. */
CHROMA_REBUILD_FN int chroma_upsample_at(const uint8_t *c, int cw, int ch, int cpitch, int cstep, int hs, int vs, int x,
                                         int y)
{
    const int s = cstep;
    if (hs == 4)
        return c[(long)(y / vs) * cpitch + (x >> 2) * s];
    /* vertically: the nearer chroma row weighs 3, the farther 1 (the edge
     * rows stand in for the missing neighbours) */
    const int r = vs == 2 ? y >> 1 : y;
    const int rf = vs == 1 ? r : y & 1 ? (r + 1 < ch ? r + 1 : r) : (r > 0 ? r - 1 : 0);
    const uint8_t *near = c + (long)r * cpitch, *far = c + (long)rf * cpitch;
    if (hs == 1) /* h1v2: bias 1 above, 2 below */
        return vs == 1 ? near[x * s] : (near[x * s] * 3 + far[x * s] + (y & 1 ? 2 : 1)) >> 2;
    const int k = x >> 1;
    if (vs == 1) { /* h2v1: 3:1 across, biases 2 and 1 */
        if (x & 1)
            return k == cw - 1 ? near[k * s] : (near[k * s] * 3 + near[(k + 1) * s] + 2) >> 2;
        return k == 0 ? near[0] : (near[k * s] * 3 + near[(k - 1) * s] + 1) >> 2;
    }
    /* h2v2: 3:1 down, then 3:1 across, biases 8 and 7 */
    int sum = near[k * s] * 3 + far[k * s];
    if (x & 1)
        return k == cw - 1 ? (sum * 4 + 7) >> 4 : (sum * 3 + near[(k + 1) * s] * 3 + far[(k + 1) * s] + 7) >> 4;
    return k == 0 ? (sum * 4 + 8) >> 4 : (sum * 3 + near[(k - 1) * s] * 3 + far[(k - 1) * s] + 8) >> 4;
}

#endif
