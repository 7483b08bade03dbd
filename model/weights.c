/* ResNet18 weights: loads torchvision's parameters from a safetensors file
 * and folds each BatchNorm into its convolution, or makes seeded synthetic
 * weights for tests.
 *
 * The file is mmap'd read-only. Every header entry is validated (dtype,
 * shape against byte count, offsets inside the data area, no overlaps)
 * before any tensor data is read, so a malformed file gets a one-line error
 * and never a crash. Tensors may start at any byte offset, so values are
 * assembled from little-endian bytes rather than cast in place.
 * Output (see model/resnet18.h): conv weights KRSC ([cout][kh][kw][cin])
 * FP32, each BN folded in double and rounded once; fc as stored, with as
 * many classes as fc.weight has rows. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "model/resnet18.h"
#include "util/sha256.h"

#define BN_EPS 1e-5 /* torchvision's BatchNorm2d default */
#define ST_MAX_DIMS 8

/* safetensors dtypes with their element sizes. Only the first three can
 * hold ResNet18 parameters; the others are sized so that entries we ignore
 * (num_batches_tracked is I64) can still have their offsets checked. */
enum { DT_F32, DT_F16, DT_BF16 };
static const struct {
    const char *name;
    uint64_t size;
} st_dtypes[] = {
    { "F32", 4 }, { "F16", 2 }, { "BF16", 2 }, { "F64", 8 },     { "I64", 8 },
    { "U64", 8 }, { "I32", 4 }, { "U32", 4 },  { "I16", 2 },     { "U16", 2 },
    { "I8", 1 },  { "U8", 1 },  { "BOOL", 1 }, { "F8_E4M3", 1 }, { "F8_E5M2", 1 },
};
#define ST_NDTYPES (sizeof st_dtypes / sizeof st_dtypes[0])

typedef struct st_tensor {
    const char *name; /* borrowed from the JSON header */
    int dtype; /* index into st_dtypes */
    int ndim;
    uint64_t shape[ST_MAX_DIMS];
    uint64_t begin, end; /* byte range within the data area */
} st_tensor;

typedef struct st_file {
    const char *path;
    uint8_t *map; /* the whole file, read-only */
    size_t size;
    const uint8_t *data; /* the data area, after the header */
    uint64_t data_len;
    json_t *header;
    st_tensor *t; /* every entry but __metadata__ */
    size_t n;
} st_file;

/* Formats "path: message" into err as one line (tensor names come from the
 * file and could hold control characters). Returns -1. */
__attribute__((format(printf, 4, 5))) static int st_fail(char *err, size_t errlen, const char *path, const char *fmt,
                                                         ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (errlen == 0)
        return -1;
    snprintf(err, errlen, "%s: %s", path, msg);
    for (char *p = err; *p; p++)
        if ((unsigned char)*p < 0x20)
            *p = ' ';
    return -1;
}

static void st_shape_str(const uint64_t *shape, int ndim, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%" PRIu64, i ? ", " : "", shape[i]);
    if (o < len)
        snprintf(buf + o, len - o, "]");
}

static float f32_from_bits(uint32_t u)
{
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* IEEE binary16 to binary32, exact: subnormal halves become normal floats,
 * inf and NaN (payload kept) map to their binary32 counterparts. */
static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f)
        return f32_from_bits(sign | 0x7f800000u | man << 13);
    if (exp != 0)
        return f32_from_bits(sign | (exp + 112) << 23 | man << 13);
    if (man == 0)
        return f32_from_bits(sign);
    /* Subnormal man * 2^-24: shift the leading 1 into the implicit bit. */
    uint32_t e = 113;
    while (!(man & 0x400)) {
        man <<= 1;
        e--;
    }
    return f32_from_bits(sign | e << 23 | (man & 0x3ff) << 13);
}

/* bfloat16 is the top half of a binary32, so this is exact for every value. */
static float bf16_to_f32(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

/* Element i of t as FP32; t was validated, so i is in range. */
static float st_value(const st_file *f, const st_tensor *t, uint64_t i)
{
    const uint8_t *p = f->data + t->begin + i * st_dtypes[t->dtype].size;
    switch (t->dtype) {
    case DT_F32:
        return f32_from_bits((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
    case DT_F16: return f16_to_f32((uint16_t)(p[0] | p[1] << 8));
    default: return bf16_to_f32((uint16_t)(p[0] | p[1] << 8));
    }
}

/* Element i of t, or an error if it is inf or NaN. */
static int st_finite(const st_file *f, const st_tensor *t, uint64_t i, double *v, char *err, size_t errlen)
{
    *v = st_value(f, t, i);
    if (!isfinite(*v))
        return st_fail(err, errlen, f->path, "tensor %s: non-finite value %g at index %" PRIu64, t->name, *v, i);
    return 0;
}

static int st_uint(json_t *j, uint64_t *v)
{
    if (!json_is_integer(j) || json_integer_value(j) < 0)
        return -1;
    *v = (uint64_t)json_integer_value(j);
    return 0;
}

/* Validates one header entry against the data area and fills t. */
static int st_parse_entry(st_file *f, const char *name, json_t *e, st_tensor *t, char *err, size_t errlen)
{
    const char *path = f->path;
    t->name = name;
    if (!json_is_object(e))
        return st_fail(err, errlen, path, "tensor %s: header entry is not a JSON object", name);
    json_t *dtype = json_object_get(e, "dtype");
    json_t *shape = json_object_get(e, "shape");
    json_t *offs = json_object_get(e, "data_offsets");
    if (!json_is_string(dtype))
        return st_fail(err, errlen, path, "tensor %s: dtype missing or not a string", name);
    t->dtype = -1;
    for (size_t i = 0; i < ST_NDTYPES; i++)
        if (strcmp(json_string_value(dtype), st_dtypes[i].name) == 0)
            t->dtype = (int)i;
    if (t->dtype < 0)
        return st_fail(err, errlen, path, "tensor %s: unknown dtype %s", name, json_string_value(dtype));
    if (!json_is_array(shape) || json_array_size(shape) > ST_MAX_DIMS)
        return st_fail(err, errlen, path, "tensor %s: shape missing, not an array or over %d dimensions", name,
                       ST_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    uint64_t count = 1, esize = st_dtypes[t->dtype].size;
    for (int i = 0; i < t->ndim; i++) {
        if (st_uint(json_array_get(shape, (size_t)i), &t->shape[i]) != 0)
            return st_fail(err, errlen, path, "tensor %s: shape holds something other than a non-negative integer",
                           name);
        if (t->shape[i] && count > UINT64_MAX / esize / t->shape[i])
            return st_fail(err, errlen, path, "tensor %s: shape is too large", name);
        count *= t->shape[i];
    }
    if (!json_is_array(offs) || json_array_size(offs) != 2 || st_uint(json_array_get(offs, 0), &t->begin) != 0 ||
        st_uint(json_array_get(offs, 1), &t->end) != 0)
        return st_fail(err, errlen, path, "tensor %s: data_offsets is not [begin, end] in non-negative integers", name);
    if (t->begin > t->end)
        return st_fail(err, errlen, path, "tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 "] has begin > end", name,
                       t->begin, t->end);
    if (t->end > f->data_len)
        return st_fail(err, errlen, path,
                       "tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 "] out of range (data area is %" PRIu64
                       " bytes)",
                       name, t->begin, t->end, f->data_len);
    if (count * esize != t->end - t->begin) {
        char s[128];
        st_shape_str(t->shape, t->ndim, s, sizeof s);
        return st_fail(err, errlen, path,
                       "tensor %s: size mismatch: shape %s of %s needs %" PRIu64 " bytes, data_offsets span %" PRIu64,
                       name, s, st_dtypes[t->dtype].name, count * esize, t->end - t->begin);
    }
    return 0;
}

static int st_cmp_begin(const void *a, const void *b)
{
    const st_tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

static void st_close(st_file *f)
{
    free(f->t);
    json_decref(f->header);
    if (f->map)
        munmap(f->map, f->size);
    memset(f, 0, sizeof *f);
}

/* Maps path and validates its whole header. On error the caller still
 * calls st_close(). */
static int st_open(st_file *f, const char *path, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    f->path = path;
    /* O_NONBLOCK: open() on a FIFO must not wait for a writer (a reload
     * of one held every later reload). */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return st_fail(err, errlen, path, "%s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return st_fail(err, errlen, path, "%s", strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return st_fail(err, errlen, path, "not a regular file");
    }
    if (st.st_size < 8) {
        close(fd);
        return st_fail(err, errlen, path, "file too short (%lld bytes) for the 8-byte header length",
                       (long long)st.st_size);
    }
    f->size = (size_t)st.st_size;
    void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED)
        return st_fail(err, errlen, path, "mmap: %s", strerror(e));
    f->map = m;

    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | f->map[i];
    /* Files users have instead of safetensors (whose header is a JSON
     * object that fits): say what they are and how to convert them. */
    const char *kind = NULL;
    if (hlen == 0 || hlen > f->size - 8 || f->map[8] != '{') {
        if (memcmp(f->map, "PK\x03\x04", 4) == 0)
            kind = "a PyTorch checkpoint (torch.save's zip: .pth/.pt)";
        else if (f->map[0] == 0x80 && f->map[1] >= 2 && f->map[1] <= 5)
            kind = "a Python pickle (an old-style torch.save .pth/.pt)";
        else if (memcmp(f->map, "\x89HDF", 4) == 0)
            kind = "an HDF5 file (Keras .h5)";
    }
    if (kind)
        return st_fail(err, errlen, path,
                       "not safetensors: this is %s; convert a torchvision/timm ResNet-18 "
                       "checkpoint with: resnetd-convert FILE OUT.safetensors",
                       kind);
    if (hlen > f->size - 8)
        return st_fail(err, errlen, path, "header length %" PRIu64 " runs past the end of the file (%zu bytes)", hlen,
                       f->size);
    json_error_t je;
    f->header = json_loadb((const char *)f->map + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!f->header)
        return st_fail(err, errlen, path, "bad JSON header: %s (line %d, column %d)", je.text, je.line, je.column);
    if (!json_is_object(f->header))
        return st_fail(err, errlen, path, "JSON header is not an object");
    f->data = f->map + 8 + hlen;
    f->data_len = f->size - 8 - hlen;

    f->t = calloc(json_object_size(f->header) + 1, sizeof *f->t);
    if (!f->t)
        return st_fail(err, errlen, path, "out of memory");
    const char *name;
    json_t *entry;
    json_object_foreach(f->header, name, entry)
    {
        if (strcmp(name, "__metadata__") == 0)
            continue;
        if (st_parse_entry(f, name, entry, &f->t[f->n], err, errlen) != 0)
            return -1;
        f->n++;
    }

    /* Sorted by begin, ranges that do not overlap so far are disjoint and
     * in order, so each need only be checked against the one before it.
     * Empty tensors own no bytes and overlap nothing. */
    qsort(f->t, f->n, sizeof *f->t, st_cmp_begin);
    const st_tensor *last = NULL;
    for (size_t i = 0; i < f->n; i++) {
        const st_tensor *t = &f->t[i];
        if (t->begin == t->end)
            continue;
        if (last && t->begin < last->end)
            return st_fail(err, errlen, path,
                           "tensors %s [%" PRIu64 ", %" PRIu64 "] and %s [%" PRIu64 ", %" PRIu64 "] overlap",
                           last->name, last->begin, last->end, t->name, t->begin, t->end);
        last = t;
    }
    return 0;
}

/* The tensor called name, checked to be floating point of the given shape;
 * NULL with a message when it is missing or wrong. */
static const st_tensor *st_find(const st_file *f, const char *name, char *err, size_t errlen)
{
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0)
            return &f->t[i];
    st_fail(err, errlen, f->path, "missing tensor %s", name);
    return NULL;
}

static const st_tensor *st_expect(const st_file *f, const char *name, int ndim, const uint64_t *shape, char *err,
                                  size_t errlen)
{
    const st_tensor *t = st_find(f, name, err, errlen);
    if (!t)
        return NULL;
    if (t->dtype != DT_F32 && t->dtype != DT_F16 && t->dtype != DT_BF16) {
        st_fail(err, errlen, f->path, "tensor %s: unsupported dtype %s (need F32, F16 or BF16)", name,
                st_dtypes[t->dtype].name);
        return NULL;
    }
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char got[128], want[128];
        st_shape_str(t->shape, t->ndim, got, sizeof got);
        st_shape_str(shape, ndim, want, sizeof want);
        st_fail(err, errlen, f->path, "tensor %s: wrong shape %s, expected %s", name, got, want);
        return NULL;
    }
    return t;
}

/* Folds conv d and its BatchNorm into out:
 *   scale = gamma / sqrt(var + eps), w' = w * scale, b' = beta - mean * scale
 * transposing OIHW to KRSC on the way. */
static int fold_conv(const st_file *f, const resnet18_conv_desc *d, resnet18_conv *out, char *err, size_t errlen)
{
    static const char *const bn_fields[4] = { "weight", "bias", "running_mean", "running_var" };
    const uint64_t cout = (uint64_t)d->cout, cin = (uint64_t)d->cin, k = (uint64_t)d->k;
    const uint64_t wshape[4] = { cout, cin, k, k };
    char name[128];
    snprintf(name, sizeof name, "%s.weight", d->name);
    const st_tensor *tw = st_expect(f, name, 4, wshape, err, errlen);
    if (!tw)
        return -1;
    const st_tensor *tbn[4];
    for (int j = 0; j < 4; j++) {
        snprintf(name, sizeof name, "%s.%s", d->bn, bn_fields[j]);
        if (!(tbn[j] = st_expect(f, name, 1, &cout, err, errlen)))
            return -1;
    }
    out->w = malloc(cout * cin * k * k * sizeof *out->w);
    out->b = malloc(cout * sizeof *out->b);
    if (!out->w || !out->b)
        return st_fail(err, errlen, f->path, "out of memory");

    for (uint64_t o = 0; o < cout; o++) {
        double bn[4];
        for (int j = 0; j < 4; j++)
            if (st_finite(f, tbn[j], o, &bn[j], err, errlen) != 0)
                return -1;
        if (bn[3] < 0)
            return st_fail(err, errlen, f->path, "tensor %s: negative running_var %g at index %" PRIu64, tbn[3]->name,
                           bn[3], o);
        double scale = bn[0] / sqrt(bn[3] + BN_EPS);
        out->b[o] = (float)(bn[1] - bn[2] * scale);
        if (!isfinite(out->b[o]))
            return st_fail(err, errlen, f->path, "%s: folded bias overflows float at channel %" PRIu64, d->bn, o);
        for (uint64_t c = 0; c < cin; c++)
            for (uint64_t y = 0; y < k; y++)
                for (uint64_t x = 0; x < k; x++) {
                    double v;
                    if (st_finite(f, tw, ((o * cin + c) * k + y) * k + x, &v, err, errlen) != 0)
                        return -1;
                    float fv = (float)(v * scale);
                    if (!isfinite(fv))
                        return st_fail(err, errlen, f->path, "%s: folded weight overflows float at channel %" PRIu64,
                                       d->name, o);
                    out->w[((o * k + y) * k + x) * cin + c] = fv;
                }
    }
    return 0;
}

/* Copies a floating-point tensor of the given shape into a new FP32 array. */
static float *st_copy(const st_file *f, const char *name, int ndim, const uint64_t *shape, char *err, size_t errlen)
{
    const st_tensor *t = st_expect(f, name, ndim, shape, err, errlen);
    if (!t)
        return NULL;
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    float *out = malloc(n * sizeof *out);
    if (!out) {
        st_fail(err, errlen, f->path, "out of memory");
        return NULL;
    }
    for (uint64_t i = 0; i < n; i++) {
        double v;
        if (st_finite(f, t, i, &v, err, errlen) != 0) {
            free(out);
            return NULL;
        }
        out[i] = (float)v;
    }
    return out;
}

/* The head's class count: fc.weight's first dimension, [classes][512]. */
static int fc_classes(const st_file *f, int *classes, char *err, size_t errlen)
{
    const st_tensor *t = st_find(f, "fc.weight", err, errlen);
    if (!t)
        return -1;
    if (t->ndim != 2 || t->shape[1] != RESNET18_FEATURES) {
        char got[128];
        st_shape_str(t->shape, t->ndim, got, sizeof got);
        return st_fail(err, errlen, f->path, "tensor fc.weight: wrong shape %s, expected [classes, %d]", got,
                       RESNET18_FEATURES);
    }
    if (t->shape[0] < 1 || t->shape[0] > RESNET18_MAX_CLASSES)
        return st_fail(err, errlen, f->path, "tensor fc.weight: %" PRIu64 " classes, expected 1 to %d", t->shape[0],
                       RESNET18_MAX_CLASSES);
    *classes = (int)t->shape[0];
    return 0;
}

int weights_load(const char *path, resnet18_weights *w, char *err, size_t errlen)
{
    st_file f;
    memset(w, 0, sizeof *w);
    if (st_open(&f, path, err, errlen) != 0)
        goto fail;
    for (int i = 0; i < RESNET18_NUM_CONVS; i++)
        if (fold_conv(&f, &resnet18_convs[i], &w->conv[i], err, errlen) != 0)
            goto fail;
    if (fc_classes(&f, &w->classes, err, errlen) != 0)
        goto fail;
    const uint64_t fc_w_shape[2] = { (uint64_t)w->classes, RESNET18_FEATURES };
    const uint64_t fc_b_shape[1] = { (uint64_t)w->classes };
    if (!(w->fc_w = st_copy(&f, "fc.weight", 2, fc_w_shape, err, errlen)) ||
        !(w->fc_b = st_copy(&f, "fc.bias", 1, fc_b_shape, err, errlen)))
        goto fail;
    sha256_hex(f.map, f.size, w->sha256);
    st_close(&f);
    return 0;
fail:
    weights_free(w);
    st_close(&f);
    return -1;
}

/* splitmix64: a tiny, well-mixed generator, so a seed fixes every weight. */
static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-a, a). */
static float synth_uniform(uint64_t *s, double a)
{
    return (float)(a * ((double)(splitmix64(s) >> 11) * 0x1p-52 - 1.0));
}

int weights_synthetic(uint64_t seed, resnet18_weights *w, char *err, size_t errlen)
{
    uint64_t s = seed;
    memset(w, 0, sizeof *w);
    for (int i = 0; i < RESNET18_NUM_CONVS; i++) {
        const resnet18_conv_desc *d = &resnet18_convs[i];
        size_t n = (size_t)d->cout * d->k * d->k * d->cin;
        resnet18_conv *c = &w->conv[i];
        c->w = malloc(n * sizeof *c->w);
        c->b = malloc((size_t)d->cout * sizeof *c->b);
        if (!c->w || !c->b)
            goto oom;
        /* He-uniform (variance 2 / fan_in) keeps ReLU activations at a
         * steady scale. Without BN every residual add doubles the variance,
         * so the convs that add one get half the gain. */
        double gain = d->residual == R18_NONE ? 1.0 : 0.5;
        double a = gain * sqrt(6.0 / ((double)d->cin * d->k * d->k));
        for (size_t j = 0; j < n; j++)
            c->w[j] = synth_uniform(&s, a);
        for (int j = 0; j < d->cout; j++)
            c->b[j] = synth_uniform(&s, 0.1);
    }
    w->classes = RESNET18_IMAGENET_CLASSES;
    w->fc_w = malloc((size_t)w->classes * RESNET18_FEATURES * sizeof *w->fc_w);
    w->fc_b = malloc((size_t)w->classes * sizeof *w->fc_b);
    if (!w->fc_w || !w->fc_b)
        goto oom;
    double a = sqrt(3.0 / RESNET18_FEATURES);
    for (size_t j = 0; j < (size_t)w->classes * RESNET18_FEATURES; j++)
        w->fc_w[j] = synth_uniform(&s, a);
    for (int j = 0; j < w->classes; j++)
        w->fc_b[j] = synth_uniform(&s, 0.1);
    w->synthetic = 1;
    return 0;
oom:
    weights_free(w);
    snprintf(err, errlen, "synthetic weights: out of memory");
    return -1;
}

void weights_free(resnet18_weights *w)
{
    for (int i = 0; i < RESNET18_NUM_CONVS; i++) {
        free(w->conv[i].w);
        free(w->conv[i].b);
    }
    free(w->fc_w);
    free(w->fc_b);
    memset(w, 0, sizeof *w);
}
