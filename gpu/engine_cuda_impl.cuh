// What the CUDA engine's files share (gpu/engine_cuda.cu: creation and the
// engine interface; gpu/engine_plan.cu: buffers, plans, the autotuner;
// gpu/engine_forward.cu: the forward pass and its graphs): the engine's
// structs, the network's topology as the engine runs it, and the ce_
// functions one file calls in another. Not for anything outside the engine.
#ifndef RESNETD_GPU_ENGINE_CUDA_IMPL_CUH
#define RESNETD_GPU_ENGINE_CUDA_IMPL_CUH

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_fp16.h>
#include "gpu/cuda_check.cuh"
#include "gpu/gpu.h"
#include "gpu/kernels.cuh"
#include "engine/calib.h"

#define NCONV RESNET18_NUM_CONVS
#define MAX_BUCKETS 48
#define STEM_C 4  // stem input channels after padding RGB
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
    cudaEvent_t done;  // after its output copies
    uint8_t *h_in, *d_in;  // [max_batch][224][224][3]
    float *d_f32;  // [max_batch][3][224][224]: FP32 input images
    int *h_which, *d_which;  // [max_batch]: i when image i is in d_f32, else -1
    int which_set;  // d_which names some image (else it is all -1)
    float *h_logits;  // [max_batch][classes]
    float *d_logits;  // [fc_rows][classes]
    cudaGraphExec_t graph[MAX_BUCKETS];
    cudaEvent_t staged;  // set by engine_cuda_input_staged: d_in is ready after it
} cuda_slot;

typedef struct cuda_engine {
    engine pub;
    int kind;  // CONV_FP32, CONV_FP16 or CONV_INT8 (gpu/kernels.cuh)
    int fused_stem;  // FP16/INT8: the stem conv and the max pool are one kernel (stem_pool_launch)
    int fused_ds;  // FP16: each downsample runs inside the conv that adds it (conv_shape.c2)
    int s8_ds;  // INT8's downsamples: 0 separate, 1 inside where timed faster (ds_in), 2 always inside
    unsigned char ds_in[MAX_BUCKETS][NCONV];  // INT8: at this bucket conv i runs its downsample inside
    int fc16;  // the FC on FP16 features and weights: FP16 and INT8 (engine/int8.h)
    int pool_mode;  // INT8: the average pool inside the last conv where its plan allows (pool_inside)
    int deterministic;  // float kinds: plans without split-K, one tile family per conv (ce_choose_plans)
    int fc_rows;  // max_batch rounded up to FC_COLS: rows of feat and d_logits
    double *pool_part;  // [max_batch][2][512]: the pool's sums of images split between two tiles
    int *pool_cnt;  // [max_batch][512 / 64]: their meeting counts, 0 between passes
    int fp16, esize, num_sms;  // esize: bytes of an activation (INT8: 1, but the last conv's output is FP32)
    size_t device_bytes, pinned_bytes;
    void *w[NCONV];  // KRSC, stem padded
    float *b[NCONV];
    void *fc_w;  // [classes][512], FP16 if fc16
    float *fc_b;
    conv_shape shape_per_image[NCONV];  // n = 1
    void *buf[MAX_BUFFERS];
    size_t buf_bytes[MAX_BUFFERS];  // per image
    float *mult[NCONV];  // INT8: [cout] s_in * s_w[c] (device)
    conv_q8 q8[NCONV];  // INT8: each conv's epilogue
    int8_t *qlut;  // INT8: [3][256] the quantised normalisation (device)
    __half *hlut;  // FP16 with the fused stem: [3][256] the normalisation (device)
    float in_inv;  // INT8: 1 / the input's scale
    int nbuf;
    int tensor_buf[NTENSORS];
    void *feat;  // [max_batch][512], as fc_w
    conv_plan plan[MAX_BUCKETS][NCONV];  // per bucket and conv: tile and split-K
    conv_plan plan_sc[MAX_BUCKETS][NCONV];  // INT8: conv i's plan with its downsample inside
    void *w_sc[NCONV];  // INT8: conv i's weight rows joined with its downsample's (conv_shape.c2)
    char tile_sc[NCONV][64];  // INT8: layer times' tile names of convs with their downsample inside
    float *workspace;  // split-K partial sums, shared like the activations
    void *blas_ws;
    cublasHandle_t blas;
    int buckets[MAX_BUCKETS], nbuckets;
    int pdl_mode;  // programmatic launches: 0 never, 1 always, 2 where timed faster (ce_capture_graphs)
    engine_tune autotune;  // engine_config.tuning.autotune (ce_choose_plans)
    unsigned char pdl[MAX_BUCKETS];  // the bucket's graph launches its kernels programmatically (kernels.cuh)
    cuda_slot slot[ENGINE_MAX_SLOTS];
    pthread_mutex_t order;
    int order_init;
    int last_slot;  // slot of the previous submit, -1 before the first
    // INT8 with a precision mix (engine/calib.h): convs [0, float_convs)
    // run on `prefix`, an FP16 engine of one slot whose own slot and graphs
    // go unused (ce_forward).
    int float_convs;
    struct cuda_engine *prefix;
} cuda_engine;
#define NOPS (NCONV + 5)  // normalise, 20 convs, maxpool, avgpool, fc, fc bias
#define MAX_CANDIDATES 24

/* ---- topology, as the engine runs it ------------------------------------ */

// A downsample: it reads the same input as the conv before it (its block's conv1).
static inline int is_downsample(int i)
{
    return i >= 2 && resnet18_convs[i].src == resnet18_convs[i - 1].src;
}

// The downsample whose output conv i adds, or -1.
static inline int downsample_of(int i)
{
    const int r = resnet18_convs[i].residual;
    return r >= 1 && is_downsample(r) ? r : -1;
}

// FP16: the downsample that runs inside conv i as its shortcut, or -1.
static inline int shortcut_of(const cuda_engine *ce, int i)
{
    return ce->fused_ds ? downsample_of(i) : -1;
}

// INT8: the downsample that may run inside conv i, or -1: at the buckets
// ds_in says, both ways planned and their buffers kept (s8_ds 1), or at
// every bucket (s8_ds 2).
static inline int s8_shortcut_of(const cuda_engine *ce, int i)
{
    return ce->kind == CONV_INT8 && ce->s8_ds ? downsample_of(i) : -1;
}

// Conv i has a kernel of its own at some bucket: not the fused stem, not a
// downsample always inside the conv that adds it.
static inline int conv_runs(const cuda_engine *ce, int i)
{
    return i == 0 ? !ce->fused_stem : !((ce->fused_ds || ce->s8_ds == 2) && is_downsample(i));
}

// INT8: conv i runs with its downsample inside at bucket b.
static inline int s8_inside_at(const cuda_engine *ce, int b, int i)
{
    return s8_shortcut_of(ce, i) >= 0 && (ce->s8_ds == 2 || ce->ds_in[b][i]);
}

// Conv i runs at bucket b: conv_runs, and not an INT8 downsample inside the
// conv after it (its user: the model runs each downsample just before).
static inline int conv_runs_at(const cuda_engine *ce, int b, int i)
{
    return conv_runs(ce, i) && !(is_downsample(i) && i + 1 < NCONV && s8_inside_at(ce, b, i + 1));
}

// INT8: the average pool runs inside the last conv with plan p.
static inline int pool_inside(const cuda_engine *ce, const conv_plan *p)
{
    return ce->pool_mode && conv_pool_fits(ce->kind, p, &ce->shape_per_image[NCONV - 1]);
}

static inline conv_shape conv_shape_for(const cuda_engine *ce, int i, int n)
{
    conv_shape s = ce->shape_per_image[i];
    s.n = n;
    return s;
}

// Conv i's shape with its downsample's input as the shortcut (conv_shape.c2).
static inline void add_shortcut(conv_shape *s, int ds)
{
    s->c2 = resnet18_convs[ds].cin;
    s->h2 = s->w2 = resnet18_convs[ds].in_h;
    s->stride2 = resnet18_convs[ds].stride;
}

// INT8: conv i's shape with its downsample inside.
static inline conv_shape conv_shape_sc(const cuda_engine *ce, int i, int n)
{
    conv_shape s = conv_shape_for(ce, i, n);
    add_shortcut(&s, s8_shortcut_of(ce, i));
    return s;
}

// Bytes of tensor t per image (none for the output of a conv fused into
// another kernel, the stem or a downsample: it never reaches global memory).
static inline size_t tensor_bytes(const cuda_engine *ce, int t)
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

static inline int source_tensor(int src)
{
    return src == R18_IMAGE ? T_IMG : src == R18_POOL ? T_POOL : src;
}

static inline void *tensor_ptr(cuda_engine *ce, int t)
{
    return ce->buf[ce->tensor_buf[t]];
}

// The best of `runs` timings of enqueue(), after a warm-up run.
template <typename F>
static inline int best_time(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, int runs, F &&enqueue, float *best,
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

/* ---- gpu/engine_plan.cu --------------------------------------------------- */

// Assigns every tensor a shared buffer (ce->tensor_buf, ce->buf_bytes per
// image) so that tensors whose lifetimes do not overlap share memory.
void ce_plan_buffers(cuda_engine *ce);
// 0 when no op writes a buffer one of its inputs is in; else -1 with err.
int ce_check_plan(const cuda_engine *ce, char *err, size_t errlen);
// The batch-size buckets up to max_batch, and the bucket that runs n images.
void ce_make_buckets(cuda_engine *ce, int max_batch);
int ce_bucket_for(const cuda_engine *ce, int n);
// Split-K workspace bytes for the largest plan any candidate uses.
size_t ce_plans_workspace(cuda_engine *ce);
// Every conv's plan at every bucket: the cost model's, then measured ones.
int ce_choose_plans(cuda_engine *ce, char *err, size_t errlen);

/* ---- gpu/engine_forward.cu ------------------------------------------------ */

// The name of op `op` of the forward pass (NOPS of them).
const char *ce_op_name(int op);
// Conv i at batch n with plan p on stream st (s8_sc: INT8 with its downsample inside).
cudaError_t ce_launch_conv(cuda_engine *ce, int i, int n, const conv_plan *p, int s8_sc, cudaStream_t st);
// The average pool's own kernel on the last conv's output.
cudaError_t ce_avgpool_last(cuda_engine *ce, int n, cudaStream_t st);
// Enqueues the forward pass of n images of slot s (marks: an event after each op).
int ce_forward(cuda_engine *ce, int s, int n, cudaStream_t st, cudaEvent_t *marks, char *err, size_t errlen);
// Slot s's graphs, one per bucket.
int ce_capture_graphs(cuda_engine *ce, int s, char *err, size_t errlen);

#endif
