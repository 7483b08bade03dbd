/* resnetd-calibrate: makes the INT8 calibration table of a set of weights,
 * and checks a table against FP32.
 * Calibration runs the FP32 CPU engine on every JPEG of a directory (name
 * order, with the daemon's preprocessing), observes each tensor that INT8
 * quantises (engine_cpu_observe), histograms |x| per tensor
 * (engine/calib.h), and writes the scales chosen by KL-divergence (entropy),
 * a percentile or the least squared error (mse). The same weights, images, method and batch give the
 * same table, byte for byte: the images are read in strcmp order and the
 * statistics are exact counts.
 * The check runs the CPU engine at FP32 once on held-out JPEGs, keeps their
 * logits, and compares an INT8 engine's with them (top-1 agreement, the
 * logits' relative L2 error). The INT8 engine is the CPU one by default;
 * --device cuda checks the CUDA engine's own figures, which differ where a
 * mix has FP16 layers (the all-INT8 activations are the same bits on both,
 * engine/int8.h). A table made with a check records its figures.
 * --target-agreement times the INT8 engine at every precision mix on this
 * machine, makes one table per method from one pass over the calibration
 * images, and checks the candidates mix by mix, fastest first, until a
 * mix meets the target (tools/calib_search.h decides). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "config.h"
#include "engine/calib.h"
#include "engine/engine.h"
#include "engine/engine_cpu.h"
#include "engine/engine_registry.h"
#include "image/preprocess.h"
#include "model/resnet18.h"
#include "tools/calib_images.h"
#include "tools/calib_search.h"
#include "tools/toolopt.h"

#define CALIBRATE_BATCH 8 /* the FP32 engine's, for calibration and the reference logits */
#define SPEED_BATCH_CPU 8
#define SPEED_BATCH_CUDA 256
#define SPEED_BATCH_MAX 4096
#define SPEED_SECONDS 1.0 /* timed batches per mix, after one warm-up batch */

typedef struct calibrate_opts {
    const char *weights, *images, *out;
    const char *table; /* check this table instead of making one */
    const char *check; /* held-out JPEGs for the check, or NULL */
    double min_agreement; /* percent; < 0: none */
    double target_agreement; /* percent; < 0: make one table by --method */
    calib_method method;
    double percentile;
    /* --mix: the made table's one mix, or the mixes the search may pick */
    calib_mix mixes[CALIB_NMIXES];
    int nmixes;
    engine_device device; /* the INT8 engine of the check and the speed: CPU or CUDA */
    int device_index;
    int speed_batch; /* the speed's batch, and the CUDA check engine's */
    int threads;
} calibrate_opts;

/* Exit status when the check falls below --min-agreement. */
#define EXIT_BELOW_MIN 3

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: resnetd-calibrate --weights FILE|synthetic --images DIR --out TABLE.json [OPTION]...\n"
            "       resnetd-calibrate --weights FILE|synthetic --table TABLE.json --check DIR [OPTION]...\n"
            "Make the INT8 calibration table (per-tensor activation scales) of ResNet18 weights\n"
            "from the JPEGs in DIR, for resnetd --precision int8 --calibration TABLE.json;\n"
            "or check a table: INT8 against FP32 on held-out JPEGs.\n\n"
            "  --weights FILE       safetensors weights (torchvision names); 'synthetic' for random\n"
            "  --images DIR         calibration JPEGs (*.jpg, *.jpeg); a few hundred typical inputs\n"
            "  --method M           entropy (KL divergence, TensorRT's; default), percentile, or mse\n"
            "                       (the threshold with the least squared rounding and clipping error)\n"
            "  --percentile P       with --method percentile: the percentile of |x| (default 99.99)\n"
            "  --mix M              the table's precision mix: int8 (default: every layer at INT8),\n"
            "                       float:stem, float:layer1.0, float:layer1, ... float:layer3\n"
            "                       (the network up to the end of the stem, of that stage's first\n"
            "                       block or of that stage in float: FP16 on a GPU, FP32 on the\n"
            "                       CPU);\n"
            "                       with --target-agreement, a comma-separated list: the mixes to\n"
            "                       search (default all)\n"
            "  --out FILE           the table to write (JSON)\n"
            "  --table FILE         check this table, at its own mix, instead of making one (needs\n"
            "                       --check)\n"
            "  --check DIR          run FP32 and INT8 on the JPEGs in DIR (not the calibration\n"
            "                       images) and print top-1 agreement and the logits' rel L2\n"
            "  --min-agreement PCT  with --check: exit 3 when top-1 agreement is below PCT percent\n"
            "                       (a table made here is written all the same)\n"
            "  --target-agreement PCT  with --images, --out and --check: time the INT8 engine at\n"
            "                       each mix on this machine, then, fastest mix first, check every\n"
            "                       calibration method (entropy; mse; percentile 99.9, 99.99,\n"
            "                       99.999, 100) at that mix, printing each candidate's agreement, rel L2\n"
            "                       and img/s; write the first mix whose most agreeing method\n"
            "                       reaches PCT percent, with that method; none: the most agreeing\n"
            "                       candidate is written and the exit status is 3\n"
            "  --device D           the INT8 engine of --check and of the timing: cpu (default),\n"
            "                       cuda or cuda:N; the FP32 reference is always the CPU engine's\n"
            "  --speed-batch N      with --target-agreement: the batch each mix is timed at\n"
            "                       (default %d on cpu, %d on cuda; random pixels, %.0f s a mix)\n"
            "  --threads N          CPU engine threads (default: all cores)\n"
            "  --help, --version\n",
            SPEED_BATCH_CPU, SPEED_BATCH_CUDA, SPEED_SECONDS);
}

/* A percentage in [0, 100] into *out; 0, or -1 after saying why. */
static int parse_percent(const char *name, const char *arg, double *out)
{
    char *end;
    errno = 0;
    *out = strtod(arg, &end);
    if (errno || end == arg || *end || !(*out >= 0 && *out <= 100)) {
        fprintf(stderr, "resnetd-calibrate: --%s must be in [0, 100], got '%s'\n", name, arg);
        return -1;
    }
    return 0;
}

/* --mix's comma-separated mixes, without repeats, into o; 0 or -1. */
static int parse_mixes(const char *arg, calibrate_opts *o)
{
    const char *p = arg;
    o->nmixes = 0;
    while (*p) {
        char name[32];
        size_t n = strcspn(p, ",");
        calib_mix m;
        int ok = n < sizeof name && o->nmixes < CALIB_NMIXES;
        if (ok) {
            memcpy(name, p, n);
            name[n] = '\0';
            ok = calib_parse_mix(name, &m) == 0;
        }
        for (int i = 0; ok && i < o->nmixes; i++)
            ok = o->mixes[i] != m;
        if (!ok)
            break;
        o->mixes[o->nmixes++] = m;
        p += n;
        if (*p == ',' && !*++p) { /* "int8,": a name left out */
            o->nmixes = 0;
            break;
        }
    }
    if (*p || o->nmixes == 0) {
        fprintf(stderr,
                "resnetd-calibrate: --mix must be " CALIB_MIX_NAMES
                " (a list of them, each once, with --target-agreement), got '%s'\n",
                arg);
        return -1;
    }
    return 0;
}

/* A number in lo..hi into *out; 0, or -1 after saying why. */
static int parse_count(const char *name, const char *arg, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (errno || end == arg || *end || v < lo || v > hi) {
        fprintf(stderr, "resnetd-calibrate: --%s must be %ld..%ld, got '%s'\n", name, lo, hi, arg);
        return -1;
    }
    *out = (int)v;
    return 0;
}

enum {
    OPT_WEIGHTS = 256,
    OPT_IMAGES,
    OPT_METHOD,
    OPT_PCT,
    OPT_MIX,
    OPT_OUT,
    OPT_TABLE,
    OPT_CHECK,
    OPT_MIN_AGREE,
    OPT_TARGET,
    OPT_DEVICE,
    OPT_SPEED_BATCH,
    OPT_THREADS,
    OPT_HELP,
    OPT_VERSION
};

/* One option c with its argument into o; 0, or -1 after saying why. */
static int parse_one(int c, const char *arg, calibrate_opts *o)
{
    char *end;
    switch (c) {
    case OPT_WEIGHTS: o->weights = arg; return 0;
    case OPT_IMAGES: o->images = arg; return 0;
    case OPT_OUT: o->out = arg; return 0;
    case OPT_TABLE: o->table = arg; return 0;
    case OPT_CHECK: o->check = arg; return 0;
    case OPT_MIX: return parse_mixes(arg, o);
    case OPT_MIN_AGREE: return parse_percent("min-agreement", arg, &o->min_agreement);
    case OPT_TARGET: return parse_percent("target-agreement", arg, &o->target_agreement);
    case OPT_METHOD:
        if (calib_parse_method(arg, &o->method) == 0)
            return 0;
        fprintf(stderr, "resnetd-calibrate: --method must be entropy, percentile or mse, got '%s'\n", arg);
        return -1;
    case OPT_PCT:
        errno = 0;
        o->percentile = strtod(arg, &end);
        if (!errno && end != arg && !*end && o->percentile > 0 && o->percentile <= 100)
            return 0;
        fprintf(stderr, "resnetd-calibrate: --percentile must be in (0, 100], got '%s'\n", arg);
        return -1;
    case OPT_DEVICE:
        if (engine_parse_device(arg, &o->device, &o->device_index) == 0 && o->device != ENGINE_DEVICE_AUTO)
            return 0;
        fprintf(stderr, "resnetd-calibrate: --device must be cpu, cuda or cuda:N, got '%s'\n", arg);
        return -1;
    case OPT_SPEED_BATCH: return parse_count("speed-batch", arg, 1, SPEED_BATCH_MAX, &o->speed_batch);
    case OPT_THREADS: return parse_count("threads", arg, 0, 256, &o->threads);
    case OPT_HELP: usage(stdout); exit(0);
    case OPT_VERSION: printf("resnetd-calibrate %s\n", PACKAGE_VERSION); exit(0);
    default: usage(stderr); return -1;
    }
}

/* Which options go together; 0, or -1 after saying why. given[c -
 * OPT_WEIGHTS]: option c was given. */
static int check_args(const calibrate_opts *o, const int *given)
{
#define GIVEN(c) given[(c)-OPT_WEIGHTS]
    const int method = GIVEN(OPT_METHOD), pct = GIVEN(OPT_PCT), mix = GIVEN(OPT_MIX);
    if (!o->weights) {
        fprintf(stderr, "resnetd-calibrate: --weights is required\n");
        return -1;
    }
    if (o->table) {
        if (o->images || o->out || method || pct || mix || !o->check) {
            fprintf(stderr, "resnetd-calibrate: --table checks a table at its own mix: it needs --check, and "
                            "takes no --images, --out, --method, --percentile or --mix\n");
            return -1;
        }
    } else if (!o->images || !o->out) {
        fprintf(stderr, "resnetd-calibrate: --images and --out are required (or --table and --check)\n");
        return -1;
    }
    if ((o->min_agreement >= 0 || o->target_agreement >= 0 || GIVEN(OPT_DEVICE)) && !o->check) {
        fprintf(stderr, "resnetd-calibrate: --min-agreement, --target-agreement and --device need --check\n");
        return -1;
    }
    if (o->target_agreement >= 0 && (o->table || method || pct || o->min_agreement >= 0)) {
        fprintf(stderr, "resnetd-calibrate: --target-agreement makes a table by trying every method: it takes "
                        "--images, --out and --check, and no --table, --method, --percentile or --min-agreement\n");
        return -1;
    }
    if (o->target_agreement < 0 && (o->nmixes > 1 || GIVEN(OPT_SPEED_BATCH))) {
        fprintf(stderr, "resnetd-calibrate: a list of mixes and --speed-batch go with --target-agreement\n");
        return -1;
    }
    if (pct && o->method != CALIB_PERCENTILE) {
        fprintf(stderr, "resnetd-calibrate: --percentile needs --method percentile\n");
        return -1;
    }
    return 0;
#undef GIVEN
}

static int parse_args(int argc, char **argv, calibrate_opts *o)
{
    static const struct option longopts[] = {
        { "weights", required_argument, NULL, OPT_WEIGHTS },
        { "images", required_argument, NULL, OPT_IMAGES },
        { "method", required_argument, NULL, OPT_METHOD },
        { "percentile", required_argument, NULL, OPT_PCT },
        { "mix", required_argument, NULL, OPT_MIX },
        { "out", required_argument, NULL, OPT_OUT },
        { "table", required_argument, NULL, OPT_TABLE },
        { "check", required_argument, NULL, OPT_CHECK },
        { "min-agreement", required_argument, NULL, OPT_MIN_AGREE },
        { "target-agreement", required_argument, NULL, OPT_TARGET },
        { "device", required_argument, NULL, OPT_DEVICE },
        { "speed-batch", required_argument, NULL, OPT_SPEED_BATCH },
        { "threads", required_argument, NULL, OPT_THREADS },
        { "help", no_argument, NULL, OPT_HELP },
        { "version", no_argument, NULL, OPT_VERSION },
        { NULL, 0, NULL, 0 },
    };
    int given[OPT_VERSION - OPT_WEIGHTS + 1] = { 0 };
    memset(o, 0, sizeof *o);
    o->method = CALIB_ENTROPY;
    o->percentile = 99.99;
    o->min_agreement = -1;
    o->target_agreement = -1;
    o->device = ENGINE_DEVICE_CPU;
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (parse_one(c, optarg, o) != 0)
            return -1;
        given[c - OPT_WEIGHTS] = 1;
    }
    if (optind < argc) {
        fprintf(stderr, "resnetd-calibrate: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (check_args(o, given) != 0)
        return -1;
    if (o->nmixes == 0) {
        o->nmixes = o->target_agreement >= 0 ? CALIB_NMIXES : 1;
        for (int i = 0; i < o->nmixes; i++)
            o->mixes[i] = (calib_mix)i;
    }
    if (o->speed_batch == 0)
        o->speed_batch = o->device == ENGINE_DEVICE_CUDA ? SPEED_BATCH_CUDA : SPEED_BATCH_CPU;
    return 0;
}

/* The observer: the interior of every image's tensor into its histogram. */
static void observe(void *ctx, int tensor, const float *data, int n, int h, int c, int pad)
{
    calib_hist *hist = (calib_hist *)ctx + tensor;
    const size_t side = (size_t)h + 2 * pad;
    for (int img = 0; img < n; img++)
        for (int y = 0; y < h; y++)
            calib_hist_add(hist, data + (((size_t)img * side + (size_t)(y + pad)) * side + (size_t)pad) * c,
                           (size_t)h * c);
}

/* Runs the FP32 engine e over every JPEG of o->images and histograms each
 * tensor INT8 quantises into hist[CALIB_NTENSORS]; *used: images seen. */
static int observe_images(engine *e, preprocess_ctx *pp, const calibrate_opts *o, calib_hist *hist, int *used)
{
    char err[1024];
    int nfiles = 0, rc = -1;
    char **files = jpegdir_list(o->images, &nfiles);
    *used = 0;
    if (!files)
        goto out;
    if (nfiles == 0) {
        fprintf(stderr, "resnetd-calibrate: no JPEG files (*.jpg, *.jpeg) in %s\n", o->images);
        goto out;
    }
    if (engine_cpu_observe(e, observe, hist, err, sizeof err) != 0) {
        fprintf(stderr, "resnetd-calibrate: %s\n", err);
        goto out;
    }
    for (int next = 0; next < nfiles;) {
        int n = jpegdir_load(pp, o->images, files, nfiles, &next, e->input[0], e->max_batch);
        if (n < 0)
            goto out;
        if (engine_submit(e, 0, n, err, sizeof err) != 0 || engine_wait(e, 0, err, sizeof err) != 0) {
            fprintf(stderr, "resnetd-calibrate: inference failed: %s\n", err);
            goto out;
        }
        if (jpegdir_logits_finite(e->logits[0], n, e->classes, o->images, files + next - n, 0) != 0)
            goto out;
        *used += n;
    }
    if (engine_cpu_observe(e, NULL, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "resnetd-calibrate: %s\n", err);
        goto out;
    }
    rc = 0;
out:
    jpegdir_free(files, nfiles);
    return rc;
}

/* The table a method (and percentile) picks from the histograms, at mix. */
static void table_of(const calib_hist *hist, int used, const resnet18_weights *w, calib_method method,
                     double percentile, calib_mix mix, calib_table *t)
{
    memset(t, 0, sizeof *t);
    snprintf(t->weights_sha256, sizeof t->weights_sha256, "%s", calib_weights_id(w));
    t->method = method;
    t->percentile = method == CALIB_PERCENTILE ? percentile : 0;
    t->images = used;
    t->mix = mix;
    for (int i = 0; i < CALIB_NTENSORS; i++) {
        const int levels = calib_tensor_levels(i);
        t->scale[i] = method == CALIB_ENTROPY ? calib_scale_entropy(&hist[i], levels)
                      : method == CALIB_MSE   ? calib_scale_mse(&hist[i], levels)
                                              : calib_scale_percentile(&hist[i], percentile, levels);
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* "cpu" or "cuda:N": the INT8 engine o asks for. */
static const char *device_label(const calibrate_opts *o, char *buf, size_t len)
{
    if (o->device == ENGINE_DEVICE_CPU)
        return "cpu";
    snprintf(buf, len, "cuda:%d", o->device_index);
    return buf;
}

/* The INT8 engine o asks for, with table t, for batches up to max_batch;
 * NULL after saying why. */
static engine *int8_engine(const resnet18_weights *w, const calib_table *t, const calibrate_opts *o, int max_batch)
{
    char err[1024];
    engine_config ec = { .device = o->device,
                         .device_index = o->device_index,
                         .precision = ENGINE_PRECISION_INT8,
                         .max_batch = max_batch,
                         .nslots = 1,
                         .threads = o->threads,
                         .calib = t };
    engine *e = engine_create(w, &ec, err, sizeof err);
    if (!e)
        fprintf(stderr, "resnetd-calibrate: %s\n", err);
    return e;
}

/* INT8 (table t, on o's device) against h's FP32 logits. 0, or -1. */
static int measure(const heldout *h, preprocess_ctx *pp, const resnet18_weights *w, const calib_table *t,
                   const calibrate_opts *o, heldout_result *r)
{
    /* The CUDA engine at the batch it is timed at: a check of thousands of
     * images is then quick, and INT8's bits do not depend on the batch. */
    engine *e = int8_engine(w, t, o, o->device == ENGINE_DEVICE_CUDA ? o->speed_batch : CALIBRATE_BATCH);
    int rc = e ? heldout_measure(h, pp, e, r) : -1;
    engine_destroy(e);
    return rc;
}

/* Measures table t on o->check, prints the figures and records them in
 * t->check. Returns 0, EXIT_BELOW_MIN, or -1. */
static int check(engine *f32, preprocess_ctx *pp, const resnet18_weights *w, calib_table *t, const calibrate_opts *o)
{
    heldout h;
    heldout_result r;
    char dev[32];
    int rc = heldout_open(f32, pp, o->check, &h) == 0 ? measure(&h, pp, w, t, o, &r) : -1;
    heldout_free(&h);
    if (rc != 0)
        return -1;
    printf("check: INT8 vs FP32 on %d images of %s (mix %s, INT8 on %s): top-1 agreement %d/%d (%.1f%%), "
           "logits rel L2 %.4f (per image: median %.4f, max %.4f)\n",
           r.images, o->check, calib_mix_name(t->mix), device_label(o, dev, sizeof dev), r.agree, r.images, r.agreement,
           r.rel_l2, r.median, r.max);
    t->check = (calib_check){ .images = r.images, .agreement = r.agreement, .rel_l2 = r.rel_l2 };
    if (o->min_agreement >= 0 && r.agreement < o->min_agreement) {
        fprintf(stderr, "resnetd-calibrate: top-1 agreement %.1f%% is below --min-agreement %g%%\n", r.agreement,
                o->min_agreement);
        return EXIT_BELOW_MIN;
    }
    return 0;
}

/* img/s of o's INT8 engine with table t at mix: one warm-up batch of
 * o->speed_batch random images, then as many as fit in SPEED_SECONDS,
 * each submit to wait (copies included). 0, or -1 after saying why. */
static int mix_speed(const resnet18_weights *w, const calib_table *t, calib_mix mix, const calibrate_opts *o,
                     double *img_s)
{
    char err[1024];
    calib_table at = *t;
    at.mix = mix;
    engine *e = int8_engine(w, &at, o, o->speed_batch);
    if (!e)
        return -1;
    /* Random pixels: an all-zero input could take faster paths. */
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < (size_t)o->speed_batch * RESNET18_INPUT_BYTES; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        e->input[0][i] = (uint8_t)(s >> 32);
    }
    int rc = 0, batches = -1; /* the first batch is the warm-up */
    double t0 = 0, elapsed = 0;
    while (rc == 0 && (batches < 1 || elapsed < SPEED_SECONDS)) {
        rc = engine_submit(e, 0, o->speed_batch, err, sizeof err) != 0 || engine_wait(e, 0, err, sizeof err) != 0;
        if (++batches == 0)
            t0 = now_s();
        elapsed = now_s() - t0;
    }
    engine_destroy(e);
    if (rc != 0) {
        fprintf(stderr, "resnetd-calibrate: inference failed: %s\n", err);
        return -1;
    }
    *img_s = (double)batches * o->speed_batch / elapsed;
    return 0;
}

/* The methods --target-agreement tries at each mix. */
static const struct candidate {
    calib_method method;
    double percentile;
} candidates[] = {
    { CALIB_ENTROPY, 0 },         { CALIB_MSE, 0 },          { CALIB_PERCENTILE, 99.9 }, { CALIB_PERCENTILE, 99.99 },
    { CALIB_PERCENTILE, 99.999 }, { CALIB_PERCENTILE, 100 },
};
#define NCANDIDATES (int)(sizeof candidates / sizeof candidates[0])

/* What the search's candidates share (calib_search_eval's ctx). */
typedef struct search_ctx {
    const heldout *h;
    preprocess_ctx *pp;
    const resnet18_weights *w;
    const calibrate_opts *o;
    const calib_hist *hist;
    int used;
    const double *img_s; /* [CALIB_NMIXES] */
} search_ctx;

/* calib_search_eval: one candidate's table, checked and printed. */
static int search_eval(void *ctx, calib_mix mix, int method, calib_score *s)
{
    const search_ctx *c = ctx;
    const struct candidate *k = &candidates[method];
    calib_table t;
    heldout_result r;
    char name[48];
    table_of(c->hist, c->used, c->w, k->method, k->percentile, mix, &t);
    if (measure(c->h, c->pp, c->w, &t, c->o, &r) != 0)
        return -1;
    calib_method_label(k->method, k->percentile, name, sizeof name);
    printf("%-22s %-13s %5d/%-4d %8.4f %10.1f\n", name, calib_mix_name(mix), r.agree, r.images, r.rel_l2,
           c->img_s[mix]);
    fflush(stdout);
    *s = (calib_score){ .agree = r.agree, .images = r.images, .rel_l2 = r.rel_l2 };
    return 0;
}

/* Times o's INT8 engine at every mix o->mixes names (table t's scales),
 * prints the speeds and sorts order[] fastest first. 0, or -1. */
static int time_mixes(const resnet18_weights *w, const calib_table *t, const calibrate_opts *o, double *img_s,
                      calib_mix *order)
{
    char dev[32];
    for (int i = 0; i < o->nmixes; i++) {
        if (mix_speed(w, t, o->mixes[i], o, &img_s[o->mixes[i]]) != 0)
            return -1;
        order[i] = o->mixes[i];
    }
    calib_search_order(order, o->nmixes, img_s);
    printf("speed: INT8 on %s, batch %d of random pixels, %.0f s per mix, fastest first:",
           device_label(o, dev, sizeof dev), o->speed_batch, SPEED_SECONDS);
    for (int i = 0; i < o->nmixes; i++)
        printf("%s %s %.1f img/s", i ? "," : "", calib_mix_name(order[i]), img_s[order[i]]);
    printf("\n");
    return 0;
}

/* --target-agreement: every mix timed, then the candidates (mix, method)
 * of one set of histograms checked against one set of FP32 logits in
 * calib_search_run's order; the chosen table into *t. Returns 0,
 * EXIT_BELOW_MIN when none meets the target, or -1. */
static int search(engine *f32, preprocess_ctx *pp, const resnet18_weights *w, const calibrate_opts *o, calib_table *t)
{
    calib_hist *hist = calloc(CALIB_NTENSORS, sizeof *hist);
    double img_s[CALIB_NMIXES] = { 0 };
    calib_mix order[CALIB_NMIXES];
    heldout h = { 0 };
    calib_search_result res;
    int used, rc = -1;
    if (!hist) {
        fprintf(stderr, "resnetd-calibrate: out of memory\n");
        return -1;
    }
    if (observe_images(f32, pp, o, hist, &used) != 0 || heldout_open(f32, pp, o->check, &h) != 0)
        goto out;
    table_of(hist, used, w, CALIB_ENTROPY, 0, CALIB_MIX_INT8, t);
    if (time_mixes(w, t, o, img_s, order) != 0)
        goto out;
    printf("candidates: INT8 against FP32 on the %d images of %s, fastest mix first (img/s: the mix's, above)\n", h.n,
           o->check);
    printf("%-22s %-13s %10s %8s %10s\n", "method", "mix", "agreement", "rel L2", "img/s");
    search_ctx ctx = { .h = &h, .pp = pp, .w = w, .o = o, .hist = hist, .used = used, .img_s = img_s };
    if (calib_search_run(order, o->nmixes, NCANDIDATES, o->target_agreement, search_eval, &ctx, &res) != 0)
        goto out;
    const struct candidate *k = &candidates[res.method];
    const double agreement = 100.0 * res.score.agree / res.score.images;
    table_of(hist, used, w, k->method, k->percentile, res.mix, t);
    t->check = (calib_check){ .images = res.score.images, .agreement = agreement, .rel_l2 = res.score.rel_l2 };
    char chosen[48];
    calib_method_label(k->method, k->percentile, chosen, sizeof chosen);
    printf("chosen: mix %s, %s (%d of %d candidates tried): top-1 agreement %d/%d (%.1f%%), rel L2 %.4f, "
           "%.1f img/s; %s the target %g%%\n",
           calib_mix_name(res.mix), chosen, res.tried, o->nmixes * NCANDIDATES, res.score.agree, res.score.images,
           agreement, res.score.rel_l2, img_s[res.mix], res.met ? "meets" : "is below", o->target_agreement);
    rc = res.met ? 0 : EXIT_BELOW_MIN;
out:
    heldout_free(&h);
    free(hist);
    return rc;
}

/* Makes the table (by --method, or by --target-agreement's search) and
 * writes it, with its check when there is one. Returns 0, EXIT_BELOW_MIN
 * or -1. */
static int make_table(engine *e, preprocess_ctx *pp, const resnet18_weights *w, const calibrate_opts *o, calib_table *t)
{
    char err[1024];
    int status;
    if (o->target_agreement >= 0) {
        status = search(e, pp, w, o, t);
    } else {
        calib_hist *hist = calloc(CALIB_NTENSORS, sizeof *hist);
        int used;
        if (!hist || observe_images(e, pp, o, hist, &used) != 0) {
            if (!hist)
                fprintf(stderr, "resnetd-calibrate: out of memory\n");
            free(hist);
            return -1;
        }
        table_of(hist, used, w, o->method, o->percentile, o->mixes[0], t);
        free(hist);
        status = o->check ? check(e, pp, w, t, o) : 0;
    }
    if (status < 0)
        return -1;
    if (calib_save(o->out, t, err, sizeof err) != 0) {
        fprintf(stderr, "resnetd-calibrate: %s\n", err);
        return -1;
    }
    fprintf(stderr, "resnetd-calibrate: %d images, %s, mix %s: wrote %s\n", t->images, calib_method_name(t->method),
            calib_mix_name(t->mix), o->out);
    return status;
}

/* The CUDA device --device names exists; 0, or -1 after saying why (before
 * the calibration pass, which can take minutes). */
static int device_usable(const calibrate_opts *o)
{
    if (o->device != ENGINE_DEVICE_CUDA)
        return 0;
    int n = engine_cuda_device_count();
    if (o->device_index < n)
        return 0;
    fprintf(stderr, "resnetd-calibrate: --device cuda:%d: %s\n", o->device_index,
            n == 0 ? "no CUDA device is usable (or resnetd was built without CUDA)" : "no such CUDA device");
    return -1;
}

int main(int argc, char **argv)
{
    calibrate_opts o;
    if (parse_args(argc, argv, &o) != 0)
        return 2;
    if (device_usable(&o) != 0)
        return 1;
    char err[1024];
    int status = 1;
    engine *e = NULL;
    preprocess_ctx *pp = NULL;
    resnet18_weights w;
    calib_table t;
    memset(&w, 0, sizeof w);

    if (toolopt_load_weights("resnetd-calibrate", o.weights, &w) != 0)
        return 1;
    if (o.table && toolopt_load_calibration("resnetd-calibrate", o.table, &w, o.weights, &t) != 0)
        goto out;
    engine_config ec = { .device = ENGINE_DEVICE_CPU,
                         .precision = ENGINE_PRECISION_FP32,
                         .max_batch = CALIBRATE_BATCH,
                         .nslots = 1,
                         .threads = o.threads };
    preprocess_options popt = { .max_pixels = PREPROCESS_DEFAULT_MAX_PIXELS };
    if (!(e = engine_create(&w, &ec, err, sizeof err))) {
        fprintf(stderr, "resnetd-calibrate: %s\n", err);
        goto out;
    }
    if (!(pp = preprocess_create(&popt))) {
        fprintf(stderr, "resnetd-calibrate: out of memory\n");
        goto out;
    }
    status = o.table ? check(e, pp, &w, &t, &o) : make_table(e, pp, &w, &o, &t);
    if (status < 0)
        status = 1;
out:
    preprocess_destroy(pp);
    engine_destroy(e);
    weights_free(&w);
    return status;
}
