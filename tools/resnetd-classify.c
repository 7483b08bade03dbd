/* resnetd-classify: offline classification of JPEG files with the same
 * preprocessing and engines as the daemon. Prints top-k labels per file, or
 * one JSON object per file (--json), optionally with the raw logits, and can
 * dump each preprocessed input tensor as .npy for comparison with another
 * implementation. Files are run in batches through one engine slot; a
 * directory stands for its *.jpg and *.jpeg files, in name order. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include "config.h"
#include "engine/calib.h"
#include "engine/engine.h"
#include "engine/engine_registry.h"
#include "model/labels.h"
#include "util/npy.h"
#include "image/preprocess.h"
#include "model/resnet18.h"
#include "engine/topk.h"
#include "tools/toolopt.h"

#define CLASSIFY_MAX_BATCH 16

typedef struct classify_opts {
    const char *weights, *labels, *dump_dir, *calibration;
    int top_k; /* 0: the default, 5 or all classes of a smaller head */
    int json, logits, fast;
    unsigned long long max_pixels;
    engine_config ecfg;
} classify_opts;

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: resnetd-classify --weights FILE|synthetic [OPTION]... FILE|DIR...\n"
            "Classify JPEG files with ResNet18 (a directory: its *.jpg and *.jpeg files).\n\n"
            "  --weights FILE       safetensors weights (torchvision names); 'synthetic' for random\n"
            "  --labels FILE        class names, one a line (default: %s)\n"
            "  --top-k K            labels to print per file, 1..the model's classes (default 5)\n"
            "  --device D           cpu, cuda, cuda:N or auto (default auto)\n"
            "  --precision P        fp32, fp16 or int8 (default: fp32 on cpu, fp16 on cuda;\n"
            "                       int8 needs --calibration)\n"
            "  --calibration FILE   INT8 calibration table made by resnetd-calibrate for these weights\n"
            "  --json               one JSON object per file\n"
            "  --logits             add the raw logits (one per class) to the JSON\n"
            "  --dump-input DIR     write each preprocessed tensor as DIR/NAME.npy\n"
            "                       (float32 [3,224,224], normalised)\n"
            "  --fast               DCT-domain downscaling for large images (not bit-exact)\n"
            "  --max-pixels N       reject images with more pixels (default %u)\n"
            "  --threads N          CPU engine threads (default: all cores)\n"
            "  --help, --version\n",
            labels_default_path(), PREPROCESS_DEFAULT_MAX_PIXELS);
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

static int parse_args(int argc, char **argv, classify_opts *o)
{
    enum {
        OPT_WEIGHTS = 256,
        OPT_LABELS,
        OPT_TOPK,
        OPT_DEVICE,
        OPT_PRECISION,
        OPT_JSON,
        OPT_LOGITS,
        OPT_DUMP,
        OPT_FAST,
        OPT_MAXPIX,
        OPT_THREADS,
        OPT_CALIB,
        OPT_HELP,
        OPT_VERSION
    };
    static const struct option longopts[] = {
        { "weights", required_argument, NULL, OPT_WEIGHTS },
        { "labels", required_argument, NULL, OPT_LABELS },
        { "top-k", required_argument, NULL, OPT_TOPK },
        { "device", required_argument, NULL, OPT_DEVICE },
        { "precision", required_argument, NULL, OPT_PRECISION },
        { "json", no_argument, NULL, OPT_JSON },
        { "logits", no_argument, NULL, OPT_LOGITS },
        { "dump-input", required_argument, NULL, OPT_DUMP },
        { "fast", no_argument, NULL, OPT_FAST },
        { "max-pixels", required_argument, NULL, OPT_MAXPIX },
        { "threads", required_argument, NULL, OPT_THREADS },
        { "calibration", required_argument, NULL, OPT_CALIB },
        { "help", no_argument, NULL, OPT_HELP },
        { "version", no_argument, NULL, OPT_VERSION },
        { NULL, 0, NULL, 0 },
    };
    memset(o, 0, sizeof *o);
    o->max_pixels = PREPROCESS_DEFAULT_MAX_PIXELS;
    o->ecfg.device = ENGINE_DEVICE_AUTO;
    int c;
    long v;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_WEIGHTS: o->weights = optarg; break;
        case OPT_LABELS: o->labels = optarg; break;
        case OPT_TOPK:
            if (parse_int(optarg, 1, RESNET18_MAX_CLASSES, &v) != 0) {
                fprintf(stderr, "resnetd-classify: --top-k must be 1..%d, got '%s'\n", RESNET18_MAX_CLASSES, optarg);
                return -1;
            }
            o->top_k = (int)v;
            break;
        case OPT_DEVICE:
            if (toolopt_device("resnetd-classify", optarg, &o->ecfg) != 0)
                return -1;
            break;
        case OPT_PRECISION:
            if (toolopt_precision("resnetd-classify", optarg, &o->ecfg) != 0)
                return -1;
            break;
        case OPT_CALIB: o->calibration = optarg; break;
        case OPT_JSON: o->json = 1; break;
        case OPT_LOGITS: o->logits = 1; break;
        case OPT_DUMP: o->dump_dir = optarg; break;
        case OPT_FAST: o->fast = 1; break;
        case OPT_MAXPIX:
            if (parse_int(optarg, 1, 1L << 40, &v) != 0) {
                fprintf(stderr, "resnetd-classify: --max-pixels must be a positive integer, got '%s'\n", optarg);
                return -1;
            }
            o->max_pixels = (unsigned long long)v;
            break;
        case OPT_THREADS:
            if (parse_int(optarg, 0, 1024, &v) != 0) {
                fprintf(stderr, "resnetd-classify: --threads must be 0..1024, got '%s'\n", optarg);
                return -1;
            }
            o->ecfg.threads = (int)v;
            break;
        case OPT_HELP: usage(stdout); exit(0);
        case OPT_VERSION: printf("resnetd-classify %s\n", PACKAGE_VERSION); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (!o->weights) {
        fprintf(stderr, "resnetd-classify: --weights is required\n");
        return -1;
    }
    if (optind >= argc) {
        fprintf(stderr, "resnetd-classify: no input files\n");
        return -1;
    }
    if (o->logits && !o->json) {
        fprintf(stderr, "resnetd-classify: --logits needs --json\n");
        return -1;
    }
    if (o->ecfg.precision == ENGINE_PRECISION_INT8 && !o->calibration) {
        fprintf(stderr, "resnetd-classify: --precision int8 needs --calibration FILE (made by resnetd-calibrate)\n");
        return -1;
    }
    if (o->calibration && o->ecfg.precision != ENGINE_PRECISION_INT8) {
        fprintf(stderr, "resnetd-classify: --calibration is for --precision int8\n");
        return -1;
    }
    if (!o->labels)
        o->labels = labels_default_path();
    return 0;
}

/* dog.jpg -> DIR/dog.npy */
static int dump_input(const char *dir, const char *file, const uint8_t *img)
{
    static float chw[3 * RESNET18_IMG * RESNET18_IMG];
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    size_t n = strlen(base);
    const char *dot = strrchr(base, '.');
    if (dot && dot != base)
        n = (size_t)(dot - base);
    char path[4096], err[512];
    if (snprintf(path, sizeof path, "%s/%.*s.npy", dir, (int)n, base) >= (int)sizeof path) {
        fprintf(stderr, "resnetd-classify: %s: dump path too long\n", file);
        return -1;
    }
    preprocess_normalize_chw(img, chw);
    const size_t shape[3] = { 3, RESNET18_IMG, RESNET18_IMG };
    if (npy_write_f32(path, chw, 3, shape, err, sizeof err) != 0) {
        fprintf(stderr, "resnetd-classify: %s\n", err);
        return -1;
    }
    return 0;
}

/* top has room for o->top_k entries. */
static void print_result(const classify_opts *o, const labels *lb, const char *file, const float *logits, int classes,
                         topk_entry *top)
{
    int k = topk_softmax(logits, classes, o->top_k, top);
    if (!o->json) {
        printf("%s:\n", file);
        for (int i = 0; i < k; i++)
            printf("  %.4f  %3d  %s\n", top[i].score, top[i].index, lb->names[top[i].index]);
        return;
    }
    json_t *obj = json_object(), *preds = json_array();
    json_object_set_new(obj, "file", json_string(file));
    for (int i = 0; i < k; i++)
        json_array_append_new(preds, json_pack("{s:i, s:s, s:f}", "index", top[i].index, "label",
                                               lb->names[top[i].index], "score", (double)top[i].score));
    json_object_set_new(obj, "predictions", preds);
    if (o->logits) {
        json_t *l = json_array();
        for (int i = 0; i < classes; i++)
            json_array_append_new(l, json_real(logits[i]));
        json_object_set_new(obj, "logits", l);
    }
    char *s = json_dumps(obj, JSON_COMPACT | JSON_REAL_PRECISION(9));
    if (s)
        puts(s);
    free(s);
    json_decref(obj);
}

static void print_error(const classify_opts *o, const char *file, const char *code, const char *msg)
{
    fprintf(stderr, "resnetd-classify: %s: %s\n", file, msg);
    if (o->json) {
        json_t *obj = json_pack("{s:s, s:{s:s, s:s}}", "file", file, "error", "code", code, "message", msg);
        char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
        if (s)
            puts(s);
        free(s);
        json_decref(obj);
    }
}

static int is_jpeg_name(const struct dirent *d)
{
    const char *dot = strrchr(d->d_name, '.');
    return d->d_name[0] != '.' && dot && (strcasecmp(dot, ".jpg") == 0 || strcasecmp(dot, ".jpeg") == 0);
}

/* The arguments with each directory replaced by its JPEG files, in name
 * order (malloc'd strings in a malloc'd array); NULL when out of memory or
 * a directory cannot be read (said on stderr). */
static char **expand_args(int argc, char **argv, int *n)
{
    char **out = NULL;
    int cap = 0;
    *n = 0;
    for (int i = 0; i < argc; i++) {
        struct stat st;
        struct dirent **ents = NULL;
        int ne = 0;
        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
            ne = scandir(argv[i], &ents, is_jpeg_name, alphasort);
            if (ne < 0) {
                fprintf(stderr, "resnetd-classify: %s: %s\n", argv[i], strerror(errno));
                goto fail;
            }
            if (ne == 0)
                fprintf(stderr, "resnetd-classify: %s: no .jpg or .jpeg files\n", argv[i]);
        }
        for (int k = 0; k < (ents ? ne : 1); k++) {
            char **grown = *n == cap ? realloc(out, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *out) : out;
            size_t len = ents ? strlen(argv[i]) + strlen(ents[k]->d_name) + 2 : strlen(argv[i]) + 1;
            char *path = grown ? malloc(len) : NULL;
            if (grown)
                out = grown;
            if (!path) {
                for (; k < ne; k++)
                    free(ents[k]);
                free(ents);
                fprintf(stderr, "resnetd-classify: out of memory\n");
                goto fail;
            }
            if (ents) {
                snprintf(path, len, "%s/%s", argv[i], ents[k]->d_name);
                free(ents[k]);
            } else {
                snprintf(path, len, "%s", argv[i]);
            }
            out[(*n)++] = path;
        }
        free(ents);
    }
    return out;
fail:
    for (int i = 0; i < *n; i++)
        free(out[i]);
    free(out);
    *n = 0;
    return NULL;
}

int main(int argc, char **argv)
{
    classify_opts o;
    if (parse_args(argc, argv, &o) != 0)
        return 2;
    int nfiles;
    char **files = expand_args(argc - optind, argv + optind, &nfiles);
    if (!files) /* a directory unreadable or without JPEGs, or out of memory */
        return 1;
    char err[1024];
    int status = 0;
    resnet18_weights w;
    labels lb;
    engine *e = NULL;
    preprocess_ctx *pp = NULL;
    topk_entry *top = NULL;
    memset(&w, 0, sizeof w);
    memset(&lb, 0, sizeof lb);

    /* Weights first: their head sets how many class names the labels need. */
    if (toolopt_load_weights("resnetd-classify", o.weights, &w) != 0)
        return 1;
    calib_table calib;
    if (o.calibration) {
        if (toolopt_load_calibration("resnetd-classify", o.calibration, &w, o.weights, &calib) != 0) {
            status = 1;
            goto out;
        }
        o.ecfg.calib = &calib;
    }
    if (labels_load(o.labels, w.classes, &lb, err, sizeof err) != 0) {
        fprintf(stderr, "resnetd-classify: labels: %s; weights %s\n", err, o.weights);
        status = 1;
        goto out;
    }
    if (o.top_k > w.classes) {
        fprintf(stderr, "resnetd-classify: --top-k %d is more than the model's %d classes\n", o.top_k, w.classes);
        status = 1;
        goto out;
    }
    if (o.top_k == 0)
        o.top_k = w.classes < 5 ? w.classes : 5;
    if (!(top = malloc((size_t)o.top_k * sizeof *top))) {
        fprintf(stderr, "resnetd-classify: out of memory\n");
        status = 1;
        goto out;
    }
    if (w.synthetic)
        fprintf(stderr, "resnetd-classify: WARNING: synthetic random weights, predictions are meaningless\n");
    o.ecfg.max_batch = nfiles < CLASSIFY_MAX_BATCH ? nfiles : CLASSIFY_MAX_BATCH;
    o.ecfg.nslots = 1;
    e = engine_create(&w, &o.ecfg, err, sizeof err);
    if (!e) {
        fprintf(stderr, "resnetd-classify: %s\n", err);
        status = 1;
        goto out;
    }
    preprocess_options popt = { .max_pixels = o.max_pixels, .fast = o.fast };
    pp = preprocess_create(&popt);
    if (!pp) {
        fprintf(stderr, "resnetd-classify: cannot create the JPEG decoder\n");
        status = 1;
        goto out;
    }

    int batch_file[CLASSIFY_MAX_BATCH];
    for (int next = 0; next < nfiles;) {
        int n = 0;
        for (; next < nfiles && n < e->max_batch; next++) {
            const char *f = files[next];
            FILE *fp = fopen(f, "rb");
            uint8_t *buf = NULL;
            long len = -1;
            if (fp && fseek(fp, 0, SEEK_END) == 0 && (len = ftell(fp)) >= 0 && fseek(fp, 0, SEEK_SET) == 0 &&
                (buf = malloc((size_t)len + 1)) != NULL && fread(buf, 1, (size_t)len, fp) == (size_t)len) {
                uint8_t *slot = e->input[0] + (size_t)n * RESNET18_INPUT_BYTES;
                preprocess_status ps = preprocess_jpeg(pp, buf, (size_t)len, slot, err, sizeof err);
                if (ps == PREP_OK && (!o.dump_dir || dump_input(o.dump_dir, f, slot) == 0)) {
                    batch_file[n++] = next;
                } else {
                    if (ps != PREP_OK)
                        print_error(&o, f, preprocess_status_code(ps), err);
                    status = 1;
                }
            } else {
                print_error(&o, f, "io_error", strerror(errno ? errno : EIO));
                status = 1;
            }
            free(buf);
            if (fp)
                fclose(fp);
        }
        if (n == 0)
            continue;
        if (engine_submit(e, 0, n, err, sizeof err) != 0 || engine_wait(e, 0, err, sizeof err) != 0) {
            fprintf(stderr, "resnetd-classify: inference failed: %s\n", err);
            status = 1;
            goto out;
        }
        for (int i = 0; i < n; i++)
            print_result(&o, &lb, files[batch_file[i]], e->logits[0] + (size_t)i * (size_t)e->classes, e->classes, top);
    }
out:
    if (fflush(stdout) != 0)
        status = 1;
    free(top);
    preprocess_destroy(pp);
    engine_destroy(e);
    weights_free(&w);
    labels_free(&lb);
    for (int i = 0; i < nfiles; i++)
        free(files[i]);
    free(files);
    return status;
}
