/* INT8 calibration tables (JSON through jansson), the histogram
 * statistics behind them, and what the INT8 engines derive from a table
 * (calib_conv_params, calib_input_lut); see calib.h for the format. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/calib.h"
#include "engine/int8.h"
#include "image/preprocess.h"
#include "util/textfile.h"

#define CALIB_FILE_MAX (16u << 20) /* a table is a few KB */

const char *calib_tensor_name(int i)
{
    if (i == 0)
        return "input";
    if (i < 1 || i >= CALIB_NTENSORS)
        return NULL;
    return resnet18_convs[i - 1].name;
}

int calib_source_unsigned(int src)
{
    return src == R18_POOL || (src >= 0 && src < RESNET18_NUM_CONVS && resnet18_convs[src].relu);
}

/* Tensor i >= 1 is conv i - 1's output (the image, 0, is signed). */
int calib_tensor_unsigned(int i)
{
    return i >= 1 && i < CALIB_NTENSORS && calib_source_unsigned(i - 1);
}

int calib_tensor_levels(int i)
{
    return calib_tensor_unsigned(i) ? 255 : 127;
}

const char *calib_method_name(calib_method m)
{
    return m == CALIB_PERCENTILE ? "percentile" : m == CALIB_MSE ? "mse" : "entropy";
}

void calib_method_label(calib_method m, double percentile, char *out, size_t outlen)
{
    if (m != CALIB_PERCENTILE) {
        snprintf(out, outlen, "%s", calib_method_name(m));
        return;
    }
    char num[32];
    int digits = 1;
    do
        snprintf(num, sizeof num, "%.*g", digits, percentile);
    while ((strtod(num, NULL) != percentile || strchr(num, 'e')) && ++digits <= 17); /* 100, not 1e+02 */
    snprintf(out, outlen, "percentile %s", num);
}

static const char *const mix_names[CALIB_NMIXES] = {
    "int8",           "float:stem",   "float:layer1.0", "float:layer1",
    "float:layer2.0", "float:layer2", "float:layer3.0", "float:layer3"
};

const char *calib_mix_name(calib_mix m)
{
    return m >= 0 && m < CALIB_NMIXES ? mix_names[m] : "?";
}

int calib_parse_mix(const char *s, calib_mix *m)
{
    for (int i = 0; i < CALIB_NMIXES; i++)
        if (strcmp(s, mix_names[i]) == 0) {
            *m = (calib_mix)i;
            return 0;
        }
    return -1;
}

/* A prefix ends with a block (or the stem's pool): the last conv whose
 * name starts with the mix's "layerN.0." or "layerN.", counted from the
 * table so that it cannot drift. */
int calib_mix_float_convs(calib_mix m)
{
    if (m < 0 || m >= CALIB_NMIXES)
        return -1;
    if (m == CALIB_MIX_INT8)
        return 0;
    if (m == CALIB_MIX_STEM)
        return 1;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%s.", mix_names[m] + strlen("float:"));
    int last = 0;
    for (int i = 0; i < RESNET18_NUM_CONVS; i++)
        if (strncmp(resnet18_convs[i].name, prefix, strlen(prefix)) == 0)
            last = i;
    return last + 1;
}

int calib_mix_boundary(calib_mix m)
{
    const int n = calib_mix_float_convs(m);
    return n <= 0 ? R18_IMAGE : n == 1 ? R18_POOL : n - 1;
}

int calib_parse_method(const char *s, calib_method *m)
{
    if (strcmp(s, "entropy") == 0) {
        *m = CALIB_ENTROPY;
        return 0;
    }
    if (strcmp(s, "percentile") == 0) {
        *m = CALIB_PERCENTILE;
        return 0;
    }
    if (strcmp(s, "mse") == 0) {
        *m = CALIB_MSE;
        return 0;
    }
    return -1;
}

const char *calib_weights_id(const resnet18_weights *w)
{
    return w->synthetic ? CALIB_WEIGHTS_SYNTHETIC : w->sha256;
}

/* The input scale of a conv: its source tensor's (the pool's is the stem's). */
static float src_scale(const calib_table *t, int src)
{
    if (src == R18_IMAGE)
        return t->scale[0];
    return t->scale[(src == R18_POOL ? 0 : src) + 1];
}

void calib_conv_params(const resnet18_weights *w, const calib_table *t, int i, int8_t *q, float *mult, float *res_scale,
                       float *out_inv)
{
    const resnet18_conv_desc *d = &resnet18_convs[i];
    int8_quantize_weights(w->conv[i].w, d->cout, d->k * d->k * d->cin, q, mult);
    const float s_in = src_scale(t, d->src);
    for (int c = 0; c < d->cout; c++)
        mult[c] = s_in * mult[c];
    *res_scale = d->residual == R18_NONE ? 0.0f : src_scale(t, d->residual);
    *out_inv = i == RESNET18_NUM_CONVS - 1 ? 0.0f : 1.0f / t->scale[i + 1];
}

void calib_input_lut(const calib_table *t, int8_t lut[3][256], float *in_inv)
{
    float f[3][256];
    preprocess_normalize_lut(f);
    *in_inv = 1.0f / t->scale[0]; /* the input is signed (calib_tensor_unsigned) */
    for (int c = 0; c < 3; c++)
        for (int v = 0; v < 256; v++)
            lut[c][v] = int8_quantize(f[c][v], *in_inv);
}

static int valid_id(const char *s)
{
    if (strcmp(s, CALIB_WEIGHTS_SYNTHETIC) == 0)
        return 1;
    if (strlen(s) != 64)
        return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return 0;
    return 1;
}

/* The optional "check" object into *c; NULL, or what is wrong with it. */
static const char *load_check(json_t *check, calib_check *c)
{
    if (!check)
        return NULL;
    json_t *images = json_object_get(check, "images");
    json_t *agreement = json_object_get(check, "top1_agreement");
    json_t *rel_l2 = json_object_get(check, "rel_l2");
    if (!json_is_object(check) || !json_is_integer(images) || json_integer_value(images) < 1 ||
        json_integer_value(images) > 1000000000 || !json_is_number(agreement) || !json_is_number(rel_l2))
        return "\"check\" must be {\"images\": N >= 1, \"top1_agreement\": percent, \"rel_l2\": number}";
    c->images = (int)json_integer_value(images);
    c->agreement = json_number_value(agreement);
    c->rel_l2 = json_number_value(rel_l2);
    if (!(c->agreement >= 0 && c->agreement <= 100) || !(c->rel_l2 >= 0) || !isfinite(c->rel_l2)) {
        memset(c, 0, sizeof *c);
        return "\"check\" has an agreement outside 0..100 or a rel_l2 that is not a finite number >= 0";
    }
    return NULL;
}

/* A version 1 or 2 table (every tensor int8, every scale threshold / 127)
 * as version 3: the tensors after a ReLU keep their threshold at 255
 * levels; the check measured the older arithmetic, so it goes. */
static void from_int8_everywhere(calib_table *t)
{
    for (int i = 0; i < CALIB_NTENSORS; i++)
        if (calib_tensor_unsigned(i))
            t->scale[i] = (float)((double)t->scale[i] * 127.0 / 255.0);
    memset(&t->check, 0, sizeof t->check);
}

int calib_load(const char *path, calib_table *t, char *err, size_t errlen)
{
    json_error_t je;
    memset(t, 0, sizeof *t);
    /* Read as a regular file first: json_load_file would wait forever on
     * a FIFO. */
    char *text, why_read[512];
    size_t len;
    if (textfile_read(path, CALIB_FILE_MAX, &text, &len, why_read, sizeof why_read) != 0) {
        size_t skip = strncmp(why_read, path, strlen(path)) == 0 ? strlen(path) + 2 : 0; /* "PATH: why" */
        snprintf(err, errlen, "calibration table %s: cannot read: %s", path,
                 skip <= strlen(why_read) ? why_read + skip : why_read);
        return -1;
    }
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root) {
        if (je.line < 1)
            snprintf(err, errlen, "calibration table %s: cannot read: %s", path, je.text);
        else
            snprintf(err, errlen, "calibration table %s:%d: not JSON: %s", path, je.line, je.text);
        return -1;
    }
    const char *why = NULL, *name = NULL;
    const char *format = json_string_value(json_object_get(root, "format"));
    json_t *version = json_object_get(root, "version");
    const char *id = json_string_value(json_object_get(root, "weights_sha256"));
    const char *method = json_string_value(json_object_get(root, "method"));
    json_t *images = json_object_get(root, "images");
    json_t *scales = json_object_get(root, "scales");
    if (!json_is_object(root) || !format || strcmp(format, CALIB_FORMAT) != 0)
        why = "not a resnetd INT8 calibration table (\"format\" is not \"" CALIB_FORMAT "\")";
    else if (!json_is_integer(version) || json_integer_value(version) < CALIB_VERSION_INT8 ||
             json_integer_value(version) > CALIB_VERSION)
        why = "unsupported \"version\" (this resnetd reads versions 1 to 3)";
    else if ((json_integer_value(version) != CALIB_VERSION_INT8) != (json_object_get(root, "mix") != NULL))
        why = "\"mix\" is required from version 2 and not allowed in version 1";
    else if (json_object_get(root, "mix") &&
             (!json_is_string(json_object_get(root, "mix")) ||
              calib_parse_mix(json_string_value(json_object_get(root, "mix")), &t->mix) != 0))
        why = "\"mix\" must be one of " CALIB_MIX_NAMES;
    else if (!id || !valid_id(id))
        why = "\"weights_sha256\" must be 64 lower-case hex digits or \"synthetic\"";
    else if (!method || calib_parse_method(method, &t->method) != 0)
        why = "\"method\" must be \"entropy\", \"percentile\" or \"mse\"";
    else if (!json_is_integer(images) || json_integer_value(images) < 1 || json_integer_value(images) > 1000000000)
        why = "\"images\" must be a positive integer";
    else if (!json_is_object(scales))
        why = "\"scales\" must be an object";
    else
        why = load_check(json_object_get(root, "check"), &t->check);
    if (!why) {
        snprintf(t->weights_sha256, sizeof t->weights_sha256, "%s", id);
        t->images = (int)json_integer_value(images);
        json_t *pct = json_object_get(root, "percentile");
        t->percentile = json_is_number(pct) ? json_number_value(pct) : 0;
        for (int i = 0; i < CALIB_NTENSORS && !why; i++) {
            name = calib_tensor_name(i);
            json_t *v = json_object_get(scales, name);
            double d = json_is_number(v) ? json_number_value(v) : -1;
            float f = (float)d;
            if (!v)
                why = "has no scale for tensor";
            else if (!json_is_number(v) || !isfinite(f) || !(f > 0) || !isfinite(1.0f / f) || f > 1e30f)
                why = "scale is not a positive float32 from 1e-38 to 1e30 for tensor";
            else
                t->scale[i] = f;
        }
        if (!why && json_integer_value(version) < CALIB_VERSION)
            from_int8_everywhere(t);
        if (!why && json_object_size(scales) != CALIB_NTENSORS) {
            const char *key;
            json_t *v;
            json_object_foreach(scales, key, v)
            {
                int known = 0;
                for (int i = 0; i < CALIB_NTENSORS; i++)
                    known |= strcmp(key, calib_tensor_name(i)) == 0;
                if (!known) {
                    why = "names a tensor this network does not have:";
                    name = key;
                    break;
                }
            }
        }
    }
    if (why) {
        if (name)
            snprintf(err, errlen, "calibration table %s: %s %s", path, why, name);
        else
            snprintf(err, errlen, "calibration table %s: %s", path, why);
    }
    json_decref(root);
    return why ? -1 : 0;
}

int calib_check_weights(const calib_table *t, const char *table_path, const resnet18_weights *w,
                        const char *weights_path, char *err, size_t errlen)
{
    const char *id = calib_weights_id(w);
    if (strcmp(t->weights_sha256, id) == 0)
        return 0;
    snprintf(err, errlen,
             "calibration table %s was made for weights with SHA-256 %s, but %s has %s%s: "
             "run resnetd-calibrate on these weights",
             table_path, t->weights_sha256, weights_path, w->synthetic ? "none (synthetic weights)" : "SHA-256 ",
             w->synthetic ? "" : id);
    return -1;
}

int calib_save(const char *path, const calib_table *t, char *err, size_t errlen)
{
    if (calib_mix_float_convs(t->mix) < 0) {
        snprintf(err, errlen, "%s: the table's mix is not a calib_mix", path);
        return -1;
    }
    json_t *scales = json_object();
    json_t *root = json_object();
    int bad = !scales || !root;
    for (int i = 0; i < CALIB_NTENSORS && !bad; i++)
        bad = json_object_set_new(scales, calib_tensor_name(i), json_real((double)t->scale[i])) != 0;
    if (!bad)
        bad = json_object_set_new(root, "format", json_string(CALIB_FORMAT)) ||
              json_object_set_new(root, "version", json_integer(CALIB_VERSION)) ||
              json_object_set_new(root, "mix", json_string(calib_mix_name(t->mix))) ||
              json_object_set_new(root, "weights_sha256", json_string(t->weights_sha256)) ||
              json_object_set_new(root, "method", json_string(calib_method_name(t->method))) ||
              (t->method == CALIB_PERCENTILE && json_object_set_new(root, "percentile", json_real(t->percentile))) ||
              json_object_set_new(root, "images", json_integer(t->images)) ||
              json_object_set_new(root, "histogram_bins", json_integer(CALIB_BINS)) ||
              json_object_set(root, "scales", scales) ||
              (t->check.images > 0 &&
               json_object_set_new(root, "check",
                                   json_pack("{s:i, s:f, s:f}", "images", t->check.images, "top1_agreement",
                                             t->check.agreement, "rel_l2", t->check.rel_l2)) != 0);
    json_decref(scales);
    if (bad) {
        json_decref(root);
        snprintf(err, errlen, "%s: out of memory building the table", path);
        return -1;
    }
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) {
        json_decref(root);
        snprintf(err, errlen, "%s: path too long", path);
        return -1;
    }
    /* Full precision: each float scale reads back as the same float. */
    int rc = json_dump_file(root, tmp, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(root);
    if (rc != 0) {
        snprintf(err, errlen, "%s: cannot write: %s", tmp, strerror(errno));
        remove(tmp);
        return -1;
    }
    if (rename(tmp, path) != 0) {
        snprintf(err, errlen, "%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}

/* ---- histograms and the scales they give --------------------------------- */

void calib_hist_add(calib_hist *h, const float *x, size_t n)
{
    float m = 0.0f;
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) > m)
            m = fabsf(x[i]);
    if (m > 0 && h->range == 0)
        h->range = m;
    while (h->range > 0 && m > h->range) {
        for (int j = 0; j < CALIB_BINS / 2; j++)
            h->count[j] = h->count[2 * j] + h->count[2 * j + 1];
        memset(h->count + CALIB_BINS / 2, 0, CALIB_BINS / 2 * sizeof h->count[0]);
        h->range *= 2;
    }
    if (h->range == 0) {
        h->count[0] += n;
        return;
    }
    const double per = CALIB_BINS / h->range;
    for (size_t i = 0; i < n; i++) {
        double v = fabs((double)x[i]) * per;
        /* NaN, or inf after the range has doubled past the largest float:
         * into the last bin (a float to integer conversion of either is
         * undefined). */
        long b = isfinite(v) && v < CALIB_BINS ? (long)v : CALIB_BINS - 1;
        h->count[b]++;
    }
}

static float scale_of(double threshold, int levels)
{
    float s = (float)(threshold / levels);
    return s > 0 && isfinite(s) ? s : 1.0f;
}

float calib_scale_percentile(const calib_hist *h, double percentile, int levels)
{
    uint64_t total = 0;
    for (int b = 0; b < CALIB_BINS; b++)
        total += h->count[b];
    if (h->range == 0 || total == 0)
        return 1.0f;
    const double want = percentile / 100.0 * (double)total;
    uint64_t cum = 0;
    int b = 0;
    for (; b < CALIB_BINS - 1; b++) {
        cum += h->count[b];
        if ((double)cum >= want)
            break;
    }
    return scale_of(h->range * (b + 1) / CALIB_BINS, levels);
}

float calib_scale_mse(const calib_hist *h, int levels)
{
    if (h->range == 0)
        return 1.0f;
    const double w = h->range / CALIB_BINS;
    double best_err = INFINITY;
    int best = CALIB_BINS;
    for (int i = 1; i <= CALIB_BINS; i++) {
        const double t = w * i, s = t / levels;
        double err = 0;
        for (int k = 0; k < CALIB_BINS; k++) {
            if (!h->count[k])
                continue;
            const double c = w * (k + 0.5);
            double q = c >= t ? t : rint(c / s) * s;
            if (q > t)
                q = t;
            err += (double)h->count[k] * (c - q) * (c - q);
        }
        if (err < best_err) {
            best_err = err;
            best = i;
        }
    }
    return scale_of(w * best, levels);
}

/* Spreads eps of probability mass over p's zero entries, taken from its
 * non-zero ones (MXNet's smoothing), so KL(P||Q) stays finite. */
static void smooth(double *p, int n)
{
    const double eps = 1e-4;
    int zeros = 0;
    for (int i = 0; i < n; i++)
        zeros += p[i] == 0;
    if (zeros == 0 || zeros == n)
        return;
    double take = eps * zeros / (n - zeros);
    for (int i = 0; i < n; i++)
        p[i] = p[i] == 0 ? eps : p[i] - take;
}

float calib_scale_entropy(const calib_hist *h, int levels)
{
    if (h->range == 0)
        return 1.0f;
    static const int n = CALIB_BINS;
    const int target = levels + 1; /* quantised magnitudes 0..levels */
    double p[CALIB_BINS], q[CALIB_BINS];
    /* Bin 0 holds every exact zero a ReLU makes: counted as it is, spreading
     * it over its quantisation level dominates the divergence and drives
     * the threshold far too low. Like NVIDIA's pytorch-quantization, give
     * it bin 1's count instead. */
    uint64_t count[CALIB_BINS];
    memcpy(count, h->count, sizeof count);
    count[0] = count[1];
    double best_kl = INFINITY;
    int best = n;
    uint64_t beyond = 0; /* counts at or past bin i */
    for (int b = target; b < n; b++)
        beyond += count[b];
    for (int i = target; i <= n; i++) {
        /* P: the first i bins, the clipped tail folded into the last. */
        double psum = 0;
        for (int k = 0; k < i; k++)
            p[k] = (double)count[k];
        p[i - 1] += (double)beyond;
        if (i < n)
            beyond -= count[i];
        for (int k = 0; k < i; k++)
            psum += p[k];
        if (psum == 0)
            continue;
        /* Q: the same i bins merged into target levels, each level's count
         * spread evenly over the bins of it that were non-zero. */
        const int per = i / target;
        for (int j = 0; j < target; j++) {
            int lo = j * per, hi = j == target - 1 ? i : lo + per;
            double total = 0;
            int nz = 0;
            for (int k = lo; k < hi; k++) {
                total += (double)count[k];
                nz += count[k] != 0;
            }
            for (int k = lo; k < hi; k++)
                q[k] = count[k] != 0 ? total / nz : 0;
        }
        double qsum = 0;
        for (int k = 0; k < i; k++)
            qsum += q[k];
        if (qsum == 0)
            continue;
        for (int k = 0; k < i; k++) {
            p[k] /= psum;
            q[k] /= qsum;
        }
        smooth(p, i);
        smooth(q, i);
        double kl = 0;
        for (int k = 0; k < i; k++)
            if (p[k] > 0 && q[k] > 0)
                kl += p[k] * log(p[k] / q[k]);
        if (kl < best_kl) {
            best_kl = kl;
            best = i;
        }
    }
    return scale_of(h->range * best / n, levels);
}
