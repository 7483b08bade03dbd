/* GPU JPEG decoding (gpu/nvjpeg_decode.cu, gpu/resize.cu) against the CPU
 * path (image/preprocess.c).
 *
 * - resize_bit_exact: the GPU's resize + crop of the very pixels the CPU
 *   decoded equals preprocess_resize_crop byte for byte, for every reference
 *   JPEG and for random images of awkward sizes (upscaling, 1-pixel sides,
 *   long strips, 8192 x 8192 at the kernel's tap limit).
 * - rebuild_restores_fancy_upsampling: the reference JPEGs decoded with
 *   replicated chroma (as the hardware does), rebuilt and resized on the
 *   GPU, against the CPU path's crops.
 * - fidelity, in both GPU modes: every reference JPEG the hardware takes, a
 *   generated photo-like set (4:2:0, 4:2:2, 4:4:4, grey, 4:4:0, 4:1:1,
 *   4:1:0, half with restart markers; q75-95; 0.1-1.9 MP), of which the
 *   device must take all but 4:1:1 and 4:1:0 (the hardware refuses those),
 *   and, if RESNETD_FIDELITY_DIR names one, a directory (the e2e
 *   corpus), through the whole GPU decode path and through the CPU path,
 *   into the same FP16 engine: prints the max and mean pixel difference of
 *   the crops, the logits' rel L2 and the top-1 agreement. gpu-exact must
 *   give the CPU's crops byte for byte; gpu (the hardware's RGB with its
 *   chroma rebuilt) within 0.02 level on average, 2e-3 logits rel L2 and
 *   99% top-1 agreement on every set.
 * - routing: progressive -> unsupported, truncated -> no_eoi, over the arena
 *   -> too_large; corrupt scan data neither crashes nor hangs: it decodes,
 *   or goes to the fallback.
 * - mixed_and_chunked: CPU crops first, compressed images behind them, with
 *   an arena so small that the batch is decoded in several chunks (exact
 *   mode) and in one (fast mode): the CPU crops arrive in front, and the
 *   exact chunked crops equal the CPU path's.
 *
 * Exits 77 without a CUDA device. RESNETD_GPU_TEST_QUICK=1 leaves out the
 * largest images (for compute-sanitizer). */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>
#include "gpu/gpu.h"
#include "gpu/gpu_test.h"
#include "image/devjpeg.h"
#include "image/devjpeg_registry.h"
#include "engine/engine.h"
#include "engine/engine_registry.h"
#include "image/preprocess.h"
#include "model/resnet18.h"
#include "tests/lib/jpegenc.h"
#include "tests/lib/testutil.h"

#define MAX_BATCH 64
#define CROP_BYTES RESNET18_INPUT_BYTES

static int quick;
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rng_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

typedef struct jpeg_file {
    char name[160];
    uint8_t *data;
    size_t len;
} jpeg_file;

/* The reference JPEGs (tests/ref/jpegs.txt order); returns the count. */
static int load_reference(jpeg_file *out, int max)
{
    FILE *f = fopen(testutil_ref_path("jpegs.txt"), "r");
    ck_assert_msg(f != NULL, "no jpegs.txt");
    char line[128];
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char rel[160];
        snprintf(rel, sizeof rel, "jpeg/%s.jpg", line);
        snprintf(out[n].name, sizeof out[n].name, "%s", line);
        out[n].data = testutil_read_file(testutil_ref_path(rel), &out[n].len);
        ck_assert_msg(out[n].data != NULL, "cannot read %s", rel);
        n++;
    }
    fclose(f);
    return n;
}

/* A photo-like w x h image: smooth gradients, a few discs and noise. */
static uint8_t *photo_like(int w, int h)
{
    uint8_t *p = malloc((size_t)w * h * 3);
    ck_assert(p != NULL);
    int cx = (int)(rng_u32() % (uint32_t)w), cy = (int)(rng_u32() % (uint32_t)h), r = 10 + (int)(rng_u32() % 200);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *q = p + ((size_t)y * w + x) * 3;
            int in = (x - cx) * (x - cx) + (y - cy) * (y - cy) < r * r;
            int n = (int)(rng_u32() % 17) - 8;
            q[0] = (uint8_t)((x * 200 / w + (in ? 60 : 0) + n) & 0xff);
            q[1] = (uint8_t)((y * 180 / h + 30 + n) & 0xff);
            q[2] = (uint8_t)(((x + y) * 150 / (w + h) + (in ? 0 : 80) + n) & 0xff);
        }
    return p;
}

static jpeg_file encode(const uint8_t *rgb, int w, int h, int subsamp, int quality, const char *name)
{
    tjhandle tj = tjInitCompress();
    ck_assert(tj != NULL);
    unsigned char *out = NULL;
    unsigned long len = 0;
    ck_assert_msg(tjCompress2(tj, rgb, w, 0, h, TJPF_RGB, &out, &len, subsamp, quality, 0) == 0, "%s",
                  tjGetErrorStr2(tj));
    jpeg_file j;
    snprintf(j.name, sizeof j.name, "%s", name);
    j.data = malloc(len);
    ck_assert(j.data != NULL);
    memcpy(j.data, out, len);
    j.len = len;
    tjFree(out);
    tjDestroy(tj);
    return j;
}

/* The layouts of the generated sets (luma sampling hs x vs; 0 x 0: grey):
 * the first NLAYOUTS_HW the hardware decodes; it refuses 4:1:1 and 4:1:0
 * (nvjpegDecodeBatchedSupported, and a batched decode of them fails). */
static const int layouts[][2] = { { 2, 2 }, { 2, 1 }, { 1, 1 }, { 0, 0 }, { 1, 2 }, { 4, 1 }, { 4, 2 } };
#define NLAYOUTS_HW 5

/* A generated set in every layout (hw: only those the hardware takes),
 * every other round of layouts with restart markers; returns the count. */
static int make_corpus(jpeg_file *out, int n, int hw)
{
    const int nlayouts = hw ? NLAYOUTS_HW : (int)(sizeof layouts / sizeof layouts[0]);
    for (int i = 0; i < n; i++) {
        int w = 320 + (int)(rng_u32() % 1400), h = 240 + (int)(rng_u32() % 1000);
        uint8_t *rgb = photo_like(w, h);
        char name[96];
        int hs = layouts[i % nlayouts][0], vs = layouts[i % nlayouts][1], q = 75 + (int)(rng_u32() % 21);
        int restart = (i / nlayouts) % 2 ? 1 + (int)(rng_u32() % 8) : 0;
        snprintf(name, sizeof name, "gen%02d_%dx%d_h%dv%d_dri%d_q%d", i, w, h, hs, vs, restart, q);
        if (hs == 0) {
            out[i] = encode(rgb, w, h, TJSAMP_GRAY, q, name);
        } else {
            snprintf(out[i].name, sizeof out[i].name, "%s", name);
            out[i].data = jpegenc_layout(rgb, w, h, hs, vs, restart, q, &out[i].len);
        }
        free(rgb);
    }
    return n;
}

static engine *cuda_engine(const resnet18_weights *w)
{
    char err[512];
    engine_config cfg = {
        .device = ENGINE_DEVICE_CUDA, .precision = ENGINE_PRECISION_FP16, .max_batch = MAX_BATCH, .nslots = 2
    };
    engine *e = engine_create(w, &cfg, err, sizeof err);
    ck_assert_msg(e != NULL, "%s", err);
    return e;
}

static int no_fallback(void *cls, int index, uint8_t *out)
{
    (void)out;
    int *calls = cls;
    (*calls)++;
    (void)index;
    return -1;
}

/* ---- resize: bit-exact on identical pixels ------------------------------- */

static void check_resize(const uint8_t *rgb, int w, int h, const char *what)
{
    char err[256];
    uint8_t cpu[CROP_BYTES], gpu[CROP_BYTES];
    uint8_t *scratch = malloc(preprocess_scratch_bytes(w, h));
    ck_assert(scratch != NULL);
    preprocess_resize_crop(rgb, w, h, cpu, scratch);
    free(scratch);
    preprocess_geom g;
    preprocess_geometry(w, h, &g);
    ck_assert_msg(gpu_test_resize_crop(rgb, w, h, 1, 1, g.rw, g.rh, g.left, g.top, gpu, err, sizeof err) == 0, "%s",
                  err);
    int diffs = 0, first = -1;
    for (int i = 0; i < CROP_BYTES; i++)
        if (cpu[i] != gpu[i] && diffs++ == 0)
            first = i;
    ck_assert_msg(diffs == 0, "%s (%dx%d): %d of %d bytes differ, first at %d: cpu %d gpu %d", what, w, h, diffs,
                  CROP_BYTES, first, cpu[first], gpu[first]);
}

START_TEST(resize_bit_exact)
{
    jpeg_file ref[64];
    int nref = load_reference(ref, 64);
    tjhandle tj = tjInitDecompress();
    ck_assert(tj != NULL);
    for (int i = 0; i < nref; i++) {
        int w, h, ss, cs;
        ck_assert(tjDecompressHeader3(tj, ref[i].data, ref[i].len, &w, &h, &ss, &cs) == 0);
        uint8_t *rgb = malloc((size_t)w * h * 3);
        ck_assert(rgb != NULL);
        ck_assert_msg(tjDecompress2(tj, ref[i].data, ref[i].len, rgb, w, 0, h, TJPF_RGB, TJFLAG_ACCURATEDCT) == 0,
                      "%s: %s", ref[i].name, tjGetErrorStr2(tj));
        check_resize(rgb, w, h, ref[i].name);
        free(rgb);
        free(ref[i].data);
    }
    tjDestroy(tj);
    static const int sizes[][2] = { { 1, 1 },      { 3, 700 },     { 700, 3 },     { 223, 225 },
                                    { 256, 256 },  { 257, 1000 },  { 2000, 1500 }, { 8192, 300 },
                                    { 300, 8000 }, { 5000, 4000 }, { 8192, 8192 } };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int w = sizes[i][0], h = sizes[i][1];
        if (quick && (size_t)w * h > 4000000)
            continue;
        uint8_t *rgb = malloc((size_t)w * h * 3);
        ck_assert(rgb != NULL);
        for (size_t k = 0; k < (size_t)w * h * 3; k++)
            rgb[k] = (uint8_t)rng_u32();
        check_resize(rgb, w, h, "random");
        free(rgb);
    }
    printf("resize: GPU crops bit-exact with the CPU's on %d reference JPEGs and random images\n", nref);
}
END_TEST

/* ---- chroma rebuild: replicated chroma back to the CPU's pixels ------- */

/* TurboJPEG's fast upsampling replicates chroma exactly as the hardware
 * decoder does (the fast mode's crops matched it to the last level before
 * the rebuild existed); the rebuild kernel must bring those pixels back to
 * the CPU path's crop. On the CPU (tests/image/test_chroma_rebuild.c) the same
 * code gives 100% of these crops' values exact but for a few clamped
 * pixels of the photo (99.8%, max 5 levels). */
START_TEST(rebuild_restores_fancy_upsampling)
{
    char err[256];
    jpeg_file ref[64];
    int nref = load_reference(ref, 64), tested = 0;
    tjhandle tj = tjInitDecompress();
    ck_assert(tj != NULL);
    long total = 0, exact = 0;
    int worst = 0;
    for (int i = 0; i < nref; i++) {
        int w, h, ss, cs;
        ck_assert(tjDecompressHeader3(tj, ref[i].data, ref[i].len, &w, &h, &ss, &cs) == 0);
        int vs = ss == TJSAMP_420 ? 2 : ss == TJSAMP_422 ? 1 : 0;
        if (!vs || cs != TJCS_YCbCr || w < 3 || h < 3) {
            free(ref[i].data);
            continue;
        }
        uint8_t *fast = malloc((size_t)w * h * 3), *fancy = malloc((size_t)w * h * 3);
        uint8_t *scratch = malloc(preprocess_scratch_bytes(w, h));
        ck_assert(fast && fancy && scratch);
        if (tjDecompress2(tj, ref[i].data, ref[i].len, fast, w, 0, h, TJPF_RGB,
                          TJFLAG_ACCURATEDCT | TJFLAG_FASTUPSAMPLE) != 0 ||
            tjDecompress2(tj, ref[i].data, ref[i].len, fancy, w, 0, h, TJPF_RGB, TJFLAG_ACCURATEDCT) != 0) {
            /* progressive: the hardware never sees these */
            free(fast);
            free(fancy);
            free(scratch);
            free(ref[i].data);
            continue;
        }
        uint8_t cpu[CROP_BYTES], gpu[CROP_BYTES];
        preprocess_resize_crop(fancy, w, h, cpu, scratch);
        preprocess_geom g;
        preprocess_geometry(w, h, &g);
        ck_assert_msg(gpu_test_resize_crop(fast, w, h, 2, vs, g.rw, g.rh, g.left, g.top, gpu, err, sizeof err) == 0,
                      "%s", err);
        int md = 0, ex = 0;
        for (int k = 0; k < CROP_BYTES; k++) {
            int d = abs(cpu[k] - gpu[k]);
            ex += d == 0;
            md = d > md ? d : md;
        }
        printf("  %-28s %4dx%-4d h2v%d: %7.3f%% of crop values exact, max |diff| %d\n", ref[i].name, w, h, vs,
               100.0 * ex / CROP_BYTES, md);
        ck_assert_msg(ex * 100 >= CROP_BYTES * 99 && md <= 10, "%s: %d values off, max %d", ref[i].name,
                      CROP_BYTES - ex, md);
        total += CROP_BYTES;
        exact += ex;
        worst = md > worst ? md : worst;
        tested++;
        free(fast);
        free(fancy);
        free(scratch);
        free(ref[i].data);
    }
    tjDestroy(tj);
    printf("rebuild: %d reference JPEGs with replicated chroma, %.4f%% of crop values exact, max |diff| %d\n", tested,
           100.0 * exact / total, worst);
    ck_assert_int_ge(tested, 15);
}
END_TEST

/* ---- the whole path against the CPU path -------------------------------- */

typedef struct fidelity {
    int images, top1_agree;
    int max_diff;
    double sum_diff;
    double worst_rel_l2, sum_rel_l2;
} fidelity;

/* Runs files[0..n) (all accepted by the device) through both paths in
 * batches of up to MAX_BATCH and accumulates the comparison. */
static void compare_paths(engine *e, devjpeg *dj, preprocess_ctx *ctx, jpeg_file *files, int n, fidelity *fd)
{
    char err[512], why[256];
    static uint8_t gpu_crops[MAX_BATCH * CROP_BYTES], cpu_crops[MAX_BATCH * CROP_BYTES];
    const size_t C = (size_t)e->classes;
    float *gpu_logits = malloc(MAX_BATCH * C * sizeof(float));
    ck_assert_ptr_nonnull(gpu_logits);
    const uint8_t *ptrs[MAX_BATCH];
    size_t lens[MAX_BATCH];
    int ws[MAX_BATCH], hs[MAX_BATCH];
    for (int b0 = 0; b0 < n; b0 += MAX_BATCH) {
        int m = n - b0 < MAX_BATCH ? n - b0 : MAX_BATCH;
        for (int i = 0; i < m; i++) {
            jpeg_file *f = &files[b0 + i];
            preprocess_info info;
            ck_assert(preprocess_header(ctx, f->data, f->len, &info, why, sizeof why) == PREP_OK);
            ws[i] = info.w;
            hs[i] = info.h;
            ck_assert_msg(preprocess_jpeg(ctx, f->data, f->len, cpu_crops + (size_t)i * CROP_BYTES, why, sizeof why) ==
                              PREP_OK,
                          "%s: %s", f->name, why);
            ptrs[i] = f->data;
            lens[i] = f->len;
        }
        int calls = 0, nfb = 0;
        ck_assert_msg(devjpeg_stage(dj, 0, 0, ptrs, lens, ws, hs, m, no_fallback, &calls, &nfb, err, sizeof err) == 0,
                      "%s", err);
        ck_assert_msg(nfb == 0 && calls == 0, "the device failed on %d images", nfb);
        ck_assert_msg(engine_submit(e, 0, m, err, sizeof err) == 0 && engine_wait(e, 0, err, sizeof err) == 0, "%s",
                      err);
        memcpy(gpu_logits, e->logits[0], (size_t)m * C * sizeof(float));
        ck_assert_msg(gpu_test_engine_device_input(e, 0, m, gpu_crops, err, sizeof err) == 0, "%s", err);

        memcpy(e->input[0], cpu_crops, (size_t)m * CROP_BYTES);
        ck_assert_msg(engine_submit(e, 0, m, err, sizeof err) == 0 && engine_wait(e, 0, err, sizeof err) == 0, "%s",
                      err);
        for (int i = 0; i < m; i++) {
            const float *lg = gpu_logits + (size_t)i * C;
            const float *lc = e->logits[0] + (size_t)i * C;
            int tg, tc;
            testutil_topk(lg, (int)C, 1, &tg);
            testutil_topk(lc, (int)C, 1, &tc);
            double rel = testutil_rel_l2(lg, lc, C);
            fd->top1_agree += tg == tc;
            fd->sum_rel_l2 += rel;
            if (rel > fd->worst_rel_l2)
                fd->worst_rel_l2 = rel;
            int img_max = 0;
            double img_sum = 0;
            for (int k = 0; k < CROP_BYTES; k++) {
                int d = abs((int)gpu_crops[(size_t)i * CROP_BYTES + k] - (int)cpu_crops[(size_t)i * CROP_BYTES + k]);
                img_sum += d;
                if (d > img_max)
                    img_max = d;
            }
            fd->sum_diff += img_sum;
            if (img_max > fd->max_diff)
                fd->max_diff = img_max;
            if (tg != tc || img_sum / CROP_BYTES > 0.5)
                printf("  %-28s crop max |diff| %d mean %.3f, logits rel L2 %.2e, top-1 %s (gpu %d, cpu %d)\n",
                       files[b0 + i].name, img_max, img_sum / CROP_BYTES, rel, tg == tc ? "agrees" : "DIFFERS", tg, tc);
            fd->images++;
        }
    }
    free(gpu_logits);
}

static void report(const char *set, const fidelity *fd)
{
    printf("fidelity %-10s: %3d images, crop max |diff| %d, mean |diff| %.3f levels, logits rel L2 mean %.2e "
           "worst %.2e, top-1 agreement %d/%d (%.1f%%)\n",
           set, fd->images, fd->max_diff, fd->sum_diff / ((double)fd->images * CROP_BYTES), fd->sum_rel_l2 / fd->images,
           fd->worst_rel_l2, fd->top1_agree, fd->images, 100.0 * fd->top1_agree / fd->images);
}

/* The files the decoder takes, after the CPU's header check; prints each
 * refusal. */
static int accepted(devjpeg *dj, preprocess_ctx *ctx, jpeg_file *in, int n, jpeg_file *out, int verbose)
{
    int nok = 0;
    for (int i = 0; i < n; i++) {
        preprocess_info info;
        char why[256];
        ck_assert_msg(preprocess_header(ctx, in[i].data, in[i].len, &info, why, sizeof why) == PREP_OK, "%s: %s",
                      in[i].name, why);
        devjpeg_reason r = devjpeg_check(dj, in[i].data, in[i].len, &info);
        if (r == DEVJPEG_OK)
            out[nok++] = in[i];
        else if (verbose)
            printf("  %-28s %5dx%-5d %s: CPU\n", in[i].name, info.w, info.h, devjpeg_reason_name(r));
    }
    return nok;
}

/* Every *.jpg of RESNETD_FIDELITY_DIR (e.g. the e2e corpus), if set. */
static int load_dir(jpeg_file *out, int max)
{
    const char *dir = getenv("RESNETD_FIDELITY_DIR");
    if (!dir)
        return 0;
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "RESNETD_FIDELITY_DIR=%s: cannot open", dir);
    int n = 0;
    for (struct dirent *de; n < max && (de = readdir(d));) {
        size_t l = strlen(de->d_name);
        if (l < 5 || strcmp(de->d_name + l - 4, ".jpg") != 0)
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        snprintf(out[n].name, sizeof out[n].name, "%s", de->d_name);
        out[n].data = testutil_read_file(path, &out[n].len);
        ck_assert_msg(out[n].data != NULL, "cannot read %s", path);
        n++;
    }
    closedir(d);
    return n;
}

/* A directory's manifest.tsv (tools/make-camera-corpus): each file's group
 * "CLASS LAYOUT[+DRI]" into group[i] (files[i] order); 0 without one. */
static int load_groups(jpeg_file *files, int n, char (*group)[48])
{
    const char *dir = getenv("RESNETD_FIDELITY_DIR");
    char path[4096], line[512];
    snprintf(path, sizeof path, "%s/manifest.tsv", dir ? dir : "");
    FILE *f = dir ? fopen(path, "r") : NULL;
    if (!f)
        return 0;
    for (int i = 0; i < n; i++)
        snprintf(group[i], sizeof group[i], "unlisted");
    while (fgets(line, sizeof line, f)) {
        char name[160], cls[16], layout[16];
        int w, h, restart;
        if (sscanf(line, "%159s %15s %d %d %15s %d", name, cls, &w, &h, layout, &restart) != 6)
            continue; /* the header */
        for (int i = 0; i < n; i++)
            if (strcmp(files[i].name, name) == 0)
                snprintf(group[i], sizeof group[i], "%s %s%s", cls, layout, restart ? "+DRI" : "");
    }
    fclose(f);
    return 1;
}

/* With a manifest: the comparison again per size class and layout. */
static void report_groups(engine *e, devjpeg *dj, preprocess_ctx *ctx, jpeg_file *ok, int nok, const char *mode)
{
    static char group[1000][48];
    static jpeg_file sub[1000];
    static int done[1000];
    if (nok > 1000 || !load_groups(ok, nok, group))
        return;
    memset(done, 0, sizeof done);
    for (int i = 0; i < nok; i++) {
        if (done[i])
            continue;
        int m = 0;
        for (int k = i; k < nok; k++)
            if (!done[k] && strcmp(group[k], group[i]) == 0) {
                sub[m++] = ok[k];
                done[k] = 1;
            }
        fidelity f = { 0 };
        compare_paths(e, dj, ctx, sub, m, &f);
        char label[96];
        snprintf(label, sizeof label, "%s %.47s", mode, group[i]);
        report(label, &f);
    }
}

/* Both paths over the reference JPEGs, the generated set and the optional
 * directory. Exact mode: every crop equal byte for byte. Fast mode: bounds
 * on the photo-like sets; the reference set (edge-case sizes, sharp colour
 * edges) is reported. */
static void fidelity_run(int exact)
{
    char err[512];
    const char *mode = exact ? "gpu-exact" : "gpu";
    resnet18_weights w;
    ck_assert_msg(weights_load(testutil_ref_path("weights.safetensors"), &w, err, sizeof err) == 0, "%s", err);
    engine *e = cuda_engine(&w);
    devjpeg *dj = devjpeg_create(e, 512u << 20, 4, exact, err, sizeof err);
    ck_assert_msg(dj != NULL, "%s", err);
    preprocess_ctx *ctx = preprocess_create(NULL);
    ck_assert(ctx != NULL);

    enum { NGEN = 96, NDIR = 1000 };
    static jpeg_file ref[64], gen[NGEN], dir[NDIR], ok[NDIR];
    struct {
        const char *name;
        jpeg_file *files;
        int n;
    } sets[3] = { { "reference", ref, load_reference(ref, 64) },
                  { "generated", gen, make_corpus(gen, quick ? 16 : NGEN, 0) },
                  { "directory", dir, load_dir(dir, NDIR) } };
    for (int k = 0; k < 3; k++) {
        if (sets[k].n == 0)
            continue;
        int nok = accepted(dj, ctx, sets[k].files, sets[k].n, ok, k != 2);
        /* every generated file in a layout the hardware decodes, restart
         * markers included, goes to the device */
        int hw = 0;
        for (int i = 0; k == 1 && i < sets[k].n; i++)
            hw += i % (int)(sizeof layouts / sizeof layouts[0]) < NLAYOUTS_HW;
        ck_assert_msg(nok >= (k == 1 ? hw : sets[k].n / 2), "%s: the hardware took only %d of %d", sets[k].name, nok,
                      sets[k].n);
        fidelity f = { 0 };
        compare_paths(e, dj, ctx, ok, nok, &f);
        char label[64];
        snprintf(label, sizeof label, "%s %s", mode, sets[k].name);
        report(label, &f);
        if (k == 2)
            report_groups(e, dj, ctx, ok, nok, mode);
        if (exact)
            ck_assert_msg(f.max_diff == 0, "%s: crops differ from the CPU path's by up to %d levels", label,
                          f.max_diff);
        else {
            /* The rebuilt chroma leaves only a few clamped pixels off
             * (tests/image/test_chroma_rebuild.c); the random test weights' top-1
             * flips at ~1% logit change, and agreed on 91.7-99% before the
             * rebuild. */
            ck_assert_msg(f.sum_diff / ((double)f.images * CROP_BYTES) < 0.02, "%s: mean difference over 0.02 level",
                          label);
            ck_assert_msg(f.sum_rel_l2 / f.images < 2e-3, "%s: mean logits rel L2 over 2e-3", label);
            ck_assert_msg(f.top1_agree * 100 >= f.images * 99, "%s: top-1 agreement below 99%%", label);
        }
        for (int i = 0; i < sets[k].n; i++)
            free(sets[k].files[i].data);
    }
    preprocess_destroy(ctx);
    devjpeg_destroy(dj);
    engine_destroy(e);
    weights_free(&w);
}

START_TEST(fidelity_exact_is_bit_exact)
{
    fidelity_run(1);
}
END_TEST

START_TEST(fidelity_fast_agrees)
{
    fidelity_run(0);
}
END_TEST

/* ---- routing of what the hardware cannot take ---------------------------- */

START_TEST(routing)
{
    char err[512], why[256];
    resnet18_weights w;
    ck_assert_msg(weights_load(testutil_ref_path("weights.safetensors"), &w, err, sizeof err) == 0, "%s", err);
    engine *e = cuda_engine(&w);
    devjpeg *dj = devjpeg_create(e, 16u << 20, 2, 0, err, sizeof err);
    ck_assert_msg(dj != NULL, "%s", err);
    preprocess_ctx *ctx = preprocess_create(NULL);
    ck_assert(ctx != NULL);
    preprocess_info info;

    size_t len;
    uint8_t *prog = testutil_read_file(testutil_ref_path("jpeg/progressive_801x601.jpg"), &len);
    ck_assert(prog && preprocess_header(ctx, prog, len, &info, why, sizeof why) == PREP_OK);
    ck_assert_int_eq(devjpeg_check(dj, prog, len, &info), DEVJPEG_UNSUPPORTED);
    free(prog);

    uint8_t *rgb = photo_like(640, 480);
    jpeg_file good = encode(rgb, 640, 480, TJSAMP_420, 90, "good");
    free(rgb);
    ck_assert(preprocess_header(ctx, good.data, good.len, &info, why, sizeof why) == PREP_OK);
    ck_assert_int_eq(devjpeg_check(dj, good.data, good.len, &info), DEVJPEG_OK);
    ck_assert_int_eq(devjpeg_check(dj, good.data, good.len / 2, &info), DEVJPEG_NO_EOI);

    /* 16 MB arena: 3000 x 2000 x 3 does not fit. */
    rgb = photo_like(3000, 2000);
    jpeg_file big = encode(rgb, 3000, 2000, TJSAMP_420, 85, "big");
    free(rgb);
    ck_assert(preprocess_header(ctx, big.data, big.len, &info, why, sizeof why) == PREP_OK);
    ck_assert_int_eq(devjpeg_check(dj, big.data, big.len, &info), DEVJPEG_TOO_LARGE);

    /* Corrupt scan data, EOI intact: decoded (garbage) or sent to the fallback. */
    uint8_t *bad = malloc(good.len);
    ck_assert(bad != NULL);
    memcpy(bad, good.data, good.len);
    for (size_t k = good.len / 3; k < good.len / 3 + 64; k++)
        bad[k] = (uint8_t)rng_u32();
    const uint8_t *ptrs[3] = { good.data, bad, good.data };
    size_t lens[3] = { good.len, good.len, good.len };
    int ws[3] = { 640, 640, 640 }, hs[3] = { 480, 480, 480 };
    int calls = 0, nfb = 0;
    ck_assert_msg(devjpeg_stage(dj, 1, 0, ptrs, lens, ws, hs, 3, no_fallback, &calls, &nfb, err, sizeof err) == 0, "%s",
                  err);
    ck_assert_int_eq(calls, nfb);
    ck_assert_msg(nfb <= 1, "the device failed on %d images, only one is corrupt", nfb);
    ck_assert_msg(engine_submit(e, 1, 3, err, sizeof err) == 0 && engine_wait(e, 1, err, sizeof err) == 0, "%s", err);
    printf("routing: corrupt scan data %s\n", nfb ? "went to the CPU fallback" : "was decoded by the hardware");

    free(bad);
    free(good.data);
    free(big.data);
    preprocess_destroy(ctx);
    devjpeg_destroy(dj);
    engine_destroy(e);
    weights_free(&w);
}
END_TEST

/* ---- mixed batches and chunking ------------------------------------------ */

START_TEST(mixed_and_chunked)
{
    char err[512], why[256];
    resnet18_weights w;
    ck_assert_msg(weights_load(testutil_ref_path("weights.safetensors"), &w, err, sizeof err) == 0, "%s", err);
    engine *e = cuda_engine(&w);
    devjpeg *big = devjpeg_create(e, 512u << 20, 2, 0, err, sizeof err);
    ck_assert_msg(big != NULL, "%s", err);
    devjpeg *small = devjpeg_create(e, 16u << 20, 2, 1, err, sizeof err);
    ck_assert_msg(small != NULL, "%s", err);
    preprocess_ctx *ctx = preprocess_create(NULL);
    ck_assert(ctx != NULL);

    enum { NHOST = 5, NCOMP = 40 };
    static jpeg_file files[NCOMP];
    make_corpus(files, NCOMP, 1);
    static uint8_t host[NHOST * CROP_BYTES], one[(NHOST + NCOMP) * CROP_BYTES], chunked[(NHOST + NCOMP) * CROP_BYTES];
    for (size_t k = 0; k < sizeof host; k++)
        host[k] = (uint8_t)rng_u32();
    const uint8_t *ptrs[NCOMP];
    size_t lens[NCOMP];
    int ws[NCOMP], hs[NCOMP];
    size_t pixels = 0;
    for (int i = 0; i < NCOMP; i++) {
        preprocess_info info;
        ck_assert(preprocess_header(ctx, files[i].data, files[i].len, &info, why, sizeof why) == PREP_OK);
        ws[i] = info.w;
        hs[i] = info.h;
        ptrs[i] = files[i].data;
        lens[i] = files[i].len;
        pixels += (size_t)ws[i] * hs[i] * 3;
    }
    ck_assert_msg(pixels > 2 * (16u << 20), "the batch must need several 16 MB chunks (%zu bytes)", pixels);
    devjpeg *dj[2] = { big, small };
    uint8_t *out[2] = { one, chunked };
    for (int r = 0; r < 2; r++) {
        int calls = 0, nfb = 0;
        memcpy(e->input[0], host, sizeof host);
        ck_assert_msg(
            devjpeg_stage(dj[r], 0, NHOST, ptrs, lens, ws, hs, NCOMP, no_fallback, &calls, &nfb, err, sizeof err) == 0,
            "%s", err);
        ck_assert_int_eq(nfb, 0);
        ck_assert_msg(engine_submit(e, 0, NHOST + NCOMP, err, sizeof err) == 0 &&
                          engine_wait(e, 0, err, sizeof err) == 0,
                      "%s", err);
        ck_assert_msg(gpu_test_engine_device_input(e, 0, NHOST + NCOMP, out[r], err, sizeof err) == 0, "%s", err);
        ck_assert_msg(memcmp(out[r], host, sizeof host) == 0, "the CPU crops were not uploaded in front");
        ck_assert_msg(devjpeg_stage_ms(dj[r], 0) > 0, "no stage time");
    }
    static uint8_t cpu[CROP_BYTES];
    for (int i = 0; i < NCOMP; i++) {
        ck_assert(preprocess_jpeg(ctx, files[i].data, files[i].len, cpu, why, sizeof why) == PREP_OK);
        ck_assert_msg(memcmp(chunked + (size_t)(NHOST + i) * CROP_BYTES, cpu, CROP_BYTES) == 0,
                      "image %d: the chunked exact decode differs from the CPU path", i);
    }
    for (int i = 0; i < NCOMP; i++)
        free(files[i].data);
    preprocess_destroy(ctx);
    devjpeg_destroy(small);
    devjpeg_destroy(big);
    engine_destroy(e);
    weights_free(&w);
}
END_TEST

int main(void)
{
    if (gpu_device_count() == 0) {
        printf("no CUDA device: skipping\n");
        return 77;
    }
    testutil_require_reference();
    const char *q = getenv("RESNETD_GPU_TEST_QUICK");
    quick = q && strcmp(q, "1") == 0;
    setenv("CK_FORK", "no", 1); /* a CUDA context does not survive fork() */
    /* One case per concern, so that each can run alone (CK_RUN_CASE=resize). */
    Suite *s = suite_create("gpu_decode");
    TCase *resize = tcase_create("resize"), *fid = tcase_create("fidelity"), *path = tcase_create("path");
    tcase_set_timeout(resize, 600);
    tcase_set_timeout(fid, 600);
    tcase_set_timeout(path, 600);
    tcase_add_test(resize, resize_bit_exact);
    tcase_add_test(resize, rebuild_restores_fancy_upsampling);
    tcase_add_test(fid, fidelity_exact_is_bit_exact);
    tcase_add_test(fid, fidelity_fast_agrees);
    tcase_add_test(path, routing);
    tcase_add_test(path, mixed_and_chunked);
    suite_add_tcase(s, resize);
    suite_add_tcase(s, fid);
    suite_add_tcase(s, path);
    return testutil_run(s);
}
