/* Kernel-level entry points for tests/gpu/test_gpu_kernels.c (not used by the
 * engine). Each runs one gpu/ kernel on host data: inputs are FP32 arrays,
 * first rounded in place to FP16 when fp16 is set, so that the test's CPU
 * reference sees exactly what the kernel saw; outputs come back as FP32.
 * The INT8 entry points take and return int8 arrays instead.
 * Device outputs are poisoned (all bits set: NaN) before each launch, so an
 * element the kernel fails to write shows up as NaN. Each returns 0, or -1
 * with a one-line message in err. */
#ifndef RESNETD_GPU_TEST_H
#define RESNETD_GPU_TEST_H

#include <stddef.h>
#include <stdint.h>
#include "engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpu_test_conv_shape {
    int n, h, w, c; /* input NHWC */
    int k, kh, kw; /* output channels, filter size */
    int stride, pad_h, pad_w;
    int oh, ow; /* 0: computed from the above */
} gpu_test_conv_shape;

/* The conv tile table of a kind (0 FP32, 1 FP16, 2 INT8): how many
 * configurations, and their names. */
int gpu_test_conv_tiles(int kind);
const char *gpu_test_conv_tile_name(int kind, int tile);
/* 1 when this device runs the tile (wgmma tiles need compute capability 9.0),
 * 0 when not, -1 when the device cannot be queried. */
int gpu_test_conv_tile_usable(int kind, int tile);
/* The tile's family: without split-K, tiles of one family give every output
 * the same bits (gpu/kernels.cuh, conv_tile_info.family). */
int gpu_test_conv_tile_family(int kind, int tile);

/* out[n][oh][ow][k] = relu?(conv(in, w) + bias (+ res)); res may be NULL.
 * splits > 1 splits K over that many CTAs (fewer when K is short) and adds
 * the partial sums in the split-K epilogue (a tile without split-K ignores
 * it). Fills s->oh and s->ow when 0. Returns 0, 1 when the tile is a special
 * kernel that does not run this shape (nothing computed), -1 on error. */
int gpu_test_conv(int fp16, int tile, int splits, gpu_test_conv_shape *s, float *in, float *w, const float *bias,
                  float *res, int relu, float *out, char *err, size_t errlen);

/* A conv's shortcut: a 1x1 conv of the given stride, no padding, on a
 * second input n x h x w x c (in), weights [k][c] (wgt); FP16 rounds both in
 * place to the values the device holds, as gpu_test_conv does. */
typedef struct gpu_test_shortcut {
    int c, h, w, stride;
    float *in, *wgt;
} gpu_test_shortcut;

/* out = relu?(conv(in, w) + shortcut + bias) in one conv (conv_shape.c2):
 * FP16's general tiles (INT8's: gpu_test_conv_s8_shortcut; here only its
 * shape check); other kinds and shapes the kernels refuse return -1 with
 * err. Otherwise returns as gpu_test_conv. */
int gpu_test_conv_shortcut(int kind, int tile, int splits, gpu_test_conv_shape *s, gpu_test_shortcut *sc, float *in,
                           float *w, const float *bias, int relu, float *out, char *err, size_t errlen);

/* INT8 (engine/int8.h): in u8 (as every INT8 conv kernel reads it: the
 * stem is gpu_test_stem_pool's), w (KRSC) int8, c % 16 == 0, res u8
 * (res_u8) or int8; the sums' epilogue with mult, bias, res_scale, relu,
 * then quantised with out_inv into out, u8 with relu and int8 without, or
 * out_f32: FP32 out. Returns as gpu_test_conv. */
int gpu_test_conv_s8(int tile, int splits, gpu_test_conv_shape *s, const int8_t *in, const int8_t *w, const float *bias,
                     const float *mult, float res_scale, float out_inv, int out_f32, const int8_t *res, int res_u8,
                     int relu, void *out, char *err, size_t errlen);
/* INT8's last conv with the average pool inside (conv_q8.pool_out): as
 * gpu_test_conv_s8 into FP32 (res u8: a block's output), but each image's channel means land in feat
 * [n][k] as FP16 bits (engine/int8.h) and no output is stored. Returns 1
 * for tiles without it (not general wgmma tiles, or fewer rows than an
 * image's oh * ow), -1 with err when a counter is not left at 0. */
int gpu_test_conv_s8_pool(int tile, gpu_test_conv_shape *s, const int8_t *in, const int8_t *w, const float *bias,
                          const float *mult, float res_scale, const int8_t *res, int relu, uint16_t *feat, char *err,
                          size_t errlen);
/* INT8 with a shortcut (conv_shape.c2): as gpu_test_conv_s8, the residual
 * (scale res_scale) being the shortcut's 1x1 conv of sc->in (n x h x w x c
 * u8, weights sc->wgt [k][c] int8) finished by its own epilogue with
 * sc->mult, sc->bias and sc->inv (engine/int8.h, no ReLU: int8). General tiles,
 * no split-K: splits > 1 is refused (-1). Returns as gpu_test_conv. */
typedef struct gpu_test_shortcut_s8 {
    int c, h, w, stride;
    const int8_t *in, *wgt;
    const float *mult, *bias;
    float inv;
} gpu_test_shortcut_s8;
int gpu_test_conv_s8_shortcut(int tile, int splits, gpu_test_conv_shape *s, const gpu_test_shortcut_s8 *sc,
                              const int8_t *in, const int8_t *w, const float *bias, const float *mult, float res_scale,
                              float out_inv, int out_f32, int relu, void *out, char *err, size_t errlen);
/* INT8 input: in npix RGB pixels -> out npix x 4 (lut[c][byte], then 0). */
int gpu_test_normalize_s8(const uint8_t *in, long npix, const int8_t lut[3][256], int8_t *out, char *err,
                          size_t errlen);
/* INT8 3x3/2 pad-1 max pool of u8 values; c % 16 == 0. */
int gpu_test_maxpool_s8(const int8_t *in, int n, int h, int w, int c, int oh, int ow, int8_t *out, char *err,
                        size_t errlen);

/* The fused stem + max pool (gpu/stem.cu), its mma.sync kernel (wgmma 0)
 * or its wgmma one (1), on at most ctas CTAs: in
 * [n][h][224][4], w [64][7][8][4] (tap s of filter row r reads input column
 * 2x - 4 + s), out [n][h/4][56][64]; image i is rgb's [h][224][3] through
 * lut ([3][256]) when which[i] < 0, else in's. FP16 (kind 1): in and w FP32
 * arrays rounded in place to FP16, lut FP32 (rounded to FP16 on the way),
 * out FP32; mult and out_inv unused. INT8 (kind 2): int8 arrays, lut
 * (as gpu_test_normalize_s8's) and out, the epilogue with mult and
 * out_inv. Returns 0, 1 (wgmma asked for and not usable here) or -1. */
int gpu_test_stem_pool(int kind, int wgmma, int ctas, int n, int h, void *in, const uint8_t *rgb, const void *lut,
                       const int *which, void *w, const float *bias, const float *mult, float out_inv, void *out,
                       char *err, size_t errlen);

/* in: npix RGB pixels; out: npix x 4 (normalised RGB, then 0). */
int gpu_test_normalize(int fp16, const uint8_t *in, long npix, float *out, char *err, size_t errlen);

/* 3x3/2 pad-1 max pool of in[n][h][w][c] into out[n][oh][ow][c]. */
int gpu_test_maxpool(int fp16, float *in, int n, int h, int w, int c, int oh, int ow, float *out, char *err,
                     size_t errlen);

/* Mean over hw of in[n][hw][c] into out[n][c]; kind 0 FP32, 1 FP16, 2 INT8's
 * (FP32 in, the mean summed in float64 and rounded to FP16 out). */
int gpu_test_avgpool(int kind, float *in, int n, int hw, int c, float *out, char *err, size_t errlen);

/* logits_out = logits + bias, per row of classes. */
int gpu_test_fc_bias(const float *logits, const float *bias, int n, int classes, float *logits_out, char *err,
                     size_t errlen);

/* PIL-exact resize + crop (gpu/resize.cu) of one w x h RGB image, given
 * interleaved on the host and handed to the kernel as planes, as nvJPEG
 * writes them; rw, rh, left, top as preprocess_geometry gives them.
 * hs x vs other than 1 x 1: the image's chroma, subsampled that much, is
 * replicated (as the hardware decoder returns it) and is rebuilt first
 * (chroma_rebuild_launch); 1 x 1: plain RGB. out: 224x224x3 HWC. */
int gpu_test_resize_crop(const uint8_t *rgb, int w, int h, int hs, int vs, int rw, int rh, int left, int top,
                         uint8_t *out, char *err, size_t errlen);

/* Copies the first n images of a CUDA engine slot's device input (what the
 * GPU JPEG decoder wrote there) to out, after the device is idle. */
int gpu_test_engine_device_input(engine *e, int slot, int n, uint8_t *out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
