// The CUDA engine's plans (gpu/engine_cuda_impl.cuh): the activation
// buffers, the batch buckets, and each conv's tile and split-K per bucket,
// from the cost model or timed by the autotuner at creation.
//
// Plans. Each conv at each bucket runs with one entry of gpu/conv.cu's tile
// table, with split-K where a layer has too few tiles to fill the GPU. At
// creation the engine times every candidate on random input and keeps the
// fastest (tuning autotune=off: the cost model's pick instead; =log:
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gpu/engine_cuda_impl.cuh"

// Execution order: normalise (writes IMG; the FP32 images only with the
// fused stem), conv 0, maxpool (writes POOL),
// convs 1..19, avgpool. step_of_* give each tensor's write step and last read.
void ce_plan_buffers(cuda_engine *ce)
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

    int order[NTENSORS] = { T_IMG, 0, T_POOL };
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
            if (owner[b] < 0 &&
                (pick < 0 ||
                 (ce->buf_bytes[b] >= need && (ce->buf_bytes[pick] < need || ce->buf_bytes[b] < ce->buf_bytes[pick])) ||
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
int ce_check_plan(const cuda_engine *ce, char *err, size_t errlen)
{
    const int *b = ce->tensor_buf;
    int bad = ce->fused_stem ? b[T_POOL] == b[T_IMG] : b[0] == b[T_IMG] || b[T_POOL] == b[0];
    for (int i = 1; i < NCONV && !bad; i++) {
        const resnet18_conv_desc *d = &resnet18_convs[i];
        const int ds = shortcut_of(ce, i), ds8 = s8_shortcut_of(ce, i);
        if (!conv_runs(ce, i))
            continue;
        bad = b[i] == b[source_tensor(d->src)] || (ds >= 0 && b[i] == b[source_tensor(resnet18_convs[ds].src)]) ||
              (ds8 >= 0 && b[i] == b[source_tensor(resnet18_convs[ds8].src)]) ||
              (ds < 0 && d->residual != R18_NONE && tensor_bytes(ce, source_tensor(d->residual)) > 0 &&
               b[i] == b[source_tensor(d->residual)]);
    }
    if (bad)
        snprintf(err, errlen, "cuda engine: the buffer plan puts an op's output where its input is");
    return bad ? -1 : 0;
}

// Workspace for the largest split-K plan any candidate of any bucket uses.
size_t ce_plans_workspace(cuda_engine *ce)
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
            cudaError_t e = pre >= 0 ? ce_launch_conv(ce, pre, n, pp, 0, st) : cudaSuccess;
            e = e == cudaSuccess ? ce_launch_conv(ce, i, n, p, s8_sc, st) : e;
            return e == cudaSuccess && pool_after ? ce_avgpool_last(ce, n, st) : e;
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
        if (ce_forward(ce, 0, ce->buckets[ce->nbuckets - 1], st, NULL, err, errlen) != 0)
            goto fail_quiet;
    for (int b = ce->nbuckets - 1; b >= 0; b--)  // the largest first: plan_filter
        for (int i = ce->float_convs; i < NCONV; i++) {  // a mix's float prefix runs on its FP16 engine
            if (!conv_runs(ce, i))
                continue;
            // sc 1: INT8 with the downsample inside (then against the two convs' best, or alone when always inside).
            const int sc_max = s8_shortcut_of(ce, i) >= 0;
            for (int sc = ce->s8_ds == 2 && sc_max; sc <= sc_max; sc++) {
                conv_shape sh = sc ? conv_shape_sc(ce, i, ce->buckets[b]) : conv_shape_for(ce, i, ce->buckets[b]);
                conv_plan c[MAX_CANDIDATES];
                conv_filter f;
                int nc = conv_plan_candidates(ce->kind, &sh, ce->num_sms, plan_filter(ce, b, i, &f), c, MAX_CANDIDATES);
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
                        time_conv(ce, st, e0, e1, ce->buckets[b], ds, &ce->plan[b][ds], i, &ce->plan[b][i], 0, &apart,
                                  err, errlen) != 0)
                        goto fail_quiet;
                    ce->ds_in[b][i] = inside < apart;
                    if (log)
                        fprintf(stderr, "autotune: batch %d %s: downsample %s (%.4f ms inside, %.4f apart)\n",
                                ce->buckets[b], resnet18_convs[i].name, ce->ds_in[b][i] ? "inside" : "apart", inside,
                                apart);
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

// The cost model's plans, then (unless tuning autotune=off) measured ones.
int ce_choose_plans(cuda_engine *ce, char *err, size_t errlen)
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
    if (ce->autotune == ENGINE_TUNE_OFF)
        return 0;
    return autotune(ce, ce->autotune == ENGINE_TUNE_LOG, err, errlen);
}

void ce_make_buckets(cuda_engine *ce, int max_batch)
{
    static const int steps[] = { 1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256 };
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

int ce_bucket_for(const cuda_engine *ce, int n)
{
    for (int b = 0; b < ce->nbuckets; b++)
        if (ce->buckets[b] >= n)
            return b;
    return ce->nbuckets - 1;
}
