/* resnetd-bench: times the shipped engines and the JPEG preprocessing.
 *
 * The engine part drives the real engine through the engine interface
 * (engine_create, then engine_submit + engine_wait on a slot filled with
 * random bytes), so it times exactly what the daemon runs. Per batch size:
 * warm-up, then --iters timed batches; ms/batch is their median. The decode
 * part runs preprocess_jpeg over every JPEG of a directory with N threads,
 * one preprocess context per thread; img/s is the median over passes.
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
#include "model/clock.h"
#include "model/engine.h"
#include "model/preprocess.h"
#include "model/resnet18.h"

#define BENCH_MAX_BATCHES 16
#define BENCH_MAX_BATCH 4096
#define BENCH_WARMUP 2

typedef struct bench_opts {
    engine_config ecfg;
    const char *weights;        /* path or "synthetic" */
    int batches[BENCH_MAX_BATCHES];
    int nbatches;
    int iters;
    const char *decode_dir;
    int decode_only;
    int decode_threads;
    int json;
} bench_opts;

/* One engine measurement: a batch size at one precision. */
typedef struct engine_result {
    int batch;
    double ms_per_batch;        /* median */
    double ms_min, ms_max;
    double img_per_s;
    double gflops;
} engine_result;

typedef struct decode_result {
    int files;
    int failed;                 /* files skipped because they do not decode */
    int threads;
    double img_per_s;           /* median over passes */
} decode_result;

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: resnetd-bench [OPTION]...\n"
            "Time ResNet18 inference through the engine interface, and JPEG preprocessing.\n\n"
            "  --device D           cpu, cuda, cuda:N or auto (default auto)\n"
            "  --precision P        fp32 or fp16 (default: the engine's default)\n"
            "  --weights F          safetensors weights, or 'synthetic' (default)\n"
            "  --batches LIST       comma-separated batch sizes (default 1,8,32)\n"
            "  --iters N            timed batches per size, after %d warm-up (default 10)\n"
            "  --threads N          CPU engine threads (default: all cores)\n"
            "  --decode-dir DIR     also time preprocessing of every *.jpg/*.jpeg in DIR\n"
            "  --decode-threads N   preprocessing threads (default: all cores)\n"
            "  --decode-only        time only the preprocessing\n"
            "  --json               print one JSON object\n"
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

static int parse_args(int argc, char **argv, bench_opts *o)
{
    enum { OPT_DEVICE = 256, OPT_PRECISION, OPT_WEIGHTS, OPT_BATCHES, OPT_ITERS, OPT_THREADS,
           OPT_DECODE_DIR, OPT_DECODE_THREADS, OPT_DECODE_ONLY, OPT_JSON, OPT_HELP };
    static const struct option longopts[] = {
        {"device", required_argument, NULL, OPT_DEVICE},
        {"precision", required_argument, NULL, OPT_PRECISION},
        {"weights", required_argument, NULL, OPT_WEIGHTS},
        {"batches", required_argument, NULL, OPT_BATCHES},
        {"iters", required_argument, NULL, OPT_ITERS},
        {"threads", required_argument, NULL, OPT_THREADS},
        {"decode-dir", required_argument, NULL, OPT_DECODE_DIR},
        {"decode-threads", required_argument, NULL, OPT_DECODE_THREADS},
        {"decode-only", no_argument, NULL, OPT_DECODE_ONLY},
        {"json", no_argument, NULL, OPT_JSON},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    memset(o, 0, sizeof *o);
    o->ecfg.device = ENGINE_DEVICE_AUTO;
    o->weights = "synthetic";
    o->iters = 10;
    parse_batches("1,8,32", o);
    int c;
    long v;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_DEVICE:
            if (engine_parse_device(optarg, &o->ecfg.device, &o->ecfg.device_index) != 0) {
                fprintf(stderr, "resnetd-bench: --device must be cpu, cuda, cuda:N or auto, got '%s'\n", optarg);
                return -1;
            }
            break;
        case OPT_PRECISION:
            if (engine_parse_precision(optarg, &o->ecfg.precision) != 0) {
                fprintf(stderr, "resnetd-bench: --precision must be fp32 or fp16, got '%s'\n", optarg);
                return -1;
            }
            break;
        case OPT_WEIGHTS: o->weights = optarg; break;
        case OPT_BATCHES:
            if (parse_batches(optarg, o) != 0) {
                fprintf(stderr, "resnetd-bench: --batches must be up to %d sizes in 1..%d, got '%s'\n",
                        BENCH_MAX_BATCHES, BENCH_MAX_BATCH, optarg);
                return -1;
            }
            break;
        case OPT_ITERS:
            if (parse_int(optarg, 1, 1000000, &v) != 0) {
                fprintf(stderr, "resnetd-bench: --iters must be a positive integer, got '%s'\n", optarg);
                return -1;
            }
            o->iters = (int)v;
            break;
        case OPT_THREADS:
            if (parse_int(optarg, 0, 256, &v) != 0) {
                fprintf(stderr, "resnetd-bench: --threads must be 0..256, got '%s'\n", optarg);
                return -1;
            }
            o->ecfg.threads = (int)v;
            break;
        case OPT_DECODE_DIR: o->decode_dir = optarg; break;
        case OPT_DECODE_THREADS:
            if (parse_int(optarg, 1, 256, &v) != 0) {
                fprintf(stderr, "resnetd-bench: --decode-threads must be 1..256, got '%s'\n", optarg);
                return -1;
            }
            o->decode_threads = (int)v;
            break;
        case OPT_DECODE_ONLY: o->decode_only = 1; break;
        case OPT_JSON: o->json = 1; break;
        case OPT_HELP: usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "resnetd-bench: unexpected argument '%s'\n", argv[optind]);
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

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
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
    r->ms_per_batch = median(ms, iters);
    r->ms_min = ms[0];
    r->ms_max = ms[iters - 1];
    r->img_per_s = batch * 1000.0 / r->ms_per_batch;
    r->gflops = r->img_per_s * 2.0 * resnet18_macs_per_image() / 1e9;
    free(ms);
    return 0;
}

/* Creates one engine sized for the largest batch and times every size. */
static int bench_engine(const bench_opts *o, const resnet18_weights *w, engine_result *res,
                        engine *info, char *err, size_t errlen)
{
    engine_config cfg = o->ecfg;
    cfg.max_batch = 0;
    for (int i = 0; i < o->nbatches; i++)
        if (o->batches[i] > cfg.max_batch)
            cfg.max_batch = o->batches[i];
    engine *e = engine_create(w, &cfg, err, errlen);
    if (!e)
        return -1;
    /* Random pixels: an all-zero input could take faster paths. */
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < (size_t)cfg.max_batch * RESNET18_INPUT_BYTES; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        e->input[0][i] = (uint8_t)(s >> 32);
    }
    *info = *e;
    int rc = 0;
    for (int i = 0; i < o->nbatches && rc == 0; i++)
        rc = bench_engine_batch(e, o->batches[i], o->iters, &res[i], err, errlen);
    engine_destroy(e);
    return rc;
}

/* ---- decode -------------------------------------------------------------- */

typedef struct jpeg_file {
    uint8_t *data;
    size_t len;
} jpeg_file;

typedef struct decode_pass {
    jpeg_file *files;
    int nfiles;
    atomic_int next;
    atomic_int errors;
} decode_pass;

typedef struct decode_worker {
    decode_pass *pass;
    preprocess_ctx *ctx;
    uint8_t out[RESNET18_INPUT_BYTES];
} decode_worker;

static void *decode_thread(void *p)
{
    decode_worker *w = p;
    char err[256];
    for (int i; (i = atomic_fetch_add(&w->pass->next, 1)) < w->pass->nfiles;) {
        jpeg_file *f = &w->pass->files[i];
        if (preprocess_jpeg(w->ctx, f->data, f->len, w->out, err, sizeof err) != PREP_OK)
            atomic_fetch_add(&w->pass->errors, 1);
    }
    return NULL;
}

static int has_jpeg_suffix(const char *name)
{
    size_t n = strlen(name);
    return (n > 4 && strcasecmp(name + n - 4, ".jpg") == 0) ||
           (n > 5 && strcasecmp(name + n - 5, ".jpeg") == 0);
}

static int read_whole(const char *path, jpeg_file *f)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return -1;
    int rc = -1;
    long n;
    if (fseek(fp, 0, SEEK_END) == 0 && (n = ftell(fp)) >= 0 && fseek(fp, 0, SEEK_SET) == 0 &&
        (f->data = malloc((size_t)n + 1)) != NULL) {
        if (fread(f->data, 1, (size_t)n, fp) == (size_t)n) {
            f->len = (size_t)n;
            rc = 0;
        } else {
            free(f->data);
            f->data = NULL;
        }
    }
    fclose(fp);
    return rc;
}

/* Loads every JPEG of dir, keeping those that decode. */
static int load_jpegs(const char *dir, jpeg_file **out, int *nout, int *failed, char *err,
                      size_t errlen)
{
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(err, errlen, "%s: %s", dir, strerror(errno));
        return -1;
    }
    jpeg_file *files = NULL;
    int n = 0, cap = 0;
    *failed = 0;
    preprocess_ctx *ctx = preprocess_create(NULL);
    uint8_t *crop = malloc(RESNET18_INPUT_BYTES);
    if (!ctx || !crop) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        if (!has_jpeg_suffix(de->d_name))
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        jpeg_file f;
        if (read_whole(path, &f) != 0) {
            snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
            goto fail;
        }
        char perr[256];
        if (preprocess_jpeg(ctx, f.data, f.len, crop, perr, sizeof perr) != PREP_OK) {
            fprintf(stderr, "resnetd-bench: skipping %s: %s\n", path, perr);
            free(f.data);
            (*failed)++;
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            jpeg_file *grown = realloc(files, (size_t)cap * sizeof *files);
            if (!grown) {
                free(f.data);
                snprintf(err, errlen, "out of memory");
                goto fail;
            }
            files = grown;
        }
        files[n++] = f;
    }
    if (n == 0) {
        snprintf(err, errlen, "%s: no decodable .jpg/.jpeg files", dir);
        goto fail;
    }
    closedir(d);
    free(crop);
    preprocess_destroy(ctx);
    *out = files;
    *nout = n;
    return 0;
fail:
    closedir(d);
    free(crop);
    if (ctx)
        preprocess_destroy(ctx);
    for (int i = 0; i < n; i++)
        free(files[i].data);
    free(files);
    return -1;
}

static int bench_decode(const bench_opts *o, decode_result *r, char *err, size_t errlen)
{
    jpeg_file *files;
    int nfiles, failed;
    if (load_jpegs(o->decode_dir, &files, &nfiles, &failed, err, errlen) != 0)
        return -1;
    const int nt = o->decode_threads;
    const int passes = o->iters < 3 ? 3 : o->iters;
    decode_worker *workers = calloc((size_t)nt, sizeof *workers);
    pthread_t *th = calloc((size_t)nt, sizeof *th);
    double *ips = calloc((size_t)passes, sizeof *ips);
    int rc = -1;
    if (!workers || !th || !ips) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    for (int t = 0; t < nt; t++)
        if (!(workers[t].ctx = preprocess_create(NULL))) {
            snprintf(err, errlen, "out of memory");
            goto out;
        }
    for (int p = 0; p < 1 + passes; p++) {   /* pass 0 warms up */
        decode_pass pass = {.files = files, .nfiles = nfiles};
        atomic_init(&pass.next, 0);
        atomic_init(&pass.errors, 0);
        uint64_t t0 = clock_now_ns();
        int started = 0;
        for (int t = 0; t < nt; t++) {
            workers[t].pass = &pass;
            int e = pthread_create(&th[t], NULL, decode_thread, &workers[t]);
            if (e != 0) {
                snprintf(err, errlen, "pthread_create: %s", strerror(e));
                break;
            }
            started++;
        }
        for (int t = 0; t < started; t++)
            pthread_join(th[t], NULL);
        if (started < nt)
            goto out;
        if (atomic_load(&pass.errors) > 0) {
            snprintf(err, errlen, "%d files failed to decode on a timed pass", atomic_load(&pass.errors));
            goto out;
        }
        if (p > 0)
            ips[p - 1] = nfiles / ((double)(clock_now_ns() - t0) / 1e9);
    }
    r->files = nfiles;
    r->failed = failed;
    r->threads = nt;
    r->img_per_s = median(ips, passes);
    rc = 0;
out:
    for (int t = 0; workers && t < nt; t++)
        if (workers[t].ctx)
            preprocess_destroy(workers[t].ctx);
    free(workers);
    free(th);
    free(ips);
    for (int i = 0; i < nfiles; i++)
        free(files[i].data);
    free(files);
    return rc;
}

/* ---- output --------------------------------------------------------------- */

static void print_table(const bench_opts *o, const engine *info, const engine_result *res,
                        const decode_result *dec)
{
    if (!o->decode_only) {
        printf("engine: %s, %s, weights %s, %d warm-up + %d timed batches (median)\n",
               engine_device_name(info->device), engine_precision_name(info->precision), o->weights,
               BENCH_WARMUP, o->iters);
        printf("%6s %12s %10s %10s\n", "batch", "ms/batch", "img/s", "GFLOP/s");
        for (int i = 0; i < o->nbatches; i++)
            printf("%6d %12.3f %10.1f %10.1f\n", res[i].batch, res[i].ms_per_batch, res[i].img_per_s,
                   res[i].gflops);
    }
    if (o->decode_dir)
        printf("decode: %d files from %s, %d threads: %.1f img/s (median of %d passes)\n",
               dec->files, o->decode_dir, dec->threads, dec->img_per_s, o->iters < 3 ? 3 : o->iters);
}

static int print_json(const bench_opts *o, const engine *info, const engine_result *res,
                      const decode_result *dec)
{
    json_t *root = json_object();
    if (!root)
        return -1;
    if (!o->decode_only) {
        json_t *rows = json_array();
        json_object_set_new(root, "device", json_string(engine_device_name(info->device)));
        json_object_set_new(root, "precision", json_string(engine_precision_name(info->precision)));
        json_object_set_new(root, "weights", json_string(o->weights));
        json_object_set_new(root, "threads", json_integer(o->ecfg.threads));
        json_object_set_new(root, "iters", json_integer(o->iters));
        for (int i = 0; i < o->nbatches; i++)
            json_array_append_new(rows, json_pack("{s:i, s:f, s:f, s:f, s:f, s:f}",
                                                  "batch", res[i].batch,
                                                  "ms_per_batch", res[i].ms_per_batch,
                                                  "ms_min", res[i].ms_min,
                                                  "ms_max", res[i].ms_max,
                                                  "img_per_s", res[i].img_per_s,
                                                  "gflops", res[i].gflops));
        json_object_set_new(root, "engine", rows);
    }
    if (o->decode_dir)
        json_object_set_new(root, "decode", json_pack("{s:s, s:i, s:i, s:i, s:f}",
                                                      "dir", o->decode_dir,
                                                      "files", dec->files,
                                                      "skipped", dec->failed,
                                                      "threads", dec->threads,
                                                      "img_per_s", dec->img_per_s));
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
    char err[8192];   /* room for a full path in a message */
    engine_result res[BENCH_MAX_BATCHES];
    decode_result dec = {0};
    engine info = {0};
    if (!o.decode_only) {
        resnet18_weights w;
        int wrc = strcmp(o.weights, "synthetic") == 0 ? weights_synthetic(1, &w, err, sizeof err)
                                                       : weights_load(o.weights, &w, err, sizeof err);
        if (wrc != 0) {
            fprintf(stderr, "resnetd-bench: %s\n", err);
            return 1;
        }
        int rc = bench_engine(&o, &w, res, &info, err, sizeof err);
        weights_free(&w);
        if (rc != 0) {
            fprintf(stderr, "resnetd-bench: %s\n", err);
            return 1;
        }
    }
    if (o.decode_dir && bench_decode(&o, &dec, err, sizeof err) != 0) {
        fprintf(stderr, "resnetd-bench: decode: %s\n", err);
        return 1;
    }
    if (o.json) {
        if (print_json(&o, &info, res, &dec) != 0) {
            fprintf(stderr, "resnetd-bench: cannot build JSON output\n");
            return 1;
        }
    } else {
        print_table(&o, &info, res, &dec);
    }
    return 0;
}
