// The CUDA engine: implements engine/engine.h on one GPU.
//
// At creation it converts the folded weights once to the kernels' layout and
// precision (KRSC FP16, FP32 or INT8; the stem padded to 4 input channels
// and 8 taps per row, see stem_weights), allocates every buffer, and captures one CUDA graph per
// (slot, batch-size bucket). After that submit/wait allocate nothing and
// never synchronise the device.
//
// INT8 computes engine/int8.h exactly, as the CPU INT8 engine does: int8
// activations and weights, the calibration table's scales (quantised once
// by calib_conv_params / calib_input_lut, shared with the CPU engine), the
// last conv's output and the average pool's sums in FP32 and FP64, and the
// FC on FP16 features and weights, as at FP16 (cuBLAS, FP32 sums).
//
// Buffers. Per slot: a stream, a pinned uint8 NHWC input (engine.input[s],
// max_batch x 224 x 224 x 3), its device copy, a device buffer for images
// that come as normalised FP32 tensors (engine.input_f32: copied from the
// caller's pageable memory at submit, max_batch x 3 x 224 x 224, 4x the
// uint8 input) with the per-image map `which` the graph reads to place them, device and pinned logits
// (engine.logits[s]). Shared by all slots: the weights and
// the activation buffers, assigned to tensors by plan_buffers so that
// tensors whose lifetimes do not overlap share memory.
//
// Pipeline. submit() enqueues on the slot's stream: the input copy, a wait
// for the previous submit's compute (the slots share activations, so their
// compute runs in submit order), the graph, then the copy of the logits
// back, and records the slot's `done` event; wait() synchronises on
// that event. Slot B's input copy thus overlaps slot A's compute, and A's
// output copy overlaps B's compute. A mutex keeps the "previous compute"
// bookkeeping consistent when slots are driven from different threads.
// When the GPU JPEG decoder has already written a slot's device input
// (engine_cuda_input_staged), submit waits for its event instead of copying.
//
// The stem. At FP16 and INT8 the stem conv and the max pool after it are
// one kernel (gpu/stem.cu), and the stem's output never reaches global
// memory (its tensor gets no bytes); it also normalises the decoded
// images (only images that came as FP32 tensors go through the normalised
// tensor), at FP16 through a table of normalize_launch's own halves. FP32
// (and RESNETD_GPU_STEM=unfused) runs them as two kernels. check_plan
// makes sure that no kernel writes where it reads: the fused stem once
// did, right only while neighbouring CTAs ran in order.
//
// The downsamples. At FP16 each block's 1x1/2 downsample runs inside the
// conv2 that adds it, as a shortcut (conv_shape.c2): its weights follow
// conv2's taps in each weight row, the two folded biases are summed, and
// its output never exists. INT8 requantises the downsample's output before
// the add, so its shortcut is finished apart inside conv2's kernel (see
// gpu/conv.cu); the engine keeps both ways and, bucket by bucket, runs the
// faster (plan_sc, ds_in). FP32 runs it as a conv of its own.
// RESNETD_GPU_DOWNSAMPLE=separate: every downsample as a conv of its own;
// =fused: INT8's inside at every bucket too (to compare; the tests run each).
//
// The average pool. At INT8 it runs inside the last conv wherever that
// conv's plan is a general wgmma tile without split-K (conv_q8.pool_out):
// the conv's FP32 output, 25.7 MB at batch 256, is then never stored and
// read back. The autotuner times the other plans with the pool's kernel
// after them. RESNETD_GPU_POOL=separate: always the pool's own kernel.
//
// Plans. Each conv at each bucket runs with one entry of gpu/conv.cu's tile
// table, with split-K where a layer has too few tiles to fill the GPU. At
// creation the engine times every candidate on random input and keeps the
// fastest (RESNETD_GPU_AUTOTUNE=0: the cost model's pick instead; =log:
// every candidate's time on stderr), and for INT8 times the downsample and
// conv2 back to back against conv2 with it inside. In FP32
// the candidates are SIMT and 3xTF32 tiles, both within ~1e-6 of FP32.
//
// Batch invariance. An image's logits are the same bits at any position of
// any batch size when every bucket's kernels compute each output in the
// same order. INT8 does by construction (int32 sums are exact, split-K or
// not; the epilogues are one formula). The FC runs in FC_COLS-image GEMMs
// of one shape whatever the bucket. FP16 and FP32
// differ between buckets only through split-K, whose partial sums round
// otherwise than one running sum, and (FP32) through SIMT against 3xTF32
// tiles; engine_config.deterministic plans them without split-K and with
// the largest bucket's tile family at every bucket (plan_filter), which
// costs small batches: protocol/API.md has the figures.
//
// Graphs. Each bucket's forward pass is one CUDA graph per slot. On 9.0
// devices its kernels may launch programmatically (gpu/kernels.cuh), each
// kernel's launch and prologue under the tail of the one before; the engine
// captures each bucket both ways and keeps that only where it is faster
// (capture_graphs): it cut b=1's time by 12-15% and cost INT8 0.8% at
// b=256. RESNETD_GPU_PDL=0: never; =1: always.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_fp16.h>
#include "gpu/cuda_check.cuh"
#include "gpu/engine_cuda.cuh"
#include "gpu/gpu.h"
#include "gpu/kernels.cuh"
#include "engine/calib.h"

#define NCONV RESNET18_NUM_CONVS
#define MAX_BUCKETS 48
#define STEM_C 4   // stem input channels after padding RGB
#define STEM_KW 8  // stem taps per row after padding 7 -> 8
#define BLAS_WORKSPACE (8u << 20)
// The FC runs as GEMMs of FC_COLS images each, every one of the same shape:
// cuBLAS picks its kernel by shape, so one GEMM over a whole bucket would
// give an image other bits at another batch size.
#define FC_COLS 64

// Tensors of one forward pass, in the order they are produced.
enum { T_IMG = NCONV, T_POOL = NCONV + 1, NTENSORS = NCONV + 2 };  // 0..19: conv outputs
#define MAX_BUFFERS NTENSORS

typedef struct cuda_slot {
    cudaStream_t stream;
    cudaEvent_t computed;  // after this slot's graph
    cudaEvent_t done;      // after its output copies
    uint8_t *h_in, *d_in;  // [max_batch][224][224][3]
    float *d_f32;          // [max_batch][3][224][224]: FP32 input images
    int *h_which, *d_which;  // [max_batch]: i when image i is in d_f32, else -1
    int which_set;         // d_which names some image (else it is all -1)
    float *h_logits;  // [max_batch][classes]
    float *d_logits;  // [fc_rows][classes]
    cudaGraphExec_t graph[MAX_BUCKETS];
    cudaEvent_t staged;    // set by engine_cuda_input_staged: d_in is ready after it
} cuda_slot;

typedef struct cuda_engine {
    engine pub;
    int kind;         // CONV_FP32, CONV_FP16 or CONV_INT8 (gpu/kernels.cuh)
    int fused_stem;   // FP16/INT8: the stem conv and the max pool are one kernel (stem_pool_launch)
    int fused_ds;     // FP16: each downsample runs inside the conv that adds it (conv_shape.c2)
    int s8_ds;        // INT8's downsamples: 0 separate, 1 inside where timed faster (ds_in), 2 always inside
    unsigned char ds_in[MAX_BUCKETS][NCONV];  // INT8: at this bucket conv i runs its downsample inside
    int fc16;         // the FC on FP16 features and weights: FP16 and INT8 (engine/int8.h)
    int pool_mode;    // INT8: the average pool inside the last conv where its plan allows (pool_inside)
    int deterministic;  // float kinds: plans without split-K, one tile family per conv (choose_plans)
    int fc_rows;      // max_batch rounded up to FC_COLS: rows of feat and d_logits
    double *pool_part;  // [max_batch][2][512]: the pool's sums of images split between two tiles
    int *pool_cnt;      // [max_batch][512 / 64]: their meeting counts, 0 between passes
    int fp16, esize, num_sms;  // esize: bytes of an activation (INT8: 1, but the last conv's output is FP32)
    size_t device_bytes, pinned_bytes;
    void *w[NCONV];   // KRSC, stem padded
    float *b[NCONV];
    void *fc_w;       // [classes][512], FP16 if fc16
    float *fc_b;
    conv_shape shape_per_image[NCONV];  // n = 1
    void *buf[MAX_BUFFERS];
    size_t buf_bytes[MAX_BUFFERS];  // per image
    float *mult[NCONV];   // INT8: [cout] s_in * s_w[c] (device)
    conv_q8 q8[NCONV];    // INT8: each conv's epilogue
    int8_t *qlut;         // INT8: [3][256] the quantised normalisation (device)
    __half *hlut;         // FP16 with the fused stem: [3][256] the normalisation (device)
    float in_inv;         // INT8: 1 / the input's scale
    int nbuf;
    int tensor_buf[NTENSORS];
    void *feat;       // [max_batch][512], as fc_w
    conv_plan plan[MAX_BUCKETS][NCONV];  // per bucket and conv: tile and split-K
    conv_plan plan_sc[MAX_BUCKETS][NCONV];  // INT8: conv i's plan with its downsample inside
    void *w_sc[NCONV];  // INT8: conv i's weight rows joined with its downsample's (conv_shape.c2)
    char tile_sc[NCONV][64];  // INT8: layer times' tile names of convs with their downsample inside
    float *workspace; // split-K partial sums, shared like the activations
    void *blas_ws;
    cublasHandle_t blas;
    int buckets[MAX_BUCKETS], nbuckets;
    int pdl_mode;     // programmatic launches: 0 never, 1 always, 2 where timed faster (capture_graphs)
    unsigned char pdl[MAX_BUCKETS];  // the bucket's graph launches its kernels programmatically (kernels.cuh)
    cuda_slot slot[ENGINE_MAX_SLOTS];
    pthread_mutex_t order;
    int order_init;
    int last_slot;    // slot of the previous submit, -1 before the first
} cuda_engine;

/* ---- allocation, counted for metrics -------------------------------- */

static cudaError_t dev_alloc(cuda_engine *ce, void **p, size_t bytes)
{
    cudaError_t e = cudaMalloc(p, bytes);
    if (e == cudaSuccess)
        ce->device_bytes += bytes;
    return e;
}

static cudaError_t host_alloc(cuda_engine *ce, void **p, size_t bytes)
{
    cudaError_t e = cudaHostAlloc(p, bytes, cudaHostAllocDefault);
    if (e == cudaSuccess)
        ce->pinned_bytes += bytes;
    return e;
}

/* ---- weights ---------------------------------------------------------- */

// The stem's 7x7x3 filters as 7 x 8 x STEM_C (4 channels at every
// precision: 16 bytes are 2 FP16 pixels or 4 INT8 ones):
// a zero tap in front of each row (so that with pad 4 every 16-byte chunk
// starts on an even pixel) and zero channels after the third. w is
// [64][7][7][3] of esize-byte elements; returns [64][7][8][STEM_C] of them.
static void *stem_weights(const void *w, size_t esize)
{
    const resnet18_conv_desc *d = &resnet18_convs[0];
    unsigned char *p = (unsigned char *)calloc((size_t)d->cout * d->k * STEM_KW * STEM_C, esize);
    const unsigned char *src = (const unsigned char *)w;
    if (!p)
        return NULL;
    for (int o = 0; o < d->cout; o++)
        for (int r = 0; r < d->k; r++)
            for (int s = 0; s < d->k; s++)
                memcpy(p + (((size_t)o * d->k + r) * STEM_KW + s + 1) * STEM_C * esize,
                       src + (((size_t)o * d->k + r) * d->k + s) * 3 * esize, 3 * esize);
    return p;
}

// A downsample: it reads the same input as the conv before it (its block's conv1).
static int is_downsample(int i)
{
    return i >= 2 && resnet18_convs[i].src == resnet18_convs[i - 1].src;
}

// The downsample whose output conv i adds, or -1.
static int downsample_of(int i)
{
    const int r = resnet18_convs[i].residual;
    return r >= 1 && is_downsample(r) ? r : -1;
}

// FP16: the downsample that runs inside conv i as its shortcut, or -1.
static int shortcut_of(const cuda_engine *ce, int i)
{
    return ce->fused_ds ? downsample_of(i) : -1;
}

// INT8: the downsample that may run inside conv i, or -1: at the buckets
// ds_in says, both ways planned and their buffers kept (s8_ds 1), or at
// every bucket (s8_ds 2).
static int s8_shortcut_of(const cuda_engine *ce, int i)
{
    return ce->kind == CONV_INT8 && ce->s8_ds ? downsample_of(i) : -1;
}

// Conv i has a kernel of its own at some bucket: not the fused stem, not a
// downsample always inside the conv that adds it.
static int conv_runs(const cuda_engine *ce, int i)
{
    return i == 0 ? !ce->fused_stem : !((ce->fused_ds || ce->s8_ds == 2) && is_downsample(i));
}

// INT8: conv i runs with its downsample inside at bucket b.
static int s8_inside_at(const cuda_engine *ce, int b, int i)
{
    return s8_shortcut_of(ce, i) >= 0 && (ce->s8_ds == 2 || ce->ds_in[b][i]);
}

// Conv i runs at bucket b: conv_runs, and not an INT8 downsample inside the
// conv after it (its user: the model runs each downsample just before).
static int conv_runs_at(const cuda_engine *ce, int b, int i)
{
    return conv_runs(ce, i) && !(is_downsample(i) && i + 1 < NCONV && s8_inside_at(ce, b, i + 1));
}

// INT8: the average pool runs inside the last conv with plan p.
static int pool_inside(const cuda_engine *ce, const conv_plan *p)
{
    return ce->pool_mode && conv_pool_fits(ce->kind, p, &ce->shape_per_image[NCONV - 1]);
}

// Copies n floats to a new device array in the engine's precision.
static int upload(cuda_engine *ce, const float *src, size_t n, int as_fp16, void **dst, char *err, size_t errlen)
{
    void *host = NULL;
    size_t bytes = n * (as_fp16 ? sizeof(__half) : sizeof(float));
    if (as_fp16) {
        __half *h = (__half *)malloc(bytes);
        if (!h) {
            snprintf(err, errlen, "out of host memory converting weights");
            return -1;
        }
        for (size_t i = 0; i < n; i++)
            h[i] = __float2half_rn(src[i]);
        host = h;
    }
    CUDA_TRY(dev_alloc(ce, dst, bytes));
    CUDA_TRY(cudaMemcpy(*dst, host ? host : src, bytes, cudaMemcpyHostToDevice));
    free(host);
    return 0;
fail:
    free(host);
    return -1;
}

// Copies bytes to a new device array.
static int upload_bytes(cuda_engine *ce, const void *src, size_t bytes, void **dst, char *err, size_t errlen)
{
    CUDA_TRY(dev_alloc(ce, dst, bytes));
    CUDA_TRY(cudaMemcpy(*dst, src, bytes, cudaMemcpyHostToDevice));
    return 0;
fail:
    return -1;
}

// INT8: conv i's quantised weight rows q1 joined with its downsample ds's
// (quantised as upload_conv_s8 quantises it, per conv) into ce->w_sc[i].
static int upload_s8_shortcut(cuda_engine *ce, const resnet18_weights *w, const calib_table *t, int i, int ds,
                              const int8_t *q1, char *err, size_t errlen)
{
    const resnet18_conv_desc *d = &resnet18_convs[i];
    const size_t k1 = (size_t)d->k * d->k * d->cin, k2 = (size_t)resnet18_convs[ds].cin, row = k1 + k2;
    int8_t *q2 = (int8_t *)malloc((size_t)d->cout * k2), *cat = (int8_t *)malloc((size_t)d->cout * row);
    float *mult = (float *)malloc((size_t)d->cout * sizeof(float));
    float rs, inv;
    int rc = -1;
    if (!q2 || !cat || !mult) {
        snprintf(err, errlen, "out of host memory joining the downsample's weights");
        goto done;
    }
    calib_conv_params(w, t, ds, q2, mult, &rs, &inv);
    for (int o = 0; o < d->cout; o++) {
        memcpy(cat + o * row, q1 + o * k1, k1);
        memcpy(cat + o * row + k1, q2 + o * k2, k2);
    }
    rc = upload_bytes(ce, cat, (size_t)d->cout * row, &ce->w_sc[i], err, errlen);
done:
    free(q2);
    free(cat);
    free(mult);
    return rc;
}

// INT8: conv i's weights quantised (the stem's padded) and its epilogue;
// joined with its downsample's when that may run inside it.
static int upload_conv_s8(cuda_engine *ce, const resnet18_weights *w, const calib_table *t, int i, char *err,
                          size_t errlen)
{
    const resnet18_conv_desc *d = &resnet18_convs[i];
    const size_t K = (size_t)d->k * d->k * d->cin;
    int8_t *q = (int8_t *)malloc((size_t)d->cout * K);
    float *mult = (float *)malloc((size_t)d->cout * sizeof(float));
    void *stem = NULL;
    conv_q8 *qp = &ce->q8[i];
    int rc = -1;
    if (!q || !mult) {
        snprintf(err, errlen, "out of host memory quantising the weights");
        goto done;
    }
    calib_conv_params(w, t, i, q, mult, &qp->res_scale, &qp->out_inv);
    qp->out_f32 = i == NCONV - 1;
    for (int c = 0; i == 0 && c < d->cout; c++)
        if (!(mult[c] >= 0.0f)) {  // the stem pools before its epilogue, which must not decrease
            snprintf(err, errlen, "stem channel %d: INT8 multiplier %g is not >= 0", c, (double)mult[c]);
            goto done;
        }
    if (i == 0 && !(stem = stem_weights(q, 1))) {
        snprintf(err, errlen, "out of host memory padding the stem weights");
        goto done;
    }
    if (upload_bytes(ce, stem ? stem : q, stem ? (size_t)d->cout * d->k * STEM_KW * STEM_C : d->cout * K,
                     &ce->w[i], err, errlen) != 0 ||
        upload_bytes(ce, mult, (size_t)d->cout * sizeof(float), (void **)&ce->mult[i], err, errlen) != 0 ||
        (s8_shortcut_of(ce, i) >= 0 && upload_s8_shortcut(ce, w, t, i, s8_shortcut_of(ce, i), q, err, errlen) != 0))
        goto done;
    qp->mult = ce->mult[i];
    rc = 0;
done:
    free(stem);
    free(mult);
    free(q);
    return rc;
}

// Conv i with downsample ds as its shortcut: each weight row is conv i's
// taps then the downsample's input channels (conv_shape.c2), and the bias
// is the sum of both folded biases.
static int upload_with_shortcut(cuda_engine *ce, const resnet18_weights *w, int i, int ds, char *err, size_t errlen)
{
    const resnet18_conv_desc *d = &resnet18_convs[i];
    const size_t k1 = (size_t)d->k * d->k * d->cin, k2 = (size_t)resnet18_convs[ds].cin, row = k1 + k2;
    float *cat = (float *)malloc((size_t)d->cout * row * sizeof(float));
    float *bias = (float *)malloc((size_t)d->cout * sizeof(float));
    int rc = -1;
    if (!cat || !bias) {
        snprintf(err, errlen, "out of host memory joining the downsample's weights");
        goto done;
    }
    for (int o = 0; o < d->cout; o++) {
        memcpy(cat + o * row, w->conv[i].w + o * k1, k1 * sizeof(float));
        memcpy(cat + o * row + k1, w->conv[ds].w + o * k2, k2 * sizeof(float));
        bias[o] = w->conv[i].b[o] + w->conv[ds].b[o];
    }
    if (upload(ce, cat, (size_t)d->cout * row, ce->fp16, &ce->w[i], err, errlen) == 0 &&
        upload(ce, bias, d->cout, 0, (void **)&ce->b[i], err, errlen) == 0)
        rc = 0;
done:
    free(cat);
    free(bias);
    return rc;
}

// FP16's normalisation as a [3][256] table for the fused stem: the halves
// normalize_launch writes for each byte, so the same values by construction.
static int upload_half_lut(cuda_engine *ce, char *err, size_t errlen)
{
    uint8_t rgb[256 * 3];
    __half px[256 * 4], lut[3 * 256];
    void *din = NULL, *dout = NULL;
    int rc = -1;
    for (int b = 0; b < 256; b++)
        rgb[3 * b] = rgb[3 * b + 1] = rgb[3 * b + 2] = (uint8_t)b;
    CUDA_TRY(cudaMalloc(&din, sizeof rgb));
    CUDA_TRY(cudaMalloc(&dout, sizeof px));
    CUDA_TRY(cudaMemcpy(din, rgb, sizeof rgb, cudaMemcpyHostToDevice));
    CUDA_TRY(normalize_launch(1, (const uint8_t *)din, dout, 256, 0));
    CUDA_TRY(cudaMemcpy(px, dout, sizeof px, cudaMemcpyDeviceToHost));
    for (int c = 0; c < 3; c++)
        for (int b = 0; b < 256; b++)
            lut[c * 256 + b] = px[b * 4 + c];
    rc = upload_bytes(ce, lut, sizeof lut, (void **)&ce->hlut, err, errlen);
fail:
    cudaFree(din);
    cudaFree(dout);
    return rc;
}

static int upload_weights(cuda_engine *ce, const resnet18_weights *w, const calib_table *t, char *err, size_t errlen)
{
    for (int i = 0; i < NCONV; i++) {
        const resnet18_conv_desc *d = &resnet18_convs[i];
        const int ds = shortcut_of(ce, i);
        size_t n = (size_t)d->cout * d->k * d->k * d->cin;
        if (ce->kind == CONV_INT8) {
            if (upload_conv_s8(ce, w, t, i, err, errlen) != 0)
                return -1;
        } else if (i > 0 && !conv_runs(ce, i)) {
            continue;  // a fused downsample: its weights and bias are in the conv that adds it
        } else if (ds >= 0) {
            if (upload_with_shortcut(ce, w, i, ds, err, errlen) != 0)
                return -1;
            continue;
        } else {
            float *stem = NULL;
            if (i == 0) {
                stem = (float *)stem_weights(w->conv[0].w, sizeof(float));
                if (!stem) {
                    snprintf(err, errlen, "out of host memory padding the stem weights");
                    return -1;
                }
                n = (size_t)d->cout * d->k * STEM_KW * STEM_C;
            }
            int rc = upload(ce, stem ? stem : w->conv[i].w, n, ce->fp16, &ce->w[i], err, errlen);
            free(stem);
            if (rc != 0)
                return -1;
        }
        if (upload(ce, w->conv[i].b, d->cout, 0, (void **)&ce->b[i], err, errlen) != 0)
            return -1;
    }
    if (ce->kind == CONV_INT8) {
        int8_t lut[3][256];
        calib_input_lut(t, lut, &ce->in_inv);
        if (upload_bytes(ce, lut, sizeof lut, (void **)&ce->qlut, err, errlen) != 0)
            return -1;
    } else if (ce->fused_stem && upload_half_lut(ce, err, errlen) != 0) {
        return -1;
    }
    if (upload(ce, w->fc_w, (size_t)w->classes * RESNET18_FEATURES, ce->fc16, &ce->fc_w, err, errlen) != 0 ||
        upload(ce, w->fc_b, (size_t)w->classes, 0, (void **)&ce->fc_b, err, errlen) != 0)
        return -1;
    return 0;
}

/* ---- activation buffers ----------------------------------------------- */

static conv_shape conv_shape_for(const cuda_engine *ce, int i, int n)
{
    conv_shape s = ce->shape_per_image[i];
    s.n = n;
    return s;
}

// Conv i's shape with its downsample's input as the shortcut (conv_shape.c2).
static void add_shortcut(conv_shape *s, int ds)
{
    s->c2 = resnet18_convs[ds].cin;
    s->h2 = s->w2 = resnet18_convs[ds].in_h;
    s->stride2 = resnet18_convs[ds].stride;
}

// INT8: conv i's shape with its downsample inside.
static conv_shape conv_shape_sc(const cuda_engine *ce, int i, int n)
{
    conv_shape s = conv_shape_for(ce, i, n);
    add_shortcut(&s, s8_shortcut_of(ce, i));
    return s;
}

// Bytes of tensor t per image (none for the output of a conv fused into
// another kernel, the stem or a downsample: it never reaches global memory).
static size_t tensor_bytes(const cuda_engine *ce, int t)
{
    if (t < NCONV && !conv_runs(ce, t))
        return 0;
    if (t == T_IMG)
        return (size_t)RESNET18_IMG * RESNET18_IMG * STEM_C * ce->esize;
    if (t == T_POOL)
        return (size_t)resnet18_convs[1].in_h * resnet18_convs[1].in_h * resnet18_convs[0].cout * ce->esize;
    const resnet18_conv_desc *d = &resnet18_convs[t];
    size_t esize = ce->kind == CONV_INT8 && t == NCONV - 1 ? sizeof(float) : (size_t)ce->esize;
    return (size_t)d->out_h * d->out_h * d->cout * esize;
}

static int source_tensor(int src)
{
    return src == R18_IMAGE ? T_IMG : src == R18_POOL ? T_POOL : src;
}

// Execution order: normalise (writes IMG; the FP32 images only with the
// fused stem), conv 0, maxpool (writes POOL),
// convs 1..19, avgpool. step_of_* give each tensor's write step and last read.
static void plan_buffers(cuda_engine *ce)
{
    int write_step[NTENSORS], last_read[NTENSORS];
    write_step[T_IMG] = 0;
    write_step[0] = 1;
    write_step[T_POOL] = 2;
    for (int i = 1; i < NCONV; i++)
        write_step[i] = 2 + i;
    for (int t = 0; t < NTENSORS; t++)
        last_read[t] = write_step[t];
    // The fused stem reads the image when it writes the pool (step 2).
    last_read[T_IMG] = ce->fused_stem ? write_step[T_POOL] : 1;
    last_read[0] = 2;
    for (int i = 1; i < NCONV; i++) {
        const resnet18_conv_desc *d = &resnet18_convs[i];
        const int ds = shortcut_of(ce, i), ds8 = s8_shortcut_of(ce, i);
        last_read[source_tensor(d->src)] = write_step[i];
        if (ds >= 0)  // it reads the downsample's input instead of its output
            last_read[source_tensor(resnet18_convs[ds].src)] = write_step[i];
        else if (d->residual != R18_NONE && tensor_bytes(ce, source_tensor(d->residual)) > 0)
            last_read[source_tensor(d->residual)] = write_step[i];
        if (ds8 >= 0)  // INT8: it reads one or the other, by bucket
            last_read[source_tensor(resnet18_convs[ds8].src)] = write_step[i];
    }
    last_read[NCONV - 1] = 2 + NCONV;  // avgpool

    int order[NTENSORS] = {T_IMG, 0, T_POOL};
    for (int i = 1; i < NCONV; i++)
        order[2 + i] = i;
    int owner[MAX_BUFFERS];  // tensor currently in each buffer, -1 free
    ce->nbuf = 0;
    for (int j = 0; j < NTENSORS; j++) {
        int t = order[j], step = write_step[t];
        size_t need = tensor_bytes(ce, t);
        for (int b = 0; b < ce->nbuf; b++)
            if (owner[b] >= 0 && last_read[owner[b]] < step)
                owner[b] = -1;
        int pick = -1;
        for (int b = 0; b < ce->nbuf; b++)  // the smallest free buffer that fits, else the largest free
            if (owner[b] < 0 && (pick < 0 || (ce->buf_bytes[b] >= need && (ce->buf_bytes[pick] < need ||
                                                                          ce->buf_bytes[b] < ce->buf_bytes[pick])) ||
                                 (ce->buf_bytes[pick] < need && ce->buf_bytes[b] > ce->buf_bytes[pick])))
                pick = b;
        if (pick < 0) {
            pick = ce->nbuf++;
            ce->buf_bytes[pick] = 0;
        }
        if (ce->buf_bytes[pick] < need)
            ce->buf_bytes[pick] = need;
        owner[pick] = t;
        ce->tensor_buf[t] = pick;
    }
}

// 0 when no op writes a buffer that one of its inputs is in (the kernels
// read their inputs while other CTAs write the output); else -1 with err.
static int check_plan(const cuda_engine *ce, char *err, size_t errlen)
{
    const int *b = ce->tensor_buf;
    int bad = ce->fused_stem ? b[T_POOL] == b[T_IMG] : b[0] == b[T_IMG] || b[T_POOL] == b[0];
    for (int i = 1; i < NCONV && !bad; i++) {
        const resnet18_conv_desc *d = &resnet18_convs[i];
        const int ds = shortcut_of(ce, i), ds8 = s8_shortcut_of(ce, i);
        if (!conv_runs(ce, i))
            continue;
        bad = b[i] == b[source_tensor(d->src)] ||
              (ds >= 0 && b[i] == b[source_tensor(resnet18_convs[ds].src)]) ||
              (ds8 >= 0 && b[i] == b[source_tensor(resnet18_convs[ds8].src)]) ||
              (ds < 0 && d->residual != R18_NONE && tensor_bytes(ce, source_tensor(d->residual)) > 0 &&
               b[i] == b[source_tensor(d->residual)]);
    }
    if (bad)
        snprintf(err, errlen, "cuda engine: the buffer plan puts an op's output where its input is");
    return bad ? -1 : 0;
}

/* ---- the forward pass --------------------------------------------------- */

#define NOPS (NCONV + 5)  // normalise, 20 convs, maxpool, avgpool, fc, fc bias

static const char *op_name(int op)
{
    // op order: 0 normalise, 1 stem conv, 2 maxpool, 3..21 convs 1..19, 22 avgpool, 23 fc, 24 fc bias
    if (op == 0)
        return "normalize";
    if (op == 1)
        return resnet18_convs[0].name;
    if (op == 2)
        return "maxpool";
    if (op < 3 + NCONV - 1)
        return resnet18_convs[op - 2].name;
    if (op == NCONV + 2)
        return "avgpool";
    if (op == NCONV + 3)
        return "fc";
    return "fc_bias";
}

static void *tensor_ptr(cuda_engine *ce, int t)
{
    return ce->buf[ce->tensor_buf[t]];
}

// s8_sc: INT8 with the downsample inside (plan p from plan_sc).
static cudaError_t launch_conv(cuda_engine *ce, int i, int n, const conv_plan *p, int s8_sc, cudaStream_t st)
{
    const resnet18_conv_desc *d = &resnet18_convs[i];
    conv_shape sh = s8_sc ? conv_shape_sc(ce, i, n) : conv_shape_for(ce, i, n);
    const int ds = s8_sc ? s8_shortcut_of(ce, i) : shortcut_of(ce, i);
    const void *res = d->residual == R18_NONE || ds >= 0 ? NULL : tensor_ptr(ce, source_tensor(d->residual));
    const void *in2 = ds >= 0 ? tensor_ptr(ce, source_tensor(resnet18_convs[ds].src)) : NULL;
    conv_q8 q = ce->q8[i];
    if (i == NCONV - 1 && pool_inside(ce, p)) {  // its output: the features
        q.pool_out = (__half *)ce->feat;
        q.pool_part = ce->pool_part;
        q.pool_cnt = ce->pool_cnt;
        q.pool_hw = d->out_h * d->out_h;
    }
    if (s8_sc) {  // the downsample's own epilogue, then conv i's with its output as the residual
        q.sc_mult = ce->mult[ds];
        q.sc_bias = ce->b[ds];
        q.sc_inv = ce->q8[ds].out_inv;
    }
    return conv_launch(ce->kind, p, &sh, tensor_ptr(ce, source_tensor(d->src)), in2, s8_sc ? ce->w_sc[i] : ce->w[i],
                       ce->b[i], res, d->relu, tensor_ptr(ce, i), ce->workspace, ce->kind == CONV_INT8 ? &q : NULL, st);
}

static int bucket_for(const cuda_engine *ce, int n);

// The average pool's own kernel, on the last conv's output.
static cudaError_t avgpool_launch_last(cuda_engine *ce, int n, cudaStream_t st)
{
    const resnet18_conv_desc *last = &resnet18_convs[NCONV - 1];
    return avgpool_launch(ce->kind, tensor_ptr(ce, NCONV - 1), ce->feat, n, last->out_h * last->out_h,
                          RESNET18_FEATURES, st);
}

// Enqueues the forward pass of n images of slot s on stream st. When marks
// is given, records marks[op] after each op (for per-layer timing).
static int forward(cuda_engine *ce, int s, int n, cudaStream_t st, cudaEvent_t *marks, char *err, size_t errlen)
{
    cuda_slot *sl = &ce->slot[s];
    const float one = 1.f, zero = 0.f;
    int op = 0;
#define MARK()                                            \
    do {                                                  \
        if (marks)                                        \
            CUDA_TRY(cudaEventRecord(marks[op], st));     \
        op++;                                             \
    } while (0)

    const int bk = bucket_for(ce, n);
    const conv_plan *plan = ce->plan[bk];
    const long npix = (long)n * RESNET18_IMG * RESNET18_IMG;
    if (ce->kind == CONV_INT8) {
        int8_t *img = (int8_t *)tensor_ptr(ce, T_IMG);
        if (!ce->fused_stem)  // else the stem normalises the decoded images itself
            CUDA_TRY(normalize_s8_launch(sl->d_in, ce->qlut, img, npix, st));
        CUDA_TRY(place_f32_s8_launch(sl->d_f32, sl->d_which, ce->in_inv, img, n, RESNET18_IMG * RESNET18_IMG, st));
    } else {
        if (!ce->fused_stem)
            CUDA_TRY(normalize_launch(ce->fp16, sl->d_in, tensor_ptr(ce, T_IMG), npix, st));
        CUDA_TRY(place_f32_launch(ce->fp16, sl->d_f32, sl->d_which, tensor_ptr(ce, T_IMG), n,
                                  RESNET18_IMG * RESNET18_IMG, st));
    }
    MARK();
    for (int i = 0; i < NCONV; i++) {
        const resnet18_conv_desc *d = &resnet18_convs[i];
        if (i == 0 && ce->fused_stem) {  // the stem and its max pool (a second mark: the pool's op, empty)
            const int s8 = ce->kind == CONV_INT8;
            const stem_rgb rgb = {sl->d_in, s8 ? (const void *)ce->qlut : (const void *)ce->hlut, sl->d_which};
            CUDA_TRY(stem_pool_launch(ce->kind, n, d->in_h, d->in_h, tensor_ptr(ce, T_IMG), &rgb, ce->w[0], ce->b[0],
                                      s8 ? &ce->q8[0] : NULL, tensor_ptr(ce, T_POOL), st));
            MARK();
            MARK();
            continue;
        }
        if (s8_inside_at(ce, bk, i))
            CUDA_TRY(launch_conv(ce, i, n, &ce->plan_sc[bk][i], 1, st));
        else if (conv_runs_at(ce, bk, i))  // else a downsample inside the next conv (its op stays, empty)
            CUDA_TRY(launch_conv(ce, i, n, &plan[i], 0, st));
        MARK();
        if (i == 0) {
            const resnet18_conv_desc *l1 = &resnet18_convs[1];
            if (ce->kind == CONV_INT8)
                CUDA_TRY(maxpool_s8_launch((const int8_t *)tensor_ptr(ce, 0), (int8_t *)tensor_ptr(ce, T_POOL), n,
                                           d->out_h, d->out_h, d->cout, l1->in_h, l1->in_h, st));
            else
                CUDA_TRY(maxpool_launch(ce->fp16, tensor_ptr(ce, 0), tensor_ptr(ce, T_POOL), n, d->out_h,
                                        d->out_h, d->cout, l1->in_h, l1->in_h, st));
            MARK();
        }
    }
    if (!pool_inside(ce, &plan[NCONV - 1]))
        CUDA_TRY(avgpool_launch_last(ce, n, st));
    MARK();
    CUBLAS_TRY(cublasSetStream(ce->blas, st));
    {
        cudaDataType_t t = ce->fc16 ? CUDA_R_16F : CUDA_R_32F;
        cublasComputeType_t ct = ce->fc16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_PEDANTIC;
        // Column-major: logits^T (classes x FC_COLS) = W (512 x classes)^T * feat^T (512 x FC_COLS),
        // per group of FC_COLS images (the last group's extra rows are
        // fc_rows' padding: defined, unread).
        const int classes = ce->pub.classes;
        const size_t fsize = ce->fc16 ? sizeof(__half) : sizeof(float);
        for (int c0 = 0; c0 < n; c0 += FC_COLS)
            CUBLAS_TRY(cublasGemmEx(ce->blas, CUBLAS_OP_T, CUBLAS_OP_N, classes, FC_COLS, RESNET18_FEATURES, &one,
                                    ce->fc_w, t, RESNET18_FEATURES,
                                    (const char *)ce->feat + (size_t)c0 * RESNET18_FEATURES * fsize, t,
                                    RESNET18_FEATURES, &zero, sl->d_logits + (size_t)c0 * classes, CUDA_R_32F,
                                    classes, ct, CUBLAS_GEMM_DEFAULT));
    }
    MARK();
    CUDA_TRY(fc_bias_launch(sl->d_logits, ce->fc_b, n, ce->pub.classes, st));
    MARK();
#undef MARK
    return 0;
fail:
    return -1;
}

/* ---- per-layer plans ---------------------------------------------------- */

#define MAX_CANDIDATES 24

// Workspace for the largest split-K plan any candidate of any bucket uses.
static size_t plans_workspace(cuda_engine *ce)
{
    size_t most = 0;
    for (int b = 0; b < ce->nbuckets; b++)
        for (int i = 0; i < NCONV; i++) {
            if (!conv_runs(ce, i))
                continue;
            conv_shape sh = conv_shape_for(ce, i, ce->buckets[b]);
            conv_plan c[MAX_CANDIDATES];
            int nc = conv_plan_candidates(ce->kind, &sh, ce->num_sms, NULL, c, MAX_CANDIDATES);
            for (int j = 0; j < nc; j++) {
                size_t w = conv_workspace_bytes(&sh, &c[j]);
                most = w > most ? w : most;
            }
        }
    return most;
}

// The planner's filter for conv i at bucket b (NULL: any plan). Batch
// invariance at the float kinds: no split-K, and at every bucket the tile
// family of the largest bucket's plan, which is planned first. INT8's sums
// are exact whatever the plan.
static const conv_filter *plan_filter(const cuda_engine *ce, int b, int i, conv_filter *f)
{
    if (!ce->deterministic || ce->kind == CONV_INT8)
        return NULL;
    const int last = ce->nbuckets - 1;
    f->unsplit = 1;
    f->family = b == last ? -1 : conv_tile_get(ce->kind, ce->plan[last][i].tile)->family;
    return f;
}

// The best of `runs` timings of enqueue(), after a warm-up run.
template <typename F>
static int best_time(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, int runs, F &&enqueue, float *best,
                     char *err, size_t errlen)
{
    *best = 1e30f;
    for (int r = 0; r <= runs; r++) {
        float ms;
        CUDA_TRY(cudaEventRecord(e0, st));
        CUDA_TRY(enqueue());
        CUDA_TRY(cudaEventRecord(e1, st));
        CUDA_TRY(cudaEventSynchronize(e1));
        CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
        if (r > 0 && ms < *best)  // r = 0: the warm-up
            *best = ms;
    }
    return 0;
fail:
    return -1;
}

// The best of 3 timings of conv i at batch n with plan p (s8_sc: with its
// downsample inside), after conv pre with plan pp in the same timing when
// pre >= 0: two convs back to back, as a graph runs them (timed alone,
// each would pay its own launch latency). The last conv's plans that
// leave the pool to its own kernel are timed with it where others take it
// inside.
static int time_conv(cuda_engine *ce, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, int n, int pre,
                     const conv_plan *pp, int i, const conv_plan *p, int s8_sc, float *best, char *err, size_t errlen)
{
    const int pool_after = i == NCONV - 1 && ce->pool_mode && !pool_inside(ce, p);
    return best_time(
        st, e0, e1, 3,
        [&]() {
            cudaError_t e = pre >= 0 ? launch_conv(ce, pre, n, pp, 0, st) : cudaSuccess;
            e = e == cudaSuccess ? launch_conv(ce, i, n, p, s8_sc, st) : e;
            return e == cudaSuccess && pool_after ? avgpool_launch_last(ce, n, st) : e;
        },
        best, err, errlen);
}

// Times every candidate plan of every conv at every bucket on slot 0 (one
// warm-up launch, then the best of 3) and keeps the fastest. The input is
// random and one full forward pass runs first, so each layer is timed on
// realistic activations and with the clocks up. Creation time only.
static int autotune(cuda_engine *ce, int log, char *err, size_t errlen)
{
    cuda_slot *sl = &ce->slot[0];
    cudaStream_t st = sl->stream;
    cudaEvent_t e0 = NULL, e1 = NULL;
    size_t bytes = (size_t)ce->pub.max_batch * RESNET18_INPUT_BYTES;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < bytes; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        sl->h_in[i] = (uint8_t)(x >> 32);
    }
    CUDA_TRY(cudaEventCreate(&e0));
    CUDA_TRY(cudaEventCreate(&e1));
    CUDA_TRY(cudaMemcpyAsync(sl->d_in, sl->h_in, bytes, cudaMemcpyHostToDevice, st));
    for (int r = 0; r < 3; r++)
        if (forward(ce, 0, ce->buckets[ce->nbuckets - 1], st, NULL, err, errlen) != 0)
            goto fail_quiet;
    for (int b = ce->nbuckets - 1; b >= 0; b--)  // the largest first: plan_filter
        for (int i = 0; i < NCONV; i++) {
            if (!conv_runs(ce, i))
                continue;
            // sc 1: INT8 with the downsample inside (then against the two convs' best, or alone when always inside).
            const int sc_max = s8_shortcut_of(ce, i) >= 0;
            for (int sc = ce->s8_ds == 2 && sc_max; sc <= sc_max; sc++) {
                conv_shape sh = sc ? conv_shape_sc(ce, i, ce->buckets[b]) : conv_shape_for(ce, i, ce->buckets[b]);
                conv_plan c[MAX_CANDIDATES];
                conv_filter f;
                int nc = conv_plan_candidates(ce->kind, &sh, ce->num_sms, plan_filter(ce, b, i, &f), c,
                                              MAX_CANDIDATES);
                float t_best = 1e30f;
                for (int j = 0; j < nc; j++) {
                    float t;
                    if (time_conv(ce, st, e0, e1, ce->buckets[b], -1, NULL, i, &c[j], sc, &t, err, errlen) != 0)
                        goto fail_quiet;
                    if (log)
                        fprintf(stderr, "autotune: batch %d %s%s: %s split %d: %.4f ms\n", ce->buckets[b],
                                resnet18_convs[i].name, sc ? " with its downsample" : "",
                                conv_tile_get(ce->kind, c[j].tile)->name, c[j].splits, t);
                    if (t < t_best) {
                        t_best = t;
                        if (sc)
                            ce->plan_sc[b][i] = c[j];
                        else
                            ce->plan[b][i] = c[j];
                    }
                }
                if (sc && ce->s8_ds == 1) {  // each way's best again: the downsample and conv i back to back
                    const int ds = s8_shortcut_of(ce, i);
                    float inside, apart;
                    if (time_conv(ce, st, e0, e1, ce->buckets[b], -1, NULL, i, &ce->plan_sc[b][i], 1, &inside, err,
                                  errlen) != 0 ||
                        time_conv(ce, st, e0, e1, ce->buckets[b], ds, &ce->plan[b][ds], i, &ce->plan[b][i], 0,
                                  &apart, err, errlen) != 0)
                        goto fail_quiet;
                    ce->ds_in[b][i] = inside < apart;
                    if (log)
                        fprintf(stderr, "autotune: batch %d %s: downsample %s (%.4f ms inside, %.4f apart)\n",
                                ce->buckets[b], resnet18_convs[i].name, ce->ds_in[b][i] ? "inside" : "apart",
                                inside, apart);
                }
            }
        }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 0;
fail:
fail_quiet:
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    return -1;
}

// The cost model's plans, then (unless RESNETD_GPU_AUTOTUNE=0) measured ones.
static int choose_plans(cuda_engine *ce, char *err, size_t errlen)
{
    for (int b = ce->nbuckets - 1; b >= 0; b--)  // the largest first: plan_filter
        for (int i = 0; i < NCONV; i++) {
            if (!conv_runs(ce, i))
                continue;
            conv_shape sh = conv_shape_for(ce, i, ce->buckets[b]);
            conv_filter f;
            ce->plan[b][i] = conv_plan_pick(ce->kind, &sh, ce->num_sms, plan_filter(ce, b, i, &f));
            if (s8_shortcut_of(ce, i) >= 0) {  // inside, unless the timing below finds it slower
                sh = conv_shape_sc(ce, i, ce->buckets[b]);
                ce->plan_sc[b][i] = conv_plan_pick(ce->kind, &sh, ce->num_sms, NULL);
                ce->ds_in[b][i] = 1;
            }
        }
    const char *env = getenv("RESNETD_GPU_AUTOTUNE");
    if (env && strcmp(env, "0") == 0)
        return 0;
    return autotune(ce, env && strcmp(env, "log") == 0, err, errlen);
}

// Bucket b's forward pass on slot s as a graph, its kernels launched
// programmatically (where supported) or not (pdl).
static int capture_one(cuda_engine *ce, int s, int b, int pdl, cudaGraphExec_t *out, char *err, size_t errlen)
{
    cuda_slot *sl = &ce->slot[s];
    cudaGraph_t g = NULL;
    int rc = -1;
    const int was = conv_set_pdl(pdl);
    CUDA_TRY(cudaStreamBeginCapture(sl->stream, cudaStreamCaptureModeThreadLocal));
    if (forward(ce, s, ce->buckets[b], sl->stream, NULL, err, errlen) != 0) {
        cudaGraph_t dropped;
        if (cudaStreamEndCapture(sl->stream, &dropped) == cudaSuccess && dropped)
            cudaGraphDestroy(dropped);
        goto fail;
    }
    CUDA_TRY(cudaStreamEndCapture(sl->stream, &g));
    {
        cudaError_t e = cudaGraphInstantiate(out, g, 0);
        cudaGraphDestroy(g);
        CUDA_TRY(e);
    }
    rc = 0;
fail:
    conv_set_pdl(was);
    return rc;
}

// One graph per (slot, bucket); the bucket runs padded inputs beyond n.
// Programmatic launches (pdl_mode 2): slot 0, captured first, captures
// each bucket both ways and keeps the programmatic graph where it is at
// least 1% faster (a stable choice where the two tie); the other slots
// take what it chose. On an H100 they took b=1 FP16 from 0.145 to 0.123 ms
// and cost INT8 0.8% at b=256.
static int capture_graphs(cuda_engine *ce, int s, char *err, size_t errlen)
{
    cuda_slot *sl = &ce->slot[s];
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaGraphExec_t other = NULL;
    if (s == 0 && ce->pdl_mode == 2) {
        CUDA_TRY(cudaEventCreate(&e0));
        CUDA_TRY(cudaEventCreate(&e1));
    }
    for (int b = 0; b < ce->nbuckets; b++) {
        if (s == 0)
            ce->pdl[b] = ce->pdl_mode != 0;
        if (capture_one(ce, s, b, ce->pdl[b], &sl->graph[b], err, errlen) != 0)
            goto fail;
        if (s > 0 || ce->pdl_mode != 2)
            continue;
        float t_on, t_off;
        if (capture_one(ce, s, b, 0, &other, err, errlen) != 0 ||
            best_time(sl->stream, e0, e1, 5, [&]() { return cudaGraphLaunch(sl->graph[b], sl->stream); }, &t_on,
                      err, errlen) != 0 ||
            best_time(sl->stream, e0, e1, 5, [&]() { return cudaGraphLaunch(other, sl->stream); }, &t_off, err,
                      errlen) != 0)
            goto fail;
        if (t_on > 0.99f * t_off) {
            cudaGraphExec_t t = sl->graph[b];
            sl->graph[b] = other;
            other = t;
            ce->pdl[b] = 0;
        }
        cudaGraphExec_t done = other;
        other = NULL;
        CUDA_TRY(cudaGraphExecDestroy(done));
    }
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    return 0;
fail:
    if (other)
        cudaGraphExecDestroy(other);
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    return -1;
}

static void make_buckets(cuda_engine *ce, int max_batch)
{
    static const int steps[] = {1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256};
    int nb = 0;
    for (size_t i = 0; i < sizeof steps / sizeof steps[0] && steps[i] < max_batch; i++)
        ce->buckets[nb++] = steps[i];
    int next = 256 + 64;
    while (next < max_batch && nb < MAX_BUCKETS - 1) {
        ce->buckets[nb++] = next;
        next += next >= 1024 ? 256 : 64;
    }
    ce->buckets[nb++] = max_batch;
    ce->nbuckets = nb;
}

static int bucket_for(const cuda_engine *ce, int n)
{
    for (int b = 0; b < ce->nbuckets; b++)
        if (ce->buckets[b] >= n)
            return b;
    return ce->nbuckets - 1;
}

/* ---- engine_ops ---------------------------------------------------------- */

// Enqueues on the slot's stream the copies of its FP32 input images and of
// the map that places them (skipped while no batch has had any).
static int stage_f32(cuda_engine *ce, int s, int n, char *err, size_t errlen)
{
    cuda_slot *sl = &ce->slot[s];
    const size_t plane = (size_t)3 * RESNET18_IMG * RESNET18_IMG;
    int nf = 0;
    for (int i = 0; i < ce->pub.max_batch; i++) {
        const float *src = i < n ? ce->pub.input_f32[s][i] : NULL;
        sl->h_which[i] = src ? i : -1;
        if (src) {
            CUDA_TRY(cudaMemcpyAsync(sl->d_f32 + (size_t)i * plane, src, plane * sizeof(float),
                                     cudaMemcpyHostToDevice, sl->stream));
            nf++;
        }
    }
    if (nf > 0 || sl->which_set)
        CUDA_TRY(cudaMemcpyAsync(sl->d_which, sl->h_which, (size_t)ce->pub.max_batch * sizeof(int),
                                 cudaMemcpyHostToDevice, sl->stream));
    sl->which_set = nf > 0;
    return 0;
fail:
    return -1;
}

static int cuda_submit(void *ctx, int s, int n, char *err, size_t errlen)
{
    cuda_engine *ce = (cuda_engine *)ctx;
    cuda_slot *sl = &ce->slot[s];
    int b = bucket_for(ce, n);
    cudaEvent_t ready = sl->staged;   // consumed by this submit whatever happens, so never reused stale
    sl->staged = NULL;
    if (pthread_mutex_lock(&ce->order) != 0) {
        snprintf(err, errlen, "cuda engine: cannot lock the submit order");
        return -1;
    }
    CUDA_TRY(cudaSetDevice(ce->pub.device_index));  // the calling thread may be new to this device
    if (ready) {
        CUDA_TRY(cudaStreamWaitEvent(sl->stream, ready, 0));
    } else {
        CUDA_TRY(cudaMemcpyAsync(sl->d_in, sl->h_in, (size_t)n * RESNET18_INPUT_BYTES, cudaMemcpyHostToDevice,
                                 sl->stream));
    }
    if (stage_f32(ce, s, n, err, errlen) != 0)
        goto fail;
    if (ce->last_slot >= 0 && ce->last_slot != s)
        CUDA_TRY(cudaStreamWaitEvent(sl->stream, ce->slot[ce->last_slot].computed, 0));
    CUDA_TRY(cudaGraphLaunch(sl->graph[b], sl->stream));
    CUDA_TRY(cudaEventRecord(sl->computed, sl->stream));
    ce->last_slot = s;
    CUDA_TRY(cudaMemcpyAsync(sl->h_logits, sl->d_logits, (size_t)n * ce->pub.classes * sizeof(float),
                             cudaMemcpyDeviceToHost, sl->stream));
    CUDA_TRY(cudaEventRecord(sl->done, sl->stream));
    pthread_mutex_unlock(&ce->order);
    return 0;
fail:
    pthread_mutex_unlock(&ce->order);
    return -1;
}

static int cuda_wait(void *ctx, int s, char *err, size_t errlen)
{
    cuda_engine *ce = (cuda_engine *)ctx;
    CUDA_TRY(cudaSetDevice(ce->pub.device_index));
    CUDA_TRY(cudaEventSynchronize(ce->slot[s].done));
    return 0;
fail:
    return -1;
}

static size_t cuda_device_memory(void *ctx)
{
    return ((cuda_engine *)ctx)->device_bytes;
}

static size_t cuda_pinned_memory(void *ctx)
{
    return ((cuda_engine *)ctx)->pinned_bytes;
}

static void cuda_destroy(void *ctx)
{
    cuda_engine *ce = (cuda_engine *)ctx;
    if (!ce)
        return;
    cudaSetDevice(ce->pub.device_index);
    for (int s = 0; s < ENGINE_MAX_SLOTS; s++) {
        cuda_slot *sl = &ce->slot[s];
        if (sl->stream)
            cudaStreamSynchronize(sl->stream);
        for (int b = 0; b < MAX_BUCKETS; b++)
            if (sl->graph[b])
                cudaGraphExecDestroy(sl->graph[b]);
        if (sl->computed)
            cudaEventDestroy(sl->computed);
        if (sl->done)
            cudaEventDestroy(sl->done);
        if (sl->stream)
            cudaStreamDestroy(sl->stream);
        cudaFreeHost(sl->h_in);
        cudaFreeHost(sl->h_which);
        cudaFree(sl->d_which);
        cudaFree(sl->d_f32);
        free(ce->pub.input_f32[s]);
        cudaFreeHost(sl->h_logits);
        cudaFree(sl->d_in);
        cudaFree(sl->d_logits);
    }
    for (int i = 0; i < NCONV; i++) {
        cudaFree(ce->w[i]);
        cudaFree(ce->w_sc[i]);
        cudaFree(ce->b[i]);
        cudaFree(ce->mult[i]);
    }
    cudaFree(ce->qlut);
    cudaFree(ce->hlut);
    for (int b = 0; b < ce->nbuf; b++)
        cudaFree(ce->buf[b]);
    cudaFree(ce->fc_w);
    cudaFree(ce->fc_b);
    cudaFree(ce->feat);
    cudaFree(ce->pool_part);
    cudaFree(ce->pool_cnt);
    cudaFree(ce->workspace);
    if (ce->blas)
        cublasDestroy(ce->blas);
    cudaFree(ce->blas_ws);
    if (ce->order_init)
        pthread_mutex_destroy(&ce->order);
    free(ce);
}

static const engine_ops cuda_ops = {
    "cuda", cuda_submit, cuda_wait, cuda_destroy, cuda_device_memory, cuda_pinned_memory,
};

static int create_slot(cuda_engine *ce, int s, char *err, size_t errlen)
{
    cuda_slot *sl = &ce->slot[s];
    size_t nb = (size_t)ce->pub.max_batch, classes = (size_t)ce->pub.classes;
    CUDA_TRY(cudaStreamCreateWithFlags(&sl->stream, cudaStreamNonBlocking));
    CUDA_TRY(cudaEventCreateWithFlags(&sl->computed, cudaEventDisableTiming));
    CUDA_TRY(cudaEventCreateWithFlags(&sl->done, cudaEventDisableTiming | cudaEventBlockingSync));
    CUDA_TRY(host_alloc(ce, (void **)&sl->h_in, nb * RESNET18_INPUT_BYTES));
    CUDA_TRY(host_alloc(ce, (void **)&sl->h_which, nb * sizeof(int)));
    CUDA_TRY(dev_alloc(ce, (void **)&sl->d_which, nb * sizeof(int)));
    CUDA_TRY(dev_alloc(ce, (void **)&sl->d_f32, nb * 3 * RESNET18_IMG * RESNET18_IMG * sizeof(float)));
    CUDA_TRY(cudaMemset(sl->d_which, 0xff, nb * sizeof(int)));   // all -1: no FP32 image
    if (!(ce->pub.input_f32[s] = (const float **)calloc(nb, sizeof(float *)))) {
        snprintf(err, errlen, "cuda engine: out of memory");
        return -1;
    }
    CUDA_TRY(host_alloc(ce, (void **)&sl->h_logits, nb * classes * sizeof(float)));
    CUDA_TRY(dev_alloc(ce, (void **)&sl->d_in, nb * RESNET18_INPUT_BYTES));
    CUDA_TRY(dev_alloc(ce, (void **)&sl->d_logits, (size_t)ce->fc_rows * classes * sizeof(float)));
    // Padded bucket rows read whatever is in d_in: make that defined.
    memset(sl->h_in, 0, nb * RESNET18_INPUT_BYTES);
    CUDA_TRY(cudaMemset(sl->d_in, 0, nb * RESNET18_INPUT_BYTES));
    ce->pub.input[s] = sl->h_in;
    ce->pub.logits[s] = sl->h_logits;
    return 0;
fail:
    return -1;
}

extern "C" engine *engine_cuda_create(const resnet18_weights *w, const engine_config *cfg, char *err, size_t errlen)
{
    cuda_engine *ce = (cuda_engine *)calloc(1, sizeof *ce);
    if (!ce) {
        snprintf(err, errlen, "out of memory creating the CUDA engine");
        return NULL;
    }
    int nslots = cfg->nslots > 0 ? cfg->nslots : 2;
    if (nslots > ENGINE_MAX_SLOTS) {
        snprintf(err, errlen, "cuda engine: %d slots requested, at most %d", nslots, ENGINE_MAX_SLOTS);
        free(ce);
        return NULL;
    }
    ce->pub.ops = &cuda_ops;
    ce->pub.ctx = ce;
    ce->pub.device = ENGINE_DEVICE_CUDA;
    ce->pub.precision = cfg->precision == ENGINE_PRECISION_FP32 || cfg->precision == ENGINE_PRECISION_INT8
                            ? cfg->precision : ENGINE_PRECISION_FP16;
    ce->pub.device_index = cfg->device_index;
    ce->pub.max_batch = cfg->max_batch;
    ce->pub.nslots = nslots;
    ce->pub.classes = w->classes;
    ce->fp16 = ce->pub.precision == ENGINE_PRECISION_FP16;
    ce->kind = ce->pub.precision == ENGINE_PRECISION_INT8 ? CONV_INT8 : ce->fp16 ? CONV_FP16 : CONV_FP32;
    ce->esize = ce->kind == CONV_INT8 ? 1 : ce->fp16 ? 2 : 4;
    ce->fc16 = ce->kind != CONV_FP32;
    if (ce->kind == CONV_INT8 && !cfg->calib) {
        snprintf(err, errlen, "cuda engine: precision int8 needs a calibration table");
        free(ce);
        return NULL;
    }
    ce->last_slot = -1;
    ce->deterministic = cfg->deterministic != 0;
    ce->pub.deterministic = ce->deterministic || ce->kind == CONV_INT8;
    ce->fc_rows = (cfg->max_batch + FC_COLS - 1) / FC_COLS * FC_COLS;
    size_t nb = (size_t)cfg->max_batch;

    if (pthread_mutex_init(&ce->order, NULL) != 0) {
        snprintf(err, errlen, "cuda engine: cannot create a mutex");
        goto fail;
    }
    ce->order_init = 1;
    CUDA_TRY(cudaSetDevice(cfg->device_index));
    CUDA_TRY(cudaDeviceGetAttribute(&ce->num_sms, cudaDevAttrMultiProcessorCount, cfg->device_index));
    CUDA_TRY(conv_init());

    {
        // Programmatic launches (capture_graphs): RESNETD_GPU_PDL=0 never, =1 always.
        const char *pdl = getenv("RESNETD_GPU_PDL");
        if (pdl && strcmp(pdl, "0") != 0 && strcmp(pdl, "1") != 0) {
            snprintf(err, errlen, "RESNETD_GPU_PDL must be 0 or 1 (got '%s')", pdl);
            goto fail;
        }
        ce->pdl_mode = !conv_pdl_supported() ? 0 : !pdl ? 2 : pdl[0] == '1';
    }
    {
        // The downsamples (see the top of the file).
        const char *how = getenv("RESNETD_GPU_DOWNSAMPLE");
        if (how && strcmp(how, "fused") != 0 && strcmp(how, "separate") != 0) {
            snprintf(err, errlen, "RESNETD_GPU_DOWNSAMPLE must be fused or separate (got '%s')", how);
            goto fail;
        }
        const int separate = how && strcmp(how, "separate") == 0;
        ce->fused_ds = ce->kind == CONV_FP16 && !separate;
        ce->s8_ds = ce->kind != CONV_INT8 || separate ? 0 : how ? 2 : 1;
    }
    {
        // The average pool (see the top of the file).
        const char *how = getenv("RESNETD_GPU_POOL");
        if (how && strcmp(how, "inside") != 0 && strcmp(how, "separate") != 0) {
            snprintf(err, errlen, "RESNETD_GPU_POOL must be inside or separate (got '%s')", how);
            goto fail;
        }
        ce->pool_mode = ce->kind == CONV_INT8 && !(how && strcmp(how, "separate") == 0);
    }
    for (int i = 0; i < NCONV; i++) {
        const resnet18_conv_desc *d = &resnet18_convs[i];
        const int ds = ce->fused_ds ? shortcut_of(ce, i) : s8_shortcut_of(ce, i);
        if (i == 0) {  // padded stem; ow fixed because the extra left tap would add a column
            ce->shape_per_image[i] = conv_shape_make(1, d->in_h, d->in_h, STEM_C, d->cout, d->k, STEM_KW, d->stride,
                                                     d->pad, d->pad + 1);
            ce->shape_per_image[i].ow = d->out_h;
        } else {
            ce->shape_per_image[i] = conv_shape_make(1, d->in_h, d->in_h, d->cin, d->cout, d->k, d->k, d->stride,
                                                     d->pad, d->pad);
        }
        if (ds >= 0) {
            const resnet18_conv_desc *dd = &resnet18_convs[ds];
            conv_shape *sh = &ce->shape_per_image[i];
            if (dd->k != 1 || dd->pad != 0 || dd->cout != d->cout || dd->out_h != d->out_h) {
                snprintf(err, errlen, "cuda engine: %s is not a 1x1 unpadded conv to %s's shape", dd->name, d->name);
                goto fail;
            }
            if (ce->fused_ds)
                add_shortcut(sh, ds);
        }
        if (conv_shape_check(&ce->shape_per_image[i], ce->kind, err, errlen) != 0)
            goto fail;
        if (s8_shortcut_of(ce, i) >= 0) {
            const conv_shape sc = conv_shape_sc(ce, i, 1);
            if (conv_shape_check(&sc, ce->kind, err, errlen) != 0)
                goto fail;
        }
    }
    {
        // RESNETD_GPU_STEM=unfused: the stem conv and the max pool as two
        // kernels (to compare; the tests run both).
        const resnet18_conv_desc *d = &resnet18_convs[0];
        const char *how = getenv("RESNETD_GPU_STEM");
        if (how && strcmp(how, "fused") != 0 && strcmp(how, "unfused") != 0) {
            snprintf(err, errlen, "RESNETD_GPU_STEM must be fused or unfused (got '%s')", how);
            goto fail;
        }
        ce->fused_stem = ce->kind != CONV_FP32 && stem_pool_fits(d->in_h, d->in_h, STEM_C, d->cout) &&
                         !(how && strcmp(how, "unfused") == 0);
    }
    if (upload_weights(ce, w, cfg->calib, err, errlen) != 0)
        goto fail;

    plan_buffers(ce);
    if (check_plan(ce, err, errlen) != 0)
        goto fail;
    for (int b = 0; b < ce->nbuf; b++)
        CUDA_TRY(dev_alloc(ce, &ce->buf[b], nb * ce->buf_bytes[b]));
    {
        const size_t bytes = (size_t)ce->fc_rows * RESNET18_FEATURES * (ce->fc16 ? sizeof(__half) : sizeof(float));
        CUDA_TRY(dev_alloc(ce, &ce->feat, bytes));
        CUDA_TRY(cudaMemset(ce->feat, 0, bytes));  // the FC reads the padding rows
    }
    if (ce->pool_mode) {
        CUDA_TRY(dev_alloc(ce, (void **)&ce->pool_part, nb * 2 * RESNET18_FEATURES * sizeof(double)));
        CUDA_TRY(dev_alloc(ce, (void **)&ce->pool_cnt, nb * (RESNET18_FEATURES / 64) * sizeof(int)));
        CUDA_TRY(cudaMemset(ce->pool_cnt, 0, nb * (RESNET18_FEATURES / 64) * sizeof(int)));
    }
    CUDA_TRY(dev_alloc(ce, &ce->blas_ws, BLAS_WORKSPACE));
    CUBLAS_TRY(cublasCreate(&ce->blas));
    CUBLAS_TRY(cublasSetWorkspace(ce->blas, ce->blas_ws, BLAS_WORKSPACE));

    make_buckets(ce, cfg->max_batch);
    {
        size_t ws = plans_workspace(ce);
        if (ws > 0)
            CUDA_TRY(dev_alloc(ce, (void **)&ce->workspace, ws));
    }
    for (int s = 0; s < nslots; s++)
        if (create_slot(ce, s, err, errlen) != 0)
            goto fail;
    {
        const int was = conv_set_pdl(ce->pdl_mode != 0);  // the autotuner's launches as the graphs' may be
        const int rc = choose_plans(ce, err, errlen);
        conv_set_pdl(was);
        if (rc != 0)
            goto fail;
    }
    memset(ce->slot[0].h_in, 0, nb * RESNET18_INPUT_BYTES);  // autotuning left random pixels
    CUDA_TRY(cudaMemsetAsync(ce->slot[0].d_in, 0, nb * RESNET18_INPUT_BYTES, ce->slot[0].stream));
    for (int s = 0; s < nslots; s++)
        if (capture_graphs(ce, s, err, errlen) != 0)
            goto fail;
    CUDA_TRY(cudaDeviceSynchronize());  // creation only: the memsets and uploads are done
    return &ce->pub;
fail:
    cuda_destroy(ce);
    return NULL;
}

/* ---- extras for tools and tests (gpu/gpu.h) ----------------------------- */

static cuda_engine *as_cuda(engine *e)
{
    return e && e->ops == &cuda_ops ? (cuda_engine *)e->ctx : NULL;
}

uint8_t *engine_cuda_device_input(engine *e, int slot)
{
    cuda_engine *ce = as_cuda(e);
    return ce && slot >= 0 && slot < e->nslots ? ce->slot[slot].d_in : NULL;
}

int engine_cuda_input_staged(engine *e, int slot, cudaEvent_t ready)
{
    cuda_engine *ce = as_cuda(e);
    if (!ce || slot < 0 || slot >= e->nslots)
        return -1;
    ce->slot[slot].staged = ready;
    return 0;
}

extern "C" int engine_cuda_layer_times(engine *e, int n, gpu_layer_time *out, int max, char *err, size_t errlen)
{
    cuda_engine *ce = as_cuda(e);
    cudaEvent_t marks[NOPS + 1] = {0};
    int count = 0;
    if (!ce || n < 1 || n > e->max_batch) {
        snprintf(err, errlen, "layer times need a CUDA engine and 1..max_batch images");
        return -1;
    }
    cuda_slot *sl = &ce->slot[0];
    CUDA_TRY(cudaSetDevice(e->device_index));
    for (int i = 0; i <= NOPS; i++)
        CUDA_TRY(cudaEventCreate(&marks[i]));
    CUDA_TRY(cudaMemcpyAsync(sl->d_in, sl->h_in, (size_t)n * RESNET18_INPUT_BYTES, cudaMemcpyHostToDevice, sl->stream));
    CUDA_TRY(cudaEventRecord(marks[0], sl->stream));
    if (forward(ce, 0, n, sl->stream, marks + 1, err, errlen) != 0)
        goto fail;
    CUDA_TRY(cudaStreamSynchronize(sl->stream));
    for (int op = 0; op < NOPS && op < max; op++) {
        float ms;
        CUDA_TRY(cudaEventElapsedTime(&ms, marks[op], marks[op + 1]));
        out[op].name = op_name(op);
        out[op].ms = ms;
        out[op].tile = NULL;
        out[op].splits = 0;
        if (op == 0 && ce->fused_stem) {
            out[op].tile = "FP32 images only: the stem normalises";
        } else if (op == 2 && ce->fused_stem) {
            out[op].tile = "fused into conv1";
        } else if (op == 1 && ce->fused_stem) {
            out[op].tile = "direct stem + max pool + normalise";
            out[op].splits = 1;
        } else if (op == NCONV + 2 && pool_inside(ce, &ce->plan[bucket_for(ce, n)][NCONV - 1])) {
            out[op].tile = "inside the last conv";
        } else if (op >= 3 && op < NCONV + 2 && !conv_runs_at(ce, bucket_for(ce, n), op - 2)) {
            out[op].tile = "fused into the next conv (its shortcut)";
        } else if (op == 1 || (op >= 3 && op < NCONV + 2)) {
            const int b = bucket_for(ce, n), i = op == 1 ? 0 : op - 2;
            const conv_plan *p = s8_inside_at(ce, b, i) ? &ce->plan_sc[b][i] : &ce->plan[b][i];
            out[op].tile = conv_tile_get(ce->kind, p->tile)->name;
            if (s8_inside_at(ce, b, i)) {
                snprintf(ce->tile_sc[i], sizeof ce->tile_sc[i], "%s + downsample", out[op].tile);
                out[op].tile = ce->tile_sc[i];
            }
            out[op].splits = p->splits;
        }
        count++;
    }
    for (int i = 0; i <= NOPS; i++)
        cudaEventDestroy(marks[i]);
    return count;
fail:
    for (int i = 0; i <= NOPS; i++)
        if (marks[i])
            cudaEventDestroy(marks[i]);
    return -1;
}

extern "C" int engine_cuda_last_conv(engine *e, int n, float *out, char *err, size_t errlen)
{
    cuda_engine *ce = as_cuda(e);
    const resnet18_conv_desc *d = &resnet18_convs[NCONV - 1];
    if (!ce || ce->kind != CONV_INT8 || n < 1 || n > e->max_batch) {
        snprintf(err, errlen, "the last conv's output needs an INT8 CUDA engine and 1..max_batch images");
        return -1;
    }
    if (pool_inside(ce, &ce->plan[bucket_for(ce, n)][NCONV - 1]))
        return 1;  // never stored: the pool runs inside the conv
    CUDA_TRY(cudaSetDevice(e->device_index));
    CUDA_TRY(cudaMemcpy(out, tensor_ptr(ce, NCONV - 1), (size_t)n * d->out_h * d->out_h * d->cout * sizeof(float),
                        cudaMemcpyDeviceToHost));
    return 0;
fail:
    return -1;
}

extern "C" int engine_cuda_features(engine *e, int n, uint16_t *out, char *err, size_t errlen)
{
    cuda_engine *ce = as_cuda(e);
    if (!ce || !ce->fc16 || n < 1 || n > e->max_batch) {
        snprintf(err, errlen, "the features need an FP16 or INT8 CUDA engine and 1..max_batch images");
        return -1;
    }
    CUDA_TRY(cudaSetDevice(e->device_index));
    CUDA_TRY(cudaMemcpy(out, ce->feat, (size_t)n * RESNET18_FEATURES * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    return 0;
fail:
    return -1;
}

// Enqueues one serial batch on slot 0 with events between its phases.
static int phase_batch(cuda_engine *ce, int n, cudaEvent_t ev[4], char *err, size_t errlen)
{
    cuda_slot *sl = &ce->slot[0];
    if (ce->last_slot > 0)
        CUDA_TRY(cudaStreamWaitEvent(sl->stream, ce->slot[ce->last_slot].computed, 0));
    ce->last_slot = 0;
    CUDA_TRY(cudaEventRecord(ev[0], sl->stream));
    CUDA_TRY(cudaMemcpyAsync(sl->d_in, sl->h_in, (size_t)n * RESNET18_INPUT_BYTES, cudaMemcpyHostToDevice, sl->stream));
    CUDA_TRY(cudaEventRecord(ev[1], sl->stream));
    CUDA_TRY(cudaGraphLaunch(sl->graph[bucket_for(ce, n)], sl->stream));
    CUDA_TRY(cudaEventRecord(sl->computed, sl->stream));
    CUDA_TRY(cudaEventRecord(ev[2], sl->stream));
    CUDA_TRY(cudaMemcpyAsync(sl->h_logits, sl->d_logits, (size_t)n * ce->pub.classes * sizeof(float),
                             cudaMemcpyDeviceToHost, sl->stream));
    CUDA_TRY(cudaEventRecord(ev[3], sl->stream));
    return 0;
fail:
    return -1;
}

extern "C" int gpu_programmatic_launch_supported(void)
{
    return conv_pdl_supported();
}

extern "C" int engine_cuda_programmatic(engine *e, int n)
{
    cuda_engine *ce = as_cuda(e);
    if (!ce || n < 1 || n > e->max_batch)
        return -1;
    return ce->pdl[bucket_for(ce, n)];
}

extern "C" int engine_cuda_phase_times(engine *e, int n, double *h2d_ms, double *compute_ms, double *d2h_ms,
                                       char *err, size_t errlen)
{
    cuda_engine *ce = as_cuda(e);
    cudaEvent_t ev[4] = {0};
    float t[3];
    int rc;
    if (!ce || n < 1 || n > e->max_batch) {
        snprintf(err, errlen, "phase times need a CUDA engine and 1..max_batch images");
        return -1;
    }
    CUDA_TRY(cudaSetDevice(e->device_index));
    for (int i = 0; i < 4; i++)
        CUDA_TRY(cudaEventCreate(&ev[i]));
    if (pthread_mutex_lock(&ce->order) != 0) {
        snprintf(err, errlen, "cuda engine: cannot lock the submit order");
        goto fail;
    }
    rc = phase_batch(ce, n, ev, err, errlen);
    pthread_mutex_unlock(&ce->order);
    if (rc != 0)
        goto fail;
    CUDA_TRY(cudaStreamSynchronize(ce->slot[0].stream));
    for (int i = 0; i < 3; i++)
        CUDA_TRY(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
    *h2d_ms = t[0];
    *compute_ms = t[1];
    *d2h_ms = t[2];
    for (int i = 0; i < 4; i++)
        cudaEventDestroy(ev[i]);
    return 0;
fail:
    for (int i = 0; i < 4; i++)
        if (ev[i])
            cudaEventDestroy(ev[i]);
    return -1;
}
