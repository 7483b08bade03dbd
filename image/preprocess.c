/* JPEG bytes -> the 224x224 uint8 crop torchvision computes, bit for bit.
 *
 * Pipeline: SOI check, header (size limit before any allocation), libjpeg
 * decode to packed RGB (ISLOW DCT + fancy upsampling, PIL's defaults, and
 * PIL's library), then Pillow 9.4's ImagingResample (BILINEAR,
 * src/libImaging/Resample.c) for torchvision's Resize(256), evaluated only
 * at the CenterCrop(224) pixels. Each output pixel depends only on its own
 * coefficients, so computing just the crop gives the same bytes as resizing
 * everything and cropping.
 *
 * Why libjpeg's API and not TurboJPEG's: TurboJPEG 2.1 refuses sampling
 * factors it has no name for (4x2, 3x1, 1x4, 2x4: TJSAMP_UNKNOWN) that
 * libjpeg and PIL decode, and it has no progress hook, so a decode could
 * not be stopped once started. Both wrap the same decoder with the same
 * settings, so the pixels are the same.
 *
 * Strictness: any libjpeg warning rejects the image (as TurboJPEG's
 * TJFLAG_STOPONWARNING). PIL also refuses truncated files, but decodes
 * through corrupt entropy data or an inconsistent progression; we prefer a
 * clear invalid_jpeg on the request path to guessed pixels.
 *
 * Decode budget, enforced from libjpeg's progress monitor (called once per
 * iMCU row of every scan, and per output row group):
 *   - at most 500 scans (TurboJPEG's TJFLAG_LIMITSCANS figure);
 *   - the DCT blocks of all scans together at most PREPROCESS_WORK_PASSES
 *     full-colour passes over a max_pixels image: a progressive file's
 *     cost is scans x blocks: an 8192x8192 4:4:4 file of 100 one-coefficient
 *     scans costs 34 passes, libjpeg's default progression 2.7 (4:2:0) to
 *     4.7 (4:4:4);
 *   - the caller's stop hook (deadline, client gone), see
 *     preprocess_set_stop().
 *
 * The ctx owns the decode buffer and the resize scratch; both grow to the
 * largest image seen and are reused, except that after an image whose
 * buffers exceed retain_bytes they are freed, so one huge image does not
 * pin its memory for the life of the thread. One thread at a time per ctx;
 * preprocess_ctx_bytes() may be read from any thread. */
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h> /* before jpeglib.h, which needs size_t and FILE */
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>
#include "image/preprocess.h"

#define PRECISION_BITS 22 /* Pillow's 32 - 8 - 2 */
#define SCAN_LIMIT 500

const float preprocess_mean[3] = { 0.485f, 0.456f, 0.406f };
const float preprocess_std[3] = { 0.229f, 0.224f, 0.225f };

/* libjpeg reports errors through err->error_exit, which must not return:
 * we longjmp back into preprocess_jpeg with the status and message. */
typedef struct jpeg_guard {
    struct jpeg_error_mgr err; /* first: libjpeg's cinfo->err points here */
    struct jpeg_progress_mgr progress;
    jmp_buf jump;
    preprocess_status status; /* why we jumped */
    char msg[JMSG_LENGTH_MAX + 128];
    int last_scan; /* input_scan_number already counted */
    uint64_t work, work_limit; /* DCT blocks of the scans so far, and the cap */
    preprocess_ctx *p;
} jpeg_guard;

struct preprocess_ctx {
    struct jpeg_decompress_struct cinfo;
    jpeg_guard g;
    uint64_t max_pixels;
    size_t retain_bytes;
    int fast;
    int (*stop)(void *cls); /* optional: nonzero stops the decode */
    void *stop_cls;
    uint8_t *pixels; /* decoded image, [h][w][3] */
    size_t pixels_cap;
    uint8_t *scratch; /* resize coefficients + intermediate, see crop_plan */
    size_t scratch_cap;
    uint8_t *cmyk; /* CMYK/YCCK files: libjpeg's CMYK rows, [ROWS][w][4] */
    size_t cmyk_cap;
    atomic_size_t held; /* the three caps + libjpeg's share during a decode */
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
    int ksize; /* taps per output, Pillow's ceil(support) * 2 + 1 */
} axis;

static axis axis_make(int in_size, int out_size)
{
    axis a = { .in_size = in_size, .out_size = out_size };
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
            ki[x] = w < 0 ? (int32_t)(-0.5 + w * (1 << PRECISION_BITS)) : (int32_t)(0.5 + w * (1 << PRECISION_BITS));
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
    int row_first, rows; /* source rows read by the vertical pass */
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

static void guard_jump(j_common_ptr c, preprocess_status s, const char *msg)
{
    jpeg_guard *g = (jpeg_guard *)c->err;
    g->status = s;
    snprintf(g->msg, sizeof g->msg, "%s", msg);
    longjmp(g->jump, 1);
}

static void on_error_exit(j_common_ptr c)
{
    char buf[JMSG_LENGTH_MAX], msg[JMSG_LENGTH_MAX + 32];
    (*c->err->format_message)(c, buf);
    preprocess_status s = PREP_ERR_CORRUPT;
    if (c->err->msg_code == JERR_OUT_OF_MEMORY)
        s = PREP_ERR_NOMEM;
    else if (c->err->msg_code == JERR_NO_BACKING_STORE) /* over max_memory_to_use */
        s = PREP_ERR_TOO_LARGE;
    snprintf(msg, sizeof msg, "invalid JPEG data: %s", buf);
    guard_jump(c, s, s == PREP_ERR_CORRUPT ? msg : buf);
}

/* Level -1 is a warning (corrupt data libjpeg would guess through): fatal
 * here. Other levels are trace messages: ignored. */
static void on_emit_message(j_common_ptr c, int level)
{
    if (level < 0)
        on_error_exit(c);
}

static void on_progress(j_common_ptr c)
{
    jpeg_guard *g = (jpeg_guard *)c->err;
    j_decompress_ptr d = (j_decompress_ptr)c;
    char msg[192];
    if (d->input_scan_number > g->last_scan) {
        g->last_scan = d->input_scan_number;
        if (g->last_scan > SCAN_LIMIT) {
            snprintf(msg, sizeof msg, "invalid JPEG data: progressive JPEG with more than %d scans", SCAN_LIMIT);
            guard_jump(c, PREP_ERR_CORRUPT, msg);
        }
        for (int i = 0; i < d->comps_in_scan && i < MAX_COMPS_IN_SCAN; i++)
            if (d->cur_comp_info[i])
                g->work += (uint64_t)d->cur_comp_info[i]->width_in_blocks * d->cur_comp_info[i]->height_in_blocks;
        if (g->work > g->work_limit) {
            snprintf(msg, sizeof msg,
                     "decoding this JPEG (%ux%u, %d scans so far) needs more work than %d "
                     "full passes over a max_pixels image",
                     d->image_width, d->image_height, g->last_scan, PREPROCESS_WORK_PASSES);
            guard_jump(c, PREP_ERR_TOO_LARGE, msg);
        }
    }
    if (g->p->stop && g->p->stop(g->p->stop_cls))
        guard_jump(c, PREP_ERR_STOPPED, "decoding stopped");
}

/* jpeg_create_decompress reports running out of memory through error_exit. */
static int create_decompress(preprocess_ctx *p)
{
    if (setjmp(p->g.jump))
        return -1;
    jpeg_create_decompress(&p->cinfo);
    return 0;
}

preprocess_ctx *preprocess_create(const preprocess_options *opt)
{
    preprocess_ctx *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->cinfo.err = jpeg_std_error(&p->g.err);
    p->g.err.error_exit = on_error_exit;
    p->g.err.emit_message = on_emit_message;
    p->g.progress.progress_monitor = on_progress;
    p->g.p = p;
    if (create_decompress(p) != 0) {
        free(p);
        return NULL;
    }
    p->cinfo.progress = &p->g.progress;
    p->max_pixels = opt && opt->max_pixels ? opt->max_pixels : PREPROCESS_DEFAULT_MAX_PIXELS;
    p->retain_bytes = opt && opt->retain_bytes ? opt->retain_bytes : PREPROCESS_DEFAULT_RETAIN_BYTES;
    p->fast = opt ? opt->fast : 0;
    atomic_init(&p->held, 0);
    return p;
}

void preprocess_destroy(preprocess_ctx *p)
{
    if (!p)
        return;
    jpeg_destroy_decompress(&p->cinfo);
    free(p->pixels);
    free(p->scratch);
    free(p->cmyk);
    free(p);
}

void preprocess_set_stop(preprocess_ctx *p, int (*stop)(void *cls), void *cls)
{
    p->stop = stop;
    p->stop_cls = cls;
}

size_t preprocess_ctx_bytes(const preprocess_ctx *p)
{
    return atomic_load(&((preprocess_ctx *)p)->held);
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

/* After every image: buffers over the retained size are given back. */
static void release_oversized(preprocess_ctx *p)
{
    if (p->pixels_cap + p->scratch_cap + p->cmyk_cap > p->retain_bytes) {
        free(p->pixels);
        free(p->scratch);
        free(p->cmyk);
        p->pixels = p->scratch = p->cmyk = NULL;
        p->pixels_cap = p->scratch_cap = p->cmyk_cap = 0;
    }
    atomic_store(&p->held, p->pixels_cap + p->scratch_cap + p->cmyk_cap);
}

/* libjpeg's large allocation: a multi-scan file keeps every DCT
 * coefficient (2 bytes each, blocks padded to the MCU) until the last scan. */
static size_t coefficient_bytes(j_decompress_ptr d)
{
    if (!jpeg_has_multiple_scans(d))
        return 0;
    size_t n = 0;
    for (int i = 0; i < d->num_components; i++) {
        const jpeg_component_info *c = &d->comp_info[i];
        size_t bw = ((size_t)c->width_in_blocks + (size_t)c->h_samp_factor - 1) / (size_t)c->h_samp_factor;
        size_t bh = ((size_t)c->height_in_blocks + (size_t)c->v_samp_factor - 1) / (size_t)c->v_samp_factor;
        n += bw * (size_t)c->h_samp_factor * bh * (size_t)c->v_samp_factor * sizeof(JBLOCK);
    }
    return n;
}

/* Fast mode: the largest DCT-domain reduction 1/2, 1/4 or 1/8 that keeps the
 * shorter side at or above 512, twice what the resize makes, so that its
 * antialiasing filter still does the last halving. Down to 256 instead,
 * the crops of camera photos (tools/decode-fidelity) moved by 0.5-2.6
 * levels on average and 46 at most, against 0.2-0.4 and 21; the decode was
 * hardly faster (libjpeg-turbo's Huffman decoding costs the same at any
 * scale). */
static unsigned fast_denom(unsigned w, unsigned h)
{
    unsigned s = w < h ? w : h;
    for (unsigned d = 8; d >= 2; d /= 2)
        if (s >= 2u * PREPROCESS_RESIZE * d)
            return d;
    return 1;
}

static preprocess_status decode_fail(preprocess_ctx *p, preprocess_status s, char *err, size_t errlen, const char *msg)
{
    jpeg_abort_decompress(&p->cinfo);
    release_oversized(p);
    snprintf(err, errlen, "%s", msg);
    return s;
}

/* The checks before any decoder call, and a fresh guard for this image. */
static preprocess_status begin(preprocess_ctx *p, const uint8_t *jpeg, size_t len, char *err, size_t errlen)
{
    if (len == 0 || !jpeg) {
        snprintf(err, errlen, "empty body");
        return PREP_ERR_EMPTY;
    }
    if (len < 2 || jpeg[0] != 0xFF || jpeg[1] != 0xD8) {
        snprintf(err, errlen, "not a JPEG (no SOI marker)");
        return PREP_ERR_NOT_JPEG;
    }
    if (len > ULONG_MAX) {
        snprintf(err, errlen, "JPEG too large (%zu bytes)", len);
        return PREP_ERR_TOO_LARGE;
    }
    jpeg_guard *g = &p->g;
    g->status = PREP_OK;
    g->msg[0] = '\0';
    g->last_scan = 0;
    g->work = 0;
    /* Blocks of one full-colour pass over a max_pixels image, times the passes. */
    g->work_limit = PREPROCESS_WORK_PASSES * 3 * ((p->max_pixels + 63) / 64);
    return PREP_OK;
}

static int is_cmyk(j_decompress_ptr d)
{
    return (d->jpeg_color_space == JCS_CMYK || d->jpeg_color_space == JCS_YCCK) && d->num_components == 4;
}

/* After jpeg_read_header: a colour space we convert, and a size within
 * the pixel limit, before anything is allocated. */
static preprocess_status check_header(j_decompress_ptr d, uint64_t max_pixels, char *msg, size_t msglen)
{
    if (!((d->jpeg_color_space == JCS_GRAYSCALE && d->num_components == 1) || is_cmyk(d) ||
          ((d->jpeg_color_space == JCS_YCbCr || d->jpeg_color_space == JCS_RGB) && d->num_components == 3))) {
        snprintf(msg, msglen, "unsupported JPEG with %d components in no known colour space", d->num_components);
        return PREP_ERR_UNSUPPORTED;
    }
    unsigned w = d->image_width, h = d->image_height;
    if (w == 0 || h == 0) {
        snprintf(msg, msglen, "invalid JPEG size %ux%u", w, h);
        return PREP_ERR_CORRUPT;
    }
    if ((uint64_t)w * h > max_pixels) {
        snprintf(msg, msglen, "image %ux%u exceeds the %llu pixel limit", w, h, (unsigned long long)max_pixels);
        return PREP_ERR_TOO_LARGE;
    }
    return PREP_OK;
}

/* After a good header: the output format and scale. */
static void setup_output(preprocess_ctx *p, j_decompress_ptr d)
{
    d->out_color_space = is_cmyk(d) ? JCS_CMYK : JCS_RGB; /* libjpeg turns YCCK into CMYK */
    d->dct_method = JDCT_ISLOW;
    d->do_fancy_upsampling = TRUE;
    d->scale_num = 1;
    d->scale_denom = p->fast ? fast_denom(d->image_width, d->image_height) : 1;
    jpeg_calc_output_dimensions(d);
}

#define ROWS 16 /* scanlines per jpeg_read_scanlines */

/* The bytes a decode of d's image holds: the output image, the resize
 * scratch, CMYK rows and libjpeg's coefficients. */
static size_t decode_bytes(j_decompress_ptr d)
{
    unsigned sw = d->output_width, sh = d->output_height;
    return (size_t)sw * sh * 3 + preprocess_scratch_bytes((int)sw, (int)sh) + coefficient_bytes(d) +
           (is_cmyk(d) ? (size_t)sw * ROWS * 4 : 0);
}

/* PIL's conversion of a CMYK JPEG to RGB, as torchvision's loader runs it
 * (Image.convert("RGB")): PIL reads CMYK JPEGs as Adobe's inverted CMYK
 * ("CMYK;I": every value 255 - v), then cmyk2rgb takes out = nk - nk * c /
 * 255 with nk = 255 - k, rounded as its MULDIV255. On libjpeg's values that
 * is k * (255 - c') rounded the same way, with c' = 255 - c. */
static void cmyk_to_rgb(const uint8_t *in, uint8_t *out, unsigned n)
{
    for (unsigned i = 0; i < n; i++, in += 4, out += 3) {
        const int nk = in[3]; /* 255 - (255 - k) */
        for (int c = 0; c < 3; c++) {
            const int t = (255 - in[c]) * nk + 128;
            const int v = nk - (((t >> 8) + t) >> 8);
            out[c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
}

/* One pass over a JPEG, with the one setjmp that libjpeg's errors and the
 * budget return to: the header and its checks, then either what
 * preprocess_header reports (info) or the decode and crop (out). */
static preprocess_status jpeg_pass(preprocess_ctx *p, const uint8_t *jpeg, size_t len, preprocess_info *info,
                                   uint8_t *out, char *err, size_t errlen)
{
    preprocess_status s = begin(p, jpeg, len, err, errlen);
    if (s != PREP_OK)
        return s;
    j_decompress_ptr d = &p->cinfo;
    char msg[256];
    if (setjmp(p->g.jump))
        return decode_fail(p, p->g.status, err, errlen, p->g.msg);
    jpeg_mem_src(d, jpeg, (unsigned long)len);
    (void)jpeg_read_header(d, TRUE); /* a tables-only stream is an error (JERR_NO_IMAGE) */
    if ((s = check_header(d, p->max_pixels, msg, sizeof msg)) != PREP_OK)
        return decode_fail(p, s, err, errlen, msg);
    setup_output(p, d);
    if (info) {
        info->w = (int)d->image_width;
        info->h = (int)d->image_height;
        info->ycc = d->jpeg_color_space == JCS_YCbCr || d->jpeg_color_space == JCS_GRAYSCALE;
        info->decode_bytes = decode_bytes(d);
        jpeg_abort_decompress(d);
        return PREP_OK;
    }
    unsigned sw = d->output_width, sh = d->output_height;
    /* A backstop: libjpeg refuses ("backing store") coefficient buffers past
     * what a max_pixels image with padded 4:4:4 components needs. */
    d->mem->max_memory_to_use = (long)(p->max_pixels * 8 + (16u << 20) < LONG_MAX ? p->max_pixels * 8 + (16u << 20)
                                                                                  : LONG_MAX);
    const int cmyk = is_cmyk(d);
    if (grow(&p->pixels, &p->pixels_cap, (size_t)sw * sh * 3) != 0 ||
        grow(&p->scratch, &p->scratch_cap, preprocess_scratch_bytes((int)sw, (int)sh)) != 0 ||
        (cmyk && grow(&p->cmyk, &p->cmyk_cap, (size_t)sw * ROWS * 4) != 0)) {
        snprintf(msg, sizeof msg, "out of memory for a %ux%u image", sw, sh);
        return decode_fail(p, PREP_ERR_NOMEM, err, errlen, msg);
    }
    /* What is held: the buffers as grown (maybe larger than this image
     * needs) plus libjpeg's coefficients for this one. */
    atomic_store(&p->held, p->pixels_cap + p->scratch_cap + p->cmyk_cap + coefficient_bytes(d));

    (void)jpeg_start_decompress(d); /* a progressive file's scans are all read here */
    while (d->output_scanline < sh) {
        JSAMPROW rows[ROWS];
        const unsigned y0 = d->output_scanline;
        unsigned n = sh - y0;
        if (n > ROWS)
            n = ROWS;
        for (unsigned i = 0; i < n; i++)
            rows[i] = cmyk ? p->cmyk + (size_t)i * sw * 4 : p->pixels + (size_t)(y0 + i) * sw * 3;
        unsigned got = jpeg_read_scanlines(d, rows, n);
        if (got == 0)
            return decode_fail(p, PREP_ERR_CORRUPT, err, errlen, "invalid JPEG data: no scanlines decoded");
        if (cmyk)
            cmyk_to_rgb(p->cmyk, p->pixels + (size_t)y0 * sw * 3, got * sw);
    }
    (void)jpeg_finish_decompress(d);
    preprocess_resize_crop(p->pixels, (int)sw, (int)sh, out, p->scratch);
    release_oversized(p);
    return PREP_OK;
}

preprocess_status preprocess_header(preprocess_ctx *p, const uint8_t *jpeg, size_t len, preprocess_info *info,
                                    char *err, size_t errlen)
{
    return jpeg_pass(p, jpeg, len, info, NULL, err, errlen);
}

preprocess_status preprocess_jpeg(preprocess_ctx *p, const uint8_t *jpeg, size_t len, uint8_t *out, char *err,
                                  size_t errlen)
{
    return jpeg_pass(p, jpeg, len, NULL, out, err, errlen);
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
    case PREP_ERR_STOPPED: return "stopped";
    }
    return "internal";
}

/* --- geometry for other implementations (the GPU's) ----------------------- */

void preprocess_geometry(int w, int h, preprocess_geom *g)
{
    resize_geometry(w, h, &g->rw, &g->rh, &g->left, &g->top);
    g->ksize_x = axis_make(w, g->rw).ksize;
    g->ksize_y = axis_make(h, g->rh).ksize;
}
