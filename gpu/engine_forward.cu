// The CUDA engine's forward pass (gpu/engine_cuda_impl.cuh): the kernels of
// one batch in order, enqueued on a stream, and the CUDA graphs captured
// from it.
//
// Graphs. Each bucket's forward pass is one CUDA graph per slot. On 9.0
// devices its kernels may launch programmatically (gpu/kernels.cuh), each
// kernel's launch and prologue under the tail of the one before; the engine
// captures each bucket both ways and keeps that only where it is faster
// (ce_capture_graphs): it cut b=1's time by 12-15% and cost INT8 0.8% at
// b=256. Tuning pdl=off: never; =on: always.
#include <stdio.h>
#include <string.h>
#include "gpu/engine_cuda_impl.cuh"

const char *ce_op_name(int op)
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

// s8_sc: INT8 with the downsample inside (plan p from plan_sc).
cudaError_t ce_launch_conv(cuda_engine *ce, int i, int n, const conv_plan *p, int s8_sc, cudaStream_t st)
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

// The average pool's own kernel, on the last conv's output.
cudaError_t ce_avgpool_last(cuda_engine *ce, int n, cudaStream_t st)
{
    const resnet18_conv_desc *last = &resnet18_convs[NCONV - 1];
    return avgpool_launch(ce->kind, tensor_ptr(ce, NCONV - 1), ce->feat, n, last->out_h * last->out_h,
                          RESNET18_FEATURES, st);
}

#define MARK()                                         \
    do {                                               \
        if (marks)                                     \
            CUDA_TRY(cudaEventRecord(marks[*op], st)); \
        (*op)++;                                       \
    } while (0)

// The input step (when from is 0) and convs [from, to) of ce, with the max
// pool after conv 0, on slot sl's images: sl is ce's own slot, or, for an
// INT8 engine's float prefix (ce its FP16 engine), the INT8 engine's.
// Records marks[*op] after each op and advances *op.
static int forward_convs(cuda_engine *ce, cuda_slot *sl, int n, int from, int to, cudaStream_t st, cudaEvent_t *marks,
                         int *op, char *err, size_t errlen)
{
    const int bk = ce_bucket_for(ce, n);
    const conv_plan *plan = ce->plan[bk];
    const long npix = (long)n * RESNET18_IMG * RESNET18_IMG;
    if (from == 0 && ce->kind == CONV_INT8) {
        int8_t *img = (int8_t *)tensor_ptr(ce, T_IMG);
        if (!ce->fused_stem)  // else the stem normalises the decoded images itself
            CUDA_TRY(normalize_s8_launch(sl->d_in, ce->qlut, img, npix, st));
        CUDA_TRY(place_f32_s8_launch(sl->d_f32, sl->d_which, ce->in_inv, img, n, RESNET18_IMG * RESNET18_IMG, st));
        MARK();
    } else if (from == 0) {
        if (!ce->fused_stem)
            CUDA_TRY(normalize_launch(ce->fp16, sl->d_in, tensor_ptr(ce, T_IMG), npix, st));
        CUDA_TRY(place_f32_launch(ce->fp16, sl->d_f32, sl->d_which, tensor_ptr(ce, T_IMG), n,
                                  RESNET18_IMG * RESNET18_IMG, st));
        MARK();
    }
    for (int i = from; i < to; i++) {
        const resnet18_conv_desc *d = &resnet18_convs[i];
        if (i == 0 && ce->fused_stem) {  // the stem and its max pool (a second mark: the pool's op, empty)
            const int s8 = ce->kind == CONV_INT8;
            const stem_rgb rgb = { sl->d_in, s8 ? (const void *)ce->qlut : (const void *)ce->hlut, sl->d_which };
            CUDA_TRY(stem_pool_launch(ce->kind, n, d->in_h, d->in_h, tensor_ptr(ce, T_IMG), &rgb, ce->w[0], ce->b[0],
                                      s8 ? &ce->q8[0] : NULL, tensor_ptr(ce, T_POOL), st));
            MARK();
            MARK();
            continue;
        }
        if (s8_inside_at(ce, bk, i))
            CUDA_TRY(ce_launch_conv(ce, i, n, &ce->plan_sc[bk][i], 1, st));
        else if (conv_runs_at(ce, bk, i))  // else a downsample inside the next conv (its op stays, empty)
            CUDA_TRY(ce_launch_conv(ce, i, n, &plan[i], 0, st));
        MARK();
        if (i == 0) {
            const resnet18_conv_desc *l1 = &resnet18_convs[1];
            if (ce->kind == CONV_INT8)
                CUDA_TRY(maxpool_s8_launch((const int8_t *)tensor_ptr(ce, 0), (int8_t *)tensor_ptr(ce, T_POOL), n,
                                           d->out_h, d->out_h, d->cout, l1->in_h, l1->in_h, st));
            else
                CUDA_TRY(maxpool_launch(ce->fp16, tensor_ptr(ce, 0), tensor_ptr(ce, T_POOL), n, d->out_h, d->out_h,
                                        d->cout, l1->in_h, l1->in_h, st));
            MARK();
        }
    }
    return 0;
fail:
    return -1;
}

// The tensor a precision mix's float prefix ends with (calib_mix_boundary).
static int boundary_tensor(const cuda_engine *ce)
{
    return ce->float_convs == 1 ? T_POOL : ce->float_convs - 1;
}

// Enqueues the forward pass of n images of slot s on stream st. When marks
// is given, records marks[op] after each op (for per-layer timing). A
// precision mix runs its float prefix on the FP16 engine ce->prefix, then
// quantises the boundary tensor into this engine's (timed with the first
// INT8 conv's op).
int ce_forward(cuda_engine *ce, int s, int n, cudaStream_t st, cudaEvent_t *marks, char *err, size_t errlen)
{
    cuda_slot *sl = &ce->slot[s];
    const float one = 1.f, zero = 0.f;
    int op_count = 0, *op = &op_count;
    const int bk = ce_bucket_for(ce, n);
    const conv_plan *plan = ce->plan[bk];
    if (ce->prefix) {
        const int t = boundary_tensor(ce);
        const long count = (long)n * (long)(tensor_bytes(ce, t) / (size_t)ce->esize);
        if (forward_convs(ce->prefix, sl, n, 0, ce->float_convs, st, marks, op, err, errlen) != 0)
            goto fail;
        CUDA_TRY(quantize_f16_s8_launch((const __half *)tensor_ptr(ce->prefix, t), ce->q8[ce->float_convs - 1].out_inv,
                                        (int8_t *)tensor_ptr(ce, t), count, st));
    }
    if (forward_convs(ce, sl, n, ce->float_convs, NCONV, st, marks, op, err, errlen) != 0)
        goto fail;
    if (!pool_inside(ce, &plan[NCONV - 1]))
        CUDA_TRY(ce_avgpool_last(ce, n, st));
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
                                    RESNET18_FEATURES, &zero, sl->d_logits + (size_t)c0 * classes, CUDA_R_32F, classes,
                                    ct, CUBLAS_GEMM_DEFAULT));
    }
    MARK();
    CUDA_TRY(fc_bias_launch(sl->d_logits, ce->fc_b, n, ce->pub.classes, st));
    MARK();
    return 0;
fail:
    return -1;
}

#undef MARK

// Bucket b's forward pass on slot s as a graph, its kernels launched
// programmatically (where supported) or not (pdl).
static int capture_one(cuda_engine *ce, int s, int b, int pdl, cudaGraphExec_t *out, char *err, size_t errlen)
{
    cuda_slot *sl = &ce->slot[s];
    cudaGraph_t g = NULL;
    int rc = -1;
    const int was = conv_set_pdl(pdl);
    CUDA_TRY(cudaStreamBeginCapture(sl->stream, cudaStreamCaptureModeThreadLocal));
    if (ce_forward(ce, s, ce->buckets[b], sl->stream, NULL, err, errlen) != 0) {
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
int ce_capture_graphs(cuda_engine *ce, int s, char *err, size_t errlen)
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
            best_time(
                sl->stream, e0, e1, 5, [&]() { return cudaGraphLaunch(sl->graph[b], sl->stream); }, &t_on, err,
                errlen) != 0 ||
            best_time(
                sl->stream, e0, e1, 5, [&]() { return cudaGraphLaunch(other, sl->stream); }, &t_off, err, errlen) != 0)
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
