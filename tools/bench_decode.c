/* resnetd-bench's decode part (tools/bench_decode.h). */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "util/clock.h"
#include "image/devjpeg_registry.h"
#include "engine/engine_registry.h"
#include "image/preprocess.h"
#include "model/resnet18.h"
#include "tools/bench_decode.h"
#include "tools/toolopt.h"

typedef struct jpeg_file {
    uint8_t *data;
    size_t len;
} jpeg_file;

typedef struct decode_pass {
    jpeg_file *files;
    int nfiles;
    int images; /* decoded per pass: the files over and over */
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
    for (int i; (i = atomic_fetch_add(&w->pass->next, 1)) < w->pass->images;) {
        jpeg_file *f = &w->pass->files[i % w->pass->nfiles];
        if (preprocess_jpeg(w->ctx, f->data, f->len, w->out, err, sizeof err) != PREP_OK)
            atomic_fetch_add(&w->pass->errors, 1);
    }
    return NULL;
}

static int has_jpeg_suffix(const char *name)
{
    size_t n = strlen(name);
    return (n > 4 && strcasecmp(name + n - 4, ".jpg") == 0) || (n > 5 && strcasecmp(name + n - 5, ".jpeg") == 0);
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
static int load_jpegs(const char *dir, jpeg_file **out, int *nout, int *failed, char *err, size_t errlen)
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

/* img/s of nthreads threads decoding files[0..nfiles) with options opt
 * (median of passes, after one warm-up pass). A pass goes through the files
 * until each thread has had 24 on average: with fewer, a few large photos
 * decoded last leave most threads idle and the figure says less than the
 * CPUs can do. */
static int cpu_decode_ips(jpeg_file *files, int nfiles, int nt, int passes, const preprocess_options *opt,
                          double *img_per_s, char *err, size_t errlen)
{
    decode_worker *workers = calloc((size_t)nt, sizeof *workers);
    pthread_t *th = calloc((size_t)nt, sizeof *th);
    double *ips = calloc((size_t)passes, sizeof *ips);
    int rc = -1;
    if (!workers || !th || !ips) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    for (int t = 0; t < nt; t++)
        if (!(workers[t].ctx = preprocess_create(opt))) {
            snprintf(err, errlen, "out of memory");
            goto out;
        }
    for (int p = 0; p < 1 + passes; p++) { /* pass 0 warms up */
        decode_pass pass = { .files = files, .nfiles = nfiles, .images = nfiles };
        while (pass.images < 24 * nt)
            pass.images += nfiles;
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
            ips[p - 1] = pass.images / ((double)(clock_now_ns() - t0) / 1e9);
    }
    *img_per_s = toolopt_median(ips, passes);
    rc = 0;
out:
    for (int t = 0; workers && t < nt; t++)
        if (workers[t].ctx)
            preprocess_destroy(workers[t].ctx);
    free(workers);
    free(th);
    free(ips);
    return rc;
}

/* The most img/s of a corpus whose share f only the CPU can decode (at
 * cpu_ref img/s alone), the rest either the GPU (gpu img/s) or the CPU
 * (cpu_acc img/s): T is reachable when the CPU has time for the refused
 * share plus whatever the GPU cannot take. */
static double mixed_ceiling(double f, double gpu, double cpu_acc, double cpu_ref)
{
    double lo = 0, hi = gpu + cpu_acc + cpu_ref + 1;
    for (int i = 0; i < 100; i++) {
        double t = (lo + hi) / 2, spill = (1 - f) * t - gpu;
        double cpu_time = (f > 0 ? f * t / cpu_ref : 0) + (spill > 0 ? spill / cpu_acc : 0);
        if (cpu_time <= 1)
            lo = t;
        else
            hi = t;
    }
    return lo;
}

/* The GPU decode path, stage after stage on alternating slots of a CUDA
 * engine (synthetic weights; the engine itself does not run): img/s of the
 * device decoder, the GPU decode-only ceiling of the daemon. */
static int bench_decode_gpu(const bench_decode_opts *o, jpeg_file *files, int nfiles, decode_result *r, char *err,
                            size_t errlen)
{
    enum { MIN_IMAGES_PER_PASS = 2048 };
    const int B = o->batch, passes = o->iters < 3 ? 3 : o->iters;
    resnet18_weights w;
    engine *e = NULL;
    devjpeg *dj = NULL;
    preprocess_ctx *ctx = preprocess_create(NULL);
    /* The accepted files, then the first B of them again (cyclically): every
     * stage holds B images, as the daemon's do under load, however few files
     * the corpus has (the hardware decodes more per second the more a call
     * holds). */
    const size_t ncyc = (size_t)nfiles + (size_t)B;
    const uint8_t **ptrs = calloc(ncyc, sizeof *ptrs);
    size_t *lens = calloc(ncyc, sizeof *lens);
    int *ws = calloc(ncyc, sizeof *ws), *hs = calloc(ncyc, sizeof *hs);
    double *ips = calloc((size_t)passes, sizeof *ips);
    jpeg_file *acc = calloc((size_t)nfiles, sizeof *acc), *ref = calloc((size_t)nfiles, sizeof *ref);
    int rc = -1, nok = 0, nref = 0, have_w = 0;
    if (!ctx || !ptrs || !lens || !ws || !hs || !ips || !acc || !ref) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    if (weights_synthetic(WEIGHTS_SYNTHETIC_SEED, &w, err, errlen) != 0)
        goto out;
    have_w = 1;
    engine_config ec = o->ecfg;
    ec.device = ENGINE_DEVICE_CUDA;
    ec.max_batch = B;
    ec.nslots = 2;
    if (!(e = engine_create(&w, &ec, err, errlen)) ||
        !(dj = devjpeg_create(e, (size_t)o->memory_mib << 20, 1, o->exact, err, errlen)))
        goto out;
    for (int i = 0; i < nfiles; i++) {
        char why[256];
        preprocess_info info;
        if (preprocess_header(ctx, files[i].data, files[i].len, &info, why, sizeof why) != PREP_OK)
            continue;
        devjpeg_reason dr = devjpeg_check(dj, files[i].data, files[i].len, &info);
        if (dr != DEVJPEG_OK) {
            r->refused++;
            r->refused_by[dr]++;
            ref[nref++] = files[i];
            continue;
        }
        acc[nok] = files[i];
        ws[nok] = info.w;
        hs[nok] = info.h;
        ptrs[nok] = files[i].data;
        lens[nok++] = files[i].len;
    }
    if (nok == 0) {
        snprintf(err, errlen, "the hardware decoder refuses every file");
        goto out;
    }
    for (int i = nok; i < nok + B; i++) {
        ptrs[i] = ptrs[i - nok];
        lens[i] = lens[i - nok];
        ws[i] = ws[i - nok];
        hs[i] = hs[i - nok];
    }
    /* Every accepted file at least once a pass, in whole batches. */
    int per_pass = nok > MIN_IMAGES_PER_PASS ? nok : MIN_IMAGES_PER_PASS;
    per_pass = (per_pass + B - 1) / B * B;
    for (int p = 0, stage = 0; p < 1 + passes; p++) { /* pass 0 warms up */
        uint64_t t0 = clock_now_ns();
        for (int done = 0; done < per_pass;) {
            int i0 = done % nok, nfb = 0;
            if (devjpeg_stage(dj, stage++ % 2, 0, ptrs + i0, lens + i0, ws + i0, hs + i0, B, devjpeg_fallback_none,
                              NULL, &nfb, err, errlen) != 0)
                goto out;
            if (nfb > 0) {
                snprintf(err, errlen, "the device failed on %d images", nfb);
                goto out;
            }
            done += B;
        }
        if (devjpeg_sync(dj, err, errlen) != 0)
            goto out;
        if (p > 0)
            ips[p - 1] = per_pass / ((double)(clock_now_ns() - t0) / 1e9);
    }
    r->images = per_pass;
    r->img_per_s = toolopt_median(ips, passes);
    /* The CPU beside it, decoding as the daemon's decode threads do in this
     * mode (DCT-scaled large photos unless exact), each set on its own. */
    {
        preprocess_options po = devjpeg_cpu_options(dj, 0);
        if (cpu_decode_ips(acc, nok, o->threads, passes, &po, &r->cpu_accepted_img_per_s, err, errlen) != 0 ||
            (nref > 0 &&
             cpu_decode_ips(ref, nref, o->threads, passes, &po, &r->cpu_refused_img_per_s, err, errlen) != 0))
            goto out;
        r->mixed_img_per_s = mixed_ceiling((double)nref / (nok + nref), r->img_per_s, r->cpu_accepted_img_per_s,
                                           r->cpu_refused_img_per_s);
    }
    rc = 0;
out:
    free(acc);
    free(ref);
    devjpeg_destroy(dj);
    if (e)
        engine_destroy(e);
    if (have_w)
        weights_free(&w);
    if (ctx)
        preprocess_destroy(ctx);
    free(ptrs);
    free(lens);
    free(ws);
    free(hs);
    free(ips);
    return rc;
}

int bench_decode(const bench_decode_opts *o, decode_result *r, char *err, size_t errlen)
{
    jpeg_file *files;
    int nfiles, failed;
    if (load_jpegs(o->dir, &files, &nfiles, &failed, err, errlen) != 0)
        return -1;
    r->files = nfiles;
    r->failed = failed;
    int rc;
    if (o->gpu) {
        r->threads = o->threads;
        rc = bench_decode_gpu(o, files, nfiles, r, err, errlen);
    } else {
        r->threads = o->threads;
        rc = cpu_decode_ips(files, nfiles, o->threads, o->iters < 3 ? 3 : o->iters, NULL, &r->img_per_s, err, errlen);
    }
    for (int i = 0; i < nfiles; i++)
        free(files[i].data);
    free(files);
    return rc;
}
