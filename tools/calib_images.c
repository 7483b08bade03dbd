/* The images resnetd-calibrate reads (tools/calib_images.h). */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/resnet18.h"
#include "tools/calib_images.h"

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

char **jpegdir_list(const char *dir, int *n)
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

int jpegdir_load(preprocess_ctx *pp, const char *dir, char **files, int nfiles, int *next, uint8_t *dst, int max)
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

void jpegdir_free(char **files, int n)
{
    for (int i = 0; i < n; i++)
        free(files[i]);
    free(files);
}

int jpegdir_logits_finite(const float *logits, int n, int classes, const char *dir, char *const *files, int int8)
{
    for (int i = 0; i < n; i++)
        for (int k = 0; k < classes; k++) {
            if (isfinite(logits[(size_t)i * classes + k]))
                continue;
            if (int8)
                fprintf(stderr,
                        "resnetd-calibrate: %s/%s: the INT8 logits are not finite where FP32's are: the INT8 "
                        "engine's FC takes the pooled features as FP16, and these weights' exceed its range "
                        "(65504)\n",
                        dir, files[i]);
            else
                fprintf(stderr,
                        "resnetd-calibrate: %s/%s: the FP32 logits are not finite: these weights do not make a "
                        "working network (activations overflow or are NaN)\n",
                        dir, files[i]);
            return -1;
        }
    return 0;
}

void heldout_free(heldout *h)
{
    jpegdir_free(h->files, h->n);
    free(h->ref);
    free(h->pixels);
    memset(h, 0, sizeof *h);
}

/* Images first.. (up to e->max_batch) of h into e's slot 0; the count, or
 * -1. */
static int heldout_batch(const heldout *h, preprocess_ctx *pp, int first, engine *e)
{
    int n = h->n - first < e->max_batch ? h->n - first : e->max_batch;
    if (!h->pixels)
        return jpegdir_load(pp, h->dir, h->files, h->n, &first, e->input[0], e->max_batch);
    memcpy(e->input[0], h->pixels + (size_t)first * RESNET18_INPUT_BYTES, (size_t)n * RESNET18_INPUT_BYTES);
    return n;
}

/* Runs e on slot 0's first n images; 0, or -1. */
static int run(engine *e, int n)
{
    char err[1024];
    if (engine_submit(e, 0, n, err, sizeof err) == 0 && engine_wait(e, 0, err, sizeof err) == 0)
        return 0;
    fprintf(stderr, "resnetd-calibrate: inference failed: %s\n", err);
    return -1;
}

int heldout_open(engine *f32, preprocess_ctx *pp, const char *dir, heldout *h)
{
    memset(h, 0, sizeof *h);
    h->dir = dir;
    h->classes = f32->classes;
    if (!(h->files = jpegdir_list(dir, &h->n)))
        return -1;
    if (h->n == 0) {
        fprintf(stderr, "resnetd-calibrate: no JPEG files (*.jpg, *.jpeg) in %s\n", dir);
        return -1;
    }
    if (!(h->ref = malloc((size_t)h->n * (size_t)h->classes * sizeof *h->ref))) {
        fprintf(stderr, "resnetd-calibrate: out of memory\n");
        return -1;
    }
    const size_t bytes = (size_t)h->n * RESNET18_INPUT_BYTES;
    uint8_t *pixels = bytes <= HELDOUT_CACHE_BYTES ? malloc(bytes) : NULL; /* NULL: decode each time */
    for (int first = 0; first < h->n;) {
        int n = heldout_batch(h, pp, first, f32);
        if (n < 0 || run(f32, n) != 0 ||
            jpegdir_logits_finite(f32->logits[0], n, h->classes, dir, h->files + first, 0) != 0) {
            free(pixels);
            return -1;
        }
        memcpy(h->ref + (size_t)first * h->classes, f32->logits[0], (size_t)n * h->classes * sizeof *h->ref);
        if (pixels)
            memcpy(pixels + (size_t)first * RESNET18_INPUT_BYTES, f32->input[0], (size_t)n * RESNET18_INPUT_BYTES);
        first += n;
    }
    h->pixels = pixels;
    return 0;
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

/* Scores one image into r: agreement and relative L2 of y against x. */
static void score(const float *x, const float *y, int classes, heldout_result *r, double *rel, double *diff2,
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

int heldout_measure(const heldout *h, preprocess_ctx *pp, engine *e, heldout_result *r)
{
    double *rel = malloc((size_t)h->n * sizeof *rel), diff2 = 0, ref2 = 0;
    memset(r, 0, sizeof *r);
    if (!rel) {
        fprintf(stderr, "resnetd-calibrate: out of memory\n");
        return -1;
    }
    for (int first = 0; first < h->n;) {
        int n = heldout_batch(h, pp, first, e);
        if (n < 0 || run(e, n) != 0 ||
            jpegdir_logits_finite(e->logits[0], n, h->classes, h->dir, h->files + first, 1) != 0) {
            free(rel);
            return -1;
        }
        for (int i = 0; i < n; i++)
            score(h->ref + (size_t)(first + i) * h->classes, e->logits[0] + (size_t)i * h->classes, h->classes, r, rel,
                  &diff2, &ref2);
        first += n;
    }
    qsort(rel, (size_t)r->images, sizeof *rel, cmp_double);
    const int done = r->images;
    r->median = done % 2 ? rel[done / 2] : 0.5 * (rel[done / 2 - 1] + rel[done / 2]);
    r->max = rel[done - 1];
    r->agreement = 100.0 * r->agree / done;
    r->rel_l2 = ref2 > 0 ? sqrt(diff2 / ref2) : 0.0;
    free(rel);
    return 0;
}
