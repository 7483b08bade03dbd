/* resnetd-calibrate: makes the INT8 calibration table of a set of weights.
 * Runs the FP32 CPU engine on every JPEG of a directory (name order, with
 * the daemon's preprocessing), observes each tensor that INT8 quantises
 * (engine_cpu_observe), histograms |x| per tensor (model/calib.h), and
 * writes the scales chosen by KL-divergence (entropy) or a percentile.
 * The same weights, images, method and batch give the same table, byte for
 * byte: the images are read in strcmp order and the statistics are exact
 * counts. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "model/calib.h"
#include "model/engine.h"
#include "model/preprocess.h"
#include "model/resnet18.h"

#define CALIBRATE_BATCH 8

typedef struct calibrate_opts {
    const char *weights, *images, *out;
    calib_method method;
    double percentile;
    int threads;
} calibrate_opts;

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: resnetd-calibrate --weights FILE|synthetic --images DIR --out TABLE.json [OPTION]...\n"
            "Make the INT8 calibration table (per-tensor activation scales) of ResNet18 weights\n"
            "from the JPEGs in DIR, for resnetd --precision int8 --calibration TABLE.json.\n\n"
            "  --weights FILE       safetensors weights (torchvision names); 'synthetic' for random\n"
            "  --images DIR         calibration JPEGs (*.jpg, *.jpeg); a few hundred typical inputs\n"
            "  --method M           entropy (KL divergence, TensorRT's; default) or percentile\n"
            "  --percentile P       with --method percentile: the percentile of |x| (default 99.99)\n"
            "  --out FILE           the table to write (JSON)\n"
            "  --threads N          CPU engine threads (default: all cores)\n"
            "  --help, --version\n");
}

static int parse_args(int argc, char **argv, calibrate_opts *o)
{
    enum { OPT_WEIGHTS = 256, OPT_IMAGES, OPT_METHOD, OPT_PCT, OPT_OUT, OPT_THREADS, OPT_HELP, OPT_VERSION };
    static const struct option longopts[] = {
        {"weights", required_argument, NULL, OPT_WEIGHTS},
        {"images", required_argument, NULL, OPT_IMAGES},
        {"method", required_argument, NULL, OPT_METHOD},
        {"percentile", required_argument, NULL, OPT_PCT},
        {"out", required_argument, NULL, OPT_OUT},
        {"threads", required_argument, NULL, OPT_THREADS},
        {"help", no_argument, NULL, OPT_HELP},
        {"version", no_argument, NULL, OPT_VERSION},
        {NULL, 0, NULL, 0},
    };
    memset(o, 0, sizeof *o);
    o->method = CALIB_ENTROPY;
    o->percentile = 99.99;
    int c, pct_given = 0;
    char *end;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_WEIGHTS: o->weights = optarg; break;
        case OPT_IMAGES: o->images = optarg; break;
        case OPT_OUT: o->out = optarg; break;
        case OPT_METHOD:
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
    if (!o->weights || !o->images || !o->out) {
        fprintf(stderr, "resnetd-calibrate: --weights, --images and --out are required\n");
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

int main(int argc, char **argv)
{
    calibrate_opts o;
    if (parse_args(argc, argv, &o) != 0)
        return 2;
    char err[1024];
    int status = 1, nfiles = 0, used = 0;
    char **files = NULL;
    engine *e = NULL;
    preprocess_ctx *pp = NULL;
    calib_hist *hist = NULL;
    resnet18_weights w;
    memset(&w, 0, sizeof w);

    int wrc = strcmp(o.weights, "synthetic") == 0 ? weights_synthetic(1, &w, err, sizeof err)
                                                   : weights_load(o.weights, &w, err, sizeof err);
    if (wrc != 0) {
        fprintf(stderr, "resnetd-calibrate: %s\n", err);
        return 1;
    }
    if (!(files = list_jpegs(o.images, &nfiles)))
        goto out;
    if (nfiles == 0) {
        fprintf(stderr, "resnetd-calibrate: no JPEG files (*.jpg, *.jpeg) in %s\n", o.images);
        goto out;
    }
    engine_config ec = {.device = ENGINE_DEVICE_CPU, .precision = ENGINE_PRECISION_FP32,
                        .max_batch = CALIBRATE_BATCH, .nslots = 1, .threads = o.threads};
    if (!(e = engine_create(&w, &ec, err, sizeof err))) {
        fprintf(stderr, "resnetd-calibrate: %s\n", err);
        goto out;
    }
    hist = calloc(CALIB_NTENSORS, sizeof *hist);
    preprocess_options popt = {.max_pixels = PREPROCESS_DEFAULT_MAX_PIXELS};
    pp = preprocess_create(&popt);
    if (!hist || !pp) {
        fprintf(stderr, "resnetd-calibrate: out of memory\n");
        goto out;
    }
    if (engine_cpu_observe(e, observe, hist, err, sizeof err) != 0) {
        fprintf(stderr, "resnetd-calibrate: %s\n", err);
        goto out;
    }
    for (int next = 0; next < nfiles;) {
        int n = 0;
        for (; next < nfiles && n < e->max_batch; next++) {
            char path[4096];
            uint8_t *buf;
            long len;
            if ((size_t)snprintf(path, sizeof path, "%s/%s", o.images, files[next]) >= sizeof path ||
                (len = read_file(path, &buf)) < 0) {
                fprintf(stderr, "resnetd-calibrate: %s/%s: cannot read\n", o.images, files[next]);
                goto out;
            }
            preprocess_status ps = preprocess_jpeg(pp, buf, (size_t)len, e->input[0] + (size_t)n * RESNET18_INPUT_BYTES,
                                                   err, sizeof err);
            free(buf);
            if (ps != PREP_OK) {
                fprintf(stderr, "resnetd-calibrate: %s: %s\n", path, err);
                goto out;
            }
            n++;
        }
        if (engine_submit(e, 0, n, err, sizeof err) != 0 || engine_wait(e, 0, err, sizeof err) != 0) {
            fprintf(stderr, "resnetd-calibrate: inference failed: %s\n", err);
            goto out;
        }
        used += n;
    }

    calib_table t;
    memset(&t, 0, sizeof t);
    snprintf(t.weights_sha256, sizeof t.weights_sha256, "%s", calib_weights_id(&w));
    t.method = o.method;
    t.percentile = o.method == CALIB_PERCENTILE ? o.percentile : 0;
    t.images = used;
    for (int i = 0; i < CALIB_NTENSORS; i++)
        t.scale[i] = o.method == CALIB_ENTROPY ? calib_scale_entropy(&hist[i])
                                               : calib_scale_percentile(&hist[i], o.percentile);
    if (calib_save(o.out, &t, err, sizeof err) != 0) {
        fprintf(stderr, "resnetd-calibrate: %s\n", err);
        goto out;
    }
    fprintf(stderr, "resnetd-calibrate: %d images, %s: wrote %s\n", used, calib_method_name(o.method), o.out);
    status = 0;
out:
    for (int i = 0; i < nfiles; i++)
        free(files[i]);
    free(files);
    free(hist);
    preprocess_destroy(pp);
    engine_destroy(e);
    weights_free(&w);
    return status;
}
