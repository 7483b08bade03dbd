/* Tests gpu/chroma_rebuild.h, the GPU fast decode's way back to libjpeg's
 * pixels, on the CPU: libjpeg decodes each reference JPEG twice, once with
 * replicated chroma (do_fancy_upsampling off: what the hardware decoder
 * returns) and once as the CPU path does (fancy upsampling). Rebuilding Y,
 * Cb, Cr from the replicated RGB and upsampling them as libjpeg does must
 * give back the fancy decode in nearly every pixel, where the replicated
 * decode alone differs in most of them. */
#include <check.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include "gpu/chroma_rebuild.h"
#include "tests/testutil.h"

typedef struct {
    int w, h, hs, vs;       /* size; luma samples per chroma sample across, down */
    uint8_t *rgb;           /* w x h x 3 */
} decoded;

struct err_jmp {
    struct jpeg_error_mgr mgr;
    jmp_buf jb;
};

static void on_error(j_common_ptr c)
{
    longjmp(((struct err_jmp *)c->err)->jb, 1);
}

/* Decodes path to RGB with libjpeg's islow IDCT; 0 for a 3-component JPEG
 * with 4:2:0 or 4:2:2 chroma, -1 otherwise (or on error). */
static int decode(const char *path, int fancy, decoded *out)
{
    size_t len;
    uint8_t *data = testutil_read_file(path, &len);
    ck_assert_ptr_nonnull(data);
    struct jpeg_decompress_struct c;
    struct err_jmp e;
    volatile int rc = -1;
    out->rgb = NULL;
    c.err = jpeg_std_error(&e.mgr);
    e.mgr.error_exit = on_error;
    jpeg_create_decompress(&c);
    if (setjmp(e.jb)) {
        free(out->rgb);
        out->rgb = NULL;
        goto done;
    }
    jpeg_mem_src(&c, data, (unsigned long)len);
    jpeg_read_header(&c, TRUE);
    if (c.num_components != 3 || c.jpeg_color_space != JCS_YCbCr || c.progressive_mode)
        goto done;
    out->hs = c.max_h_samp_factor / c.comp_info[1].h_samp_factor;
    out->vs = c.max_v_samp_factor / c.comp_info[1].v_samp_factor;
    if (out->hs != 2 || out->vs > 2 || c.comp_info[1].h_samp_factor != c.comp_info[2].h_samp_factor ||
        c.comp_info[1].v_samp_factor != c.comp_info[2].v_samp_factor || c.comp_info[0].h_samp_factor != 2)
        goto done;
    c.out_color_space = JCS_RGB;
    c.dct_method = JDCT_ISLOW;
    c.do_fancy_upsampling = fancy ? TRUE : FALSE;
    jpeg_start_decompress(&c);
    out->w = (int)c.output_width;
    out->h = (int)c.output_height;
    out->rgb = malloc((size_t)out->w * out->h * 3);
    ck_assert_ptr_nonnull(out->rgb);
    while (c.output_scanline < c.output_height) {
        JSAMPROW row = out->rgb + (size_t)c.output_scanline * out->w * 3;
        jpeg_read_scanlines(&c, &row, 1);
    }
    jpeg_finish_decompress(&c);
    rc = 0;
done:
    jpeg_destroy_decompress(&c);
    free(data);
    return rc;
}

/* libjpeg's h2v1 / h2v2 fancy upsampling (jdsample.c) of plane p (cw x ch)
 * at pixel (x, y); the same rules as gpu/resize.cu's chroma_at. */
static int fancy_at(const uint8_t *p, int cw, int ch, int vs, int x, int y)
{
    int k = x >> 1;
    if (vs == 1) {
        const uint8_t *row = p + (size_t)y * cw;
        if (x & 1)
            return k == cw - 1 ? row[k] : (row[k] * 3 + row[k + 1] + 2) >> 2;
        return k == 0 ? row[0] : (row[k] * 3 + row[k - 1] + 1) >> 2;
    }
    int r = y >> 1, rf = y & 1 ? (r + 1 < ch ? r + 1 : r) : (r > 0 ? r - 1 : 0);
    const uint8_t *near = p + (size_t)r * cw, *far = p + (size_t)rf * cw;
    int sum = near[k] * 3 + far[k];
    if (x & 1)
        return k == cw - 1 ? (sum * 4 + 7) >> 4 : (sum * 3 + near[k + 1] * 3 + far[k + 1] + 7) >> 4;
    return k == 0 ? (sum * 4 + 8) >> 4 : (sum * 3 + near[k - 1] * 3 + far[k - 1] + 8) >> 4;
}

/* The replicated decode rebuilt into fancy-upsampled RGB (malloc'd). */
static uint8_t *rebuild(const decoded *d)
{
    int cw = (d->w + 1) / 2, ch = (d->h + d->vs - 1) / d->vs;
    uint8_t *y = malloc((size_t)d->w * d->h), *cb = malloc((size_t)cw * ch), *cr = malloc((size_t)cw * ch);
    uint8_t *out = malloc((size_t)d->w * d->h * 3);
    ck_assert(y && cb && cr && out);
    for (int by = 0; by < ch; by++)
        for (int bx = 0; bx < cw; bx++) {
            uint8_t px[CHROMA_REBUILD_MAX_PIXELS][3], ys[CHROMA_REBUILD_MAX_PIXELS];
            size_t at[CHROMA_REBUILD_MAX_PIXELS];
            int n = 0;
            for (int dy = 0; dy < d->vs; dy++)
                for (int dx = 0; dx < 2; dx++) {
                    int x = 2 * bx + dx, yy = by * d->vs + dy;
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
    for (int yy = 0; yy < d->h; yy++)
        for (int x = 0; x < d->w; x++) {
            size_t o = (size_t)yy * d->w + x;
            int b = fancy_at(cb, cw, ch, d->vs, x, yy), r = fancy_at(cr, cw, ch, d->vs, x, yy);
            out[o * 3] = (uint8_t)chroma_rebuild_clamp(y[o] + chroma_rebuild_r(r));
            out[o * 3 + 1] = (uint8_t)chroma_rebuild_clamp(y[o] + chroma_rebuild_g(b, r));
            out[o * 3 + 2] = (uint8_t)chroma_rebuild_clamp(y[o] + chroma_rebuild_b(b));
        }
    free(y);
    free(cb);
    free(cr);
    return out;
}

START_TEST(rebuilt_pixels_match_fancy_upsampling)
{
    const char *names[] = {
        "s7x5", "s17x31", "s224x224", "s255x257", "s256x300", "s333x500", "s1000x31", "s31x1000",
        "sub420_333x501", "sub422_333x501", "restart1_501x333", "restart_rows_640x480", "q50_420_2000x1500",
        "photo_grace_hopper",
    };
    testutil_require_reference();
    size_t total = 0, exact = 0, exact_replicated = 0;
    int images = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char name[64], path[1024];
        snprintf(name, sizeof name, "jpeg/%s.jpg", names[i]);
        snprintf(path, sizeof path, "%s", testutil_ref_path(name));
        FILE *f = fopen(path, "rb");
        if (!f)   /* the photo is optional (python3-matplotlib's sample) */
            continue;
        fclose(f);
        decoded fancy, rep;
        ck_assert_msg(decode(path, 1, &fancy) == 0, "%s: not a 4:2:0/4:2:2 baseline JPEG", names[i]);
        ck_assert_int_eq(decode(path, 0, &rep), 0);
        uint8_t *rb = rebuild(&rep);
        size_t n = (size_t)fancy.w * fancy.h * 3, ex = 0, exr = 0;
        int maxd = 0;
        for (size_t k = 0; k < n; k++) {
            int d = abs(rb[k] - fancy.rgb[k]);
            ex += d == 0;
            exr += rep.rgb[k] == fancy.rgb[k];
            maxd = d > maxd ? d : maxd;
        }
        printf("  %-22s %4dx%-4d h2v%d: rebuilt %8.4f%% exact (max |diff| %2d), replicated %6.2f%%\n", names[i],
               fancy.w, fancy.h, fancy.vs, 100.0 * ex / n, maxd, 100.0 * exr / n);
        /* every image on its own: at most 0.5% of its values off */
        ck_assert_msg(ex * 1000 >= n * 995, "%s: %zu of %zu values differ", names[i], n - ex, n);
        total += n;
        exact += ex;
        exact_replicated += exr;
        images++;
        free(rb);
        free(fancy.rgb);
        free(rep.rgb);
    }
    printf("chroma rebuild: %d images, %.4f%% of values exact (replicated chroma alone: %.2f%%)\n", images,
           100.0 * exact / total, 100.0 * exact_replicated / total);
    ck_assert_int_ge(images, 13);
    ck_assert(exact * 10000 >= total * 9990);
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
