// Host-data wrappers around single kernels, for tests/gpu/test_gpu_kernels.c
// (declared in gpu/gpu_test.h). Slow and simple on purpose: allocate, copy,
// poison the output, launch, synchronise, copy back, free.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_fp16.h>
#include "gpu/cuda_check.cuh"
#include "gpu/engine_cuda.cuh"
#include "gpu/gpu_test.h"
#include "gpu/kernels.cuh"

// A device copy of n host floats in the kernel's precision; with fp16 the
// host array is rounded in place to the values the device holds.
static cudaError_t to_device(int fp16, float *host, size_t n, void **dev)
{
    size_t bytes = n * (fp16 ? 2 : 4);
    cudaError_t e = cudaMalloc(dev, bytes ? bytes : 1);
    if (e != cudaSuccess || n == 0)
        return e;
    if (!fp16)
        return cudaMemcpy(*dev, host, bytes, cudaMemcpyHostToDevice);
    __half *h = (__half *)malloc(bytes);
    if (!h)
        return cudaErrorMemoryAllocation;
    for (size_t i = 0; i < n; i++) {
        h[i] = __float2half_rn(host[i]);
        host[i] = __half2float(h[i]);
    }
    e = cudaMemcpy(*dev, h, bytes, cudaMemcpyHostToDevice);
    free(h);
    return e;
}

static cudaError_t poisoned(int fp16, size_t n, void **dev)
{
    size_t bytes = n * (fp16 ? 2 : 4);
    cudaError_t e = cudaMalloc(dev, bytes);
    return e == cudaSuccess ? cudaMemset(*dev, 0xff, bytes) : e;
}

static cudaError_t to_host(int fp16, const void *dev, size_t n, float *host)
{
    if (!fp16)
        return cudaMemcpy(host, dev, n * 4, cudaMemcpyDeviceToHost);
    __half *h = (__half *)malloc(n * 2);
    if (!h)
        return cudaErrorMemoryAllocation;
    cudaError_t e = cudaMemcpy(h, dev, n * 2, cudaMemcpyDeviceToHost);
    for (size_t i = 0; e == cudaSuccess && i < n; i++)
        host[i] = __half2float(h[i]);
    free(h);
    return e;
}

extern "C" int gpu_test_conv_tiles(int kind)
{
    return conv_tile_count(kind);
}

extern "C" const char *gpu_test_conv_tile_name(int kind, int tile)
{
    const conv_tile_info *t = conv_tile_get(kind, tile);
    return t ? t->name : "?";
}

extern "C" int gpu_test_conv_tile_usable(int kind, int tile)
{
    const conv_tile_info *t = conv_tile_get(kind, tile);
    if (!t || conv_init() != cudaSuccess)
        return -1;
    return t->usable;
}

extern "C" int gpu_test_conv_tile_family(int kind, int tile)
{
    const conv_tile_info *t = conv_tile_get(kind, tile);
    return t ? t->family : -1;
}

// Tile `tile` with K split over `splits` CTAs (fewer when K is short; none
// for a special kernel).
static conv_plan test_plan(const conv_tile_info *info, int tile, int splits, const conv_shape *s)
{
    conv_plan plan = { tile, 1, 0 };
    plan.kt_per_split = (conv_k(*s) + info->bk - 1) / info->bk;
    if (splits > 1 && !info->halo) {
        int kt = plan.kt_per_split;
        plan.kt_per_split = (kt + splits - 1) / splits;
        plan.splits = (kt + plan.kt_per_split - 1) / plan.kt_per_split;
    }
    return plan;
}

// The shape of a test conv (with sc: its shortcut), checked; -1 with err
// when the kernels refuse it.
static int test_shape(int kind, gpu_test_conv_shape *t, const gpu_test_shortcut *sc, conv_shape *s, char *err,
                      size_t errlen)
{
    *s = conv_shape_make(t->n, t->h, t->w, t->c, t->k, t->kh, t->kw, t->stride, t->pad_h, t->pad_w);
    if (t->oh > 0)
        s->oh = t->oh;
    if (t->ow > 0)
        s->ow = t->ow;
    t->oh = s->oh;
    t->ow = s->ow;
    if (sc) {
        s->c2 = sc->c;
        s->h2 = sc->h;
        s->w2 = sc->w;
        s->stride2 = sc->stride;
    }
    return conv_shape_check(s, kind, err, errlen);
}

// gpu_test_conv, and with sc gpu_test_conv_shortcut.
static int test_conv(int fp16, int tile, int splits, gpu_test_conv_shape *t, gpu_test_shortcut *sc, float *in, float *w,
                     const float *bias, float *res, int relu, float *out, char *err, size_t errlen)
{
    void *din = NULL, *din2 = NULL, *dw = NULL, *dres = NULL, *dout = NULL;
    float *dbias = NULL, *dws = NULL, *cat = NULL;
    conv_plan plan;
    const conv_tile_info *info = conv_tile_get(fp16, tile);
    int rc = -1;
    size_t nin, nw, nout, k1;
    conv_shape s;
    if (test_shape(fp16, t, sc, &s, err, errlen) != 0)
        return -1;
    if (!info || splits < 1) {
        snprintf(err, errlen, "no tile %d or bad split %d", tile, splits);
        return -1;
    }
    if (!conv_tile_fits(fp16, tile, &s))
        return 1;
    plan = test_plan(info, tile, splits, &s);
    nin = (size_t)s.n * s.h * s.w * s.c;
    k1 = (size_t)s.kh * s.kw * s.c;
    nw = (size_t)s.k * conv_k(s);
    nout = (size_t)s.n * s.oh * s.ow * s.k;
    CUDA_TRY(conv_init());
    CUDA_TRY(to_device(fp16, in, nin, &din));
    if (sc) {  // weight rows: the taps, then the shortcut's channels
        CUDA_TRY(to_device(fp16, sc->in, (size_t)s.n * s.h2 * s.w2 * s.c2, &din2));
        if (!(cat = (float *)malloc(nw * sizeof(float)))) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        for (int o = 0; o < s.k; o++) {
            memcpy(cat + o * conv_k(s), w + o * k1, k1 * sizeof(float));
            memcpy(cat + o * conv_k(s) + k1, sc->wgt + (size_t)o * s.c2, s.c2 * sizeof(float));
        }
        CUDA_TRY(to_device(fp16, cat, nw, &dw));
        for (int o = 0; o < s.k; o++) {  // the values the device holds, for the caller's reference
            memcpy(w + o * k1, cat + o * conv_k(s), k1 * sizeof(float));
            memcpy(sc->wgt + (size_t)o * s.c2, cat + o * conv_k(s) + k1, s.c2 * sizeof(float));
        }
    } else {
        CUDA_TRY(to_device(fp16, w, nw, &dw));
    }
    CUDA_TRY(cudaMalloc((void **)&dbias, s.k * sizeof(float)));
    CUDA_TRY(cudaMemcpy(dbias, bias, s.k * sizeof(float), cudaMemcpyHostToDevice));
    if (res)
        CUDA_TRY(to_device(fp16, res, nout, &dres));
    CUDA_TRY(poisoned(fp16, nout, &dout));
    if (plan.splits > 1)
        CUDA_TRY(poisoned(0, conv_workspace_bytes(&s, &plan) / sizeof(float), (void **)&dws));
    // Two CTAs a 64-channel slice: every CTA through several tiles and both buffers.
    conv_set_persistent_cap(info->halo ? 2 * (s.k / 64) : 0);
    CUDA_TRY(conv_launch(fp16, &plan, &s, din, din2, dw, dbias, dres, relu, dout, dws, NULL, 0));
    conv_set_persistent_cap(0);
    CUDA_TRY(cudaDeviceSynchronize());
    CUDA_TRY(to_host(fp16, dout, nout, out));
    rc = 0;
fail:
    conv_set_persistent_cap(0);
    free(cat);
    cudaFree(din);
    cudaFree(din2);
    cudaFree(dw);
    cudaFree(dbias);
    cudaFree(dres);
    cudaFree(dout);
    cudaFree(dws);
    return rc;
}

extern "C" int gpu_test_conv(int fp16, int tile, int splits, gpu_test_conv_shape *t, float *in, float *w,
                             const float *bias, float *res, int relu, float *out, char *err, size_t errlen)
{
    return test_conv(fp16, tile, splits, t, NULL, in, w, bias, res, relu, out, err, errlen);
}

extern "C" int gpu_test_conv_shortcut(int kind, int tile, int splits, gpu_test_conv_shape *t, gpu_test_shortcut *sc,
                                      float *in, float *w, const float *bias, int relu, float *out, char *err,
                                      size_t errlen)
{
    if (kind == CONV_INT8) {  // int8 data goes through gpu_test_conv_s8_shortcut: here only the shape check
        conv_shape s;
        if (test_shape(CONV_INT8, t, sc, &s, err, errlen) == 0)
            snprintf(err, errlen, "the INT8 shape check did not refuse it");
        return -1;
    }
    return test_conv(kind, tile, splits, t, sc, in, w, bias, NULL, relu, out, err, errlen);
}

// gpu_test_conv_s8, with sc8 gpu_test_conv_s8_shortcut, with feat (the
// pool inside, out unused) gpu_test_conv_s8_pool.
static int test_conv_s8(int tile, int splits, gpu_test_conv_shape *t, const gpu_test_shortcut_s8 *sc8, const int8_t *in,
                        const int8_t *w, const float *bias, const float *mult, float res_scale, float out_inv,
                        int out_f32, const int8_t *res, int res_u8, int relu, void *out, uint16_t *feat, char *err,
                        size_t errlen)
{
    void *din = NULL, *din2 = NULL, *dw = NULL, *dres = NULL, *dout = NULL, *dfeat = NULL;
    float *dbias = NULL, *dmult = NULL, *dws = NULL, *dmult2 = NULL, *dbias2 = NULL;
    double *dpart = NULL;
    int *dcnt = NULL, *cnt = NULL;
    int8_t *cat = NULL;
    const conv_tile_info *info = conv_tile_get(CONV_INT8, tile);
    const gpu_test_shortcut geo = {
        sc8 ? sc8->c : 0, sc8 ? sc8->h : 0, sc8 ? sc8->w : 0, sc8 ? sc8->stride : 1, NULL, NULL
    };
    int rc = -1;
    conv_shape s;
    if (test_shape(CONV_INT8, t, sc8 ? &geo : NULL, &s, err, errlen) != 0)
        return -1;
    if (!info || splits < 1) {
        snprintf(err, errlen, "no tile %d or bad split %d", tile, splits);
        return -1;
    }
    if (!conv_tile_fits(CONV_INT8, tile, &s) || (info->halo && out_f32))
        return 1;  // the patch kernel writes int8 only
    const conv_plan plan = test_plan(info, tile, splits, &s);
    if (feat && !conv_pool_fits(CONV_INT8, &plan, &s))
        return 1;
    const size_t ncnt = (size_t)s.n * (s.k / 64);  // the pool's counters
    const size_t k1 = (size_t)s.kh * s.kw * s.c, nin = (size_t)s.n * s.h * s.w * s.c, nw = (size_t)s.k * conv_k(s);
    const size_t nout = (size_t)s.n * s.oh * s.ow * s.k, obytes = nout * (out_f32 ? 4 : 1);
    conv_q8 q = {};
    q.res_scale = res_scale;
    q.res_u8 = res_u8;
    q.out_inv = out_inv;
    q.out_f32 = out_f32;
    CUDA_TRY(conv_init());
    CUDA_TRY(cudaMalloc(&din, nin));
    CUDA_TRY(cudaMemcpy(din, in, nin, cudaMemcpyHostToDevice));
    if (sc8) {  // weight rows: the taps, then the shortcut's channels; its input and epilogue
        const size_t nin2 = (size_t)s.n * s.h2 * s.w2 * s.c2;
        if (!(cat = (int8_t *)malloc(nw))) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        for (int o = 0; o < s.k; o++) {
            memcpy(cat + o * conv_k(s), w + o * k1, k1);
            memcpy(cat + o * conv_k(s) + k1, sc8->wgt + (size_t)o * s.c2, s.c2);
        }
        w = cat;
        CUDA_TRY(cudaMalloc(&din2, nin2));
        CUDA_TRY(cudaMemcpy(din2, sc8->in, nin2, cudaMemcpyHostToDevice));
        CUDA_TRY(cudaMalloc((void **)&dmult2, s.k * sizeof(float)));
        CUDA_TRY(cudaMemcpy(dmult2, sc8->mult, s.k * sizeof(float), cudaMemcpyHostToDevice));
        CUDA_TRY(cudaMalloc((void **)&dbias2, s.k * sizeof(float)));
        CUDA_TRY(cudaMemcpy(dbias2, sc8->bias, s.k * sizeof(float), cudaMemcpyHostToDevice));
        q.sc_mult = dmult2;
        q.sc_bias = dbias2;
        q.sc_inv = sc8->inv;
    }
    CUDA_TRY(cudaMalloc(&dw, nw));
    CUDA_TRY(cudaMemcpy(dw, w, nw, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMalloc((void **)&dbias, s.k * sizeof(float)));
    CUDA_TRY(cudaMemcpy(dbias, bias, s.k * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMalloc((void **)&dmult, s.k * sizeof(float)));
    CUDA_TRY(cudaMemcpy(dmult, mult, s.k * sizeof(float), cudaMemcpyHostToDevice));
    q.mult = dmult;
    if (res) {
        CUDA_TRY(cudaMalloc(&dres, nout));
        CUDA_TRY(cudaMemcpy(dres, res, nout, cudaMemcpyHostToDevice));
    }
    if (feat) {  // no output tensor; the features poisoned, the parts NaN, the counters 0
        CUDA_TRY(poisoned(1, (size_t)s.n * s.k, &dfeat));
        CUDA_TRY(cudaMalloc((void **)&dpart, (size_t)s.n * 2 * s.k * sizeof(double)));
        CUDA_TRY(cudaMemset(dpart, 0xff, (size_t)s.n * 2 * s.k * sizeof(double)));
        CUDA_TRY(cudaMalloc((void **)&dcnt, ncnt * sizeof(int)));
        CUDA_TRY(cudaMemset(dcnt, 0, ncnt * sizeof(int)));
        q.pool_out = (__half *)dfeat;
        q.pool_part = dpart;
        q.pool_cnt = dcnt;
        q.pool_hw = s.oh * s.ow;
        q.out_f32 = 1;
    } else {
        CUDA_TRY(poisoned(0, (obytes + 3) / 4, &dout));
    }
    if (plan.splits > 1)
        CUDA_TRY(poisoned(0, conv_workspace_bytes(&s, &plan) / sizeof(float), (void **)&dws));
    conv_set_persistent_cap(info->halo ? 2 * (s.k / 64) : 0);
    CUDA_TRY(conv_launch(CONV_INT8, &plan, &s, din, din2, dw, dbias, dres, relu, dout, dws, &q, 0));
    conv_set_persistent_cap(0);
    CUDA_TRY(cudaDeviceSynchronize());
    if (feat) {
        CUDA_TRY(cudaMemcpy(feat, dfeat, (size_t)s.n * s.k * sizeof(uint16_t), cudaMemcpyDeviceToHost));
        if (!(cnt = (int *)malloc(ncnt * sizeof(int)))) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        CUDA_TRY(cudaMemcpy(cnt, dcnt, ncnt * sizeof(int), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < ncnt; i++)
            if (cnt[i] != 0) {
                snprintf(err, errlen, "the pool's counter %zu left at %d", i, cnt[i]);
                goto fail;
            }
    } else {
        CUDA_TRY(cudaMemcpy(out, dout, obytes, cudaMemcpyDeviceToHost));
    }
    rc = 0;
fail:
    conv_set_persistent_cap(0);
    free(cat);
    cudaFree(din2);
    cudaFree(dmult2);
    cudaFree(dbias2);
    cudaFree(din);
    cudaFree(dw);
    cudaFree(dbias);
    cudaFree(dmult);
    cudaFree(dres);
    cudaFree(dout);
    cudaFree(dws);
    cudaFree(dfeat);
    cudaFree(dpart);
    cudaFree(dcnt);
    free(cnt);
    return rc;
}

extern "C" int gpu_test_conv_s8(int tile, int splits, gpu_test_conv_shape *t, const int8_t *in, const int8_t *w,
                                const float *bias, const float *mult, float res_scale, float out_inv, int out_f32,
                                const int8_t *res, int res_u8, int relu, void *out, char *err, size_t errlen)
{
    return test_conv_s8(tile, splits, t, NULL, in, w, bias, mult, res_scale, out_inv, out_f32, res, res_u8, relu, out,
                        NULL, err, errlen);
}

extern "C" int gpu_test_conv_s8_pool(int tile, gpu_test_conv_shape *t, const int8_t *in, const int8_t *w,
                                     const float *bias, const float *mult, float res_scale, const int8_t *res, int relu,
                                     uint16_t *feat, char *err, size_t errlen)
{
    return test_conv_s8(tile, 1, t, NULL, in, w, bias, mult, res_scale, 0.f, 1, res, 1, relu, NULL, feat, err, errlen);
}

extern "C" int gpu_test_conv_s8_shortcut(int tile, int splits, gpu_test_conv_shape *t, const gpu_test_shortcut_s8 *sc,
                                         const int8_t *in, const int8_t *w, const float *bias, const float *mult,
                                         float res_scale, float out_inv, int out_f32, int relu, void *out, char *err,
                                         size_t errlen)
{
    return test_conv_s8(tile, splits, t, sc, in, w, bias, mult, res_scale, out_inv, out_f32, NULL, 0, relu, out, NULL,
                        err, errlen);
}

extern "C" int gpu_test_stem_pool(int kind, int wgmma, int ctas, int n, int h, void *in, const uint8_t *rgb,
                                  const void *lut, const int *which, void *w, const float *bias, const float *mult,
                                  float out_inv, void *out, char *err, size_t errlen)
{
    const int W = 224, K = 64, s8 = kind == CONV_INT8;
    const size_t nin = (size_t)n * h * W * 4, nw = (size_t)K * 7 * 8 * 4, nout = (size_t)n * (h / 4) * (W / 4) * K;
    // A poisoned pooled row past the output: a CTA whose second pooled row
    // is past the image (h / 4 odd) must not write it.
    const size_t guard = (size_t)(W / 4) * K, ebytes = s8 ? 1 : 2;
    unsigned char *before = (unsigned char *)malloc(guard * ebytes), *after = (unsigned char *)malloc(guard * ebytes);
    void *din = NULL, *dw = NULL, *dout = NULL;
    float *dbias = NULL, *dmult = NULL;
    conv_q8 q = {};
    q.out_inv = out_inv;
    stem_rgb src = { NULL, NULL, NULL };
    uint8_t *drgb = NULL;
    void *dlut = NULL;
    int *dwhich = NULL;
    __half hlut[3 * 256];
    cudaError_t e = cudaSuccess;
    int rc = -1;
    if (!stem_pool_fits(h, W, 4, K) || (kind != CONV_FP16 && !s8) || !before || !after) {
        snprintf(err, errlen, before && after ? "stem shape or kind not supported" : "out of memory");
        free(before);
        free(after);
        return -1;
    }
    CUDA_TRY(conv_init());
    if (wgmma && !stem_pool_wgmma_usable()) {
        free(before);
        free(after);
        return 1;
    }
    if (s8) {
        CUDA_TRY(cudaMalloc(&din, nin));
        CUDA_TRY(cudaMemcpy(din, in, nin, cudaMemcpyHostToDevice));
        CUDA_TRY(cudaMalloc(&dw, nw));
        CUDA_TRY(cudaMemcpy(dw, w, nw, cudaMemcpyHostToDevice));
        CUDA_TRY(cudaMalloc((void **)&dmult, K * sizeof(float)));
        CUDA_TRY(cudaMemcpy(dmult, mult, K * sizeof(float), cudaMemcpyHostToDevice));
        q.mult = dmult;
        CUDA_TRY(cudaMalloc(&dlut, 3 * 256));
        CUDA_TRY(cudaMemcpy(dlut, lut, 3 * 256, cudaMemcpyHostToDevice));
        CUDA_TRY(cudaMalloc(&dout, nout + guard));
        CUDA_TRY(cudaMemset(dout, 0x55, nout + guard));
    } else {
        CUDA_TRY(to_device(1, (float *)in, nin, &din));
        CUDA_TRY(to_device(1, (float *)w, nw, &dw));
        for (int i = 0; i < 3 * 256; i++)
            hlut[i] = __float2half_rn(((const float *)lut)[i]);
        CUDA_TRY(cudaMalloc(&dlut, sizeof hlut));
        CUDA_TRY(cudaMemcpy(dlut, hlut, sizeof hlut, cudaMemcpyHostToDevice));
        CUDA_TRY(poisoned(1, nout + guard, &dout));
    }
    CUDA_TRY(cudaMalloc((void **)&drgb, (size_t)n * h * W * 3));
    CUDA_TRY(cudaMemcpy(drgb, rgb, (size_t)n * h * W * 3, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMalloc((void **)&dwhich, n * sizeof(int)));
    CUDA_TRY(cudaMemcpy(dwhich, which, n * sizeof(int), cudaMemcpyHostToDevice));
    src.rgb = drgb;
    src.lut = dlut;
    src.which = dwhich;
    CUDA_TRY(cudaMemcpy(before, (unsigned char *)dout + nout * ebytes, guard * ebytes, cudaMemcpyDeviceToHost));
    CUDA_TRY(cudaMalloc((void **)&dbias, K * sizeof(float)));
    CUDA_TRY(cudaMemcpy(dbias, bias, K * sizeof(float), cudaMemcpyHostToDevice));
    conv_set_persistent_cap(ctas);
    stem_pool_use_wgmma(wgmma);
    e = stem_pool_launch(kind, n, h, W, din, &src, dw, dbias, s8 ? &q : NULL, dout, 0);
    stem_pool_use_wgmma(1);
    conv_set_persistent_cap(0);
    CUDA_TRY(e);
    CUDA_TRY(cudaDeviceSynchronize());
    CUDA_TRY(cudaMemcpy(after, (unsigned char *)dout + nout * ebytes, guard * ebytes, cudaMemcpyDeviceToHost));
    if (memcmp(before, after, guard * ebytes) != 0) {
        snprintf(err, errlen, "the stem wrote past its output");
        goto fail;
    }
    if (s8)
        CUDA_TRY(cudaMemcpy(out, dout, nout, cudaMemcpyDeviceToHost));
    else
        CUDA_TRY(to_host(1, dout, nout, (float *)out));
    rc = 0;
fail:
    conv_set_persistent_cap(0);
    free(before);
    free(after);
    cudaFree(din);
    cudaFree(dw);
    cudaFree(dout);
    cudaFree(dbias);
    cudaFree(dmult);
    cudaFree(drgb);
    cudaFree(dlut);
    cudaFree(dwhich);
    return rc;
}

extern "C" int gpu_test_normalize_s8(const uint8_t *in, long npix, const int8_t lut[3][256], int8_t *out, char *err,
                                     size_t errlen)
{
    uint8_t *din = NULL;
    int8_t *dlut = NULL, *dout = NULL;
    int rc = -1;
    CUDA_TRY(cudaMalloc((void **)&din, npix * 3));
    CUDA_TRY(cudaMemcpy(din, in, npix * 3, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMalloc((void **)&dlut, 768));
    CUDA_TRY(cudaMemcpy(dlut, lut, 768, cudaMemcpyHostToDevice));
    CUDA_TRY(poisoned(0, npix, (void **)&dout));
    CUDA_TRY(normalize_s8_launch(din, dlut, dout, npix, 0));
    CUDA_TRY(cudaDeviceSynchronize());
    CUDA_TRY(cudaMemcpy(out, dout, npix * 4, cudaMemcpyDeviceToHost));
    rc = 0;
fail:
    cudaFree(din);
    cudaFree(dlut);
    cudaFree(dout);
    return rc;
}

extern "C" int gpu_test_maxpool_s8(const int8_t *in, int n, int h, int w, int c, int oh, int ow, int8_t *out, char *err,
                                   size_t errlen)
{
    int8_t *din = NULL, *dout = NULL;
    size_t nin = (size_t)n * h * w * c, nout = (size_t)n * oh * ow * c;
    int rc = -1;
    CUDA_TRY(cudaMalloc((void **)&din, nin));
    CUDA_TRY(cudaMemcpy(din, in, nin, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMalloc((void **)&dout, nout));
    CUDA_TRY(cudaMemset(dout, 0x55, nout));
    CUDA_TRY(maxpool_s8_launch(din, dout, n, h, w, c, oh, ow, 0));
    CUDA_TRY(cudaDeviceSynchronize());
    CUDA_TRY(cudaMemcpy(out, dout, nout, cudaMemcpyDeviceToHost));
    rc = 0;
fail:
    cudaFree(din);
    cudaFree(dout);
    return rc;
}

extern "C" int gpu_test_normalize(int fp16, const uint8_t *in, long npix, float *out, char *err, size_t errlen)
{
    uint8_t *din = NULL;
    void *dout = NULL;
    int rc = -1;
    CUDA_TRY(cudaMalloc((void **)&din, (size_t)npix * 3));
    CUDA_TRY(cudaMemcpy(din, in, (size_t)npix * 3, cudaMemcpyHostToDevice));
    CUDA_TRY(poisoned(fp16, (size_t)npix * 4, &dout));
    CUDA_TRY(normalize_launch(fp16, din, dout, npix, 0));
    CUDA_TRY(cudaDeviceSynchronize());
    CUDA_TRY(to_host(fp16, dout, (size_t)npix * 4, out));
    rc = 0;
fail:
    cudaFree(din);
    cudaFree(dout);
    return rc;
}

extern "C" int gpu_test_maxpool(int fp16, float *in, int n, int h, int w, int c, int oh, int ow, float *out, char *err,
                                size_t errlen)
{
    void *din = NULL, *dout = NULL;
    int rc = -1;
    if (c % 8 != 0) {
        snprintf(err, errlen, "maxpool channels %d not a multiple of 8", c);
        return -1;
    }
    CUDA_TRY(to_device(fp16, in, (size_t)n * h * w * c, &din));
    CUDA_TRY(poisoned(fp16, (size_t)n * oh * ow * c, &dout));
    CUDA_TRY(maxpool_launch(fp16, din, dout, n, h, w, c, oh, ow, 0));
    CUDA_TRY(cudaDeviceSynchronize());
    CUDA_TRY(to_host(fp16, dout, (size_t)n * oh * ow * c, out));
    rc = 0;
fail:
    cudaFree(din);
    cudaFree(dout);
    return rc;
}

extern "C" int gpu_test_avgpool(int kind, float *in, int n, int hw, int c, float *out, char *err, size_t errlen)
{
    void *din = NULL, *dout = NULL;
    int rc = -1;
    const int in16 = kind == CONV_FP16, out16 = kind != CONV_FP32;  // INT8: FP32 in, FP16 out
    if (c % 2 != 0) {
        snprintf(err, errlen, "avgpool channels %d not even", c);
        return -1;
    }
    CUDA_TRY(to_device(in16, in, (size_t)n * hw * c, &din));
    CUDA_TRY(poisoned(out16, (size_t)n * c, &dout));
    CUDA_TRY(avgpool_launch(kind, din, dout, n, hw, c, 0));
    CUDA_TRY(cudaDeviceSynchronize());
    CUDA_TRY(to_host(out16, dout, (size_t)n * c, out));
    rc = 0;
fail:
    cudaFree(din);
    cudaFree(dout);
    return rc;
}

extern "C" int gpu_test_fc_bias(const float *logits, const float *bias, int n, int classes, float *logits_out,
                                char *err, size_t errlen)
{
    float *dl = NULL, *db = NULL;
    int rc = -1;
    size_t nl = (size_t)n * classes;
    CUDA_TRY(cudaMalloc((void **)&dl, nl * sizeof(float)));
    CUDA_TRY(cudaMemcpy(dl, logits, nl * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMalloc((void **)&db, classes * sizeof(float)));
    CUDA_TRY(cudaMemcpy(db, bias, classes * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_TRY(fc_bias_launch(dl, db, n, classes, 0));
    CUDA_TRY(cudaDeviceSynchronize());
    CUDA_TRY(cudaMemcpy(logits_out, dl, nl * sizeof(float), cudaMemcpyDeviceToHost));
    rc = 0;
fail:
    cudaFree(dl);
    cudaFree(db);
    return rc;
}

extern "C" int gpu_test_resize_crop(const uint8_t *rgb, int w, int h, int hs, int vs, int rw, int rh, int left, int top,
                                    uint8_t *out, char *err, size_t errlen)
{
    size_t plane = (size_t)w * h, crop = (size_t)224 * 224 * 3;
    uint8_t *planar = (uint8_t *)malloc(3 * plane), *dsrc = NULL, *ddst = NULL;
    resize_job *djob = NULL;
    int rc = -1;
    if (!planar) {
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    for (size_t i = 0; i < plane; i++)
        for (int c = 0; c < 3; c++)
            planar[c * plane + i] = rgb[3 * i + c];
    CUDA_TRY(cudaMalloc((void **)&dsrc, 3 * plane));
    CUDA_TRY(cudaMemcpy(dsrc, planar, 3 * plane, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMalloc((void **)&ddst, crop));
    CUDA_TRY(cudaMemset(ddst, 0xff, crop));
    {
        resize_job j = {};
        resize_job_rebuilt(&j, dsrc, w, h, hs, vs);
        j.rw = rw;
        j.rh = rh;
        j.left = left;
        j.top = top;
        j.dst = ddst;
        CUDA_TRY(cudaMalloc((void **)&djob, sizeof j));
        CUDA_TRY(cudaMemcpy(djob, &j, sizeof j, cudaMemcpyHostToDevice));
    }
    CUDA_TRY(chroma_rebuild_launch(djob, 1, 0));
    CUDA_TRY(resize_crop_launch(djob, 1, 0));
    CUDA_TRY(cudaDeviceSynchronize());
    CUDA_TRY(cudaMemcpy(out, ddst, crop, cudaMemcpyDeviceToHost));
    rc = 0;
fail:
    free(planar);
    cudaFree(dsrc);
    cudaFree(ddst);
    cudaFree(djob);
    return rc;
}

extern "C" int gpu_test_engine_device_input(engine *e, int slot, int n, uint8_t *out, char *err, size_t errlen)
{
    uint8_t *d = engine_cuda_device_input(e, slot);
    if (!d) {
        snprintf(err, errlen, "not a CUDA engine, or no slot %d", slot);
        return -1;
    }
    CUDA_TRY(cudaSetDevice(e->device_index));
    CUDA_TRY(cudaDeviceSynchronize());
    CUDA_TRY(cudaMemcpy(out, d, (size_t)n * RESNET18_INPUT_BYTES, cudaMemcpyDeviceToHost));
    return 0;
fail:
    return -1;
}
