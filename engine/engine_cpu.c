/* The CPU engine: ResNet18 in FP32 on the host, behind the engine interface.
 *
 * Layouts: activations NHWC FP32; conv weights KRSC ([cout][kh][kw][cin]) with
 * BN folded, as resnet18_weights gives them. Each convolution is a GEMM
 * C[M][N] = A[M][K] * W[N][K]^T with M = output pixels of the batch,
 * K = k*k*cin, N = cout. The epilogue (bias, residual add, ReLU) is fused
 * into the GEMM's store. The network is walked from the resnet18_convs table;
 * activation buffers are assigned from the table's liveness at create.
 *
 * Two GEMM back ends, chosen at create:
 *  - avx512: our own 14x32 register-blocked kernel with weights packed into
 *    32-column panels, run by the engine's own thread pool; threads claim
 *    tiles of each layer's output. Where a layer's output rows are whole
 *    14-pixel tiles (all but the 7x7 layers), A is read in place: its input
 *    tensor carries a zero border as wide as the conv's padding, so the A
 *    rows of one kernel row are the input pixels themselves at a fixed
 *    stride (no im2col at all, and a 1x1 stride-2 conv gathers by stride).
 *    Other layers build im2col rows in a private per-thread workspace of
 *    about 1 MiB. Used when the CPU has AVX-512F. It exists because Debian's
 *    OpenBLAS 0.3.21 does not recognise newer Xeons and falls back to its
 *    AVX2 Haswell kernels, which are slower than PyTorch.
 *  - blas: im2col in chunks of up to 32 MiB, one cblas_sgemm per image
 *    (OpenBLAS threads it), epilogue pass. The portable path.
 *    RESNETD_CPU_GEMM=blas (or =avx512) forces a choice; the tests run both
 *    against torchvision.
 *
 * Batch invariance: an image's logits are the same bits at any position in
 * any batch, on both back ends. The avx512 kernel sums every output in one
 * fixed order whatever tile its row falls in; the blas back end gives each
 * image a GEMM of its own, always of the same shape; the average pool and
 * the FC run per image (cpu_engine_fc). tests/engine/test_engine_cpu.c checks it.
 *
 * Every buffer is allocated at create for max_batch; submit computes
 * synchronously (under a mutex, since the scratch is shared by the slots) and
 * wait has nothing left to do. The submitting thread works as pool thread 0
 * beside threads-1 workers, which sleep between jobs. Weights are copied:
 * the caller may free them after create. */
#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "engine/cpu_pool.h"
#include "engine/engine.h"
#include "engine/engine_cpu.h"
#include "image/preprocess.h"

/* The avx512 back end is x86-64 only; elsewhere the blas one runs. */
#if defined(__x86_64__)
#include <immintrin.h>
#define HAVE_AVX512_KERNEL 1
#else
#define HAVE_AVX512_KERNEL 0
#endif

/* OpenBLAS extension; not in every cblas.h. */
void openblas_set_num_threads(int num_threads);

#define MR 14 /* rows of the AVX-512 micro-kernel tile */
#define NR 32 /* columns: two 16-float vectors */
#define KC 256 /* K block: keeps a B block within L2 */
#define GROUP_FLOATS (256 * 1024) /* per-thread im2col rows: ~1 MiB */
#define BLAS_WS_FLOATS (8 * 1024 * 1024) /* blas path im2col chunk: 32 MiB */
#define MAX_THREADS CPU_POOL_MAX_THREADS
#define CPU_MAX_BATCH 65536 /* keeps every layer's work units under 2^20 */
#define NTENSORS R18_NTENSORS /* conv outputs, image, pool */
#define T_IMAGE R18_T_IMAGE
#define T_POOL R18_T_POOL

typedef struct cpu_engine cpu_engine;

typedef struct cpu_layer {
    const resnet18_conv_desc *d;
    int K; /* k*k*cin */
    float *w; /* avx512: [cout/NR][K][NR] panels; blas: [cout][K] */
    float *b; /* [cout] */
    int src, res, dst; /* activation buffer indices; res -1 = none */
    int src_pad, dst_pad, res_pad; /* zero borders of those tensors, in pixels */
    int in_place; /* avx512: read the padded input directly, no im2col */
} cpu_layer;

/* How a conv's output is cut into work units: um row groups (each at most
 * one workspace of im2col rows) times un column ranges. Threads claim units
 * dynamically, so a thread that the OS delays does not hold up the layer. */
typedef struct conv_plan {
    int M, mblocks, panels;
    int um, un;
} conv_plan;

/* The job the pool threads are running. */
typedef struct cpu_job {
    const cpu_layer *layer;
    int n; /* images in the batch */
    int slot;
    conv_plan plan; /* the layer's work units */
    int small_units; /* units of the normalise and max-pool steps */
    int ws_group[MAX_THREADS]; /* per thread: row group whose im2col rows are in its ws */
} cpu_job;

struct cpu_engine {
    engine pub;
    int avx512; /* which GEMM back end */
    int nthreads; /* pool threads including the caller */
    cpu_layer layer[RESNET18_NUM_CONVS];
    int pool_h; /* maxpool output height (= width) */
    int buf[NTENSORS]; /* tensor -> activation buffer */
    int pad[NTENSORS]; /* tensor -> zero border, in pixels */
    int th[NTENSORS], tc[NTENSORS]; /* tensor -> height (= width), channels */
    float *act[NTENSORS]; /* distinct activation buffers, [max_batch][h][w][c] */
    int nact;
    float *fc_w; /* [classes][512] */
    float *fc_b; /* [classes] */
    float *feat; /* [max_batch][512] pooled features */
    float *ws; /* im2col: nthreads x ws_floats */
    size_t ws_floats;
    float lut[3][256]; /* uint8 -> normalised float, per channel */
    pthread_mutex_t run_mu; /* one batch at a time */
    cpu_pool pool; /* nthreads threads, the caller included */
    engine_observer_fn *observe; /* calibration: sees each tensor INT8 quantises */
    void *observe_ctx;
    cpu_job job;
};

static int imin(int a, int b)
{
    return a < b ? a : b;
}

/* n floats from cpu_engine_alloc: zeroed, aligned, huge pages when large. */
static float *alloc_floats(size_t n)
{
    return cpu_engine_alloc(n * sizeof(float));
}

/* Address of pixel (img, y, x) of an h x h x c tensor with a zero border of
 * pad pixels. */
static size_t at(int img, int y, int x, int h, int c, int pad)
{
    const size_t w = (size_t)h + 2 * pad;
    return (((size_t)img * w + (size_t)(y + pad)) * w + (size_t)(x + pad)) * c;
}

/* Cuts conv L at batch n into work units (see conv_plan). */
static conv_plan plan_conv(const cpu_engine *e, const cpu_layer *L, int n)
{
    const resnet18_conv_desc *d = L->d;
    const int nt = e->nthreads;
    conv_plan p;
    p.M = n * d->out_h * d->out_h;
    p.mblocks = (p.M + MR - 1) / MR;
    p.panels = d->cout / NR;
    int cap = (int)(e->ws_floats / ((size_t)L->K * MR)); /* m-blocks per workspace */
    if (cap < 1)
        cap = 1;
    p.um = (p.mblocks + cap - 1) / cap;
    p.un = 1;
    if (p.mblocks < 4 * nt) {
        /* Few rows: split the columns instead, so each thread streams only
         * its share of the weights (the im2col rows are cheap to repeat). */
        p.un = imin(p.panels, nt);
    } else {
        /* Two units per thread at least, in a multiple of the threads. */
        if (p.um < 2 * nt)
            p.um = 2 * nt;
        p.um = (p.um + nt - 1) / nt * nt;
    }
    return p;
}

/* ---- im2col ------------------------------------------------------------ */

/* Writes rows [m0, m0 + rows) of conv d's A matrix (row m = output pixel m of
 * the batch, columns in KRSC order) to dst with leading dimension K. The
 * input has a zero border of ipad pixels. Rows at or past M are zero so a
 * full kernel tile can read them. */
static void im2col_rows(const resnet18_conv_desc *d, const float *in, int ipad, int m0, int rows, int M, float *dst,
                        int K)
{
    const int oh = d->out_h, ih = d->in_h + 2 * ipad, cin = d->cin, k = d->k, s = d->stride;
    const int p = d->pad - ipad;
    const size_t seg = (size_t)k * cin;
    for (int r = 0; r < rows; r++) {
        float *row = dst + (size_t)r * K;
        int m = m0 + r;
        if (m >= M) {
            memset(row, 0, (size_t)K * sizeof(float));
            continue;
        }
        int img = m / (oh * oh), rem = m % (oh * oh), oy = rem / oh, ox = rem % oh;
        const float *base = in + (size_t)img * ih * ih * cin;
        int x0 = ox * s - p;
        int kx0 = x0 < 0 ? -x0 : 0;
        int kx1 = imin(k, ih - x0);
        for (int ky = 0; ky < k; ky++) {
            float *out = row + ky * seg;
            int iy = oy * s - p + ky;
            if (iy < 0 || iy >= ih || kx1 <= kx0) {
                memset(out, 0, seg * sizeof(float));
                continue;
            }
            if (kx0 > 0)
                memset(out, 0, (size_t)kx0 * cin * sizeof(float));
            memcpy(out + (size_t)kx0 * cin, base + ((size_t)iy * ih + x0 + kx0) * cin,
                   (size_t)(kx1 - kx0) * cin * sizeof(float));
            if (kx1 < k)
                memset(out + (size_t)kx1 * cin, 0, (size_t)(k - kx1) * cin * sizeof(float));
        }
    }
}

/* ---- AVX-512 back end: micro-kernel and conv layers ---------------------- */
#if HAVE_AVX512_KERNEL

typedef struct epilogue {
    const float *bias; /* NR values for this tile's columns */
    const float *res; /* residual tile (row stride ldc), or NULL */
    int relu;
} epilogue;

/* C[mr][NR] (row stride ldc) = or += A[MR][kc] * B[kc][NR], where A's
 * columns are nseg segments of seglen: element (r, s*seglen + j) is at
 * a[s * segstride + r * lda + j]. im2col rows are one segment; a conv read in
 * place is one segment per kernel row. first: start from zero rather than C.
 * ep: last K block, apply bias, residual and ReLU. Rows mr..MR-1 of A are read
 * (they must exist) but their results are dropped. */
__attribute__((target("avx512f"))) static void kernel_14x32(const float *a, size_t lda, int nseg, int seglen,
                                                            size_t segstride, const float *b, float *c, size_t ldc,
                                                            int mr, int first, const epilogue *ep)
{
    __m512 acc[MR][2];
#pragma GCC unroll 14
    for (int r = 0; r < MR; r++) {
        if (!first && r < mr) {
            acc[r][0] = _mm512_loadu_ps(c + r * ldc);
            acc[r][1] = _mm512_loadu_ps(c + r * ldc + 16);
        } else {
            acc[r][0] = _mm512_setzero_ps();
            acc[r][1] = _mm512_setzero_ps();
        }
    }
    /* Two row bases keep every A address a base + scaled index, so the
     * loop needs no spilled pointers. */
    for (int sg = 0; sg < nseg; sg++) {
        const float *p = a + sg * segstride, *q = p + (MR / 2) * lda;
        for (int k = 0; k < seglen; k++) {
            __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 7
            for (int r = 0; r < MR / 2; r++) {
                __m512 av = _mm512_set1_ps(p[r * lda]);
                acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
            }
#pragma GCC unroll 7
            for (int r = 0; r < MR / 2; r++) {
                __m512 av = _mm512_set1_ps(q[r * lda]);
                acc[MR / 2 + r][0] = _mm512_fmadd_ps(av, b0, acc[MR / 2 + r][0]);
                acc[MR / 2 + r][1] = _mm512_fmadd_ps(av, b1, acc[MR / 2 + r][1]);
            }
            p++;
            q++;
            b += NR;
        }
    }
    if (ep) {
        __m512 bias0 = _mm512_loadu_ps(ep->bias), bias1 = _mm512_loadu_ps(ep->bias + 16);
        __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 14
        for (int r = 0; r < MR; r++) {
            if (r >= mr)
                break;
            __m512 v0 = _mm512_add_ps(acc[r][0], bias0), v1 = _mm512_add_ps(acc[r][1], bias1);
            if (ep->res) {
                v0 = _mm512_add_ps(v0, _mm512_loadu_ps(ep->res + r * ldc));
                v1 = _mm512_add_ps(v1, _mm512_loadu_ps(ep->res + r * ldc + 16));
            }
            if (ep->relu) {
                v0 = _mm512_max_ps(v0, zero);
                v1 = _mm512_max_ps(v1, zero);
            }
            _mm512_storeu_ps(c + r * ldc, v0);
            _mm512_storeu_ps(c + r * ldc + 16, v1);
        }
    } else {
#pragma GCC unroll 14
        for (int r = 0; r < MR; r++) {
            if (r >= mr)
                break;
            _mm512_storeu_ps(c + r * ldc, acc[r][0]);
            _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
        }
    }
}

/* M-blocks [g0, g1) x panels [p0, p1) of a conv whose input has a zero
 * border at least as wide as its padding and whose output rows are whole
 * M-blocks: a block is MR neighbouring pixels of one output row, so for
 * kernel row ky its A matrix is the input row under it, read in place with
 * a row stride of `stride` pixels. */
static void conv_in_place(cpu_engine *e, const cpu_layer *L, int g0, int g1, int p0, int p1)
{
    const resnet18_conv_desc *d = L->d;
    const int oh = d->out_h, N = d->cout, K = L->K, seg = d->k * d->cin;
    const size_t lda = (size_t)d->stride * d->cin;
    const size_t rowstride = ((size_t)d->in_h + 2 * L->src_pad) * d->cin;
    const float *in = e->act[L->src];
    const float *res = L->res >= 0 ? e->act[L->res] : NULL;
    float *out = e->act[L->dst];
    /* A short K runs as one call over all kernel rows; a long one in KC
     * blocks, each within one kernel row. */
    const int whole = K <= KC;
    for (int ky = 0; ky < (whole ? 1 : d->k); ky++) {
        for (int k0 = 0; k0 < (whole ? 1 : seg); k0 += KC) {
            int kc = whole ? seg : imin(KC, seg - k0);
            int first = ky == 0 && k0 == 0;
            int last = whole || (ky == d->k - 1 && k0 + kc == seg);
            for (int mb = g0; mb < g1; mb++) {
                int m = mb * MR, img = m / (oh * oh), oy = m / oh % oh, ox = m % oh;
                const float *a = in +
                                 at(img, oy * d->stride - d->pad, ox * d->stride - d->pad, d->in_h, d->cin,
                                    L->src_pad) +
                                 ky * rowstride + k0;
                size_t o = at(img, oy, ox, oh, N, L->dst_pad);
                for (int p = p0; p < p1; p++) {
                    epilogue ep = {
                        .bias = L->b + p * NR,
                        .res = res ? res + at(img, oy, ox, oh, N, L->res_pad) + p * NR : NULL,
                        .relu = d->relu,
                    };
                    kernel_14x32(a, lda, whole ? d->k : 1, kc, rowstride,
                                 L->w + ((size_t)p * K + (size_t)ky * seg + k0) * NR, out + o + p * NR, (size_t)N, MR,
                                 first, last ? &ep : NULL);
                }
            }
        }
    }
}

/* One unit of a conv layer, avx512 back end (see conv_plan). */
static void conv_avx512_unit(void *ctx, int u, int tid)
{
    cpu_engine *e = ctx;
    const cpu_layer *L = e->job.layer;
    const resnet18_conv_desc *d = L->d;
    const conv_plan *pl = &e->job.plan;
    const int M = pl->M, N = d->cout, K = L->K;
    const float *in = e->act[L->src];
    float *out = e->act[L->dst];
    const float *res = L->res >= 0 ? e->act[L->res] : NULL;
    float *ws = e->ws + (size_t)tid * e->ws_floats;
    int g = u / pl->un, g0, g1, p0, p1;
    cpu_pool_split(pl->mblocks, pl->um, g, &g0, &g1);
    cpu_pool_split(pl->panels, pl->un, u % pl->un, &p0, &p1);
    if (L->in_place) {
        conv_in_place(e, L, g0, g1, p0, p1);
        return;
    }
    int m0 = g0 * MR;
    if (e->job.ws_group[tid] != g)
        im2col_rows(d, in, L->src_pad, m0, (g1 - g0) * MR, M, ws, K);
    e->job.ws_group[tid] = g;
    for (int k0 = 0; k0 < K; k0 += KC) {
        int kc = imin(KC, K - k0);
        int last = k0 + kc == K;
        for (int mb = g0; mb < g1; mb++) {
            int m = mb * MR, mr = imin(MR, M - m);
            const float *a = ws + (size_t)(m - m0) * K + k0;
            for (int p = p0; p < p1; p++) {
                epilogue ep = {
                    .bias = L->b + p * NR,
                    .res = res ? res + (size_t)m * N + p * NR : NULL,
                    .relu = d->relu,
                };
                kernel_14x32(a, (size_t)K, 1, kc, 0, L->w + ((size_t)p * K + k0) * NR, out + (size_t)m * N + p * NR,
                             (size_t)N, mr, k0 == 0, last ? &ep : NULL);
            }
        }
    }
}

#else
/* Never run: choose_avx512() is 0 without the kernel. */
static void conv_avx512_unit(void *ctx, int u, int tid)
{
    cpu_engine *e = ctx;
    (void)e;
    (void)u;
    (void)tid;
}
#endif

/* ---- the other layers and the blas back end ------------------------------ */

/* One conv layer on the blas back end: im2col of as many whole images as
 * the workspace holds, one cblas_sgemm per image (OpenBLAS threads it),
 * then the epilogue pass. One GEMM per image, always of the same shape:
 * a GEMM's sums for a row depend on where the row falls in its tiles, so
 * a GEMM over the whole batch would give an image different bits at
 * another position or batch size. Runs on the calling thread only. */
static void conv_blas(cpu_engine *e, const cpu_layer *L, int n)
{
    const resnet18_conv_desc *d = L->d;
    const int rows = d->out_h * d->out_h, N = d->cout, K = L->K;
    const float *in = e->act[L->src];
    float *out = e->act[L->dst];
    const float *res = L->res >= 0 ? e->act[L->res] : NULL;
    int chunk = (int)(e->ws_floats * e->nthreads / ((size_t)rows * K)); /* images per im2col */
    if (chunk < 1)
        chunk = 1;
    for (int i0 = 0; i0 < n; i0 += chunk) {
        int imgs = imin(chunk, n - i0);
        size_t m0 = (size_t)i0 * rows;
        im2col_rows(d, in, L->src_pad, (int)m0, imgs * rows, n * rows, e->ws, K);
        for (int i = 0; i < imgs; i++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, N, K, 1.0f, e->ws + (size_t)i * rows * K, K,
                        L->w, K, 0.0f, out + (m0 + (size_t)i * rows) * N, N);
        float *C = out + m0 * N;
        const float *R = res ? res + m0 * N : NULL;
        for (size_t r = 0; r < (size_t)imgs * rows; r++) {
            float *c = C + r * N;
            for (int j = 0; j < N; j++) {
                float v = c[j] + L->b[j];
                if (R)
                    v += R[r * N + j];
                if (d->relu && v < 0.0f)
                    v = 0.0f;
                c[j] = v;
            }
        }
    }
}

/* uint8 NHWC image -> normalised float NHWC, torchvision's (x/255 - mean)/std;
 * an image given as a normalised FP32 CHW tensor is only transposed. */
static void normalize_unit(void *ctx, int u, int tid)
{
    cpu_engine *e = ctx;
    const int img = RESNET18_IMG;
    const size_t plane = (size_t)img * img;
    int lo, hi;
    (void)tid;
    cpu_pool_split(e->job.n * img, e->job.small_units, u, &lo, &hi); /* image rows */
    for (int row = lo; row < hi; row++) {
        float *out = e->act[e->buf[T_IMAGE]] + at(row / img, row % img, 0, img, 3, e->pad[T_IMAGE]);
        const float *chw = e->pub.input_f32[e->job.slot][row / img];
        if (chw) {
            const float *src = chw + (size_t)(row % img) * img;
            for (int x = 0; x < img; x++)
                for (int c = 0; c < 3; c++)
                    out[x * 3 + c] = src[c * plane + (size_t)x];
            continue;
        }
        const uint8_t *in = e->pub.input[e->job.slot] + (size_t)row * img * 3;
        for (int i = 0; i < img * 3; i += 3)
            for (int c = 0; c < 3; c++)
                out[i + c] = e->lut[c][in[i + c]];
    }
}

/* o = max(o, p) over 16 floats: a fixed count and restrict let -O2 use
 * vector max instructions. */
static void max16(float *restrict o, const float *restrict p)
{
    for (int j = 0; j < 16; j++)
        o[j] = p[j] > o[j] ? p[j] : o[j];
}

/* 3x3 stride-2 pad-1 max pool of conv 0's output (channels: a multiple of
 * NR, checked at create). Padding never wins: each window has a real pixel. */
static void maxpool_unit(void *ctx, int u, int tid)
{
    cpu_engine *e = ctx;
    const resnet18_conv_desc *d = &resnet18_convs[0];
    const int ih = d->out_h, oh = e->pool_h, C = d->cout;
    int lo, hi;
    (void)tid;
    cpu_pool_split(e->job.n * oh, e->job.small_units, u, &lo, &hi); /* output rows */
    const float *in = e->act[e->buf[0]];
    float *out = e->act[e->buf[T_POOL]];
    for (int row = lo; row < hi; row++) {
        int img = row / oh, oy = row % oh;
        int y0 = oy * 2 - 1 < 0 ? 0 : oy * 2 - 1, y1 = imin(oy * 2 + 2, ih);
        for (int ox = 0; ox < oh; ox++) {
            int x0 = ox * 2 - 1 < 0 ? 0 : ox * 2 - 1, x1 = imin(ox * 2 + 2, ih);
            float *o = out + at(img, oy, ox, oh, C, e->pad[T_POOL]);
            memcpy(o, in + at(img, y0, x0, ih, C, e->pad[0]), (size_t)C * sizeof(float));
            for (int iy = y0; iy < y1; iy++)
                for (int ix = x0; ix < x1; ix++) {
                    const float *p = in + at(img, iy, ix, ih, C, e->pad[0]);
                    for (int c = 0; c < C; c += 16)
                        max16(o + c, p + c);
                }
        }
    }
}

/* Global average pool of image `img` of the last conv's output, then the
 * FC (cpu_engine_fc): per image, so its logits are the same whatever
 * batch it is in. */
static void head_unit(void *ctx, int img, int tid)
{
    cpu_engine *e = ctx;
    const cpu_layer *L = &e->layer[RESNET18_NUM_CONVS - 1];
    const int h = L->d->out_h, C = L->d->cout, classes = e->pub.classes;
    float *f = e->feat + (size_t)img * C;
    (void)tid;
    for (int c = 0; c < C; c++)
        f[c] = 0.0f;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < h; x++) {
            const float *src = e->act[L->dst] + at(img, y, x, h, C, L->dst_pad);
            for (int c = 0; c < C; c++)
                f[c] += src[c];
        }
    for (int c = 0; c < C; c++)
        f[c] /= (float)(h * h);
    cpu_engine_fc(f, e->fc_w, e->fc_b, classes, RESNET18_FEATURES, e->pub.logits[e->job.slot] + (size_t)img * classes);
}

/* Zeroes tensor t's border for n images: its buffer may have held another
 * tensor since the last batch. The steps write only the interior. */
static void zero_border(cpu_engine *e, int t, int n)
{
    const int pad = e->pad[t], h = e->th[t], w = h + 2 * pad, c = e->tc[t];
    if (pad == 0)
        return;
    float *base = e->act[e->buf[t]];
    for (int img = 0; img < n; img++)
        for (int y = -pad; y < h + pad; y++) {
            float *row = base + at(img, y, -pad, h, c, pad);
            if (y < 0 || y >= h) {
                memset(row, 0, (size_t)w * c * sizeof(float));
            } else {
                memset(row, 0, (size_t)pad * c * sizeof(float));
                memset(row + (size_t)(pad + h) * c, 0, (size_t)pad * c * sizeof(float));
            }
        }
}

/* Hands tensor t (calibration's number `id`) to the observer, if any. */
static void observe(cpu_engine *e, int t, int id, int n)
{
    if (e->observe)
        e->observe(e->observe_ctx, id, e->act[e->buf[t]], n, e->th[t], e->tc[t], e->pad[t]);
}

/* Normalisation and convs [0, nconvs) of slot's n images, with the max
 * pool after conv 0. */
static void forward_convs(cpu_engine *e, int slot, int n, int nconvs)
{
    e->job.n = n;
    e->job.slot = slot;
    /* The memory-bound steps: a few units per thread, so a thread the OS
     * delays is covered by the others. */
    e->job.small_units = imin(4 * e->nthreads, n * e->pool_h);
    zero_border(e, T_IMAGE, n);
    cpu_pool_run(&e->pool, normalize_unit, e, e->job.small_units);
    observe(e, T_IMAGE, 0, n);
    for (int i = 0; i < nconvs; i++) {
        e->job.layer = &e->layer[i];
        zero_border(e, i, n);
        if (e->avx512) {
            e->job.plan = plan_conv(e, &e->layer[i], n);
            for (int t = 0; t < e->nthreads; t++)
                e->job.ws_group[t] = -1;
            cpu_pool_run(&e->pool, conv_avx512_unit, e, e->job.plan.um * e->job.plan.un);
        } else {
            conv_blas(e, &e->layer[i], n);
        }
        if (i + 1 < RESNET18_NUM_CONVS)
            observe(e, i, i + 1, n);
        if (i == 0) {
            zero_border(e, T_POOL, n);
            cpu_pool_run(&e->pool, maxpool_unit, e, e->job.small_units);
        }
    }
}

static void forward(void *ctx, int slot, int n)
{
    cpu_engine *e = ctx;
    forward_convs(e, slot, n, RESNET18_NUM_CONVS);
    cpu_pool_run(&e->pool, head_unit, e, n);
}

/* ---- engine interface ------------------------------------------------------ */

static int cpu_submit(void *ctx, int slot, int n, char *err, size_t errlen)
{
    cpu_engine *e = ctx;
    return cpu_engine_submit(&e->run_mu, e->pub.max_batch, forward, e, slot, n, err, errlen);
}

static void cpu_destroy(void *ctx)
{
    cpu_engine *e = ctx;
    if (!e)
        return;
    cpu_pool_stop(&e->pool);
    pthread_mutex_destroy(&e->run_mu);
    for (int i = 0; i < RESNET18_NUM_CONVS; i++) {
        free(e->layer[i].w);
        free(e->layer[i].b);
    }
    for (int i = 0; i < e->nact; i++)
        free(e->act[i]);
    cpu_engine_free_slots(&e->pub);
    free(e->fc_w);
    free(e->fc_b);
    free(e->feat);
    free(e->ws);
    free(e);
}

static const engine_ops cpu_ops = {
    .name = "cpu",
    .submit = cpu_submit,
    .wait = cpu_engine_wait,
    .destroy = cpu_destroy,
    .device_memory = cpu_engine_no_device_memory,
    .pinned_memory = cpu_engine_no_device_memory,
};

int engine_cpu_observe(engine *pub, engine_observer_fn *fn, void *ctx, char *err, size_t errlen)
{
    if (pub->ops != &cpu_ops) {
        snprintf(err, errlen, "observing activations needs the CPU engine at fp32 (this is %s at %s)", pub->ops->name,
                 engine_precision_name(pub->precision));
        return -1;
    }
    cpu_engine *e = pub->ctx;
    pthread_mutex_lock(&e->run_mu);
    e->observe = fn;
    e->observe_ctx = ctx;
    pthread_mutex_unlock(&e->run_mu);
    return 0;
}

int engine_cpu_forward_prefix(engine *pub, int slot, int n, int nconvs, engine_observer_fn *fn, void *ctx, char *err,
                              size_t errlen)
{
    if (pub->ops != &cpu_ops || nconvs < 1 || nconvs >= RESNET18_NUM_CONVS || slot < 0 || slot >= pub->nslots ||
        n < 1 || n > pub->max_batch) {
        snprintf(err, errlen,
                 "a float prefix needs the CPU engine at fp32, 1..%d convs, a slot and 1..max batch images",
                 RESNET18_NUM_CONVS - 1);
        return -1;
    }
    cpu_engine *e = pub->ctx;
    const int t = nconvs == 1 ? T_POOL : nconvs - 1;
    pthread_mutex_lock(&e->run_mu);
    forward_convs(e, slot, n, nconvs);
    fn(ctx, nconvs, e->act[e->buf[t]], n, e->th[t], e->tc[t], e->pad[t]);
    pthread_mutex_unlock(&e->run_mu);
    return 0;
}

static int tensor_id(int x)
{
    return resnet18_tensor_id(x);
}

/* Checks that shapes chain (resnet18.h's plan), decides which convs read
 * their input in place (and so which tensors need a zero border), then
 * gives every tensor an activation buffer, reusing a buffer once its
 * tensor is dead. Returns the buffer count and each buffer's size in
 * floats per image, or -1. */
static int plan_buffers(cpu_engine *e, size_t per_image[NTENSORS], char *err, size_t errlen)
{
    int *pad = e->pad;
    resnet18_tensors tp;
    if (resnet18_plan_tensors(&tp, NR, err, errlen) != 0) {
        char why[256];
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, errlen, "cpu engine: %s", why);
        return -1;
    }
    memcpy(e->th, tp.h, sizeof e->th);
    memcpy(e->tc, tp.c, sizeof e->tc);
    e->pool_h = tp.h[T_POOL];
    /* The last conv's output is read by the average pool, after it. */
    tp.last_use[RESNET18_NUM_CONVS - 1] = RESNET18_NUM_CONVS + 2;

    /* In place: output rows are whole M-blocks (avx512 only). Its input then
     * needs a border of the conv's padding. A conv run through im2col writes
     * tiles that may span output rows, so its output and residual must have
     * no border: an in-place reader of such a tensor falls back to im2col. */
    for (int i = 0; i < RESNET18_NUM_CONVS; i++)
        e->layer[i].in_place = e->avx512 && resnet18_convs[i].out_h % MR == 0;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int t = 0; t < NTENSORS; t++)
            pad[t] = 0;
        for (int i = 0; i < RESNET18_NUM_CONVS; i++) {
            int s = tensor_id(resnet18_convs[i].src);
            if (e->layer[i].in_place && resnet18_convs[i].pad > pad[s])
                pad[s] = resnet18_convs[i].pad;
        }
        for (int i = 0; i < RESNET18_NUM_CONVS; i++) {
            if (e->layer[i].in_place)
                continue;
            int r = resnet18_convs[i].residual;
            for (int j = 0; j < RESNET18_NUM_CONVS; j++) {
                int s = resnet18_convs[j].src;
                if (e->layer[j].in_place && pad[tensor_id(s)] > 0 && (s == i || (r != R18_NONE && s == r))) {
                    e->layer[j].in_place = 0;
                    changed = 1;
                }
            }
        }
    }

    int order[NTENSORS], n = 0;
    size_t elems[NTENSORS];
    order[n++] = T_IMAGE;
    order[n++] = 0;
    order[n++] = T_POOL;
    for (int i = 1; i < RESNET18_NUM_CONVS; i++)
        order[n++] = i;
    for (int t = 0; t < NTENSORS; t++) {
        size_t side = (size_t)e->th[t] + 2 * pad[t];
        elems[t] = side * side * e->tc[t];
    }
    int nbuf = resnet18_share_buffers(&tp, order, n, elems, e->buf, per_image);
    for (int i = 0; i < RESNET18_NUM_CONVS; i++) {
        const resnet18_conv_desc *d = &resnet18_convs[i];
        cpu_layer *L = &e->layer[i];
        int s = tensor_id(d->src), r = d->residual == R18_NONE ? -1 : tensor_id(d->residual);
        L->d = d;
        L->K = d->k * d->k * d->cin;
        L->src = e->buf[s];
        L->dst = e->buf[i];
        L->res = r < 0 ? -1 : e->buf[r];
        L->src_pad = pad[s];
        L->dst_pad = pad[i];
        L->res_pad = r < 0 ? 0 : pad[r];
    }
    return nbuf;
}

static int cpu_has_avx512(void)
{
#if HAVE_AVX512_KERNEL
    return __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

static int choose_avx512(void)
{
    const char *force = getenv("RESNETD_CPU_GEMM");
    if (force && strcmp(force, "blas") == 0)
        return 0;
    return cpu_has_avx512();
}

engine *engine_cpu_create(const resnet18_weights *w, const engine_config *cfg, char *err, size_t errlen)
{
    if (cfg->max_batch < 1 || cfg->max_batch > CPU_MAX_BATCH) {
        snprintf(err, errlen, "cpu engine: max batch must be 1..%d (got %d)", CPU_MAX_BATCH, cfg->max_batch);
        return NULL;
    }
    if (cfg->nslots < 0 || cfg->nslots > ENGINE_MAX_SLOTS || cfg->threads < 0 || cfg->threads > MAX_THREADS) {
        snprintf(err, errlen, "cpu engine: slots must be 0..%d and threads 0..%d", ENGINE_MAX_SLOTS, MAX_THREADS);
        return NULL;
    }
    if (cfg->precision == ENGINE_PRECISION_INT8)
        return engine_cpu_int8_create(w, cfg, err, errlen);
    if (cfg->precision == ENGINE_PRECISION_FP16) {
        snprintf(err, errlen, "cpu engine: precision fp16 is not supported (fp32 or int8)");
        return NULL;
    }
    const char *force = getenv("RESNETD_CPU_GEMM");
    if (force && strcmp(force, "blas") != 0 && strcmp(force, "avx512") != 0) {
        snprintf(err, errlen, "cpu engine: RESNETD_CPU_GEMM must be blas or avx512 (got '%s')", force);
        return NULL;
    }
    if (force && strcmp(force, "avx512") == 0 && !cpu_has_avx512()) {
        snprintf(err, errlen, "cpu engine: RESNETD_CPU_GEMM=avx512 but this CPU lacks AVX-512F");
        return NULL;
    }

    cpu_engine *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, errlen, "cpu engine: out of memory");
        return NULL;
    }
    pthread_mutex_init(&e->run_mu, NULL);
    cpu_engine_init_pub(&e->pub, &cpu_ops, e, ENGINE_PRECISION_FP32, w, cfg); /* deterministic: see the top */
    e->avx512 = choose_avx512();
    int threads = cfg->threads ? cfg->threads : cpu_pool_cpu_count();
    /* The blas back end leaves threading to OpenBLAS; the avx512 one uses the
     * pool and keeps OpenBLAS (only the FC) on the calling threads, so no
     * OpenBLAS worker spins against the pool. */
    e->nthreads = e->avx512 ? threads : 1;
    openblas_set_num_threads(e->avx512 ? 1 : threads);

    size_t per_image[NTENSORS];
    int nbuf = plan_buffers(e, per_image, err, errlen);
    if (nbuf < 0)
        goto fail;
    const size_t mb = (size_t)cfg->max_batch;
    size_t per_image_bytes = RESNET18_FEATURES * 4;
    for (int b = 0; b < nbuf; b++)
        per_image_bytes += per_image[b] * sizeof(float);
    if (cpu_engine_check_memory(&e->pub, "cpu engine", per_image_bytes, err, errlen) != 0)
        goto fail;
    for (int b = 0; b < nbuf; b++) {
        e->act[b] = alloc_floats(per_image[b] * mb);
        if (!e->act[b])
            goto oom;
        e->nact++;
    }
    if (cpu_engine_alloc_slots(&e->pub, "cpu engine", err, errlen) != 0)
        goto fail;
    e->feat = alloc_floats(mb * RESNET18_FEATURES);
    e->fc_w = alloc_floats((size_t)w->classes * RESNET18_FEATURES);
    e->fc_b = alloc_floats((size_t)w->classes);
    e->ws_floats = e->avx512 ? GROUP_FLOATS : BLAS_WS_FLOATS;
    /* Every layer needs room for at least one MR-row tile. */
    for (int i = 0; i < RESNET18_NUM_CONVS; i++)
        if ((size_t)e->layer[i].K * MR > e->ws_floats)
            e->ws_floats = (size_t)e->layer[i].K * MR;
    e->ws = alloc_floats(e->ws_floats * (size_t)e->nthreads);
    if (!e->feat || !e->fc_w || !e->fc_b || !e->ws)
        goto oom;
    memcpy(e->fc_w, w->fc_w, (size_t)w->classes * RESNET18_FEATURES * sizeof(float));
    memcpy(e->fc_b, w->fc_b, (size_t)w->classes * sizeof(float));

    for (int i = 0; i < RESNET18_NUM_CONVS; i++) {
        cpu_layer *L = &e->layer[i];
        const int N = L->d->cout, K = L->K;
        L->w = alloc_floats((size_t)N * K);
        L->b = alloc_floats((size_t)N);
        if (!L->w || !L->b)
            goto oom;
        memcpy(L->b, w->conv[i].b, (size_t)N * sizeof(float));
        if (!e->avx512) {
            memcpy(L->w, w->conv[i].w, (size_t)N * K * sizeof(float));
            continue;
        }
        for (int p = 0; p < N / NR; p++)
            for (int k = 0; k < K; k++)
                for (int j = 0; j < NR; j++)
                    L->w[((size_t)p * K + k) * NR + j] = w->conv[i].w[(size_t)(p * NR + j) * K + k];
    }
    preprocess_normalize_lut(e->lut);

    if (cpu_pool_start(&e->pool, e->nthreads, err, errlen) != 0)
        goto fail;
    return &e->pub;

oom:
    snprintf(err, errlen, "cpu engine: out of memory for max batch %d", cfg->max_batch);
fail:
    cpu_destroy(e);
    return NULL;
}
