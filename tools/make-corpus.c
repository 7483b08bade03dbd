/* make-corpus: writes synthetic "photo-like" JPEGs for the end-to-end
 * benchmark, where no photo collection can be downloaded. What makes a JPEG
 * cost what a photo costs to decode is its size, its chroma subsampling and
 * how many bits its coefficients take, so each image is built like a photo:
 * a smooth two-colour gradient with soft colour blobs (sky, light), a dozen
 * soft-edged shapes with their own shading (objects), multi-octave value
 * noise (texture) and per-pixel grain (sensor noise). Sizes are 0.2-1 MP in
 * common aspect ratios, quality 85-95, mostly 4:2:0 as cameras write them.
 * --progressive F writes that share of them progressive (as many web images
 * are), which GPU hardware decoders refuse. Deterministic for a given
 * --seed. Needs only TurboJPEG. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>

typedef struct {
    uint64_t s;
} rng;

static double rnd(rng *r) /* uniform [0, 1) */
{
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (double)(r->s >> 11) * 0x1.0p-53;
}

static double rnd_range(rng *r, double lo, double hi)
{
    return lo + (hi - lo) * rnd(r);
}

static double clampd(double v, double lo, double hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* Value noise: random values on a lattice with `cell`-pixel spacing,
 * smoothly interpolated; one channel, range about [-1, 1]. */
typedef struct {
    int cell, gw, gh;
    float *v;
} noise;

static int noise_init(noise *n, rng *r, int w, int h, int cell)
{
    n->cell = cell;
    n->gw = w / cell + 2;
    n->gh = h / cell + 2;
    n->v = malloc((size_t)n->gw * (size_t)n->gh * sizeof *n->v);
    if (!n->v)
        return -1;
    for (int i = 0; i < n->gw * n->gh; i++)
        n->v[i] = (float)(2 * rnd(r) - 1);
    return 0;
}

static double noise_at(const noise *n, int x, int y)
{
    int gx = x / n->cell, gy = y / n->cell;
    double fx = (double)(x % n->cell) / n->cell, fy = (double)(y % n->cell) / n->cell;
    fx = fx * fx * (3 - 2 * fx);
    fy = fy * fy * (3 - 2 * fy);
    const float *row0 = n->v + (size_t)gy * (size_t)n->gw, *row1 = row0 + n->gw;
    double a = row0[gx] + (row0[gx + 1] - row0[gx]) * fx;
    double b = row1[gx] + (row1[gx + 1] - row1[gx]) * fx;
    return a + (b - a) * fy;
}

#define MAX_BLOBS 6
#define MAX_SHAPES 16
#define OCTAVES 3

typedef struct {
    double cx, cy, rx, ry, rgb[3], strength;
} blob;

typedef struct {
    int ellipse;
    double cx, cy, rx, ry, rgb[3], shade; /* shade: vertical brightness slope */
} shape;

/* Renders one image into rgb (w * h * 3 bytes). */
static int render(rng *r, int w, int h, uint8_t *rgb)
{
    double top[3], bottom[3];
    for (int c = 0; c < 3; c++) {
        top[c] = rnd_range(r, 40, 230);
        bottom[c] = rnd_range(r, 20, 200);
    }
    blob blobs[MAX_BLOBS];
    int nb = 2 + (int)(rnd(r) * (MAX_BLOBS - 1));
    for (int i = 0; i < nb; i++) {
        blobs[i] = (blob){ .cx = rnd(r) * w,
                           .cy = rnd(r) * h,
                           .rx = rnd_range(r, 0.1, 0.5) * w,
                           .ry = rnd_range(r, 0.1, 0.5) * h,
                           .strength = rnd_range(r, 0.3, 0.8) };
        for (int c = 0; c < 3; c++)
            blobs[i].rgb[c] = rnd_range(r, 0, 255);
    }
    shape shapes[MAX_SHAPES];
    int ns = 4 + (int)(rnd(r) * (MAX_SHAPES - 3));
    for (int i = 0; i < ns; i++) {
        shapes[i] = (shape){ .ellipse = rnd(r) < 0.5,
                             .cx = rnd(r) * w,
                             .cy = rnd(r) * h,
                             .rx = rnd_range(r, 0.03, 0.25) * w,
                             .ry = rnd_range(r, 0.03, 0.25) * h,
                             .shade = rnd_range(r, -60, 60) };
        for (int c = 0; c < 3; c++)
            shapes[i].rgb[c] = rnd_range(r, 10, 245);
    }
    noise oct[OCTAVES];
    static const int cells[OCTAVES] = { 48, 12, 3 };
    double amp[OCTAVES] = { rnd_range(r, 8, 20), rnd_range(r, 5, 12), rnd_range(r, 3, 8) };
    double grain = rnd_range(r, 2, 5);
    for (int o = 0; o < OCTAVES; o++)
        if (noise_init(&oct[o], r, w, h, cells[o]) != 0) {
            for (int k = 0; k < o; k++)
                free(oct[k].v);
            return -1;
        }
    for (int y = 0; y < h; y++) {
        double t = (double)y / h;
        for (int x = 0; x < w; x++) {
            double px[3];
            for (int c = 0; c < 3; c++)
                px[c] = top[c] + (bottom[c] - top[c]) * t;
            for (int i = 0; i < nb; i++) {
                double dx = (x - blobs[i].cx) / blobs[i].rx, dy = (y - blobs[i].cy) / blobs[i].ry;
                double k = blobs[i].strength * exp(-(dx * dx + dy * dy));
                for (int c = 0; c < 3; c++)
                    px[c] += (blobs[i].rgb[c] - px[c]) * k;
            }
            for (int i = 0; i < ns; i++) {
                const shape *s = &shapes[i];
                double dx = (x - s->cx) / s->rx, dy = (y - s->cy) / s->ry, d;
                if (s->ellipse)
                    d = sqrt(dx * dx + dy * dy) - 1;
                else
                    d = fmax(fabs(dx), fabs(dy)) - 1;
                /* signed distance in pixels, roughly; a 1.5-pixel soft edge */
                double edge = clampd(0.5 - d * fmin(s->rx, s->ry) / 1.5, 0, 1);
                if (edge > 0)
                    for (int c = 0; c < 3; c++)
                        px[c] += (s->rgb[c] + s->shade * dy - px[c]) * edge;
            }
            double tex = 0;
            for (int o = 0; o < OCTAVES; o++)
                tex += amp[o] * noise_at(&oct[o], x, y);
            for (int c = 0; c < 3; c++) {
                double g = grain * (rnd(r) + rnd(r) + rnd(r) - 1.5) * 2;
                rgb[((size_t)y * (size_t)w + (size_t)x) * 3 + (size_t)c] = (uint8_t)clampd(
                    px[c] + tex * (0.8 + 0.1 * c) + g + 0.5, 0, 255);
            }
        }
    }
    for (int o = 0; o < OCTAVES; o++)
        free(oct[o].v);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: make-corpus --out DIR [--count N] [--seed S] [--min-mp A] [--max-mp B] [--progressive F]\n"
               "Writes N (default 200) synthetic photo-like JPEGs of A..B megapixels\n"
               "(default 0.2..1.0), quality 85-95, into DIR as photo_NNNN.jpg; a share F\n"
               "(default 0) of them progressive.\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "out", required_argument, NULL, 'o' },    { "count", required_argument, NULL, 'n' },
        { "seed", required_argument, NULL, 's' },   { "min-mp", required_argument, NULL, 'a' },
        { "max-mp", required_argument, NULL, 'b' }, { "progressive", required_argument, NULL, 'p' },
        { "help", no_argument, NULL, 'h' },         { NULL, 0, NULL, 0 }
    };
    const char *out = NULL;
    long count = 200;
    unsigned long seed = 1;
    double min_mp = 0.2, max_mp = 1.0, progressive = 0;
    int o;
    char *end;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        errno = 0;
        switch (o) {
        case 'o': out = optarg; break;
        case 'n': count = strtol(optarg, &end, 10); break;
        case 's': seed = strtoul(optarg, &end, 10); break;
        case 'a': min_mp = strtod(optarg, &end); break;
        case 'b': max_mp = strtod(optarg, &end); break;
        case 'p': progressive = strtod(optarg, &end); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (o != 'o' && (errno || *end)) {
            fprintf(stderr, "make-corpus: bad number '%s'\n", optarg);
            return 2;
        }
    }
    if (!out || optind != argc || count < 1 || count > 100000 || !(min_mp > 0.001) || !(max_mp >= min_mp) ||
        max_mp > 100 || !(progressive >= 0 && progressive <= 1)) {
        usage(stderr);
        return 2;
    }
    if (mkdir(out, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "make-corpus: %s: %s\n", out, strerror(errno));
        return 1;
    }
    /* One handle per mode: TurboJPEG 2.1 keeps a progressive compression's
     * scan script in the handle, and the next baseline image it writes is
     * corrupt ("bad Huffman code"). */
    tjhandle tjs[2] = { tjInitCompress(), tjInitCompress() };
    if (!tjs[0] || !tjs[1]) {
        fprintf(stderr, "make-corpus: tjInitCompress: %s\n", tjGetErrorStr());
        if (tjs[0])
            tjDestroy(tjs[0]);
        if (tjs[1])
            tjDestroy(tjs[1]);
        return 1;
    }
    static const double aspects[] = { 4.0 / 3, 3.0 / 2, 16.0 / 9, 1.0, 3.0 / 4, 2.0 / 3 };
    double total_px = 0, total_bytes = 0;
    int rc = 0, nprog = 0;
    for (long i = 0; i < count && rc == 0; i++) {
        rng r = { .s = (seed + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)i + 1) * 0xBF58476D1CE4E5B9ull };
        if (r.s == 0)
            r.s = 1;
        double mp = rnd_range(&r, min_mp, max_mp) * 1e6;
        double aspect = aspects[(int)(rnd(&r) * (sizeof aspects / sizeof aspects[0]))];
        int w = ((int)sqrt(mp * aspect) + 1) & ~1, h = ((int)(mp / (w > 0 ? w : 1)) + 1) & ~1;
        int quality = 85 + (int)(rnd(&r) * 11);
        double u = rnd(&r);
        int samp = u < 0.8 ? TJSAMP_420 : u < 0.9 ? TJSAMP_422 : TJSAMP_444;
        /* A low-discrepancy pick, apart from the image's own random stream,
         * so the pixels do not depend on --progressive. */
        int prog = fmod((double)i * 0.6180339887498949, 1.0) < progressive;
        nprog += prog;
        uint8_t *rgb = malloc((size_t)w * (size_t)h * 3);
        unsigned char *jpeg = NULL;
        unsigned long len = 0;
        if (!rgb || render(&r, w, h, rgb) != 0) {
            fprintf(stderr, "make-corpus: out of memory\n");
            rc = 1;
        } else if (tjCompress2(tjs[prog], rgb, w, 0, h, TJPF_RGB, &jpeg, &len, samp, quality,
                               TJFLAG_ACCURATEDCT | (prog ? TJFLAG_PROGRESSIVE : 0)) != 0) {
            fprintf(stderr, "make-corpus: tjCompress2: %s\n", tjGetErrorStr2(tjs[prog]));
            rc = 1;
        } else {
            char path[4096];
            snprintf(path, sizeof path, "%s/photo_%04ld.jpg", out, i);
            FILE *f = fopen(path, "wb");
            int ok = f && fwrite(jpeg, 1, len, f) == len;
            if (f && fclose(f) != 0)
                ok = 0;
            if (!ok) {
                fprintf(stderr, "make-corpus: %s: %s\n", path, strerror(errno));
                rc = 1;
            }
            total_px += (double)w * h;
            total_bytes += (double)len;
        }
        tjFree(jpeg);
        free(rgb);
    }
    tjDestroy(tjs[0]);
    tjDestroy(tjs[1]);
    if (rc == 0)
        printf("make-corpus: %ld images (%d progressive) in %s, mean %.2f MP, %.0f KB, %.2f bits/pixel\n", count, nprog,
               out, total_px / count / 1e6, total_bytes / count / 1e3, 8 * total_bytes / total_px);
    return rc;
}
