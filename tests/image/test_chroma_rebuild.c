/* Tests gpu/chroma_rebuild.h, the GPU decode's way to libjpeg's pixels, on
 * the CPU, over the reference JPEGs and re-encodings of some of them in
 * every layout the device path takes (4:2:2, 4:2:0, 4:4:0, 4:1:1, 4:1:0,
 * with and without restart markers):
 * - upsampling: libjpeg's raw Y/Cb/Cr planes (what the hardware returns in
 *   exact mode) upsampled by chroma_upsample_at and converted must give
 *   libjpeg's own decode (as the CPU path does it) bit for bit;
 * - rebuild: the same JPEG decoded with replicated chroma
 *   (do_fancy_upsampling off: what the hardware returns as RGB), its Y, Cb,
 *   Cr rebuilt and upsampled, must give back that decode in nearly every
 *   pixel, where the replicated decode alone differs in most of them. */
#include <check.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include "gpu/chroma_rebuild.h"
#include "tests/lib/jpegenc.h"
#include "tests/lib/testutil.h"

typedef struct {
    int w, h, hs, vs; /* size; luma samples per chroma sample across, down */
    uint8_t *rgb; /* w x h x 3 */
    uint8_t *plane[3]; /* raw decode: Y (w x h), Cb, Cr (cw x ch) */
    int cw, ch;
} decoded;

struct err_jmp {
    struct jpeg_error_mgr mgr;
    jmp_buf jb;
};

static void on_error(j_common_ptr c)
{
    longjmp(((struct err_jmp *)c->err)->jb, 1);
}

static void decoded_free(decoded *d)
{
    free(d->rgb);
    for (int c = 0; c < 3; c++)
        free(d->plane[c]);
    memset(d, 0, sizeof *d);
}

/* Reads the planes of a raw decode, iMCU row by iMCU row, into out's
 * unpadded planes. */
static void read_raw(struct jpeg_decompress_struct *c, decoded *out)
{
    JSAMPROW rows[3][4 * DCTSIZE];
    JSAMPARRAY arrays[3] = { rows[0], rows[1], rows[2] };
    size_t pw[3], ph[3];
    uint8_t *padded[3];
    for (int ci = 0; ci < 3; ci++) {
        jpeg_component_info *k = &c->comp_info[ci];
        pw[ci] = (size_t)k->width_in_blocks * DCTSIZE;
        ph[ci] = ((size_t)k->height_in_blocks + (size_t)k->v_samp_factor) * DCTSIZE;
        padded[ci] = calloc(pw[ci], ph[ci]);
        ck_assert_ptr_nonnull(padded[ci]);
    }
    for (size_t done = 0; c->output_scanline < c->output_height;) {
        for (int ci = 0; ci < 3; ci++) {
            int nrows = c->comp_info[ci].v_samp_factor * DCTSIZE;
            for (int r = 0; r < nrows; r++) {
                size_t y = done / (size_t)c->max_v_samp_factor * (size_t)c->comp_info[ci].v_samp_factor + (size_t)r;
                rows[ci][r] = padded[ci] + (y < ph[ci] ? y : ph[ci] - 1) * pw[ci];
            }
        }
        JDIMENSION got = jpeg_read_raw_data(c, arrays, (JDIMENSION)(c->max_v_samp_factor * DCTSIZE));
        ck_assert_int_gt(got, 0);
        done += got;
    }
    for (int ci = 0; ci < 3; ci++) {
        int w = ci ? out->cw : out->w, h = ci ? out->ch : out->h;
        out->plane[ci] = malloc((size_t)w * h);
        ck_assert_ptr_nonnull(out->plane[ci]);
        for (int y = 0; y < h; y++)
            memcpy(out->plane[ci] + (size_t)y * w, padded[ci] + (size_t)y * pw[ci], (size_t)w);
        free(padded[ci]);
    }
}

/* Decodes a JPEG with libjpeg's islow IDCT: mode 0 RGB with replicated
 * chroma, 1 RGB as the CPU path decodes (fancy upsampling), 2 the raw
 * planes. 0 for a baseline 3-component YCbCr JPEG whose chroma is
 * subsampled, -1 otherwise (or on error). */
static int decode(const uint8_t *data, size_t len, int mode, decoded *out)
{
    struct jpeg_decompress_struct c;
    struct err_jmp e;
    volatile int rc = -1;
    memset(out, 0, sizeof *out);
    c.err = jpeg_std_error(&e.mgr);
    e.mgr.error_exit = on_error;
    jpeg_create_decompress(&c);
    if (setjmp(e.jb)) {
        decoded_free(out);
        goto done;
    }
    jpeg_mem_src(&c, data, (unsigned long)len);
    jpeg_read_header(&c, TRUE);
    if (c.num_components != 3 || c.jpeg_color_space != JCS_YCbCr || c.progressive_mode ||
        c.comp_info[1].h_samp_factor != 1 || c.comp_info[1].v_samp_factor != 1 || c.comp_info[2].h_samp_factor != 1 ||
        c.comp_info[2].v_samp_factor != 1)
        goto done;
    out->hs = c.comp_info[0].h_samp_factor;
    out->vs = c.comp_info[0].v_samp_factor;
    if (out->hs * out->vs == 1 || out->hs == 3 || out->hs > 4 || out->vs > 2)
        goto done;
    c.out_color_space = JCS_RGB;
    c.dct_method = JDCT_ISLOW;
    c.do_fancy_upsampling = mode == 1 ? TRUE : FALSE;
    c.raw_data_out = mode == 2 ? TRUE : FALSE;
    jpeg_start_decompress(&c);
    out->w = (int)c.output_width;
    out->h = (int)c.output_height;
    out->cw = (out->w + out->hs - 1) / out->hs;
    out->ch = (out->h + out->vs - 1) / out->vs;
    if (mode == 2) {
        read_raw(&c, out);
    } else {
        out->rgb = malloc((size_t)out->w * out->h * 3);
        ck_assert_ptr_nonnull(out->rgb);
        while (c.output_scanline < c.output_height) {
            JSAMPROW row = out->rgb + (size_t)c.output_scanline * out->w * 3;
            jpeg_read_scanlines(&c, &row, 1);
        }
    }
    jpeg_finish_decompress(&c);
    rc = 0;
done:
    jpeg_destroy_decompress(&c);
    return rc;
}

/* Y, Cb, Cr planes (chroma cw x ch, packed) upsampled and converted as
 * the GPU kernels do (malloc'd RGB). */
static uint8_t *upsample(const uint8_t *y, const uint8_t *cb, const uint8_t *cr, const decoded *d)
{
    uint8_t *out = malloc((size_t)d->w * d->h * 3);
    ck_assert_ptr_nonnull(out);
    for (int yy = 0; yy < d->h; yy++)
        for (int x = 0; x < d->w; x++) {
            size_t o = (size_t)yy * d->w + x;
            int b = chroma_upsample_at(cb, d->cw, d->ch, d->cw, 1, d->hs, d->vs, x, yy);
            int r = chroma_upsample_at(cr, d->cw, d->ch, d->cw, 1, d->hs, d->vs, x, yy);
            out[o * 3] = (uint8_t)chroma_rebuild_clamp(y[o] + chroma_rebuild_r(r));
            out[o * 3 + 1] = (uint8_t)chroma_rebuild_clamp(y[o] + chroma_rebuild_g(b, r));
            out[o * 3 + 2] = (uint8_t)chroma_rebuild_clamp(y[o] + chroma_rebuild_b(b));
        }
    return out;
}

/* The replicated decode rebuilt into fancy-upsampled RGB (malloc'd). */
static uint8_t *rebuild(const decoded *d)
{
    int cw = d->cw, ch = d->ch;
    uint8_t *y = malloc((size_t)d->w * d->h), *cb = malloc((size_t)cw * ch), *cr = malloc((size_t)cw * ch);
    ck_assert(y && cb && cr);
    for (int by = 0; by < ch; by++)
        for (int bx = 0; bx < cw; bx++) {
            uint8_t px[CHROMA_REBUILD_MAX_PIXELS][3], ys[CHROMA_REBUILD_MAX_PIXELS];
            size_t at[CHROMA_REBUILD_MAX_PIXELS];
            int n = 0;
            for (int dy = 0; dy < d->vs; dy++)
                for (int dx = 0; dx < d->hs; dx++) {
                    int x = bx * d->hs + dx, yy = by * d->vs + dy;
                    if (x >= d->w || yy >= d->h)
                        continue;
                    at[n] = (size_t)yy * d->w + x;
                    memcpy(px[n], d->rgb + at[n] * 3, 3);
                    n++;
                }
            chroma_rebuild_block((const uint8_t(*)[3])px, n, &cb[by * cw + bx], &cr[by * cw + bx], ys);
            for (int i = 0; i < n; i++)
                y[at[i]] = ys[i];
        }
    uint8_t *out = upsample(y, cb, cr, d);
    free(y);
    free(cb);
    free(cr);
    return out;
}

typedef struct {
    size_t total, exact, exact_replicated;
    int images;
} tally;

/* Both checks on one JPEG; 0 when it is not one the rebuild is for. */
static int check_jpeg(const char *name, const uint8_t *data, size_t len, tally *t)
{
    decoded fancy, rep, raw;
    if (decode(data, len, 1, &fancy) != 0)
        return 0;
    ck_assert_int_eq(decode(data, len, 0, &rep), 0);
    ck_assert_int_eq(decode(data, len, 2, &raw), 0);
    size_t n = (size_t)fancy.w * fancy.h * 3, ex = 0, exr = 0;
    uint8_t *up = upsample(raw.plane[0], raw.plane[1], raw.plane[2], &raw);
    int upd = 0;
    for (size_t k = 0; k < n; k++)
        upd += up[k] != fancy.rgb[k];
    /* libjpeg replicates 2x-subsampled chroma under 3 samples wide */
    int narrow = fancy.hs == 2 && fancy.cw <= 2;
    ck_assert_msg(narrow || upd == 0,
                  "%s (h%dv%d): %d of %zu values of the upsampled raw planes differ from "
                  "libjpeg's decode",
                  name, fancy.hs, fancy.vs, upd, n);
    uint8_t *rb = rebuild(&rep);
    int maxd = 0;
    for (size_t k = 0; k < n; k++) {
        int d = abs(rb[k] - fancy.rgb[k]);
        ex += d == 0;
        exr += rep.rgb[k] == fancy.rgb[k];
        maxd = d > maxd ? d : maxd;
    }
    printf("  %-26s %4dx%-4d h%dv%d: raw upsampled %s; rebuilt %8.4f%% exact (max |diff| %2d), replicated "
           "%6.2f%%\n",
           name, fancy.w, fancy.h, fancy.hs, fancy.vs, narrow ? "(narrow, skipped)" : "exact", 100.0 * ex / n, maxd,
           100.0 * exr / n);
    /* every image on its own: at most 0.5% of its values off */
    ck_assert_msg(narrow || ex * 1000 >= n * 995, "%s: %zu of %zu values differ", name, n - ex, n);
    t->total += n;
    t->exact += ex;
    t->exact_replicated += exr;
    t->images++;
    free(up);
    free(rb);
    decoded_free(&fancy);
    decoded_free(&rep);
    decoded_free(&raw);
    return 1;
}

START_TEST(rebuilt_pixels_match_fancy_upsampling)
{
    const char *names[] = {
        "s7x5",
        "s17x31",
        "s224x224",
        "s255x257",
        "s256x300",
        "s333x500",
        "s1000x31",
        "s31x1000",
        "sub420_333x501",
        "sub422_333x501",
        "restart1_501x333",
        "restart_rows_640x480",
        "q50_420_2000x1500",
        "photo_grace_hopper",
    };
    /* re-encoded in every layout: odd sizes, a strip, a photo */
    const char *sources[] = { "s7x5", "s255x257", "s1000x31", "sub444_333x501", "photo_grace_hopper" };
    static const int layouts[][2] = { { 2, 1 }, { 2, 2 }, { 1, 2 }, { 4, 1 }, { 4, 2 } };
    testutil_require_reference();
    tally t = { 0 };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "jpeg/%s.jpg", names[i]);
        size_t len;
        uint8_t *data = testutil_read_file(testutil_ref_path(name), &len);
        if (!data) /* the photo is optional (python3-matplotlib's sample) */
            continue;
        ck_assert_msg(check_jpeg(names[i], data, len, &t), "%s: not a subsampled baseline JPEG", names[i]);
        free(data);
    }
    int encoded = 0;
    for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "jpeg/%s.jpg", sources[i]);
        size_t len;
        uint8_t *data = testutil_read_file(testutil_ref_path(name), &len);
        if (!data)
            continue;
        decoded src;
        struct jpeg_decompress_struct c;
        struct err_jmp e;
        c.err = jpeg_std_error(&e.mgr);
        jpeg_create_decompress(&c);
        jpeg_mem_src(&c, data, (unsigned long)len);
        jpeg_read_header(&c, TRUE);
        c.out_color_space = JCS_RGB;
        jpeg_start_decompress(&c);
        src.w = (int)c.output_width;
        src.h = (int)c.output_height;
        src.rgb = malloc((size_t)src.w * src.h * 3);
        ck_assert_ptr_nonnull(src.rgb);
        while (c.output_scanline < c.output_height) {
            JSAMPROW row = src.rgb + (size_t)c.output_scanline * src.w * 3;
            jpeg_read_scanlines(&c, &row, 1);
        }
        jpeg_finish_decompress(&c);
        jpeg_destroy_decompress(&c);
        free(data);
        for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++)
            for (int restart = 0; restart <= 3; restart += 3) {
                size_t n;
                uint8_t *jpg = jpegenc_layout(src.rgb, src.w, src.h, layouts[l][0], layouts[l][1], restart, 90, &n);
                char label[96];
                snprintf(label, sizeof label, "%s%s", sources[i], restart ? "+DRI" : "");
                ck_assert(check_jpeg(label, jpg, n, &t));
                free(jpg);
                encoded++;
            }
        free(src.rgb);
    }
    printf("chroma rebuild: %d images (%d re-encoded), %.4f%% of values exact (replicated chroma alone: %.2f%%)\n",
           t.images, encoded, 100.0 * t.exact / t.total, 100.0 * t.exact_replicated / t.total);
    ck_assert_int_ge(t.images, 13 + 40);
    ck_assert(t.exact * 10000 >= t.total * 9990);
}
END_TEST

START_TEST(flat_and_clamped_blocks)
{
    /* Grey, coloured, saturated, black and white blocks: Y, Cb, Cr that
     * reproduce the pixels, and the exact Cb, Cr where no channel clamps. */
    const int cases[][3] = { { 100, 128, 128 }, { 120, 90, 170 }, { 76, 85, 255 }, { 0, 128, 128 }, { 255, 128, 128 } };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int y = cases[i][0], cb = cases[i][1], cr = cases[i][2];
        uint8_t px[4][3], ys[4], gcb, gcr;
        for (int k = 0; k < 4; k++) {
            int yk = chroma_rebuild_clamp(y + k - 1);
            px[k][0] = (uint8_t)chroma_rebuild_clamp(yk + chroma_rebuild_r(cr));
            px[k][1] = (uint8_t)chroma_rebuild_clamp(yk + chroma_rebuild_g(cb, cr));
            px[k][2] = (uint8_t)chroma_rebuild_clamp(yk + chroma_rebuild_b(cb));
        }
        chroma_rebuild_block((const uint8_t(*)[3])px, 4, &gcb, &gcr, ys);
        for (int k = 0; k < 4; k++) {
            ck_assert_int_eq(chroma_rebuild_clamp(ys[k] + chroma_rebuild_r(gcr)), px[k][0]);
            ck_assert_int_eq(chroma_rebuild_clamp(ys[k] + chroma_rebuild_g(gcb, gcr)), px[k][1]);
            ck_assert_int_eq(chroma_rebuild_clamp(ys[k] + chroma_rebuild_b(gcb)), px[k][2]);
        }
        if (i < 2) {
            ck_assert_int_eq(gcb, cb);
            ck_assert_int_eq(gcr, cr);
        }
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("chroma_rebuild");
    TCase *tc = tcase_create("chroma_rebuild");
    tcase_add_test(tc, flat_and_clamped_blocks);
    tcase_add_test(tc, rebuilt_pixels_match_fancy_upsampling);
    suite_add_tcase(s, tc);
    return testutil_run(s);
}
