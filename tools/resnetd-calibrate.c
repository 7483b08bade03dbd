/* resnetd-calibrate: makes the INT8 calibration table of a set of weights,
 * and checks a table against FP32.
 * Calibration runs the FP32 CPU engine on every JPEG of a directory (name
 * order, with the daemon's preprocessing), observes each tensor that INT8
 * quantises (engine_cpu_observe), histograms |x| per tensor
 * (engine/calib.h), and writes the scales chosen by KL-divergence (entropy)
 * or a percentile. The same weights, images, method and batch give the
 * same table, byte for byte: the images are read in strcmp order and the
 * statistics are exact counts.
 * The check runs the CPU engine at FP32 and at INT8 on held-out JPEGs and
 * prints their top-1 agreement and the logits' relative L2 error: the CUDA
 * engine's INT8 activations equal the CPU engine's bit for bit
 * (engine/int8.h), so the figure holds for both. A table made with a check
 * records its figures. --target-agreement makes one table per method from
 * one pass over the calibration images, checks each, and writes the best
 * (better()). */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
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
#include "tools/toolopt.h"

#define CALIBRATE_BATCH 8

typedef struct calibrate_opts {
    const char *weights, *images, *out;
    const char *table; /* check this table instead of making one */
    const char *check; /* held-out JPEGs for the check, or NULL */
    double min_agreement; /* percent; < 0: none */
    double target_agreement; /* percent; < 0: make one table by --method */
    calib_method method;
    double percentile;
    int threads;
} calibrate_opts;

/* Exit status when the check falls below --min-agreement. */
#define EXIT_BELOW_MIN 3

static void usage(FILE *f)
{
    fprintf(f, "Usage: resnetd-calibrate --weights FILE|synthetic --images DIR --out TABLE.json [OPTION]...\n"
               "       resnetd-calibrate --weights FILE|synthetic --table TABLE.json --check DIR [OPTION]...\n"
               "Make the INT8 calibration table (per-tensor activation scales) of ResNet18 weights\n"
               "from the JPEGs in DIR, for resnetd --precision int8 --calibration TABLE.json;\n"
               "or check a table: INT8 against FP32 on held-out JPEGs.\n\n"
               "  --weights FILE       safetensors weights (torchvision names); 'synthetic' for random\n"
               "  --images DIR         calibration JPEGs (*.jpg, *.jpeg); a few hundred typical inputs\n"
               "  --method M           entropy (KL divergence, TensorRT's; default) or percentile\n"
               "  --percentile P       with --method percentile: the percentile of |x| (default 99.99)\n"
               "  --out FILE           the table to write (JSON)\n"
               "  --table FILE         check this table instead of making one (needs --check)\n"
               "  --check DIR          run FP32 and INT8 on the JPEGs in DIR (not the calibration\n"
               "                       images) and print top-1 agreement and the logits' rel L2\n"
               "  --min-agreement PCT  with --check: exit 3 when top-1 agreement is below PCT percent\n"
               "                       (a table made here is written all the same)\n"
               "  --target-agreement PCT  with --images, --out and --check: try every calibration\n"
               "                       method (entropy; percentile 99.9, 99.99, 99.999, 100), print\n"
               "                       each one's agreement, rel L2 and INT8 img/s on this machine,\n"
               "                       and write the one with the best top-1 agreement on the --check\n"
               "                       images (all are fully INT8: one speed), if at least PCT percent;\n"
               "                       none: the most agreeing is written and the exit status is 3\n"
               "  --threads N          CPU engine threads (default: all cores)\n"
               "  --help, --version\n");
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

static int parse_args(int argc, char **argv, calibrate_opts *o)
{
    enum {
        OPT_WEIGHTS = 256,
        OPT_IMAGES,
        OPT_METHOD,
        OPT_PCT,
        OPT_OUT,
        OPT_TABLE,
        OPT_CHECK,
        OPT_MIN_AGREE,
        OPT_TARGET,
        OPT_THREADS,
        OPT_HELP,
        OPT_VERSION
    };
    static const struct option longopts[] = {
        { "weights", required_argument, NULL, OPT_WEIGHTS },
        { "images", required_argument, NULL, OPT_IMAGES },
        { "method", required_argument, NULL, OPT_METHOD },
        { "percentile", required_argument, NULL, OPT_PCT },
        { "out", required_argument, NULL, OPT_OUT },
        { "table", required_argument, NULL, OPT_TABLE },
        { "check", required_argument, NULL, OPT_CHECK },
        { "min-agreement", required_argument, NULL, OPT_MIN_AGREE },
        { "target-agreement", required_argument, NULL, OPT_TARGET },
        { "threads", required_argument, NULL, OPT_THREADS },
        { "help", no_argument, NULL, OPT_HELP },
        { "version", no_argument, NULL, OPT_VERSION },
        { NULL, 0, NULL, 0 },
    };
    memset(o, 0, sizeof *o);
    o->method = CALIB_ENTROPY;
    o->percentile = 99.99;
    o->min_agreement = -1;
    o->target_agreement = -1;
    int c, pct_given = 0, method_given = 0;
    char *end;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_WEIGHTS: o->weights = optarg; break;
        case OPT_IMAGES: o->images = optarg; break;
        case OPT_OUT: o->out = optarg; break;
        case OPT_TABLE: o->table = optarg; break;
        case OPT_CHECK: o->check = optarg; break;
        case OPT_MIN_AGREE:
            if (parse_percent("min-agreement", optarg, &o->min_agreement) != 0)
                return -1;
            break;
        case OPT_TARGET:
            if (parse_percent("target-agreement", optarg, &o->target_agreement) != 0)
                return -1;
            break;
        case OPT_METHOD:
            method_given = 1;
            if (calib_parse_method(optarg, &o->method) != 0) {
                fprintf(stderr, "resnetd-calibrate: --method must be entropy or percentile, got '%s'\n", optarg);
                return -1;
            }
            break;
        case OPT_PCT:
            errno = 0;
            o->percentile = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(o->percentile > 0 && o->percentile <= 100)) {
                fprintf(stderr, "resnetd-calibrate: --percentile must be in (0, 100], got '%s'\n", optarg);
                return -1;
            }
            pct_given = 1;
            break;
        case OPT_THREADS: {
            errno = 0;
            long v = strtol(optarg, &end, 10);
            if (errno || end == optarg || *end || v < 0 || v > 256) {
                fprintf(stderr, "resnetd-calibrate: --threads must be 0..256, got '%s'\n", optarg);
                return -1;
            }
            o->threads = (int)v;
            break;
        }
        case OPT_HELP: usage(stdout); exit(0);
        case OPT_VERSION: printf("resnetd-calibrate %s\n", PACKAGE_VERSION); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (!o->weights) {
        fprintf(stderr, "resnetd-calibrate: --weights is required\n");
        return -1;
    }
    if (o->table) {
        if (o->images || o->out || method_given || pct_given || !o->check) {
            fprintf(stderr, "resnetd-calibrate: --table checks a table: it needs --check, and takes no --images, "
                            "--out, --method or --percentile\n");
            return -1;
        }
    } else if (!o->images || !o->out) {
        fprintf(stderr, "resnetd-calibrate: --images and --out are required (or --table and --check)\n");
        return -1;
    }
    if ((o->min_agreement >= 0 || o->target_agreement >= 0) && !o->check) {
        fprintf(stderr, "resnetd-calibrate: --min-agreement and --target-agreement need --check\n");
        return -1;
    }
    if (o->target_agreement >= 0 && (o->table || method_given || pct_given || o->min_agreement >= 0)) {
        fprintf(stderr, "resnetd-calibrate: --target-agreement makes a table by trying every method: it takes "
                        "--images, --out and --check, and no --table, --method, --percentile or --min-agreement\n");
        return -1;
    }
    if (optind < argc) {
        fprintf(stderr, "resnetd-calibrate: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (pct_given && o->method != CALIB_PERCENTILE) {
        fprintf(stderr, "resnetd-calibrate: --percentile needs --method percentile\n");
        return -1;
    }
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_jpeg_name(const char *n)
{
    const char *dot = strrchr(n, '.');
    return dot && (strcmp(dot, ".jpg") == 0 || strcmp(dot, ".jpeg") == 0 || strcmp(dot, ".JPG") == 0 ||
                   strcmp(dot, ".JPEG") == 0);
}

/* The JPEG file names of dir, sorted; *n gets the count. */
static char **list_jpegs(const char *dir, int *n)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "resnetd-calibrate: %s: %s\n", dir, strerror(errno));
        return NULL;
    }
    char **names = NULL;
    int count = 0, cap = 0, ok = 1;
    struct dirent *de;
    while (ok && (de = readdir(d)) != NULL) {
        if (!is_jpeg_name(de->d_name))
            continue;
        if (count == cap) {
            cap = cap ? 2 * cap : 256;
            char **grown = realloc(names, (size_t)cap * sizeof *names);
            if (!grown) {
                ok = 0;
                break;
            }
            names = grown;
        }
        if (!(names[count] = strdup(de->d_name)))
            ok = 0;
        else
            count++;
    }
    closedir(d);
    if (!ok) {
        fprintf(stderr, "resnetd-calibrate: out of memory listing %s\n", dir);
        for (int i = 0; i < count; i++)
            free(names[i]);
        free(names);
        return NULL;
    }
    if (!names && !(names = malloc(sizeof *names))) { /* no JPEGs: an empty list, not an error */
        fprintf(stderr, "resnetd-calibrate: out of memory listing %s\n", dir);
        return NULL;
    }
    qsort(names, (size_t)count, sizeof *names, cmp_str);
    *n = count;
    return names;
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

/* Reads path whole into *buf (malloc'd); returns its length or -1. */
static long read_file(const char *path, uint8_t **buf)
{
    FILE *fp = fopen(path, "rb");
    long len = -1;
    *buf = NULL;
    if (fp && fseek(fp, 0, SEEK_END) == 0 && (len = ftell(fp)) >= 0 && fseek(fp, 0, SEEK_SET) == 0 &&
        (*buf = malloc((size_t)len + 1)) != NULL && fread(*buf, 1, (size_t)len, fp) == (size_t)len) {
        fclose(fp);
        return len;
    }
    if (fp)
        fclose(fp);
    free(*buf);
    *buf = NULL;
    return -1;
}

/* Preprocesses JPEGs files[*next..] of dir into dst (up to max images),
 * advancing *next. Returns the count, or -1 with a message printed. */
static int load_batch(preprocess_ctx *pp, const char *dir, char **files, int nfiles, int *next, uint8_t *dst, int max)
{
    char err[1024];
    int n = 0;
    for (; *next < nfiles && n < max; (*next)++) {
        char path[4096];
        uint8_t *buf;
        long len;
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, files[*next]) >= sizeof path ||
            (len = read_file(path, &buf)) < 0) {
            fprintf(stderr, "resnetd-calibrate: %s/%s: cannot read\n", dir, files[*next]);
            return -1;
        }
        preprocess_status ps = preprocess_jpeg(pp, buf, (size_t)len, dst + (size_t)n * RESNET18_INPUT_BYTES, err,
                                               sizeof err);
        free(buf);
        if (ps != PREP_OK) {
            fprintf(stderr, "resnetd-calibrate: %s: %s\n", path, err);
            return -1;
        }
        n++;
    }
    return n;
}

static void free_names(char **files, int n)
{
    for (int i = 0; i < n; i++)
        free(files[i]);
    free(files);
}

/* The first of n images whose logits are not all finite, or -1. Weights
 * whose activations overflow (an untrained network's BN statistics, say)
 * give infinite FP32 logits: a table or a check made from them means
 * nothing, so both refuse them. */
static int first_nonfinite(const float *logits, int n, int classes)
{
    for (int i = 0; i < n; i++)
        for (int k = 0; k < classes; k++)
            if (!isfinite(logits[(size_t)i * classes + k]))
                return i;
    return -1;
}

static void say_nonfinite(const char *dir, const char *file)
{
    fprintf(stderr,
            "resnetd-calibrate: %s/%s: the FP32 logits are not finite: these weights do not make a working "
            "network (activations overflow or are NaN)\n",
            dir, file);
}

static void say_nonfinite_int8(const char *dir, const char *file)
{
    fprintf(stderr,
            "resnetd-calibrate: %s/%s: the INT8 logits are not finite where FP32's are: the INT8 engine's FC "
            "takes the pooled features as FP16, and these weights' exceed its range (65504)\n",
            dir, file);
}

/* Runs the FP32 engine e over every JPEG of o->images and histograms each
 * tensor INT8 quantises into hist[CALIB_NTENSORS]; *used: images seen. */
static int observe_images(engine *e, preprocess_ctx *pp, const calibrate_opts *o, calib_hist *hist, int *used)
{
    char err[1024];
    int nfiles = 0, rc = -1;
    char **files = list_jpegs(o->images, &nfiles);
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
        int n = load_batch(pp, o->images, files, nfiles, &next, e->input[0], e->max_batch);
        if (n < 0)
            goto out;
        if (engine_submit(e, 0, n, err, sizeof err) != 0 || engine_wait(e, 0, err, sizeof err) != 0) {
            fprintf(stderr, "resnetd-calibrate: inference failed: %s\n", err);
            goto out;
        }
        int bad = first_nonfinite(e->logits[0], n, e->classes);
        if (bad >= 0) {
            say_nonfinite(o->images, files[next - n + bad]);
            goto out;
        }
        *used += n;
    }
    if (engine_cpu_observe(e, NULL, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "resnetd-calibrate: %s\n", err);
        goto out;
    }
    rc = 0;
out:
    free_names(files, nfiles);
    return rc;
}

/* The table a method (and percentile) picks from the histograms. */
static void table_of(const calib_hist *hist, int used, const resnet18_weights *w, calib_method method,
                     double percentile, calib_table *t)
{
    memset(t, 0, sizeof *t);
    snprintf(t->weights_sha256, sizeof t->weights_sha256, "%s", calib_weights_id(w));
    t->method = method;
    t->percentile = method == CALIB_PERCENTILE ? percentile : 0;
    t->images = used;
    for (int i = 0; i < CALIB_NTENSORS; i++)
        t->scale[i] = method == CALIB_ENTROPY ? calib_scale_entropy(&hist[i])
                                              : calib_scale_percentile(&hist[i], percentile);
}

/* The first index of the largest value, as numpy's argmax. */
static int argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* What INT8 (one table) gave against FP32 on the check images. */
typedef struct check_result {
    int images, agree;
    double agreement, rel_l2, median, max; /* percent; rel L2 overall, per image median and max */
    double int8_img_s; /* the CPU INT8 engine's inference alone, on this machine */
} check_result;

/* Scores per image into r: agreement and relative L2 of y against x. */
static void score(const float *x, const float *y, int classes, check_result *r, double *rel, double *diff2,
                  double *ref2)
{
    double d2 = 0, r2 = 0;
    for (int k = 0; k < classes; k++) {
        double d = (double)y[k] - (double)x[k];
        d2 += d * d;
        r2 += (double)x[k] * (double)x[k];
    }
    r->agree += argmax(x, classes) == argmax(y, classes);
    rel[r->images++] = r2 > 0 ? sqrt(d2 / r2) : (d2 > 0 ? INFINITY : 0);
    *diff2 += d2;
    *ref2 += r2;
}

/* INT8 (table t) against the FP32 engine f32 on every JPEG of o->check
 * (tests/engine/int8_agreement.py computes the same from
 * resnetd-classify's output). 0, or -1 after saying why. */
static int measure(engine *f32, preprocess_ctx *pp, const resnet18_weights *w, const calib_table *t,
                   const calibrate_opts *o, check_result *r)
{
    char err[1024];
    int nfiles = 0, rc = -1;
    engine *i8 = NULL;
    uint8_t *images = NULL;
    float *a = NULL, *b = NULL;
    double *rel = NULL, diff2 = 0, ref2 = 0, busy = 0;
    char **files = list_jpegs(o->check, &nfiles);
    memset(r, 0, sizeof *r);
    if (!files)
        goto out;
    if (nfiles == 0) {
        fprintf(stderr, "resnetd-calibrate: no JPEG files (*.jpg, *.jpeg) in %s\n", o->check);
        goto out;
    }
    engine_config ec = { .device = ENGINE_DEVICE_CPU,
                         .precision = ENGINE_PRECISION_INT8,
                         .max_batch = f32->max_batch,
                         .nslots = 1,
                         .threads = o->threads,
                         .calib = t };
    if (!(i8 = engine_create(w, &ec, err, sizeof err))) {
        fprintf(stderr, "resnetd-calibrate: %s\n", err);
        goto out;
    }
    const int classes = f32->classes, max = f32->max_batch;
    images = malloc((size_t)max * RESNET18_INPUT_BYTES);
    a = malloc((size_t)max * (size_t)classes * sizeof *a);
    b = malloc((size_t)max * (size_t)classes * sizeof *b);
    rel = malloc((size_t)nfiles * sizeof *rel);
    if (!images || !a || !b || !rel) {
        fprintf(stderr, "resnetd-calibrate: out of memory\n");
        goto out;
    }
    for (int next = 0; next < nfiles;) {
        int n = load_batch(pp, o->check, files, nfiles, &next, images, max);
        if (n < 0)
            goto out;
        double t0 = 0;
        if (engine_infer(f32, images, n, a, err, sizeof err) != 0 || (t0 = now_s()) < 0 ||
            engine_infer(i8, images, n, b, err, sizeof err) != 0) {
            fprintf(stderr, "resnetd-calibrate: inference failed: %s\n", err);
            goto out;
        }
        busy += now_s() - t0;
        int bad = first_nonfinite(a, n, classes);
        if (bad >= 0) {
            say_nonfinite(o->check, files[next - n + bad]);
            goto out;
        }
        if ((bad = first_nonfinite(b, n, classes)) >= 0) {
            say_nonfinite_int8(o->check, files[next - n + bad]);
            goto out;
        }
        for (int i = 0; i < n; i++)
            score(a + (size_t)i * classes, b + (size_t)i * classes, classes, r, rel, &diff2, &ref2);
    }
    qsort(rel, (size_t)r->images, sizeof *rel, cmp_double);
    const int done = r->images;
    r->median = done % 2 ? rel[done / 2] : 0.5 * (rel[done / 2 - 1] + rel[done / 2]);
    r->max = rel[done - 1];
    r->agreement = 100.0 * r->agree / done;
    r->rel_l2 = ref2 > 0 ? sqrt(diff2 / ref2) : 0.0;
    r->int8_img_s = busy > 0 ? done / busy : 0;
    rc = 0;
out:
    free_names(files, nfiles);
    free(images);
    free(a);
    free(b);
    free(rel);
    engine_destroy(i8);
    return rc;
}

/* Measures table t on o->check, prints the figures and records them in
 * t->check. Returns 0, EXIT_BELOW_MIN, or -1. */
static int check(engine *f32, preprocess_ctx *pp, const resnet18_weights *w, calib_table *t, const calibrate_opts *o)
{
    check_result r;
    if (measure(f32, pp, w, t, o, &r) != 0)
        return -1;
    printf("check: INT8 vs FP32 on %d images of %s: top-1 agreement %d/%d (%.1f%%), logits rel L2 %.4f "
           "(per image: median %.4f, max %.4f)\n",
           r.images, o->check, r.agree, r.images, r.agreement, r.rel_l2, r.median, r.max);
    t->check = (calib_check){ .images = r.images, .agreement = r.agreement, .rel_l2 = r.rel_l2 };
    if (o->min_agreement >= 0 && r.agreement < o->min_agreement) {
        fprintf(stderr, "resnetd-calibrate: top-1 agreement %.1f%% is below --min-agreement %g%%\n", r.agreement,
                o->min_agreement);
        return EXIT_BELOW_MIN;
    }
    return 0;
}

/* The methods --target-agreement tries. */
static const struct candidate {
    calib_method method;
    double percentile;
} candidates[] = {
    { CALIB_ENTROPY, 0 },         { CALIB_PERCENTILE, 99.9 }, { CALIB_PERCENTILE, 99.99 },
    { CALIB_PERCENTILE, 99.999 }, { CALIB_PERCENTILE, 100 },
};
#define NCANDIDATES (int)(sizeof candidates / sizeof candidates[0])

/* Candidate i beats candidate j for the target: one that meets it over
 * one that does not; then the faster precision mix (every candidate here
 * is fully INT8, one mix, so their timings differ by noise only and do not
 * decide); then more agreeing; then the smaller rel L2. */
static int better(const check_result *r, int i, int j, double target)
{
    const int mi = r[i].agreement >= target, mj = r[j].agreement >= target;
    if (mi != mj)
        return mi;
    if (r[i].agree != r[j].agree)
        return r[i].agree > r[j].agree;
    return r[i].rel_l2 < r[j].rel_l2;
}

/* --target-agreement: every candidate's table from one set of histograms,
 * each measured on o->check; the best (better()) into *t. Returns 0,
 * EXIT_BELOW_MIN when none meets the target, or -1. */
static int search(engine *f32, preprocess_ctx *pp, const resnet18_weights *w, const calibrate_opts *o, calib_table *t)
{
    calib_hist *hist = calloc(CALIB_NTENSORS, sizeof *hist);
    check_result r[NCANDIDATES];
    calib_table tables[NCANDIDATES];
    int used, best = 0;
    if (!hist) {
        fprintf(stderr, "resnetd-calibrate: out of memory\n");
        return -1;
    }
    if (observe_images(f32, pp, o, hist, &used) != 0) {
        free(hist);
        return -1;
    }
    printf("candidates: INT8 against FP32 on the images of %s (img/s: the CPU INT8 engine, this machine)\n", o->check);
    printf("%-22s %-6s %12s %9s %9s\n", "method", "mix", "agreement", "rel L2", "img/s");
    for (int i = 0; i < NCANDIDATES; i++) {
        char name[48];
        table_of(hist, used, w, candidates[i].method, candidates[i].percentile, &tables[i]);
        if (measure(f32, pp, w, &tables[i], o, &r[i]) != 0) {
            free(hist);
            return -1;
        }
        calib_method_label(candidates[i].method, candidates[i].percentile, name, sizeof name);
        printf("%-22s %-6s %5d/%-4d %8.4f %9.1f\n", name, "int8", r[i].agree, r[i].images, r[i].rel_l2,
               r[i].int8_img_s);
        if (i > 0 && better(r, i, best, o->target_agreement))
            best = i;
    }
    free(hist);
    *t = tables[best];
    t->check = (calib_check){ .images = r[best].images, .agreement = r[best].agreement, .rel_l2 = r[best].rel_l2 };
    const int met = r[best].agreement >= o->target_agreement;
    char chosen[48];
    calib_method_label(t->method, t->percentile, chosen, sizeof chosen);
    printf("chosen: %s, top-1 agreement %.1f%% %s the target %g%%\n", chosen, r[best].agreement,
           met ? "meets" : "is below", o->target_agreement);
    return met ? 0 : EXIT_BELOW_MIN;
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
        table_of(hist, used, w, o->method, o->percentile, t);
        free(hist);
        status = o->check ? check(e, pp, w, t, o) : 0;
    }
    if (status < 0)
        return -1;
    if (calib_save(o->out, t, err, sizeof err) != 0) {
        fprintf(stderr, "resnetd-calibrate: %s\n", err);
        return -1;
    }
    fprintf(stderr, "resnetd-calibrate: %d images, %s: wrote %s\n", t->images, calib_method_name(t->method), o->out);
    return status;
}

int main(int argc, char **argv)
{
    calibrate_opts o;
    if (parse_args(argc, argv, &o) != 0)
        return 2;
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
