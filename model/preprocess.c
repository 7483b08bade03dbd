/* JPEG bytes -> the 224x224 uint8 crop torchvision computes, bit for bit.
 *
 * Pipeline: SOI check, header (size limit before any allocation), TurboJPEG
 * decode to packed RGB (ISLOW DCT + fancy upsampling, PIL's defaults), then
 * Pillow 9.4's ImagingResample (BILINEAR, src/libImaging/Resample.c) for
 * torchvision's Resize(256), evaluated only at the CenterCrop(224) pixels.
 * Each output pixel depends only on its own coefficients, so computing just
 * the crop gives the same bytes as resizing everything and cropping.
 *
 * Strictness: any libjpeg warning rejects the image (TJFLAG_STOPONWARNING).
 * PIL also refuses truncated files, but decodes through corrupt entropy data
 * or an inconsistent progression; we prefer a clear invalid_jpeg on the
 * request path to guessed pixels. TJFLAG_LIMITSCANS caps progressive files
 * at 500 scans, so a scan bomb costs milliseconds.
 *
 * The ctx owns the decode buffer and the resize scratch; both grow to the
 * largest image seen and are reused. One thread at a time per ctx. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>
#include "model/preprocess.h"

#define PRECISION_BITS 22 /* Pillow's 32 - 8 - 2 */

const float preprocess_mean[3] = {0.485f, 0.456f, 0.406f};
const float preprocess_std[3] = {0.229f, 0.224f, 0.225f};

struct preprocess_ctx {
    tjhandle tj;
    uint64_t max_pixels;
    int fast;
    uint8_t *pixels;   /* decoded image, [h][w][3] */
    size_t pixels_cap;
    uint8_t *scratch;  /* resize coefficients + intermediate, see crop_plan */
    size_t scratch_cap;
};

/* --- resize geometry: torchvision Resize(256) + CenterCrop(224) ---------- */

/* Python's round() of d / 2.0 for an integer d >= 0: halves go to even. */
static int round_half_even_div2(int d)
{
    int q = d / 2;
    if (d % 2 == 1 && q % 2 == 1)
        q++;
    return q;
}

/* Resized size (shorter side -> 256, longer truncated as int(256*long/short))
 * and the top-left corner of the centre crop in it. */
static void resize_geometry(int w, int h, int *rw, int *rh, int *left, int *top)
{
    int s = w <= h ? w : h, l = w <= h ? h : w;
    int nl = (int)((double)PREPROCESS_RESIZE * l / s);
    *rw = w <= h ? PREPROCESS_RESIZE : nl;
    *rh = w <= h ? nl : PREPROCESS_RESIZE;
    *left = round_half_even_div2(*rw - PREPROCESS_CROP);
    *top = round_half_even_div2(*rh - PREPROCESS_CROP);
}

/* --- Pillow's precompute_coeffs for one axis, BILINEAR (support 1) ------- */

typedef struct axis {
    int in_size, out_size;
    double scale, filterscale, support;
    int ksize;         /* taps per output, Pillow's ceil(support) * 2 + 1 */
} axis;

static axis axis_make(int in_size, int out_size)
{
    axis a = {.in_size = in_size, .out_size = out_size};
    a.scale = a.filterscale = (double)in_size / out_size;
    if (a.filterscale < 1.0)
        a.filterscale = 1.0;
    a.support = 1.0 * a.filterscale;
    a.ksize = (int)ceil(a.support) * 2 + 1;
    return a;
}

/* First source index and tap count of output xx (Pillow's xmin, xmax). */
static void axis_bounds(const axis *a, int xx, double *center, int *xmin, int *n)
{
    double c = (xx + 0.5) * a->scale;
    int lo = (int)(c - a->support + 0.5);
    int hi = (int)(c + a->support + 0.5);
    if (lo < 0)
        lo = 0;
    if (hi > a->in_size)
        hi = a->in_size;
    *center = c;
    *xmin = lo;
    *n = hi - lo;
}

static double bilinear_filter(double x)
{
    if (x < 0.0)
        x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Coefficients of outputs first..first+count-1 in 22-bit fixed point:
 * bounds[2i] = xmin, bounds[2i+1] = taps, k[i*ksize ..] = weights. The double
 * arithmetic follows Pillow's expression order exactly, since a weight that
 * differs in its last bit can flip a rounding. */
static void axis_coeffs(const axis *a, int first, int count, int *bounds, int32_t *k)
{
    double ss = 1.0 / a->filterscale;
    for (int i = 0; i < count; i++) {
        double center;
        int xmin, n;
        axis_bounds(a, first + i, &center, &xmin, &n);
        double ww = 0.0;
        for (int x = 0; x < n; x++)
            ww += bilinear_filter((x + xmin - center + 0.5) * ss);
        int32_t *ki = k + (size_t)i * a->ksize;
        for (int x = 0; x < a->ksize; x++) {
            double w = 0.0;
            if (x < n) {
                w = bilinear_filter((x + xmin - center + 0.5) * ss);
                if (ww != 0.0)
                    w /= ww;
            }
            ki[x] = w < 0 ? (int32_t)(-0.5 + w * (1 << PRECISION_BITS))
                          : (int32_t)(0.5 + w * (1 << PRECISION_BITS));
        }
        bounds[2 * i] = xmin;
        bounds[2 * i + 1] = n > 0 ? n : 0;
    }
}

static uint8_t clip8(int32_t v)
{
    if (v >= (int32_t)(255u << PRECISION_BITS))
        return 255;
    if (v <= 0)
        return 0;
    return (uint8_t)(v >> PRECISION_BITS);
}

/* Layout of the scratch buffer for one source size: both axes' bounds and
 * coefficients (int32, first, so malloc alignment suffices), then the
 * horizontally resampled rows the crop needs ([rows][224][3] uint8). */
typedef struct crop_plan {
    axis ax, ay;
    int left, top;
    int row_first, rows;     /* source rows read by the vertical pass */
    size_t off_ky, off_bx, off_by, off_tmp, bytes;
} crop_plan;

static crop_plan crop_plan_make(int w, int h)
{
    crop_plan p;
    int rw, rh;
    resize_geometry(w, h, &rw, &rh, &p.left, &p.top);
    p.ax = axis_make(w, rw);
    p.ay = axis_make(h, rh);
    double c;
    int lo, n, last_lo, last_n;
    axis_bounds(&p.ay, p.top, &c, &lo, &n);
    axis_bounds(&p.ay, p.top + PREPROCESS_CROP - 1, &c, &last_lo, &last_n);
    p.row_first = lo;
    p.rows = last_lo + last_n - lo;
    size_t kx = (size_t)PREPROCESS_CROP * p.ax.ksize * sizeof(int32_t);
    size_t ky = (size_t)PREPROCESS_CROP * p.ay.ksize * sizeof(int32_t);
    size_t bnd = (size_t)PREPROCESS_CROP * 2 * sizeof(int);
    p.off_ky = kx;
    p.off_bx = p.off_ky + ky;
    p.off_by = p.off_bx + bnd;
    p.off_tmp = p.off_by + bnd;
    p.bytes = p.off_tmp + (size_t)p.rows * PREPROCESS_CROP * 3;
    return p;
}

size_t preprocess_scratch_bytes(int w, int h)
{
    return w > 0 && h > 0 ? crop_plan_make(w, h).bytes : 0;
}

/* Pillow resamples horizontally (only the rows the vertical pass reads) into
 * a uint8 image, then vertically. An axis whose size does not change is an
 * exact identity pass (weights {1, 0}), so, unlike Pillow, we never skip one. */
void preprocess_resize_crop(const uint8_t *src, int w, int h, uint8_t *out, uint8_t *scratch)
{
    enum { C = PREPROCESS_CROP };
    if (w <= 0 || h <= 0) {
        memset(out, 0, (size_t)C * C * 3);
        return;
    }
    crop_plan p = crop_plan_make(w, h);
    int32_t *kx = (int32_t *)scratch;
    int32_t *ky = (int32_t *)(scratch + p.off_ky);
    int *bx = (int *)(scratch + p.off_bx);
    int *by = (int *)(scratch + p.off_by);
    uint8_t *tmp = scratch + p.off_tmp;
    axis_coeffs(&p.ax, p.left, C, bx, kx);
    axis_coeffs(&p.ay, p.top, C, by, ky);

    for (int r = 0; r < p.rows; r++) {
        const uint8_t *row = src + (size_t)(p.row_first + r) * w * 3;
        uint8_t *dst = tmp + (size_t)r * C * 3;
        for (int xx = 0; xx < C; xx++) {
            const int32_t *k = kx + (size_t)xx * p.ax.ksize;
            const uint8_t *s = row + (size_t)bx[2 * xx] * 3;
            int32_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
            for (int x = 0; x < bx[2 * xx + 1]; x++) {
                s0 += s[3 * x + 0] * k[x];
                s1 += s[3 * x + 1] * k[x];
                s2 += s[3 * x + 2] * k[x];
            }
            dst[3 * xx + 0] = clip8(s0);
            dst[3 * xx + 1] = clip8(s1);
            dst[3 * xx + 2] = clip8(s2);
        }
    }

    /* Row-at-a-time accumulation: the same sums in the same order as
     * Pillow's per-pixel loop, but contiguous, so the compiler vectorises. */
    int32_t acc[C * 3];
    for (int yy = 0; yy < C; yy++) {
        const int32_t *k = ky + (size_t)yy * p.ay.ksize;
        const uint8_t *rows = tmp + (size_t)(by[2 * yy] - p.row_first) * C * 3;
        for (int xc = 0; xc < C * 3; xc++)
            acc[xc] = 1 << (PRECISION_BITS - 1);
        for (int y = 0; y < by[2 * yy + 1]; y++) {
            const uint8_t *row = rows + (size_t)y * C * 3;
            for (int xc = 0; xc < C * 3; xc++)
                acc[xc] += row[xc] * k[y];
        }
        uint8_t *dst = out + (size_t)yy * C * 3;
        for (int xc = 0; xc < C * 3; xc++)
            dst[xc] = clip8(acc[xc]);
    }
}

/* --- normalisation -------------------------------------------------------- */

/* torchvision: ToTensor is x.float().div(255), Normalize is sub_(mean).div_(std),
 * all in float32; the same three IEEE operations give the same bits. Only 256
 * values per channel exist, so they are tabulated first. */
void preprocess_normalize_lut(float lut[3][256])
{
    for (int c = 0; c < 3; c++)
        for (int v = 0; v < 256; v++)
            lut[c][v] = ((float)v / 255.0f - preprocess_mean[c]) / preprocess_std[c];
}

void preprocess_normalize_chw(const uint8_t *hwc, float *chw)
{
    enum { N = PREPROCESS_CROP * PREPROCESS_CROP };
    float lut[3][256];
    preprocess_normalize_lut(lut);
    for (int i = 0; i < N; i++)
        for (int c = 0; c < 3; c++)
            chw[(size_t)c * N + i] = lut[c][hwc[3 * i + c]];
}

/* --- decode ---------------------------------------------------------------- */

preprocess_ctx *preprocess_create(const preprocess_options *opt)
{
    preprocess_ctx *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->tj = tjInitDecompress();
    if (!p->tj) {
        free(p);
        return NULL;
    }
    p->max_pixels = opt && opt->max_pixels ? opt->max_pixels : PREPROCESS_DEFAULT_MAX_PIXELS;
    p->fast = opt ? opt->fast : 0;
    return p;
}

void preprocess_destroy(preprocess_ctx *p)
{
    if (!p)
        return;
    if (p->tj)
        tjDestroy(p->tj);
    free(p->pixels);
    free(p->scratch);
    free(p);
}

/* TurboJPEG 2.1.5 leaves a handle half-way through a header after a fatal
 * error in tjDecompressHeader3(): the next call on it reports a tables-only
 * stream or "contains no image" for a valid file. A fresh handle after every
 * failure keeps one bad request from failing the next good one. */
static preprocess_status tj_fail(preprocess_ctx *p, preprocess_status s)
{
    tjDestroy(p->tj);
    p->tj = tjInitDecompress();
    return s;
}

/* Grows *buf to at least n bytes; old contents are not kept. */
static int grow(uint8_t **buf, size_t *cap, size_t n)
{
    if (n <= *cap)
        return 0;
    free(*buf);
    *buf = malloc(n);
    *cap = *buf ? n : 0;
    return *buf ? 0 : -1;
}

/* Fast mode: the largest DCT-domain reduction 1/2, 1/4 or 1/8 that keeps the
 * shorter side at or above 256 (so the image is at least 2x too large). */
static tjscalingfactor fast_scale(int w, int h)
{
    tjscalingfactor one = {1, 1};
    int nsf = 0, s = w < h ? w : h;
    tjscalingfactor *sf = tjGetScalingFactors(&nsf);
    for (int d = 8; d >= 2 && sf; d /= 2) {
        if (s < PREPROCESS_RESIZE * d)
            continue;
        for (int i = 0; i < nsf; i++)
            if (sf[i].num == 1 && sf[i].denom == d)
                return sf[i];
    }
    return one;
}

preprocess_status preprocess_jpeg(preprocess_ctx *p, const uint8_t *jpeg, size_t len,
                                  uint8_t *out, char *err, size_t errlen)
{
    if (len == 0 || !jpeg) {
        snprintf(err, errlen, "empty body");
        return PREP_ERR_EMPTY;
    }
    if (len < 2 || jpeg[0] != 0xFF || jpeg[1] != 0xD8) {
        snprintf(err, errlen, "not a JPEG (no SOI marker)");
        return PREP_ERR_NOT_JPEG;
    }
    if (!p->tj && !(p->tj = tjInitDecompress())) {
        snprintf(err, errlen, "cannot create a TurboJPEG decompressor");
        return PREP_ERR_NOMEM;
    }
    if (len > ULONG_MAX) {
        snprintf(err, errlen, "JPEG too large (%zu bytes)", len);
        return PREP_ERR_TOO_LARGE;
    }
    /* A tables-only stream returns success and leaves these untouched. */
    int w = 0, h = 0, subsamp = -1, cs = -1;
    if (tjDecompressHeader3(p->tj, jpeg, (unsigned long)len, &w, &h, &subsamp, &cs) != 0) {
        snprintf(err, errlen, "invalid JPEG header: %s", tjGetErrorStr2(p->tj));
        return tj_fail(p, PREP_ERR_CORRUPT);
    }
    if (cs == TJCS_CMYK || cs == TJCS_YCCK) {
        snprintf(err, errlen, "unsupported JPEG colour space %s", cs == TJCS_CMYK ? "CMYK" : "YCCK");
        return PREP_ERR_UNSUPPORTED;
    }
    if (w <= 0 || h <= 0) {
        snprintf(err, errlen, "invalid JPEG size %dx%d", w, h);
        return tj_fail(p, PREP_ERR_CORRUPT);
    }
    if ((uint64_t)w * (uint64_t)h > p->max_pixels) {
        snprintf(err, errlen, "image %dx%d exceeds the %llu pixel limit", w, h,
                 (unsigned long long)p->max_pixels);
        return PREP_ERR_TOO_LARGE;
    }
    tjscalingfactor sf = {1, 1};
    if (p->fast)
        sf = fast_scale(w, h);
    int sw = TJSCALED(w, sf), sh = TJSCALED(h, sf);
    size_t scratch = preprocess_scratch_bytes(sw, sh);
    if (grow(&p->pixels, &p->pixels_cap, (size_t)sw * sh * 3) != 0 ||
        grow(&p->scratch, &p->scratch_cap, scratch) != 0) {
        snprintf(err, errlen, "out of memory for a %dx%d image", sw, sh);
        return PREP_ERR_NOMEM;
    }
    if (tjDecompress2(p->tj, jpeg, (unsigned long)len, p->pixels, sw, 0, sh, TJPF_RGB,
                      TJFLAG_ACCURATEDCT | TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS) != 0) {
        snprintf(err, errlen, "invalid JPEG data: %s", tjGetErrorStr2(p->tj));
        return tj_fail(p, PREP_ERR_CORRUPT);
    }
    preprocess_resize_crop(p->pixels, sw, sh, out, p->scratch);
    return PREP_OK;
}

const char *preprocess_status_code(preprocess_status s)
{
    switch (s) {
    case PREP_OK: return "ok";
    case PREP_ERR_EMPTY: return "empty_body";
    case PREP_ERR_NOT_JPEG: return "not_jpeg";
    case PREP_ERR_CORRUPT: return "invalid_jpeg";
    case PREP_ERR_TOO_LARGE: return "too_large";
    case PREP_ERR_UNSUPPORTED: return "unsupported_jpeg";
    case PREP_ERR_NOMEM: return "internal";
    }
    return "internal";
}
