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
// the activation buffers, assigned to tensors by ce_plan_buffers so that
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
// (and FP16 with tuning stem=separate) runs them as two kernels. INT8
// always fuses them: the stem is its one conv on int8 inputs (the image),
// every other conv kernel reads u8 (engine/int8.h). ce_check_plan
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
// Tuning downsample=separate: every downsample as a conv of its own;
// =inside: INT8's inside at every bucket too (to compare; the tests run each).
//
// The average pool. At INT8 it runs inside the last conv wherever that
// conv's plan is a general wgmma tile without split-K (conv_q8.pool_out):
// the conv's FP32 output, 25.7 MB at batch 256, is then never stored and
// read back. The autotuner times the other plans with the pool's kernel
// after them. Tuning pool=separate: always the pool's own kernel.
//
// Plans, batch invariance (gpu/engine_plan.cu) and the forward pass and
// its graphs (gpu/engine_forward.cu) are in files of their own; what the
// three files share is gpu/engine_cuda_impl.cuh.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gpu/engine_cuda.cuh"
#include "gpu/engine_cuda_impl.cuh"

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
    qp->res_u8 = d->residual != R18_NONE && calib_source_unsigned(d->residual);
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
    if (upload_bytes(ce, stem ? stem : q, stem ? (size_t)d->cout * d->k * STEM_KW * STEM_C : d->cout * K, &ce->w[i],
                     err, errlen) != 0 ||
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
            CUDA_TRY(cudaMemcpyAsync(sl->d_f32 + (size_t)i * plane, src, plane * sizeof(float), cudaMemcpyHostToDevice,
                                     sl->stream));
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
    int b = ce_bucket_for(ce, n);
    cudaEvent_t ready = sl->staged;  // consumed by this submit whatever happens, so never reused stale
    sl->staged = NULL;
    if (pthread_mutex_lock(&ce->order) != 0) {
        snprintf(err, errlen, "cuda engine: cannot lock the submit order");
        return -1;
    }
    CUDA_TRY(cudaSetDevice(ce->pub.device_index));  // the calling thread may be new to this device
    if (ready) {
        CUDA_TRY(cudaStreamWaitEvent(sl->stream, ready, 0));
    } else {
        CUDA_TRY(
            cudaMemcpyAsync(sl->d_in, sl->h_in, (size_t)n * RESNET18_INPUT_BYTES, cudaMemcpyHostToDevice, sl->stream));
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
    const cuda_engine *ce = (const cuda_engine *)ctx;
    return ce->device_bytes + (ce->prefix ? ce->prefix->device_bytes : 0);
}

static size_t cuda_pinned_memory(void *ctx)
{
    const cuda_engine *ce = (const cuda_engine *)ctx;
    return ce->pinned_bytes + (ce->prefix ? ce->prefix->pinned_bytes : 0);
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
    cuda_destroy(ce->prefix);
    free(ce);
}

static const engine_ops cuda_ops = {
    "cuda", cuda_submit, cuda_wait, cuda_destroy, cuda_device_memory, cuda_pinned_memory,
};

// The engine's ways of running the network (see the top of the file), as
// engine_config.tuning asks: each AUTO field is the engine's own choice.
static void apply_tuning(cuda_engine *ce, const engine_tuning *tu)
{
    const resnet18_conv_desc *stem = &resnet18_convs[0];
    ce->autotune = tu->autotune;
    ce->pdl_mode = !conv_pdl_supported() || tu->pdl == ENGINE_TUNE_OFF ? 0 : tu->pdl == ENGINE_TUNE_ON ? 1 : 2;
    ce->fused_ds = ce->kind == CONV_FP16 && tu->downsample != ENGINE_TUNE_SEPARATE;
    ce->s8_ds = ce->kind != CONV_INT8 || tu->downsample == ENGINE_TUNE_SEPARATE ? 0
                : tu->downsample == ENGINE_TUNE_INSIDE                          ? 2
                                                                                : 1;
    ce->pool_mode = ce->kind == CONV_INT8 && tu->pool != ENGINE_TUNE_SEPARATE;
    ce->fused_stem = ce->kind != CONV_FP32 && stem_pool_fits(stem->in_h, stem->in_h, STEM_C, stem->cout) &&
                     (tu->stem != ENGINE_TUNE_SEPARATE || ce->kind == CONV_INT8);
}

// Each conv's shape for one image (the stem padded; FP16's downsamples as
// shortcuts), checked against what the kernels take.
static int make_shapes(cuda_engine *ce, char *err, size_t errlen)
{
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
                return -1;
            }
            if (ce->fused_ds)
                add_shortcut(sh, ds);
        }
        if (i == 0 && ce->kind == CONV_INT8 && !ce->fused_stem) {
            snprintf(err, errlen, "cuda engine: INT8 runs its stem only in the fused stem kernel, which does not fit");
            return -1;
        }
        if ((i > 0 || !ce->fused_stem) && conv_shape_check(&ce->shape_per_image[i], ce->kind, err, errlen) != 0)
            return -1;
        if (s8_shortcut_of(ce, i) >= 0) {
            const conv_shape sc = conv_shape_sc(ce, i, 1);
            if (conv_shape_check(&sc, ce->kind, err, errlen) != 0)
                return -1;
        }
    }
    return 0;
}

// The buffers every slot shares: activations (as ce_plan_buffers assigned
// them), features, the pool's partial sums, cuBLAS and its workspace.
static int alloc_shared(cuda_engine *ce, size_t nb, char *err, size_t errlen)
{
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
    return 0;
fail:
    return -1;
}

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
    CUDA_TRY(cudaMemset(sl->d_which, 0xff, nb * sizeof(int)));  // all -1: no FP32 image
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

// INT8 with a precision mix: the FP16 engine that runs the float prefix,
// deterministic (plans that give an image the same bits in any batch), so
// that the mix keeps INT8's batch invariance.
static int make_prefix(cuda_engine *ce, const resnet18_weights *w, const engine_config *cfg, char *err, size_t errlen)
{
    if (ce->kind != CONV_INT8)
        return 0;
    ce->float_convs = calib_mix_float_convs(cfg->calib->mix);
    if (ce->float_convs < 0) {
        snprintf(err, errlen, "cuda engine: the table's mix is not a calib_mix");
        return -1;
    }
    if (ce->float_convs == 0)
        return 0;
    engine_config fc = *cfg;
    fc.precision = ENGINE_PRECISION_FP16;
    fc.nslots = 1;
    fc.calib = NULL;
    fc.deterministic = 1;
    char why[512];
    engine *e = engine_cuda_create(w, &fc, why, sizeof why);
    if (!e) {
        snprintf(err, errlen, "cuda engine: its %s prefix: %s", calib_mix_name(cfg->calib->mix), why);
        return -1;
    }
    ce->prefix = (cuda_engine *)e->ctx;
    if (ce->prefix->nbuckets != ce->nbuckets ||
        memcmp(ce->prefix->buckets, ce->buckets, (size_t)ce->nbuckets * sizeof ce->buckets[0]) != 0) {
        snprintf(err, errlen, "cuda engine: its float prefix has other batch buckets");
        return -1;
    }
    return 0;
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
                            ? cfg->precision
                            : ENGINE_PRECISION_FP16;
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

    apply_tuning(ce, &cfg->tuning);
    if (make_shapes(ce, err, errlen) != 0)
        goto fail;
    if (upload_weights(ce, w, cfg->calib, err, errlen) != 0)
        goto fail;

    ce_plan_buffers(ce);
    if (ce_check_plan(ce, err, errlen) != 0)
        goto fail;
    if (alloc_shared(ce, nb, err, errlen) != 0)
        goto fail;

    ce_make_buckets(ce, cfg->max_batch);
    {
        size_t ws = ce_plans_workspace(ce);
        if (ws > 0)
            CUDA_TRY(dev_alloc(ce, (void **)&ce->workspace, ws));
    }
    for (int s = 0; s < nslots; s++)
        if (create_slot(ce, s, err, errlen) != 0)
            goto fail;
    if (make_prefix(ce, w, cfg, err, errlen) != 0)
        goto fail;
    {
        const int was = conv_set_pdl(ce->pdl_mode != 0);  // the autotuner's launches as the graphs' may be
        const int rc = ce_choose_plans(ce, err, errlen);
        conv_set_pdl(was);
        if (rc != 0)
            goto fail;
    }
    memset(ce->slot[0].h_in, 0, nb * RESNET18_INPUT_BYTES);  // autotuning left random pixels
    CUDA_TRY(cudaMemsetAsync(ce->slot[0].d_in, 0, nb * RESNET18_INPUT_BYTES, ce->slot[0].stream));
    for (int s = 0; s < nslots; s++)
        if (ce_capture_graphs(ce, s, err, errlen) != 0)
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
    cudaEvent_t marks[NOPS + 1] = { 0 };
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
    if (ce_forward(ce, 0, n, sl->stream, marks + 1, err, errlen) != 0)
        goto fail;
    CUDA_TRY(cudaStreamSynchronize(sl->stream));
    for (int op = 0; op < NOPS && op < max; op++) {
        float ms;
        CUDA_TRY(cudaEventElapsedTime(&ms, marks[op], marks[op + 1]));
        out[op].name = ce_op_name(op);
        out[op].ms = ms;
        out[op].tile = NULL;
        out[op].splits = 0;
        // A precision mix's float prefix: its FP16 engine's ops and plans.
        const int conv = op <= 2 ? 0 : op - 2;
        cuda_engine *oc = ce->prefix && conv < ce->float_convs ? ce->prefix : ce;
        if (op == 0 && oc->fused_stem) {
            out[op].tile = "FP32 images only: the stem normalises";
        } else if (op == 2 && oc->fused_stem) {
            out[op].tile = "fused into conv1";
        } else if (op == 1 && oc->fused_stem) {
            out[op].tile = "direct stem + max pool + normalise";
            out[op].splits = 1;
        } else if (op == NCONV + 2 && pool_inside(oc, &oc->plan[ce_bucket_for(oc, n)][NCONV - 1])) {
            out[op].tile = "inside the last conv";
        } else if (op >= 3 && op < NCONV + 2 && !conv_runs_at(oc, ce_bucket_for(oc, n), op - 2)) {
            out[op].tile = "fused into the next conv (its shortcut)";
        } else if (op == 1 || (op >= 3 && op < NCONV + 2)) {
            const int b = ce_bucket_for(oc, n), i = op == 1 ? 0 : op - 2;
            const conv_plan *p = s8_inside_at(oc, b, i) ? &oc->plan_sc[b][i] : &oc->plan[b][i];
            out[op].tile = conv_tile_get(oc->kind, p->tile)->name;
            if (s8_inside_at(oc, b, i)) {
                snprintf(oc->tile_sc[i], sizeof oc->tile_sc[i], "%s + downsample", out[op].tile);
                out[op].tile = oc->tile_sc[i];
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
    if (pool_inside(ce, &ce->plan[ce_bucket_for(ce, n)][NCONV - 1]))
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
    CUDA_TRY(cudaGraphLaunch(sl->graph[ce_bucket_for(ce, n)], sl->stream));
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
    return ce->pdl[ce_bucket_for(ce, n)];
}

extern "C" int engine_cuda_phase_times(engine *e, int n, double *h2d_ms, double *compute_ms, double *d2h_ms, char *err,
                                       size_t errlen)
{
    cuda_engine *ce = as_cuda(e);
    cudaEvent_t ev[4] = { 0 };
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
