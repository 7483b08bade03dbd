/* The CUDA engine against the CPU engine, with the reference weights and
 * random images, every third given as its normalised FP32 tensor
 * (engine.input_f32): FP32 within rel L2 1e-5 per image; FP16 within 5e-3 with
 * the same top-1 and a top-5 overlap of at least 4. Batches of 1, 2, 3, 17,
 * 64, 255 and max (300, not a power of two) through both slots, including
 * two slots in flight at once; logits poisoned before every run. The same
 * for reference.py's 10-class fine-tune and a 3-class head (its first 3
 * rows: fewer classes than a top-5), batches of 1, 3 and 17. INT8 against
 * the CPU INT8 engine: the last conv's output (where the graph stores it)
 * and the average pool's features equal bit for bit, the pool inside the
 * last conv where its plan allows and (small batches)
 * tuning pool=separate. FP16 runs with the fused stem and (small batches)
 * stem=separate; INT8 always fuses it (its one conv on the int8 image);
 * FP16 with its downsamples inside the convs that add them and (small
 * batches) downsample=separate; INT8 with them inside where
 * timed faster and (small batches) downsample=inside and
 * separate. FP16 and INT8 with each bucket's graph launching its kernels
 * programmatically where timed faster and (small batches) always
 * (pdl=on: a kernel that read before its pdl_sync would read
 * the last batch's activations) and never.
 *
 * Batch invariance: one image at every position of a sample of batch sizes
 * up to 256, bit for bit, on every precision with engine_config
 * .deterministic and on INT8 without it.
 *
 * INT8 precision mixes (engine/calib.h), each with the reference table and
 * the (FP16 prefix's) stem fused and apart, the downsamples inside and
 * apart: the logits of
 * reference.py's random images against its emulation with an FP16 float
 * prefix (the FP16 engine's arithmetic), and batch invariance at batch
 * sizes 1, 2, 3, 5 and 8.
 * Tolerance: after the boundary everything is exact, but the prefix rounds
 * every conv's output to FP16, and two implementations whose FP32 sums
 * differ in order round some values to neighbouring halves; the
 * differences grow conv by conv, and past layer1 0.08-2.4% of the
 * boundary's int8 values (150-1200 per image) end a level apart, where an
 * FP32 prefix has 0-4.
 * The INT8 layers after it spread every flip through each requantisation,
 * so the logits' distance saturates: three other FP16 emulations (float64
 * sums; sums split in two halves of the channels; the downsample fused into
 * its conv2, unrounded) are up to 0.018 mean rel L2 over the 8 images (one
 * image 0.033) from reference.py's, and every other mix's FP16 emulation
 * 0.035 or more. MIX_TOL_MEAN 0.025 lies about 1.4x from both; an FP16
 * prefix cannot be told from another mix more sharply than that (the FP32
 * one can: tests/engine/test_engine_int8.c). MIX_TOL_IMAGE 0.05. The mean
 * against every other mix's emulation (int8's included) must be 3x the
 * mean against its own (testutil_expect_nearest), so an engine that
 * ignored the mix fails. On an H200 the CUDA engine's float:stem was 0.0032
 * from its emulation and 0.0232 from int8's: nearer than the stand-ins.
 *
 * Exits 77 without a CUDA device. RESNETD_GPU_TEST_QUICK=1 runs batches of
 * 1, 3 and 17 only (max 17), for compute-sanitizer; RESNETD_GPU_TUNING
 * (engine_tuning_parse's text, e.g. autotune=off to skip the engine's tile
 * timing at creation) is the tuning every case starts from. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gpu/gpu.h"
#include "gpu/gpu_test.h"
#include "engine/calib.h"
#include "engine/engine.h"
#include "engine/engine_cpu.h"
#include "engine/engine_registry.h"
#include "engine/int8.h"
#include "image/preprocess.h"
#include "model/resnet18.h"
#include "tests/lib/invariance.h"
#include "tests/lib/testutil.h"
#include "util/npy.h"

#define POOL 24 /* distinct random images; batches draw from them */
#define MIX_TOL_MEAN 0.025
#define MIX_TOL_IMAGE 0.05

/* A model under test and the CPU engine's answers for the pool. */
typedef struct model_ref {
    const char *file;
    int head; /* use only the first `head` classes; 0: all */
    resnet18_weights w; /* with head: the file's, classes cut to head */
    float *logits; /* [POOL][w.classes], CPU engine FP32 */
} model_ref;

static model_ref imagenet = { .file = "weights.safetensors" };
static model_ref ft10 = { .file = "ft10/weights.safetensors" };
static model_ref head3 = { .file = "ft10/weights.safetensors", .head = 3 };
static uint8_t *pool; /* [POOL][224*224*3] */
static float *pool_f32; /* [POOL][3][224][224]: the pool normalised, as FP32 inputs */
static int quick;

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t rng_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static void setup_once(model_ref *m)
{
    char err[256];
    if (!pool) {
        pool = malloc((size_t)POOL * RESNET18_INPUT_BYTES);
        ck_assert(pool);
        for (size_t i = 0; i < (size_t)POOL * RESNET18_INPUT_BYTES; i++)
            pool[i] = (uint8_t)rng_u32();
        pool_f32 = malloc((size_t)POOL * RESNET18_INPUT_BYTES * sizeof(float));
        ck_assert_ptr_nonnull(pool_f32);
        for (int i = 0; i < POOL; i++)
            preprocess_normalize_chw(pool + (size_t)i * RESNET18_INPUT_BYTES,
                                     pool_f32 + (size_t)i * RESNET18_INPUT_BYTES);
    }
    if (m->logits)
        return;
    ck_assert_msg(weights_load(testutil_ref_path(m->file), &m->w, err, sizeof err) == 0, "%s", err);
    if (m->head) {
        /* fc_w is [classes][512]: its first rows are a smaller head. */
        ck_assert_int_lt(m->head, m->w.classes);
        m->w.classes = m->head;
    }
    m->logits = malloc((size_t)POOL * (size_t)m->w.classes * sizeof(float));
    ck_assert(m->logits);
    engine_config cfg = { .device = ENGINE_DEVICE_CPU, .precision = ENGINE_PRECISION_FP32, .max_batch = POOL };
    engine *cpu = engine_create(&m->w, &cfg, err, sizeof err);
    ck_assert_msg(cpu != NULL, "%s", err);
    ck_assert_int_eq(cpu->classes, m->w.classes);
    ck_assert_msg(engine_infer(cpu, pool, POOL, m->logits, err, sizeof err) == 0, "%s", err);
    engine_destroy(cpu);
}

static void model_free(model_ref *m)
{
    weights_free(&m->w);
    free(m->logits);
}

/* How many of a's top min(5, classes) are among b's. */
static int overlap5(const float *a, const float *b, int classes)
{
    int ia[5], ib[5], n = 0, k = classes < 5 ? classes : 5;
    testutil_topk(a, classes, k, ia);
    testutil_topk(b, classes, k, ib);
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++)
            n += ia[i] == ib[j];
    return n;
}

/* Fills slot s with n images drawn at random from the pool; which[] records
 * the draw. Every third image (1, 4, ...) goes in as the normalised FP32
 * tensor (engine.input_f32), with random bytes where its pixels would be,
 * so its logits are right only if the FP32 input replaced them. Poisons
 * the slot's logits (all bits set: NaN). */
static void fill_slot(engine *e, int s, int n, int *which)
{
    for (int i = 0; i < n; i++) {
        which[i] = (int)(rng_u32() % POOL);
        uint8_t *dst = e->input[s] + (size_t)i * RESNET18_INPUT_BYTES;
        if (i % 3 == 1) {
            for (size_t j = 0; j < RESNET18_INPUT_BYTES; j++)
                dst[j] = (uint8_t)rng_u32();
            e->input_f32[s][i] = pool_f32 + (size_t)which[i] * RESNET18_INPUT_BYTES;
        } else {
            memcpy(dst, pool + (size_t)which[i] * RESNET18_INPUT_BYTES, RESNET18_INPUT_BYTES);
            e->input_f32[s][i] = NULL;
        }
    }
    memset(e->logits[s], 0xff, (size_t)e->max_batch * (size_t)e->classes * sizeof(float));
}

static void check_slot(engine *e, int s, int n, const int *which, int fp16, const model_ref *m)
{
    const int C = e->classes, k = C < 5 ? C : 5;
    double worst = 0;
    for (int i = 0; i < n; i++) {
        const float *got = e->logits[s] + (size_t)i * C;
        const float *ref = m->logits + (size_t)which[i] * C;
        double rel = testutil_rel_l2(got, ref, (size_t)C);
        worst = rel > worst ? rel : worst;
        ck_assert_msg(rel <= (fp16 ? 5e-3 : 1e-5), "%s %s n=%d slot %d image %d: rel L2 %.3g", m->file,
                      fp16 ? "fp16" : "fp32", n, s, i, rel);
        if (fp16) {
            int a, b;
            testutil_topk(got, C, 1, &a);
            testutil_topk(ref, C, 1, &b);
            ck_assert_msg(a == b, "fp16 n=%d image %d: top-1 %d vs CPU %d", n, i, a, b);
            ck_assert_msg(overlap5(got, ref, C) >= k - 1, "fp16 n=%d image %d: top-%d overlap %d", n, i, k,
                          overlap5(got, ref, C));
        }
    }
    fprintf(stderr, "  %s %s n=%3d slot %d: worst rel L2 %.3g\n", m->file, fp16 ? "fp16" : "fp32", n, s, worst);
}

/* The CUDA engines' tuning: RESNETD_GPU_TUNING's, then a case's variant. */
static const char *base_tuning;
static engine_tuning tuning;

/* The base tuning with `variant` (NULL: none) after it. */
static void tune(const char *variant)
{
    char text[256], err[256];
    snprintf(text, sizeof text, "%s%s%s", base_tuning ? base_tuning : "",
             base_tuning && *base_tuning && variant ? "," : "", variant ? variant : "");
    ck_assert_msg(engine_tuning_parse(text, &tuning, err, sizeof err) == 0, "%s", err);
}

/* Under tuning pdl=on or off, every bucket's graph is as it says (on only
 * where the GPU takes programmatic launches). */
static void check_programmatic(engine *e, int max)
{
    if (tuning.pdl == ENGINE_TUNE_AUTO)
        return;
    const int want = tuning.pdl == ENGINE_TUNE_ON && gpu_programmatic_launch_supported();
    for (int n = 1; n <= max; n++)
        ck_assert_int_eq(engine_cuda_programmatic(e, n), want);
}

static void run_model(model_ref *m, engine_precision p, int small_batches)
{
    static const int full[] = { 1, 2, 3, 17, 64, 255, 300 }, small[] = { 1, 3, 17 };
    small_batches |= quick;
    const int *batches = small_batches ? small : full;
    int nb = small_batches ? 3 : 7, max = small_batches ? 17 : 300, fp16 = p == ENGINE_PRECISION_FP16;
    char err[256];
    setup_once(m);
    engine_config cfg = {
        .device = ENGINE_DEVICE_CUDA, .precision = p, .max_batch = max, .nslots = 2, .tuning = tuning
    };
    engine *e = engine_create(&m->w, &cfg, err, sizeof err);
    ck_assert_msg(e != NULL, "%s", err);
    check_programmatic(e, max);
    ck_assert_int_eq(e->nslots, 2);
    ck_assert_int_eq(e->precision, p);
    ck_assert_int_eq(e->classes, m->w.classes);
    ck_assert(engine_device_memory(e) > 0 && engine_pinned_memory(e) > 0);
    int *w0 = malloc(sizeof(int) * max), *w1 = malloc(sizeof(int) * max);
    ck_assert(w0 && w1);
    for (int i = 0; i < nb; i++) {
        int n = batches[i], s = i % 2;
        fill_slot(e, s, n, w0);
        ck_assert_msg(engine_submit(e, s, n, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(engine_wait(e, s, err, sizeof err) == 0, "%s", err);
        check_slot(e, s, n, w0, fp16, m);
    }
    /* Both slots in flight: different batches, then waited in reverse order. */
    for (int i = 0; i + 1 < nb; i++) {
        int n0 = batches[i], n1 = batches[nb - 1 - i];
        fill_slot(e, 0, n0, w0);
        fill_slot(e, 1, n1, w1);
        ck_assert_msg(engine_submit(e, 0, n0, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(engine_submit(e, 1, n1, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(engine_wait(e, 1, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(engine_wait(e, 0, err, sizeof err) == 0, "%s", err);
        check_slot(e, 0, n0, w0, fp16, m);
        check_slot(e, 1, n1, w1, fp16, m);
    }
    free(w0);
    free(w1);
    engine_destroy(e);
}

START_TEST(fp32_matches_cpu_engine_within_1e5)
{
    run_model(&imagenet, ENGINE_PRECISION_FP32, 0);
}
END_TEST

START_TEST(fp16_matches_cpu_engine_within_5e3_same_top1)
{
    run_model(&imagenet, ENGINE_PRECISION_FP16, 0);
    tune("stem=separate");
    run_model(&imagenet, ENGINE_PRECISION_FP16, 1);
    tune(NULL);
    tune("downsample=separate");
    run_model(&imagenet, ENGINE_PRECISION_FP16, 1);
    tune(NULL);
    /* Every graph with programmatic launches, and none (by default the
     * timing decides, bucket by bucket). */
    tune("pdl=on");
    run_model(&imagenet, ENGINE_PRECISION_FP16, 1);
    tune("pdl=off");
    run_model(&imagenet, ENGINE_PRECISION_FP16, 1);
    tune(NULL);
}
END_TEST

START_TEST(fine_tuned_10_class_head_matches_cpu_engine_fp32_and_fp16)
{
    run_model(&ft10, ENGINE_PRECISION_FP32, 1);
    run_model(&ft10, ENGINE_PRECISION_FP16, 1);
}
END_TEST

START_TEST(head_of_3_classes_ranks_only_3_on_the_gpu)
{
    run_model(&head3, ENGINE_PRECISION_FP32, 1);
    run_model(&head3, ENGINE_PRECISION_FP16, 1);
}
END_TEST

/* ---- INT8 ---------------------------------------------------------------- */

/* A calibration table from the pool: each tensor's max |x| under the FP32
 * CPU engine, / 127. (What the scales are does not matter for equality
 * with the CPU INT8 engine; these keep every tensor's values spread.) */
static void observe_max(void *ctx, int tensor, const float *data, int n, int h, int c, int pad)
{
    float *m = (float *)ctx + tensor;
    size_t count = (size_t)n * (h + 2 * pad) * (h + 2 * pad) * c;
    for (size_t i = 0; i < count; i++)
        *m = fabsf(data[i]) > *m ? fabsf(data[i]) : *m;
}

static void make_table(const resnet18_weights *w, calib_table *t)
{
    char err[256];
    float most[CALIB_NTENSORS] = { 0 };
    float *logits = malloc((size_t)POOL * (size_t)w->classes * sizeof(float));
    ck_assert_ptr_nonnull(logits);
    engine_config cfg = { .device = ENGINE_DEVICE_CPU, .precision = ENGINE_PRECISION_FP32, .max_batch = POOL };
    engine *cpu = engine_create(w, &cfg, err, sizeof err);
    ck_assert_msg(cpu != NULL, "%s", err);
    ck_assert_msg(engine_cpu_observe(cpu, observe_max, most, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(engine_infer(cpu, pool, POOL, logits, err, sizeof err) == 0, "%s", err);
    engine_destroy(cpu);
    free(logits);
    memset(t, 0, sizeof *t);
    snprintf(t->weights_sha256, sizeof t->weights_sha256, "%s", calib_weights_id(w));
    for (int i = 0; i < CALIB_NTENSORS; i++) {
        ck_assert_msg(most[i] > 0, "tensor %d all zero", i);
        t->scale[i] = most[i] / 127.0f;
    }
}

/* 1 when this device runs INT8's general wgmma tiles. */
static int wgmma_usable(void)
{
    for (int t = 0; t < gpu_test_conv_tiles(2); t++)
        if (strncmp(gpu_test_conv_tile_name(2, t), "wgmma_s8_", 9) == 0 && gpu_test_conv_tile_usable(2, t) == 1)
            return 1;
    return 0;
}

/* engine/int8.h fixes every integer and every float of the convs, so the
 * last conv's FP32 output must equal the CPU INT8 engine's bit for bit;
 * only the average pool and the FC sum in another order (logits within
 * 1e-5, same top-1). Same images, FP32 inputs included (one with NaN,
 * infinities and huge values), both slots. */
static void run_int8(int small_batches)
{
    static const int full[] = { 1, 3, 17, 64, 255, 300 }, small[] = { 1, 3, 17 };
    small_batches |= quick;
    const int *batches = small_batches ? small : full;
    int nb = small_batches ? 3 : 6, max = small_batches ? 17 : 300;
    char err[256];
    setup_once(&imagenet);
    calib_table t;
    make_table(&imagenet.w, &t);
    engine_config cfg = { .device = ENGINE_DEVICE_CUDA,
                          .precision = ENGINE_PRECISION_INT8,
                          .max_batch = max,
                          .nslots = 2,
                          .calib = &t,
                          .tuning = tuning };
    engine *e = engine_create(&imagenet.w, &cfg, err, sizeof err);
    ck_assert_msg(e != NULL, "%s", err);
    check_programmatic(e, max);
    ck_assert_int_eq(e->precision, ENGINE_PRECISION_INT8);
    cfg.device = ENGINE_DEVICE_CPU;
    cfg.nslots = 1;
    engine *cpu = engine_create(&imagenet.w, &cfg, err, sizeof err);
    ck_assert_msg(cpu != NULL, "%s", err);
    const resnet18_conv_desc *last = &resnet18_convs[RESNET18_NUM_CONVS - 1];
    const size_t per = (size_t)last->out_h * last->out_h * last->cout, C = (size_t)e->classes;
    float *gpu_last = malloc((size_t)max * per * sizeof(float));
    uint16_t *feat = malloc((size_t)max * last->cout * sizeof *feat);
    int *which = malloc(sizeof(int) * max);
    /* An FP32 input with values no photo has: NaN quantises to 0, +-inf and
     * 1e30 clamp to +-127 (engine/int8.h), on both engines. */
    float *odd = malloc(RESNET18_INPUT_BYTES * sizeof(float));
    ck_assert(gpu_last && feat && which && odd);
    memcpy(odd, pool_f32, RESNET18_INPUT_BYTES * sizeof(float));
    for (int c = 0; c < 3; c++) {
        float *plane = odd + (size_t)c * RESNET18_IMG * RESNET18_IMG;
        plane[c] = NAN;
        plane[100 + c] = INFINITY;
        plane[200 + c] = -INFINITY;
        plane[300 + c] = 1e30f;
        plane[400 + c] = -1e30f;
    }
    for (int b = 0; b < nb; b++) {
        const int n = batches[b], s = b % 2;
        fill_slot(e, s, n, which);
        if (n > 1)
            e->input_f32[s][1] = odd;
        memcpy(cpu->input[0], e->input[s], (size_t)n * RESNET18_INPUT_BYTES);
        for (int i = 0; i < n; i++)
            cpu->input_f32[0][i] = e->input_f32[s][i];
        ck_assert_msg(engine_submit(e, s, n, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(engine_wait(e, s, err, sizeof err) == 0, "%s", err);
        const int kept = engine_cuda_last_conv(e, n, gpu_last, err, sizeof err);
        ck_assert_msg(kept >= 0, "%s", err);
        /* Where the general wgmma tiles run, a batch this large has more
         * than enough tiles for a plan without split-K: the pool inside. */
        ck_assert_msg(kept == 1 || n < 255 || !wgmma_usable() || tuning.pool == ENGINE_TUNE_SEPARATE,
                      "int8 n=%d: the pool did not run inside the last conv", n);
        ck_assert_msg(engine_cuda_features(e, n, feat, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(engine_submit(cpu, 0, n, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(engine_wait(cpu, 0, err, sizeof err) == 0, "%s", err);
        const float *cpu_last = engine_cpu_int8_last_conv(cpu);
        ck_assert_ptr_nonnull(cpu_last);
        size_t differ = 0, nonzero = 0, fdiffer = 0;
        for (size_t i = 0; i < (size_t)n * per; i++) {
            differ += kept == 0 && memcmp(&gpu_last[i], &cpu_last[i], sizeof(float)) != 0;
            nonzero += cpu_last[i] != 0.0f;
        }
        ck_assert_msg(differ == 0, "int8 n=%d: %zu of %zu last-conv values differ from the CPU INT8 engine's", n,
                      differ, (size_t)n * per);
        ck_assert_msg(nonzero > (size_t)n * per / 10, "int8 n=%d: only %zu non-zero outputs", n, nonzero);
        /* The features (the pool of engine/int8.h on the CPU's last conv),
         * bit for bit, whether the pool ran inside the last conv or not. */
        const int hw = last->out_h * last->out_h, C8 = last->cout;
        for (int i = 0; i < n; i++)
            for (int c = 0; c < C8; c++) {
                double sum = 0;
                for (int p = 0; p < hw; p++)
                    sum += cpu_last[((size_t)i * hw + p) * C8 + c];
                const float want = int8_round_half((float)(sum / hw)),
                            got = testutil_half_bits(feat[(size_t)i * C8 + c]);
                fdiffer += memcmp(&want, &got, sizeof want) != 0;
            }
        ck_assert_msg(fdiffer == 0, "int8 n=%d: %zu of %d features differ from engine/int8.h's pool", n, fdiffer,
                      n * C8);
        double worst = 0;
        for (int i = 0; i < n; i++) {
            const float *got = e->logits[s] + i * C, *ref = cpu->logits[0] + i * C;
            if (i == 1) /* the odd image: its logits are finite, and equal as the last conv showed */
                ck_assert(isfinite(got[0]) && isfinite(ref[0]));
            double rel = testutil_rel_l2(got, ref, C);
            worst = rel > worst ? rel : worst;
            int a, c;
            testutil_topk(got, (int)C, 1, &a);
            testutil_topk(ref, (int)C, 1, &c);
            ck_assert_msg(rel <= 1e-5 && a == c, "int8 n=%d image %d: rel L2 %.3g, top-1 %d vs CPU %d", n, i, rel, a,
                          c);
        }
        fprintf(stderr, "  int8 n=%3d slot %d: %s, features bit-exact, logits worst rel L2 %.3g\n", n, s,
                kept == 0 ? "last conv bit-exact" : "pool inside the last conv", worst);
    }
    free(gpu_last);
    free(feat);
    free(which);
    free(odd);
    engine_destroy(cpu);
    engine_destroy(e);
}

START_TEST(int8_matches_the_cpu_int8_engine_bit_for_bit)
{
    run_int8(0);
    /* The downsamples inside their conv2s at every bucket, and never (by
     * default the timing decides, bucket by bucket). */
    tune("downsample=inside");
    run_int8(1);
    tune("downsample=separate");
    run_int8(1);
    tune(NULL);
    tune("pdl=on");
    run_int8(1);
    tune("pdl=off");
    run_int8(1);
    tune(NULL);
    /* The pool's own kernel after the last conv, at every bucket. */
    tune("pool=separate");
    run_int8(1);
    tune(NULL);
}
END_TEST

/* Batch invariance (tests/lib/invariance.h) at max batch 256, a sample of sizes
 * that crosses every bucket edge: with engine_config.deterministic on every
 * precision, and INT8 by default (its sums are exact whatever the plan).
 * FP16 and FP32 without the option only say whether it held. */
static void run_invariance(engine_precision p, int deterministic, int must_hold)
{
    static const int sizes[] = { 1,  2,  3,  4,  5,  7,   8,   9,   15,  16,  17,  31,
                                 32, 33, 63, 64, 65, 100, 127, 128, 129, 200, 255, 256 };
    static const int small[] = { 1, 2, 3, 5, 8, 13, 16, 17 };
    const int nsizes = quick ? (int)(sizeof small / sizeof small[0]) : (int)(sizeof sizes / sizeof sizes[0]);
    char err[256], what[96];
    setup_once(&imagenet);
    calib_table t;
    if (p == ENGINE_PRECISION_INT8)
        make_table(&imagenet.w, &t);
    engine_config cfg = { .device = ENGINE_DEVICE_CUDA,
                          .precision = p,
                          .max_batch = quick ? 17 : 256,
                          .nslots = 2,
                          .deterministic = deterministic,
                          .calib = p == ENGINE_PRECISION_INT8 ? &t : NULL,
                          .tuning = tuning };
    engine *e = engine_create(&imagenet.w, &cfg, err, sizeof err);
    ck_assert_msg(e != NULL, "%s", err);
    snprintf(what, sizeof what, "cuda %s%s%s", engine_precision_name(p), deterministic ? " deterministic" : "",
             tuning.pool == ENGINE_TUNE_SEPARATE ? " pool separate" : "");
    invariance_check(e, pool, POOL, quick ? small : sizes, nsizes, what, must_hold);
    engine_destroy(e);
}

START_TEST(same_image_same_bits_at_any_position_and_batch_size)
{
    run_invariance(ENGINE_PRECISION_FP16, 1, 1);
    run_invariance(ENGINE_PRECISION_FP32, 1, 1);
    run_invariance(ENGINE_PRECISION_INT8, 1, 1);
    run_invariance(ENGINE_PRECISION_INT8, 0, 1);
    tune("pool=separate");
    run_invariance(ENGINE_PRECISION_INT8, 0, 1);
    tune(NULL);
    run_invariance(ENGINE_PRECISION_FP16, 0, 0);
    run_invariance(ENGINE_PRECISION_FP32, 0, 0);
}
END_TEST

/* ---- INT8 precision mixes --------------------------------------------------- */

static void load_npy(const char *name, const char *dtype, npy_array *a)
{
    char err[512];
    ck_assert_msg(npy_read(testutil_ref_path(name), a, err, sizeof err) == 0, "%s: %s", name, err);
    ck_assert_msg(strcmp(a->dtype, dtype) == 0, "%s: dtype %s, want %s", name, a->dtype, dtype);
}

/* Every float mix with the reference table on reference.py's random
 * images (see the top for the tolerance), then batch invariance; under the
 * base tuning with `variant` (NULL: none) after it. */
static void run_mixes(const char *variant)
{
    static const int sizes[] = { 1, 2, 3, 5, 8 };
    char err[512], what[128];
    setup_once(&imagenet);
    tune(variant);
    calib_table t;
    ck_assert_msg(calib_load(testutil_ref_path("int8/table.json"), &t, err, sizeof err) == 0, "%s", err);
    npy_array img, emu[CALIB_NMIXES];
    load_npy("random_u8.npy", "|u1", &img);
    const int n = (int)img.shape[0], C = imagenet.w.classes;
    ck_assert_int_ge(n, 8);
    const float *refs[CALIB_NMIXES];
    const char *names[CALIB_NMIXES];
    for (int m = 0; m < CALIB_NMIXES; m++) {
        names[m] = calib_mix_name((calib_mix)m);
        load_npy(testutil_mix_logits(names[m], 1), "<f4", &emu[m]);
        ck_assert_uint_eq(emu[m].count, (size_t)n * (size_t)C);
        refs[m] = emu[m].data;
    }
    for (int m = CALIB_MIX_STEM; m < CALIB_NMIXES; m++) {
        t.mix = (calib_mix)m;
        engine_config cfg = { .device = ENGINE_DEVICE_CUDA,
                              .precision = ENGINE_PRECISION_INT8,
                              .max_batch = n,
                              .calib = &t,
                              .tuning = tuning };
        engine *e = engine_create(&imagenet.w, &cfg, err, sizeof err);
        ck_assert_msg(e != NULL, "%s: %s", names[m], err);
        ck_assert_int_eq(e->precision, ENGINE_PRECISION_INT8);
        memcpy(e->input[0], img.data, (size_t)n * RESNET18_INPUT_BYTES);
        for (int i = 0; i < n; i++)
            e->input_f32[0][i] = NULL;
        memset(e->logits[0], 0xff, (size_t)e->max_batch * (size_t)C * sizeof(float));
        ck_assert_msg(engine_submit(e, 0, n, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(engine_wait(e, 0, err, sizeof err) == 0, "%s", err);
        snprintf(what, sizeof what, "cuda int8 %s%s%s", names[m], variant ? ", " : "", variant ? variant : "");
        testutil_expect_nearest(e->logits[0], refs, names, CALIB_NMIXES, m, n, C, MIX_TOL_MEAN, MIX_TOL_IMAGE, what);
        invariance_check(e, img.data, n, sizes, (int)(sizeof sizes / sizeof sizes[0]), what, 1);
        engine_destroy(e);
    }
    for (int m = 0; m < CALIB_NMIXES; m++)
        npy_free(&emu[m]);
    npy_free(&img);
    tune(NULL);
}

START_TEST(each_float_mix_matches_its_fp16_prefix_emulation)
{
    run_mixes(NULL);
    /* The prefix's stem as two kernels, and its downsamples apart (by
     * default the timing decides, bucket by bucket). */
    run_mixes("stem=separate");
    run_mixes("downsample=separate");
}
END_TEST

START_TEST(default_precision_is_fp16_and_layer_times_cover_every_op)
{
    char err[256];
    setup_once(&imagenet);
    engine_config cfg = { .device = ENGINE_DEVICE_CUDA, .max_batch = 8, .tuning = tuning };
    engine *e = engine_create(&imagenet.w, &cfg, err, sizeof err);
    ck_assert_msg(e != NULL, "%s", err);
    ck_assert_int_eq(e->precision, ENGINE_PRECISION_FP16);
    gpu_layer_time t[64];
    int n = engine_cuda_layer_times(e, 8, t, 64, err, sizeof err);
    ck_assert_msg(n == RESNET18_NUM_CONVS + 5, "%d ops: %s", n, err);
    for (int i = 0; i < n; i++)
        ck_assert(t[i].name && t[i].ms >= 0);
    double h2d, comp, d2h;
    ck_assert_msg(engine_cuda_phase_times(e, 8, &h2d, &comp, &d2h, err, sizeof err) == 0, "%s", err);
    ck_assert(h2d > 0 && comp > 0 && d2h > 0);
    engine_destroy(e);
}
END_TEST

START_TEST(rejects_bad_slot_and_batch)
{
    char err[256];
    setup_once(&imagenet);
    engine_config cfg = {
        .device = ENGINE_DEVICE_CUDA, .precision = ENGINE_PRECISION_FP16, .max_batch = 4, .tuning = tuning
    };
    engine *e = engine_create(&imagenet.w, &cfg, err, sizeof err);
    ck_assert_msg(e != NULL, "%s", err);
    ck_assert_int_eq(engine_submit(e, 2, 1, err, sizeof err), -1);
    ck_assert_int_eq(engine_submit(e, 0, 5, err, sizeof err), -1);
    ck_assert_int_eq(engine_submit(e, 0, 0, err, sizeof err), -1);
    engine_destroy(e);
}
END_TEST

int main(void)
{
    if (gpu_device_count() == 0) {
        fprintf(stderr, "no CUDA device: skipping\n");
        return 77;
    }
    testutil_require_reference();
    const char *q = getenv("RESNETD_GPU_TEST_QUICK");
    quick = q && strcmp(q, "1") == 0;
    base_tuning = getenv("RESNETD_GPU_TUNING");
    {
        char err[256];
        if (engine_tuning_parse(base_tuning, &tuning, err, sizeof err) != 0) {
            fprintf(stderr, "RESNETD_GPU_TUNING: %s\n", err);
            return 1;
        }
    }
    setenv("CK_FORK", "no", 1); /* a CUDA context does not survive fork() */
    /* One case per precision, so that each can run alone (CK_RUN_CASE=fp16)
     * under compute-sanitizer, whose racecheck is slow. */
    Suite *s = suite_create("engine_cuda");
    TCase *fp32 = tcase_create("fp32"), *fp16 = tcase_create("fp16"), *api = tcase_create("api");
    TCase *heads = tcase_create("heads"), *int8 = tcase_create("int8");
    tcase_set_timeout(int8, 1200);
    tcase_add_test(int8, int8_matches_the_cpu_int8_engine_bit_for_bit);
    TCase *mix = tcase_create("mix");
    tcase_set_timeout(mix, 1200);
    tcase_add_test(mix, each_float_mix_matches_its_fp16_prefix_emulation);
    tcase_set_timeout(fp32, 1200);
    tcase_set_timeout(fp16, 1200);
    tcase_set_timeout(heads, 1200);
    tcase_set_timeout(api, 600);
    tcase_add_test(fp32, fp32_matches_cpu_engine_within_1e5);
    tcase_add_test(fp16, fp16_matches_cpu_engine_within_5e3_same_top1);
    tcase_add_test(heads, fine_tuned_10_class_head_matches_cpu_engine_fp32_and_fp16);
    tcase_add_test(heads, head_of_3_classes_ranks_only_3_on_the_gpu);
    tcase_add_test(api, default_precision_is_fp16_and_layer_times_cover_every_op);
    tcase_add_test(api, rejects_bad_slot_and_batch);
    TCase *inv = tcase_create("invariance");
    tcase_set_timeout(inv, 1200);
    tcase_add_test(inv, same_image_same_bits_at_any_position_and_batch_size);
    suite_add_tcase(s, inv);
    suite_add_tcase(s, fp32);
    suite_add_tcase(s, fp16);
    suite_add_tcase(s, heads);
    suite_add_tcase(s, int8);
    suite_add_tcase(s, mix);
    suite_add_tcase(s, api);
    int rc = testutil_run(s);
    model_free(&imagenet);
    model_free(&ft10);
    model_free(&head3);
    free(pool);
    free(pool_f32);
    return rc;
}
