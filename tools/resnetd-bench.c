/* resnetd-bench: times the shipped engines and the JPEG preprocessing.
 *
 * The engine part drives the real engine through the engine interface
 * (engine_create, then engine_submit + engine_wait on a slot filled with
 * random bytes), so it times exactly what the daemon runs. Per batch size:
 * warm-up, then --iters timed batches; ms/batch is their median. The decode
 * part runs preprocess_jpeg over every JPEG of a directory with N threads,
 * one preprocess context per thread; img/s is the median over passes. With
 * --decode gpu it times the GPU decode path instead: the device decoder
 * (nvJPEG hardware decode + resize + crop into a CUDA engine slot, stage
 * after stage as the batcher does) over the files the hardware accepts,
 * whose headers are checked first, as the daemon's decode threads do.
 *
 * With --gpus LIST|all it also times the engines the daemon's
 * device = cuda:LIST runs: one engine per GPU, each kept busy by its own
 * thread with two slots in flight, all at once; img/s for the first GPU
 * alone and for all of them, by the same method, and their ratio.
 *
 * Each measurement is one row in a results list, printed as a table or as one
 * JSON object (--json); a new measurement (another precision, per-layer
 * times, pipeline overlap) is a new row kind, not a new program. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "config.h"
#include "engine/calib.h"
#include "util/clock.h"
#include "image/devjpeg.h"
#include "image/devjpeg_registry.h"
#include "engine/engine.h"
#include "engine/engine_cpu.h"
#include "engine/engine_registry.h"
#include "image/preprocess.h"
#include "model/resnet18.h"
#include "tools/bench_decode.h"
#include "tools/toolopt.h"
#ifdef HAVE_CUDA
#include "gpu/gpu.h"
#endif

#define BENCH_MAX_BATCHES 16
#define BENCH_MAX_BATCH 4096
#define BENCH_WARMUP 2

typedef struct bench_opts {
    engine_config ecfg;
    const char *weights; /* path or "synthetic" */
    const char *calibration; /* INT8 calibration table, or NULL */
    int int8_mix_given; /* --int8-mix: run the table at int8_mix, not at its own mix */
    calib_mix int8_mix;
    int batches[BENCH_MAX_BATCHES];
    int nbatches;
    int iters;
    const char *decode_dir;
    int decode_only;
    int decode_threads;
    int decode_gpu; /* --decode gpu or gpu-exact */
    int decode_exact; /* --decode gpu-exact */
    int decode_batch; /* --decode gpu: images per stage */
    long decode_memory_mib; /* --decode gpu: the arena; 0: the daemon's auto */
    int json;
    int layers; /* CUDA: per-layer times at each batch size */
    int pipeline_batch; /* >0: time the two-slot pipeline at this batch */
    int gpus[ENGINE_MAX_DEVICES]; /* --gpus: CUDA devices to run at once */
    int ngpus; /* 0: no multi-GPU rows */
    int gpus_all; /* --gpus all: every device */
} bench_opts;

/* Engines on several GPUs at once, at one batch size. */
typedef struct multi_result {
    int batch;
    double one_img_per_s; /* the first GPU alone */
    double all_img_per_s; /* every GPU at once */
    int ngpus;
} multi_result;

/* One engine measurement: a batch size at one precision. */
typedef struct engine_result {
    int batch;
    double ms_per_batch; /* median */
    double ms_min, ms_max;
    double img_per_s;
    double gflops;
    double gpu_ms; /* CUDA: median compute time of the graph alone, 0 elsewhere */
    int programmatic; /* CUDA: the graph launches its kernels programmatically */
    double h2d_ms, d2h_ms; /* CUDA: median copy times */
} engine_result;

/* The two-slot pipeline at one batch size, through the engine interface. */
typedef struct pipeline_result {
    int batch;
    double serial_ms; /* per batch: submit + wait on one slot */
    double overlap_ms; /* per batch: two slots kept in flight */
    double compute_ms; /* CUDA: graph alone (0 elsewhere) */
    double copy_ms; /* CUDA: h2d + d2h */
    double hidden; /* fraction of copy time hidden: (serial - overlap) / copy */
} pipeline_result;

#define BENCH_MAX_LAYERS 32
typedef struct layer_result {
    int batch;
    int n;
#ifdef HAVE_CUDA
    gpu_layer_time t[BENCH_MAX_LAYERS];
#endif
} layer_result;

/* What the engine part measured, besides the per-batch rows. */
typedef struct engine_extras {
    size_t device_bytes, pinned_bytes;
    const char *int8_tile; /* the CPU INT8 engine's GEMM tile, else NULL */
    int has_pipeline;
    pipeline_result pipe;
    layer_result layers[BENCH_MAX_BATCHES];
    int nlayers;
} engine_extras;

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: resnetd-bench [OPTION]...\n"
            "Time ResNet18 inference through the engine interface, and JPEG preprocessing.\n\n"
            "  --device D           cpu, cuda, cuda:N or auto (default auto)\n"
            "  --precision P        fp32, fp16 or int8 (default: the engine's default)\n"
            "  --calibration FILE   INT8 calibration table for the weights (resnetd-calibrate)\n"
            "  --int8-mix M         run the table at precision mix M instead of its own: int8,\n"
            "                       float:stem, float:layer1.0, float:layer1, ... float:layer3\n"
            "                       (one table times every mix)\n"
            "  --deterministic      the same bits for an image at any batch position and size\n"
            "                       (the config's deterministic; CUDA FP16/FP32 plan for it)\n"
            "  --gpu-tuning LIST    CUDA engine overrides, as the config's gpu_tuning\n"
            "                       (autotune=off|log, stem=separate (FP16), pool=separate, ...)\n"
            "  --weights F          safetensors weights, or 'synthetic' (default)\n"
            "  --batches LIST       comma-separated batch sizes (default 1,8,32)\n"
            "  --iters N            timed batches per size, after %d warm-up (default 10)\n"
            "  --threads N          CPU engine threads (default: all cores)\n"
            "  --decode-dir DIR     also time preprocessing of every *.jpg/*.jpeg in DIR\n"
            "  --decode-threads N   preprocessing threads (default: all cores)\n"
            "  --decode-only        time only the preprocessing\n"
            "  --decode MODE        preprocessing on the cpu (libjpeg-turbo, default) or the gpu\n"
            "                       (nvJPEG hardware decoder + resize/crop into the CUDA engine);\n"
            "                       gpu-exact: the GPU path with libjpeg-exact pixels\n"
            "  --decode-batch N     --decode gpu: images per batch (default 128)\n"
            "  --decode-memory MIB  --decode gpu: GPU memory for decoded pixels (default: as the\n"
            "                       daemon's gpu_decode_memory = auto)\n"
            "  --json               print one JSON object\n"
            "  --layers             CUDA: per-layer GPU times at each batch size\n"
            "  --pipeline B         time the two-slot pipeline at batch B: overlap on vs off\n"
            "  --gpus LIST|all      also run an engine per listed CUDA device at once (0,1 or all)\n"
            "                       at each batch size: img/s on the first alone and on all\n"
            "  --help\n",
            BENCH_WARMUP);
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_batches(const char *s, bench_opts *o)
{
    char buf[256];
    if (strlen(s) >= sizeof buf)
        return -1;
    strcpy(buf, s);
    o->nbatches = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        long v;
        if (o->nbatches == BENCH_MAX_BATCHES || parse_int(tok, 1, BENCH_MAX_BATCH, &v) != 0)
            return -1;
        o->batches[o->nbatches++] = (int)v;
    }
    return o->nbatches > 0 ? 0 : -1;
}

/* An integer option's value in lo..hi into *out; 0, or -1 after saying why. */
static int int_arg(const char *name, const char *arg, long lo, long hi, long *out)
{
    if (parse_int(arg, lo, hi, out) == 0)
        return 0;
    fprintf(stderr, "resnetd-bench: --%s must be %ld..%ld, got '%s'\n", name, lo, hi, arg);
    return -1;
}

static int parse_decode(const char *arg, bench_opts *o)
{
    if (strcmp(arg, "cpu") != 0 && strcmp(arg, "gpu") != 0 && strcmp(arg, "gpu-exact") != 0) {
        fprintf(stderr, "resnetd-bench: --decode must be cpu, gpu or gpu-exact, got '%s'\n", arg);
        return -1;
    }
    o->decode_gpu = strcmp(arg, "cpu") != 0;
    o->decode_exact = strcmp(arg, "gpu-exact") == 0;
    return 0;
}

static int parse_gpus(const char *arg, bench_opts *o)
{
    char spec[256];
    engine_device d;
    snprintf(spec, sizeof spec, "cuda:%s", arg);
    if (engine_parse_devices(spec, &d, o->gpus, ENGINE_MAX_DEVICES, &o->ngpus) != 0) {
        fprintf(stderr, "resnetd-bench: --gpus must be a list like 0,1 or all, got '%s'\n", arg);
        return -1;
    }
    o->gpus_all = o->ngpus == 0;
    return 0;
}

enum {
    OPT_DEVICE = 256,
    OPT_PRECISION,
    OPT_WEIGHTS,
    OPT_BATCHES,
    OPT_ITERS,
    OPT_THREADS,
    OPT_DECODE_DIR,
    OPT_DECODE_THREADS,
    OPT_DECODE_ONLY,
    OPT_JSON,
    OPT_HELP,
    OPT_LAYERS,
    OPT_PIPELINE,
    OPT_DECODE,
    OPT_DECODE_BATCH,
    OPT_GPUS,
    OPT_CALIB,
    OPT_DETERMINISTIC,
    OPT_DECODE_MEMORY,
    OPT_GPU_TUNING,
    OPT_INT8_MIX
};

/* One option c with its argument into o; 0, or -1 after saying why. */
static int parse_one(int c, const char *arg, bench_opts *o)
{
    long v = 0;
    int rc = 0;
    switch (c) {
    case OPT_DEVICE: return toolopt_device("resnetd-bench", arg, &o->ecfg);
    case OPT_PRECISION: return toolopt_precision("resnetd-bench", arg, &o->ecfg);
    case OPT_GPU_TUNING: return toolopt_tuning("resnetd-bench", arg, &o->ecfg);
    case OPT_WEIGHTS: o->weights = arg; return 0;
    case OPT_CALIB: o->calibration = arg; return 0;
    case OPT_INT8_MIX:
        o->int8_mix_given = 1;
        if (calib_parse_mix(arg, &o->int8_mix) == 0)
            return 0;
        fprintf(stderr, "resnetd-bench: --int8-mix must be " CALIB_MIX_NAMES ", got '%s'\n", arg);
        return -1;
    case OPT_DETERMINISTIC: o->ecfg.deterministic = 1; return 0;
    case OPT_BATCHES:
        if (parse_batches(arg, o) == 0)
            return 0;
        fprintf(stderr, "resnetd-bench: --batches must be up to %d sizes in 1..%d, got '%s'\n", BENCH_MAX_BATCHES,
                BENCH_MAX_BATCH, arg);
        return -1;
    case OPT_ITERS:
        rc = int_arg("iters", arg, 1, 1000000, &v);
        o->iters = (int)v;
        return rc;
    case OPT_THREADS:
        rc = int_arg("threads", arg, 0, 256, &v);
        o->ecfg.threads = (int)v;
        return rc;
    case OPT_DECODE_DIR: o->decode_dir = arg; return 0;
    case OPT_DECODE_THREADS:
        rc = int_arg("decode-threads", arg, 1, 256, &v);
        o->decode_threads = (int)v;
        return rc;
    case OPT_DECODE_ONLY: o->decode_only = 1; return 0;
    case OPT_DECODE: return parse_decode(arg, o);
    case OPT_DECODE_BATCH:
        rc = int_arg("decode-batch", arg, 1, BENCH_MAX_BATCH, &v);
        o->decode_batch = (int)v;
        return rc;
    case OPT_DECODE_MEMORY:
        rc = int_arg("decode-memory", arg, 16, 65536, &v);
        o->decode_memory_mib = v;
        return rc;
    case OPT_JSON: o->json = 1; return 0;
    case OPT_LAYERS: o->layers = 1; return 0;
    case OPT_PIPELINE:
        rc = int_arg("pipeline", arg, 1, BENCH_MAX_BATCH, &v);
        o->pipeline_batch = (int)v;
        return rc;
    case OPT_GPUS: return parse_gpus(arg, o);
    case OPT_HELP: usage(stdout); exit(0);
    default: usage(stderr); return -1;
    }
}

static int parse_args(int argc, char **argv, bench_opts *o)
{
    static const struct option longopts[] = {
        { "device", required_argument, NULL, OPT_DEVICE },
        { "precision", required_argument, NULL, OPT_PRECISION },
        { "gpu-tuning", required_argument, NULL, OPT_GPU_TUNING },
        { "weights", required_argument, NULL, OPT_WEIGHTS },
        { "batches", required_argument, NULL, OPT_BATCHES },
        { "iters", required_argument, NULL, OPT_ITERS },
        { "threads", required_argument, NULL, OPT_THREADS },
        { "decode-dir", required_argument, NULL, OPT_DECODE_DIR },
        { "decode-threads", required_argument, NULL, OPT_DECODE_THREADS },
        { "decode-only", no_argument, NULL, OPT_DECODE_ONLY },
        { "decode", required_argument, NULL, OPT_DECODE },
        { "decode-batch", required_argument, NULL, OPT_DECODE_BATCH },
        { "decode-memory", required_argument, NULL, OPT_DECODE_MEMORY },
        { "json", no_argument, NULL, OPT_JSON },
        { "layers", no_argument, NULL, OPT_LAYERS },
        { "pipeline", required_argument, NULL, OPT_PIPELINE },
        { "gpus", required_argument, NULL, OPT_GPUS },
        { "calibration", required_argument, NULL, OPT_CALIB },
        { "int8-mix", required_argument, NULL, OPT_INT8_MIX },
        { "deterministic", no_argument, NULL, OPT_DETERMINISTIC },
        { "help", no_argument, NULL, OPT_HELP },
        { NULL, 0, NULL, 0 },
    };
    memset(o, 0, sizeof *o);
    o->ecfg.device = ENGINE_DEVICE_AUTO;
    o->weights = "synthetic";
    o->iters = 10;
    o->decode_batch = 128;
    parse_batches("1,8,32", o);
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1)
        if (parse_one(c, optarg, o) != 0)
            return -1;
    if (optind < argc) {
        fprintf(stderr, "resnetd-bench: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (o->int8_mix_given && !o->calibration) {
        fprintf(stderr, "resnetd-bench: --int8-mix needs --calibration\n");
        return -1;
    }
    if (o->decode_only && !o->decode_dir) {
        fprintf(stderr, "resnetd-bench: --decode-only needs --decode-dir\n");
        return -1;
    }
    if (o->decode_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        o->decode_threads = n > 0 ? (int)n : 1;
    }
    return 0;
}

/* ---- engine ------------------------------------------------------------ */

static int bench_engine_batch(engine *e, int batch, int iters, engine_result *r, char *err, size_t errlen)
{
    double *ms = malloc((size_t)iters * sizeof *ms);
    if (!ms) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < BENCH_WARMUP + iters; i++) {
        uint64_t t0 = clock_now_ns();
        if (engine_submit(e, 0, batch, err, errlen) != 0 || engine_wait(e, 0, err, errlen) != 0) {
            free(ms);
            return -1;
        }
        if (i >= BENCH_WARMUP)
            ms[i - BENCH_WARMUP] = (double)(clock_now_ns() - t0) / 1e6;
    }
    r->batch = batch;
    r->ms_per_batch = toolopt_median(ms, iters);
    r->ms_min = ms[0];
    r->ms_max = ms[iters - 1];
    r->img_per_s = batch * 1000.0 / r->ms_per_batch;
    r->gflops = r->img_per_s * 2.0 * resnet18_macs_per_image(e->classes) / 1e9;
    r->gpu_ms = r->h2d_ms = r->d2h_ms = 0;
    r->programmatic = 0;
#ifdef HAVE_CUDA
    if (e->device == ENGINE_DEVICE_CUDA) {
        /* The graph alone, as PyTorch is timed: inputs already on the GPU. */
        double *h2d = malloc((size_t)iters * sizeof *h2d), *d2h = malloc((size_t)iters * sizeof *d2h);
        int rc = h2d && d2h ? 0 : -1;
        for (int i = 0; rc == 0 && i < iters; i++)
            rc = engine_cuda_phase_times(e, batch, &h2d[i], &ms[i], &d2h[i], err, errlen);
        if (rc == 0) {
            r->programmatic = engine_cuda_programmatic(e, batch) == 1;
            r->gpu_ms = toolopt_median(ms, iters);
            r->h2d_ms = toolopt_median(h2d, iters);
            r->d2h_ms = toolopt_median(d2h, iters);
        }
        free(h2d);
        free(d2h);
        if (rc != 0) {
            free(ms);
            return -1;
        }
    }
#endif
    free(ms);
    return 0;
}

/* Serial (one slot: submit, wait) against overlapped (two slots in flight)
 * over the same number of batches; per-batch medians of 5 rounds. */
static int bench_pipeline(engine *e, int batch, int iters, pipeline_result *r, char *err, size_t errlen)
{
    enum { ROUNDS = 5 };
    double serial[ROUNDS], overlap[ROUNDS];
    if (e->nslots < 2) {
        snprintf(err, errlen, "the pipeline needs an engine with two slots (this one has %d)", e->nslots);
        return -1;
    }
    int n = iters < 4 ? 4 : iters;
    for (int round = 0; round < ROUNDS; round++) {
        uint64_t t0 = clock_now_ns();
        for (int i = 0; i < n; i++)
            if (engine_submit(e, 0, batch, err, errlen) != 0 || engine_wait(e, 0, err, errlen) != 0)
                return -1;
        serial[round] = (double)(clock_now_ns() - t0) / 1e6 / n;
        t0 = clock_now_ns();
        if (engine_submit(e, 0, batch, err, errlen) != 0)
            return -1;
        for (int i = 1; i < n; i++) {
            int s = i % 2;
            if (engine_submit(e, s, batch, err, errlen) != 0 || engine_wait(e, !s, err, errlen) != 0)
                return -1;
        }
        if (engine_wait(e, (n - 1) % 2, err, errlen) != 0)
            return -1;
        overlap[round] = (double)(clock_now_ns() - t0) / 1e6 / n;
    }
    r->batch = batch;
    r->serial_ms = toolopt_median(serial, ROUNDS);
    r->overlap_ms = toolopt_median(overlap, ROUNDS);
    r->compute_ms = r->copy_ms = r->hidden = 0;
#ifdef HAVE_CUDA
    if (e->device == ENGINE_DEVICE_CUDA) {
        double h2d, comp, d2h;
        if (engine_cuda_phase_times(e, batch, &h2d, &comp, &d2h, err, errlen) != 0)
            return -1;
        r->compute_ms = comp;
        r->copy_ms = h2d + d2h;
        double hidden = (r->serial_ms - r->overlap_ms) / r->copy_ms;
        r->hidden = hidden < 0 ? 0 : hidden > 1 ? 1 : hidden;
    }
#endif
    return 0;
}

/* Creates one engine sized for the largest batch and times every size. */
static int bench_engine(const bench_opts *o, const resnet18_weights *w, engine_result *res, engine *info,
                        engine_extras *x, char *err, size_t errlen)
{
    engine_config cfg = o->ecfg;
    cfg.max_batch = o->pipeline_batch;
    for (int i = 0; i < o->nbatches; i++)
        if (o->batches[i] > cfg.max_batch)
            cfg.max_batch = o->batches[i];
    engine *e = engine_create(w, &cfg, err, errlen);
    if (!e)
        return -1;
    /* Random pixels: an all-zero input could take faster paths. */
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int slot = 0; slot < e->nslots; slot++)
        for (size_t i = 0; i < (size_t)cfg.max_batch * RESNET18_INPUT_BYTES; i++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            e->input[slot][i] = (uint8_t)(s >> 32);
        }
    *info = *e;
    int rc = 0;
    for (int i = 0; i < o->nbatches && rc == 0; i++)
        rc = bench_engine_batch(e, o->batches[i], o->iters, &res[i], err, errlen);
    x->int8_tile = engine_cpu_int8_tile(e);
    x->device_bytes = engine_device_memory(e);
    x->pinned_bytes = engine_pinned_memory(e);
    if (rc == 0 && o->pipeline_batch > 0) {
        rc = bench_pipeline(e, o->pipeline_batch, o->iters, &x->pipe, err, errlen);
        x->has_pipeline = rc == 0;
    }
#ifdef HAVE_CUDA
    if (rc == 0 && o->layers && e->device == ENGINE_DEVICE_CUDA)
        for (int i = 0; i < o->nbatches && rc == 0; i++) {
            layer_result *L = &x->layers[x->nlayers];
            L->batch = o->batches[i];
            L->n = engine_cuda_layer_times(e, L->batch, L->t, BENCH_MAX_LAYERS, err, errlen);
            if (L->n < 0)
                rc = -1;
            else
                x->nlayers++;
        }
#endif
    engine_destroy(e);
    return rc;
}

/* ---- several GPUs at once ------------------------------------------------ */

typedef struct multi_worker {
    engine *e;
    int batch, iters;
    pthread_barrier_t *start;
    int rc;
    char err[256];
} multi_worker;

/* Two slots in flight, as the daemon's pipeline keeps them. */
static void *multi_thread(void *p)
{
    multi_worker *w = p;
    engine *e = w->e;
    pthread_barrier_wait(w->start);
    w->rc = engine_submit(e, 0, w->batch, w->err, sizeof w->err);
    for (int i = 1; i < w->iters && w->rc == 0; i++) {
        int s = i % e->nslots;
        w->rc = engine_submit(e, s, w->batch, w->err, sizeof w->err);
        if (w->rc == 0)
            w->rc = engine_wait(e, (i - 1) % e->nslots, w->err, sizeof w->err);
    }
    if (w->rc == 0)
        w->rc = engine_wait(e, (w->iters - 1) % e->nslots, w->err, sizeof w->err);
    return NULL;
}

/* img/s of engines[0..n) run at once at batch b: each does a warm-up
 * round, then iters batches; wall time from a common start. */
static int multi_run(engine **engines, int n, int batch, int iters, double *img_per_s, char *err, size_t errlen)
{
    multi_worker w[ENGINE_MAX_DEVICES];
    pthread_t th[ENGINE_MAX_DEVICES];
    pthread_barrier_t start;
    for (int round = 0; round < 2; round++) {
        if (pthread_barrier_init(&start, NULL, (unsigned)n + 1) != 0) {
            snprintf(err, errlen, "cannot create a barrier");
            return -1;
        }
        int started = 0;
        for (int i = 0; i < n; i++) {
            w[i] = (multi_worker){ .e = engines[i], .batch = batch, .iters = round ? iters : 2, .start = &start };
            if (pthread_create(&th[i], NULL, multi_thread, &w[i]) != 0)
                break;
            started++;
        }
        if (started < n) {
            /* the started ones wait at the barrier for n + 1: they are not
             * joinable without it, so this is a fatal set-up error */
            fprintf(stderr, "resnetd-bench: cannot start engine threads\n");
            exit(1);
        }
        pthread_barrier_wait(&start);
        uint64_t t0 = clock_now_ns();
        for (int i = 0; i < n; i++)
            pthread_join(th[i], NULL);
        double s = (double)(clock_now_ns() - t0) / 1e9;
        pthread_barrier_destroy(&start);
        for (int i = 0; i < n; i++)
            if (w[i].rc != 0) {
                snprintf(err, errlen, "%s", w[i].err);
                return -1;
            }
        *img_per_s = (double)n * iters * batch / s;
    }
    return 0;
}

static int bench_multi(const bench_opts *o, const resnet18_weights *wts, multi_result *res, int *nres, char *err,
                       size_t errlen)
{
    int gpus[ENGINE_MAX_DEVICES], n = o->ngpus;
    memcpy(gpus, o->gpus, sizeof gpus);
    if (o->gpus_all) {
        n = engine_cuda_device_count();
        n = n > ENGINE_MAX_DEVICES ? ENGINE_MAX_DEVICES : n;
        for (int i = 0; i < n; i++)
            gpus[i] = i;
    }
    if (n == 0) {
        snprintf(err, errlen, "--gpus: no CUDA device is usable");
        return -1;
    }
    engine *e[ENGINE_MAX_DEVICES] = { 0 };
    engine_config cfg = o->ecfg;
    cfg.device = ENGINE_DEVICE_CUDA;
    cfg.max_batch = 1;
    for (int i = 0; i < o->nbatches; i++)
        cfg.max_batch = o->batches[i] > cfg.max_batch ? o->batches[i] : cfg.max_batch;
    int rc = 0, made = 0;
    for (; made < n && rc == 0; made++) {
        cfg.device_index = gpus[made];
        if (!(e[made] = engine_create(wts, &cfg, err, errlen)))
            rc = -1;
        else
            for (int s = 0; s < e[made]->nslots; s++)
                memset(e[made]->input[s], 0x5a, (size_t)cfg.max_batch * RESNET18_INPUT_BYTES);
    }
    for (int i = 0; i < o->nbatches && rc == 0; i++) {
        multi_result *r = &res[i];
        r->batch = o->batches[i];
        r->ngpus = n;
        rc = multi_run(e, 1, r->batch, o->iters, &r->one_img_per_s, err, errlen);
        if (rc == 0)
            rc = multi_run(e, n, r->batch, o->iters, &r->all_img_per_s, err, errlen);
        *nres = i + 1;
    }
    for (int i = 0; i < made; i++)
        engine_destroy(e[i]);
    return rc;
}

/* ---- output --------------------------------------------------------------- */

static void print_multi(const multi_result *m, int n)
{
    for (int i = 0; i < n; i++)
        printf("gpus b=%d: 1 GPU %.1f img/s, %d GPUs at once %.1f img/s: %.2fx\n", m[i].batch, m[i].one_img_per_s,
               m[i].ngpus, m[i].all_img_per_s, m[i].all_img_per_s / m[i].one_img_per_s);
}

/* The INT8 engine's precision mix ("int8", "float:layer1", ...); NULL at
 * other precisions. */
static const char *int8_mix(const bench_opts *o, const engine *info)
{
    return info->precision == ENGINE_PRECISION_INT8 && o->ecfg.calib ? calib_mix_name(o->ecfg.calib->mix) : NULL;
}

static void print_table(const bench_opts *o, const engine *info, const engine_result *res, const engine_extras *x,
                        const decode_result *dec)
{
    if (!o->decode_only) {
        int cuda = info->device == ENGINE_DEVICE_CUDA;
        const char *tile = x->int8_tile, *mix = int8_mix(o, info);
        char tuning[128];
        engine_tuning_format(&o->ecfg.tuning, tuning, sizeof tuning);
        printf("engine: %s, %s%s%s%s%s%s%s%s%s, weights %s (%d classes), %d warm-up + %d timed batches (median)\n",
               engine_device_name(info->device), engine_precision_name(info->precision), tile ? " (" : "",
               tile ? tile : "", tile ? " tile)" : "", mix ? ", mix " : "", mix ? mix : "",
               o->ecfg.deterministic ? ", deterministic" : "", tuning[0] ? ", tuning " : "", tuning, o->weights,
               info->classes, BENCH_WARMUP, o->iters);
        if (cuda)
            printf("(ms/batch: submit to wait, copies included; gpu: the graph alone, inputs on the GPU;\n"
                   " pdl: its kernels launched programmatically, where timed faster)\n");
        printf("%6s %12s %10s %10s", "batch", "ms/batch", "img/s", "GFLOP/s");
        if (cuda)
            printf(" %10s %10s %10s %9s %9s %4s", "gpu ms", "gpu img/s", "gpu TFLOP/s", "h2d ms", "d2h ms", "pdl");
        printf("\n");
        for (int i = 0; i < o->nbatches; i++) {
            printf("%6d %12.3f %10.1f %10.1f", res[i].batch, res[i].ms_per_batch, res[i].img_per_s, res[i].gflops);
            if (cuda && res[i].gpu_ms > 0)
                printf(" %10.3f %10.1f %10.1f %9.3f %9.3f %4s", res[i].gpu_ms, res[i].batch * 1000.0 / res[i].gpu_ms,
                       res[i].batch / res[i].gpu_ms * 2.0 * resnet18_macs_per_image(info->classes) / 1e9, res[i].h2d_ms,
                       res[i].d2h_ms, res[i].programmatic ? "yes" : "no");
            printf("\n");
        }
        if (x->device_bytes || x->pinned_bytes)
            printf("memory: device %.1f MiB, pinned host %.1f MiB (max batch %d, %d slots)\n",
                   x->device_bytes / 1048576.0, x->pinned_bytes / 1048576.0, info->max_batch, info->nslots);
        if (x->has_pipeline) {
            const pipeline_result *p = &x->pipe;
            printf("pipeline b=%d: serial %.3f ms/batch (%.0f img/s), two slots %.3f ms/batch (%.0f img/s), "
                   "speed-up %.2fx",
                   p->batch, p->serial_ms, p->batch * 1000.0 / p->serial_ms, p->overlap_ms,
                   p->batch * 1000.0 / p->overlap_ms, p->serial_ms / p->overlap_ms);
            if (p->copy_ms > 0)
                printf("; compute alone %.3f ms, copies %.3f ms, %.0f%% of copy time hidden", p->compute_ms, p->copy_ms,
                       100 * p->hidden);
            printf("\n");
        }
#ifdef HAVE_CUDA
        for (int l = 0; l < x->nlayers; l++) {
            const layer_result *L = &x->layers[l];
            double total = 0;
            for (int j = 0; j < L->n; j++)
                total += L->t[j].ms;
            printf("layers at batch %d (op by op, not graphed: %.3f ms total)\n", L->batch, total);
            for (int j = 0; j < L->n; j++)
                printf("  %-24s %9.3f ms %5.1f%%  %s%s\n", L->t[j].name, L->t[j].ms, 100 * L->t[j].ms / total,
                       L->t[j].tile ? L->t[j].tile : "", L->t[j].splits > 1 ? " split-K" : "");
        }
#endif
    }
    if (o->decode_dir && !o->decode_gpu)
        printf("decode: %d files from %s, %d threads: %.1f img/s (median of %d passes)\n", dec->files, o->decode_dir,
               dec->threads, dec->img_per_s, o->iters < 3 ? 3 : o->iters);
    if (o->decode_dir && o->decode_gpu) {
        printf("decode (%s: nvJPEG hardware + resize/crop into the engine slot): %d files from %s, %d refused by "
               "the hardware",
               o->decode_exact ? "gpu-exact" : "gpu", dec->files, o->decode_dir, dec->refused);
        for (int k = DEVJPEG_OK + 1; k < DEVJPEG_NREASONS; k++)
            if (dec->refused_by[k])
                printf(" (%s %d)", devjpeg_reason_name((devjpeg_reason)k), dec->refused_by[k]);
        printf("; batch %d, %d images per pass: %.1f img/s (median of %d passes)\n", o->decode_batch, dec->images,
               dec->img_per_s, o->iters < 3 ? 3 : o->iters);
        printf("decode (cpu beside it, %d threads%s): %.1f img/s on the files the hardware takes, %.1f on those it "
               "refuses; mixed ceiling of this corpus, both together: %.1f img/s\n",
               dec->threads, o->decode_exact ? "" : ", large photos DCT-scaled", dec->cpu_accepted_img_per_s,
               dec->cpu_refused_img_per_s, dec->mixed_img_per_s);
    }
}

static int print_json(const bench_opts *o, const engine *info, const engine_result *res, const engine_extras *x,
                      const decode_result *dec, const multi_result *multi, int nmulti)
{
    json_t *root = json_object();
    if (!root)
        return -1;
    if (!o->decode_only) {
        json_t *rows = json_array();
        json_object_set_new(root, "device", json_string(engine_device_name(info->device)));
        json_object_set_new(root, "precision", json_string(engine_precision_name(info->precision)));
        if (x->int8_tile)
            json_object_set_new(root, "int8_tile", json_string(x->int8_tile));
        if (int8_mix(o, info))
            json_object_set_new(root, "int8_mix", json_string(int8_mix(o, info)));
        json_object_set_new(root, "weights", json_string(o->weights));
        json_object_set_new(root, "classes", json_integer(info->classes));
        json_object_set_new(root, "threads", json_integer(o->ecfg.threads));
        json_object_set_new(root, "deterministic", json_boolean(o->ecfg.deterministic));
        char tuning[128];
        engine_tuning_format(&o->ecfg.tuning, tuning, sizeof tuning);
        json_object_set_new(root, "gpu_tuning", json_string(tuning));
        json_object_set_new(root, "iters", json_integer(o->iters));
        for (int i = 0; i < o->nbatches; i++) {
            json_t *row = json_pack("{s:i, s:f, s:f, s:f, s:f, s:f}", "batch", res[i].batch, "ms_per_batch",
                                    res[i].ms_per_batch, "ms_min", res[i].ms_min, "ms_max", res[i].ms_max, "img_per_s",
                                    res[i].img_per_s, "gflops", res[i].gflops);
            if (row && res[i].gpu_ms > 0) {
                json_object_set_new(row, "gpu_ms", json_real(res[i].gpu_ms));
                json_object_set_new(row, "gpu_img_per_s", json_real(res[i].batch * 1000.0 / res[i].gpu_ms));
                json_object_set_new(row, "h2d_ms", json_real(res[i].h2d_ms));
                json_object_set_new(row, "d2h_ms", json_real(res[i].d2h_ms));
                json_object_set_new(row, "programmatic_launch", json_boolean(res[i].programmatic));
            }
            json_array_append_new(rows, row);
        }
        json_object_set_new(root, "engine", rows);
        json_object_set_new(root, "max_batch", json_integer(info->max_batch));
        json_object_set_new(root, "device_memory_bytes", json_integer((json_int_t)x->device_bytes));
        json_object_set_new(root, "pinned_memory_bytes", json_integer((json_int_t)x->pinned_bytes));
        if (x->has_pipeline)
            json_object_set_new(root, "pipeline",
                                json_pack("{s:i, s:f, s:f, s:f, s:f, s:f}", "batch", x->pipe.batch, "serial_ms",
                                          x->pipe.serial_ms, "overlap_ms", x->pipe.overlap_ms, "compute_ms",
                                          x->pipe.compute_ms, "copy_ms", x->pipe.copy_ms, "copy_hidden",
                                          x->pipe.hidden));
#ifdef HAVE_CUDA
        if (x->nlayers > 0) {
            json_t *layers = json_array();
            for (int l = 0; l < x->nlayers; l++)
                for (int j = 0; j < x->layers[l].n; j++) {
                    const gpu_layer_time *t = &x->layers[l].t[j];
                    json_array_append_new(layers, json_pack("{s:i, s:s, s:f, s:s, s:i}", "batch", x->layers[l].batch,
                                                            "name", t->name, "ms", t->ms, "tile",
                                                            t->tile ? t->tile : "", "splits", t->splits));
                }
            json_object_set_new(root, "layers", layers);
        }
#endif
    }
    if (o->decode_dir) {
        json_object_set_new(root, "decode",
                            json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:f}", "dir", o->decode_dir, "backend",
                                      o->decode_exact ? "gpu-exact"
                                      : o->decode_gpu ? "gpu"
                                                      : "cpu",
                                      "files", dec->files, "skipped", dec->failed, "refused", dec->refused, "threads",
                                      dec->threads, "batch", o->decode_gpu ? o->decode_batch : 0, "img_per_s",
                                      dec->img_per_s));
        if (o->decode_gpu) {
            json_t *d = json_object_get(root, "decode");
            json_object_set_new(d, "cpu_accepted_img_per_s", json_real(dec->cpu_accepted_img_per_s));
            json_object_set_new(d, "cpu_refused_img_per_s", json_real(dec->cpu_refused_img_per_s));
            json_object_set_new(d, "mixed_img_per_s", json_real(dec->mixed_img_per_s));
        }
    }
    if (nmulti > 0) {
        json_t *rows = json_array();
        for (int i = 0; i < nmulti; i++)
            json_array_append_new(rows, json_pack("{s:i, s:i, s:f, s:f, s:f}", "batch", multi[i].batch, "gpus",
                                                  multi[i].ngpus, "one_gpu_img_per_s", multi[i].one_img_per_s,
                                                  "all_gpus_img_per_s", multi[i].all_img_per_s, "scaling",
                                                  multi[i].all_img_per_s / multi[i].one_img_per_s));
        json_object_set_new(root, "gpus", rows);
    }
    char *s = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(6));
    json_decref(root);
    if (!s)
        return -1;
    puts(s);
    free(s);
    return 0;
}

int main(int argc, char **argv)
{
    bench_opts o;
    if (parse_args(argc, argv, &o) != 0)
        return 2;
    char err[8192]; /* room for a full path in a message */
    engine_result res[BENCH_MAX_BATCHES];
    decode_result dec = { 0 };
    engine info = { 0 };
    static engine_extras extras;
    multi_result multi[BENCH_MAX_BATCHES];
    int nmulti = 0;
    if (!o.decode_only) {
        resnet18_weights w;
        if (toolopt_load_weights("resnetd-bench", o.weights, &w) != 0)
            return 1;
        static calib_table calib;
        if (o.calibration) {
            if (toolopt_load_calibration("resnetd-bench", o.calibration, &w, o.weights, &calib) != 0) {
                weights_free(&w);
                return 1;
            }
            if (o.int8_mix_given)
                calib.mix = o.int8_mix;
            o.ecfg.calib = &calib;
        }
        int rc = bench_engine(&o, &w, res, &info, &extras, err, sizeof err);
        if (rc == 0 && (o.ngpus > 0 || o.gpus_all))
            rc = bench_multi(&o, &w, multi, &nmulti, err, sizeof err);
        weights_free(&w);
        if (rc != 0) {
            fprintf(stderr, "resnetd-bench: %s\n", err);
            return 1;
        }
    }
    const bench_decode_opts dopt = {
        .dir = o.decode_dir,
        .threads = o.decode_threads,
        .gpu = o.decode_gpu,
        .exact = o.decode_exact,
        .batch = o.decode_batch,
        .memory_mib = o.decode_memory_mib,
        .iters = o.iters,
        .ecfg = o.ecfg,
    };
    if (o.decode_dir && bench_decode(&dopt, &dec, err, sizeof err) != 0) {
        fprintf(stderr, "resnetd-bench: decode: %s\n", err);
        return 1;
    }
    if (o.json) {
        if (print_json(&o, &info, res, &extras, &dec, multi, nmulti) != 0) {
            fprintf(stderr, "resnetd-bench: cannot build JSON output\n");
            return 1;
        }
    } else {
        print_table(&o, &info, res, &extras, &dec);
        print_multi(multi, nmulti);
    }
    return 0;
}
