/* Open Inference Protocol v2: paths, the inference request parser and the
 * response bodies (see daemon/api/v2.h). Every length the client states (the
 * JSON header's, binary_data_size, each BYTES element's prefix, the shape)
 * is checked against the bytes actually received before anything is read
 * or allocated from it. */
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/api/jsonout.h"
#include "daemon/api/v2.h"
#include "model/resnet18.h"
#include "engine/topk.h"
#include "util/utf8.h"

#define TENSOR_FLOATS ((size_t)3 * RESNET18_IMG * RESNET18_IMG)
/* What jansson holds per JSON value, at most (a number: its json_t and
 * malloc overhead, plus its slot in an array that grows by doubling). */
#define JSON_BYTES_PER_VALUE 64
#define MAX_DIMS 8

static const struct {
    const char *name, *datatype;
} inputs[] = {
    [V2_IN_TENSOR] = { "input", "FP32" },
    [V2_IN_PIXELS] = { "pixels", "UINT8" },
    [V2_IN_JPEG] = { "jpeg", "BYTES" },
};
static const char *const output_names[V2_NOUTPUTS] = {
    [V2_OUT_LOGITS] = "logits",
    [V2_OUT_PROBABILITIES] = "probabilities",
};

/* ---- paths ---------------------------------------------------------------- */

/* If s starts with prefix, the rest of s; else NULL. */
static const char *after(const char *s, const char *prefix)
{
    size_t n = strlen(prefix);
    return strncmp(s, prefix, n) == 0 ? s + n : NULL;
}

v2_route v2_route_of(const char *url)
{
    const char *p;
    if (strcmp(url, "/v2") == 0)
        return V2_SERVER_META;
    if (!(p = after(url, "/v2/")))
        return V2_NOT_V2;
    if (strcmp(p, "health/live") == 0)
        return V2_LIVE;
    if (strcmp(p, "health/ready") == 0)
        return V2_READY;
    if (strcmp(p, "models/stats") == 0)
        return V2_STATS;
    if (!(p = after(p, "models/")))
        return V2_UNKNOWN_PATH;
    const char *slash = strchr(p, '/');
    size_t nlen = slash ? (size_t)(slash - p) : strlen(p);
    if (nlen == 0)
        return V2_UNKNOWN_PATH;
    if (nlen != strlen(V2_MODEL_NAME) || strncmp(p, V2_MODEL_NAME, nlen) != 0)
        return V2_UNKNOWN_MODEL;
    p += nlen;
    const char *v = after(p, "/versions/");
    if (v) {
        size_t vlen = strcspn(v, "/");
        if (vlen == 0)
            return V2_UNKNOWN_PATH;
        if (vlen != strlen(V2_MODEL_VERSION) || strncmp(v, V2_MODEL_VERSION, vlen) != 0)
            return V2_UNKNOWN_MODEL;
        p = v + vlen;
    }
    if (*p == '\0')
        return V2_MODEL_META;
    if (strcmp(p, "/ready") == 0)
        return V2_MODEL_READY;
    if (strcmp(p, "/config") == 0)
        return V2_MODEL_CONFIG;
    if (strcmp(p, "/stats") == 0)
        return V2_MODEL_STATS;
    if (strcmp(p, "/infer") == 0)
        return V2_INFER;
    return V2_UNKNOWN_PATH;
}

long v2_parse_header_length(const char *s, size_t max)
{
    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    unsigned long long n = strtoull(s, &end, 10);
    if (errno || *end != '\0' || n > max)
        return -1;
    return (long)n;
}

/* ---- request parsing ------------------------------------------------------- */

typedef struct parse {
    const v2_limits *lim;
    v2_infer *v;
    int status;
    const char *code;
    char *err;
    size_t errlen;
    size_t values; /* JSON values in the document, at most */
} parse;

/* Records the first failure; returns -1 for `return fail(...)`. */
static int fail(parse *p, int status, const char *code, const char *fmt, ...)
{
    if (p->status)
        return -1;
    p->status = status;
    p->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, p->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* Charges n more bytes to the request's budget: 413 when they could never
 * fit, 503 when they do not fit now. */
static int charge(parse *p, size_t n)
{
    v2_infer *v = p->v;
    if (!v->budget)
        return 0;
    if (n > budget_cap(v->budget))
        return fail(p, 413, "too_large", "the request needs %zu bytes of memory, more than body_memory_bytes (%zu)", n,
                    budget_cap(v->budget));
    if (budget_try_acquire(v->budget, n) != 0)
        return fail(p, 503, "memory_full", "the server's body memory (body_memory_bytes) is full; retry later");
    v->charged += n;
    return 0;
}

static void *alloc_charged(parse *p, size_t n)
{
    if (charge(p, n) != 0)
        return NULL;
    void *m = malloc(n ? n : 1);
    if (!m)
        fail(p, 500, "internal", "out of memory");
    return m;
}

/* Optional boolean member: 0/1, or -1 (and the failure) when not a boolean. */
static int get_bool(parse *p, const json_t *obj, const char *key, const char *what, int *out)
{
    const json_t *j = obj ? json_object_get(obj, key) : NULL;
    if (!j)
        return 0;
    if (!json_is_boolean(j))
        return fail(p, 400, "bad_request", "%s: parameter '%s' must be true or false", what, key);
    *out = json_is_true(j);
    return 0;
}

/* The "parameters" member: absent, or an object. */
static int get_params(parse *p, const json_t *obj, const char *what, const json_t **params)
{
    *params = json_object_get(obj, "parameters");
    if (*params && !json_is_object(*params))
        return fail(p, 400, "bad_request", "%s: 'parameters' must be an object", what);
    return 0;
}

/* Counts into *count the leaves of a (possibly nested) array of non-arrays,
 * calling leaf (unless NULL: only counting) for each; -1 on a failure
 * recorded in p. */
typedef int leaf_fn(parse *p, const json_t *j, size_t i, void *cls);
static int walk(parse *p, const json_t *a, int depth, size_t *count, size_t max, leaf_fn *leaf, void *cls)
{
    if (depth > MAX_DIMS)
        return fail(p, 400, "bad_request", "input data: arrays nested deeper than %d", MAX_DIMS);
    size_t i;
    const json_t *e;
    json_array_foreach(a, i, e)
    {
        if (json_is_array(e)) {
            if (walk(p, e, depth + 1, count, max, leaf, cls) != 0)
                return -1;
            continue;
        }
        if (*count >= max)
            return fail(p, 400, "bad_request", "input data has more elements than its shape (%zu)", max);
        if (leaf && leaf(p, e, *count, cls) != 0)
            return -1;
        (*count)++;
    }
    return 0;
}

static int leaf_f32(parse *p, const json_t *j, size_t i, void *cls)
{
    if (!json_is_number(j))
        return fail(p, 400, "bad_request", "input 'input': element %zu is not a number", i);
    double d = json_number_value(j);
    if (!(fabs(d) <= FLT_MAX))
        return fail(p, 400, "bad_request", "input 'input': element %zu (%g) is not representable as FP32", i, d);
    ((float *)cls)[i] = (float)d;
    return 0;
}

static int leaf_u8(parse *p, const json_t *j, size_t i, void *cls)
{
    json_int_t x = json_is_integer(j) ? json_integer_value(j) : -1;
    if (x < 0 || x > 255)
        return fail(p, 400, "bad_request", "input 'pixels': element %zu is not a whole number from 0 to 255", i);
    ((uint8_t *)cls)[i] = (uint8_t)x;
    return 0;
}

typedef struct strings {
    const json_t **s;
    size_t bytes;
} strings;

static int leaf_string(parse *p, const json_t *j, size_t i, void *cls)
{
    strings *st = cls;
    if (!json_is_string(j))
        return fail(p, 400, "bad_request", "input 'jpeg': element %zu is not a string", i);
    st->s[i] = j;
    st->bytes += json_string_length(j);
    return 0;
}

/* The input's shape: checked against its kind, elements counted. */
static int check_shape(parse *p, const json_t *shape, size_t *elements)
{
    v2_infer *v = p->v;
    int64_t d[MAX_DIMS];
    size_t nd = json_is_array(shape) ? json_array_size(shape) : 0;
    if (!json_is_array(shape) || nd == 0 || nd > MAX_DIMS)
        return fail(p, 400, "bad_request", "input '%s': 'shape' must be an array of 1 to %d dimensions",
                    inputs[v->kind].name, MAX_DIMS);
    for (size_t i = 0; i < nd; i++) {
        const json_t *e = json_array_get(shape, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return fail(p, 400, "bad_request", "input '%s': shape dimension %zu is not a whole number >= 0",
                        inputs[v->kind].name, i);
        d[i] = json_integer_value(e);
    }
    const char *want = v->kind == V2_IN_TENSOR   ? "[N,3,224,224]"
                       : v->kind == V2_IN_PIXELS ? "[N,H,W,3]"
                                                 : "[N] or [N,1]";
    int ok = v->kind == V2_IN_TENSOR   ? nd == 4 && d[1] == 3 && d[2] == RESNET18_IMG && d[3] == RESNET18_IMG
             : v->kind == V2_IN_PIXELS ? nd == 4 && d[3] == 3
                                       : nd == 1 || (nd == 2 && d[1] == 1);
    if (!ok)
        return fail(p, 400, "bad_request", "input '%s' must have shape %s", inputs[v->kind].name, want);
    if (d[0] < 1)
        return fail(p, 400, "bad_request", "input '%s': the batch dimension N must be at least 1",
                    inputs[v->kind].name);
    if (d[0] > p->lim->max_images)
        return fail(p, 413, "too_many_images", "%" PRId64 " images in one request; the limit is %d", d[0],
                    p->lim->max_images);
    v->n = (int)d[0];
    if (v->kind == V2_IN_PIXELS) {
        if (d[1] < 1 || d[2] < 1)
            return fail(p, 400, "bad_request", "input 'pixels': H and W must be at least 1");
        if (d[1] > INT32_MAX || d[2] > INT32_MAX || (uint64_t)d[1] * (uint64_t)d[2] > p->lim->max_pixels)
            return fail(p, 413, "too_large",
                        "input 'pixels': %" PRId64 "x%" PRId64 " is more than max_pixels "
                        "(%" PRIu64 ")",
                        d[2], d[1], p->lim->max_pixels);
        v->h = (int)d[1];
        v->w = (int)d[2];
        *elements = (size_t)v->n * (size_t)v->h * (size_t)v->w * 3;
    } else {
        *elements = v->kind == V2_IN_TENSOR ? (size_t)v->n * TENSOR_FLOATS : (size_t)v->n;
    }
    return 0;
}

/* BYTES in binary form: each element a 4-byte little-endian length, then
 * that many bytes; exactly n elements filling exactly len bytes. */
static int split_bytes(parse *p, const uint8_t *data, size_t len, request_part *parts)
{
    size_t off = 0;
    for (int i = 0; i < p->v->n; i++) {
        if (len - off < 4)
            return fail(p, 400, "bad_request", "input 'jpeg': binary data ends inside element %d's length", i);
        uint32_t n = (uint32_t)data[off] | (uint32_t)data[off + 1] << 8 | (uint32_t)data[off + 2] << 16 |
                     (uint32_t)data[off + 3] << 24;
        off += 4;
        if (n > len - off)
            return fail(p, 400, "bad_request", "input 'jpeg': element %d says %" PRIu32 " bytes, %zu remain", i, n,
                        len - off);
        parts[i].data = data + off;
        parts[i].len = n;
        off += n;
    }
    if (off != len)
        return fail(p, 400, "bad_request", "input 'jpeg': %zu bytes of binary data after its %d elements", len - off,
                    p->v->n);
    return 0;
}

/* The input's data, from the binary section (bin != NULL) or JSON. */
static int read_data(parse *p, const json_t *data, const uint8_t *bin, size_t binlen, size_t elements,
                     request_part *parts)
{
    v2_infer *v = p->v;
    const char *name = inputs[v->kind].name;
    if (bin) {
        size_t want = v->kind == V2_IN_TENSOR ? elements * sizeof(float) : elements;
        if (v->kind != V2_IN_JPEG && binlen != want)
            return fail(p, 400, "bad_request", "input '%s': binary_data_size is %zu bytes; its shape needs %zu", name,
                        binlen, want);
        if (v->kind == V2_IN_JPEG)
            return split_bytes(p, bin, binlen, parts);
        if (v->kind == V2_IN_PIXELS) {
            v->pixels = bin;
            return 0;
        }
        /* Copied: the engines read aligned floats, and the data may start
         * anywhere in the body. The protocol's binary FP32 is little-endian,
         * as the host is (x86-64, arm64). */
        if (!(v->tensor = alloc_charged(p, want)))
            return -1;
        memcpy(v->tensor, bin, want);
        return 0;
    }
    if (!json_is_array(data))
        return fail(p, 400, "bad_request", "input '%s': 'data' must be an array", name);
    /* Before allocating for the shape: a document with fewer values
     * cannot fill it. */
    size_t count = 0;
    if (p->values < elements) {
        if (walk(p, data, 1, &count, elements, NULL, NULL) != 0)
            return -1;
        return fail(p, 400, "bad_request", "input '%s' has %zu data elements; its shape needs %zu", name, count,
                    elements);
    }
    int rc;
    if (v->kind == V2_IN_TENSOR) {
        if (!(v->tensor = alloc_charged(p, elements * sizeof(float))))
            return -1;
        rc = walk(p, data, 1, &count, elements, leaf_f32, v->tensor);
    } else if (v->kind == V2_IN_PIXELS) {
        if (!(v->owned = alloc_charged(p, elements)))
            return -1;
        v->pixels = v->owned;
        rc = walk(p, data, 1, &count, elements, leaf_u8, v->owned);
    } else {
        strings st = { .s = calloc(elements, sizeof *st.s) };
        if (!st.s)
            return fail(p, 500, "internal", "out of memory");
        rc = walk(p, data, 1, &count, elements, leaf_string, &st);
        if (rc == 0 && count == elements && (v->owned = alloc_charged(p, st.bytes))) {
            size_t off = 0;
            for (size_t i = 0; i < elements; i++) {
                size_t n = json_string_length(st.s[i]);
                memcpy(v->owned + off, json_string_value(st.s[i]), n);
                parts[i].data = v->owned + off;
                parts[i].len = n;
                off += n;
            }
        }
        free(st.s);
        if (rc == 0 && count == elements && !v->owned)
            return -1;
    }
    if (rc != 0)
        return -1;
    if (count != elements)
        return fail(p, 400, "bad_request", "input '%s' has %zu data elements; its shape needs %zu", name, count,
                    elements);
    return 0;
}

static int parse_input(parse *p, const json_t *in, const uint8_t *bin, size_t binlen, request_part *parts)
{
    v2_infer *v = p->v;
    if (!json_is_object(in))
        return fail(p, 400, "bad_request", "'inputs' entries must be objects");
    const json_t *name = json_object_get(in, "name"), *dt = json_object_get(in, "datatype");
    if (!json_is_string(name) || !json_is_string(dt))
        return fail(p, 400, "bad_request", "an input needs a 'name' and a 'datatype' (strings)");
    int k = -1;
    for (int i = 0; i < (int)(sizeof inputs / sizeof inputs[0]); i++)
        if (strcmp(json_string_value(name), inputs[i].name) == 0)
            k = i;
    if (k < 0)
        return fail(p, 400, "bad_request",
                    "unknown input '%.100s'; " V2_MODEL_NAME " takes 'input' (FP32), "
                    "'pixels' (UINT8) or 'jpeg' (BYTES)",
                    json_string_value(name));
    v->kind = (v2_input_kind)k;
    if (strcmp(json_string_value(dt), inputs[k].datatype) != 0)
        return fail(p, 400, "bad_request", "input '%s' has datatype %s, not %.40s", inputs[k].name, inputs[k].datatype,
                    json_string_value(dt));
    size_t elements = 0;
    if (check_shape(p, json_object_get(in, "shape"), &elements) != 0)
        return -1;
    const json_t *params, *bds = NULL, *data = json_object_get(in, "data");
    if (get_params(p, in, inputs[k].name, &params) != 0)
        return -1;
    if (params)
        bds = json_object_get(params, "binary_data_size");
    if (bds && data)
        return fail(p, 400, "bad_request", "input '%s' has both 'data' and binary_data_size", inputs[k].name);
    if (!bds && !data)
        return fail(p, 400, "bad_request", "input '%s' has neither 'data' nor binary_data_size", inputs[k].name);
    if (bds) {
        if (!json_is_integer(bds) || json_integer_value(bds) < 0)
            return fail(p, 400, "bad_request", "input '%s': binary_data_size must be a whole number >= 0",
                        inputs[k].name);
        if (!bin)
            return fail(p, 400, "bad_request",
                        "input '%s' has binary_data_size but the request has no "
                        "Inference-Header-Content-Length header",
                        inputs[k].name);
        if ((uint64_t)json_integer_value(bds) != binlen)
            return fail(p, 400, "bad_request",
                        "input '%s': binary_data_size is %" JSON_INTEGER_FORMAT " but %zu bytes follow the JSON header",
                        inputs[k].name, json_integer_value(bds), binlen);
        return read_data(p, NULL, bin, binlen, elements, parts);
    }
    if (bin && binlen > 0)
        return fail(p, 400, "bad_request", "%zu bytes follow the JSON header but no input has binary_data_size",
                    binlen);
    return read_data(p, data, NULL, 0, elements, parts);
}

static int parse_outputs(parse *p, const json_t *outs, int binary_default)
{
    v2_infer *v = p->v;
    if (!outs) {
        for (int i = 0; i < V2_NOUTPUTS; i++)
            v->outputs[i] = (v2_output){ .kind = (v2_output_kind)i, .binary = binary_default };
        v->noutputs = V2_NOUTPUTS;
        return 0;
    }
    if (!json_is_array(outs) || json_array_size(outs) == 0)
        return fail(p, 400, "bad_request", "'outputs' must be a non-empty array");
    if (json_array_size(outs) > V2_NOUTPUTS)
        return fail(p, 400, "bad_request", "'outputs' names more than the model's %d outputs", V2_NOUTPUTS);
    size_t i;
    const json_t *o;
    json_array_foreach(outs, i, o)
    {
        const json_t *name = json_is_object(o) ? json_object_get(o, "name") : NULL;
        if (!json_is_string(name))
            return fail(p, 400, "bad_request", "an output needs a 'name' (string)");
        int k = -1;
        for (int j = 0; j < V2_NOUTPUTS; j++)
            if (strcmp(json_string_value(name), output_names[j]) == 0)
                k = j;
        if (k < 0)
            return fail(p, 400, "bad_request",
                        "unknown output '%.100s'; " V2_MODEL_NAME " has 'logits' and "
                        "'probabilities'",
                        json_string_value(name));
        for (int j = 0; j < v->noutputs; j++)
            if (v->outputs[j].kind == (v2_output_kind)k)
                return fail(p, 400, "bad_request", "output '%s' is requested twice", output_names[k]);
        v2_output *out = &v->outputs[v->noutputs++];
        *out = (v2_output){ .kind = (v2_output_kind)k, .binary = binary_default };
        const json_t *params;
        if (get_params(p, o, output_names[k], &params) != 0 ||
            get_bool(p, params, "binary_data", output_names[k], &out->binary) != 0)
            return -1;
        const json_t *cls = params ? json_object_get(params, "classification") : NULL;
        if (cls) {
            if (!json_is_integer(cls) || json_integer_value(cls) < 1)
                return fail(p, 400, "bad_request", "output '%s': classification must be a whole number >= 1",
                            output_names[k]);
            json_int_t c = json_integer_value(cls);
            out->classification = c > p->lim->classes ? p->lim->classes : (int)c;
        }
    }
    return 0;
}

static int parse_document(parse *p, const json_t *root, const uint8_t *bin, size_t binlen, request_part *parts)
{
    v2_infer *v = p->v;
    if (!json_is_object(root))
        return fail(p, 400, "bad_request", "the inference request must be a JSON object");
    const json_t *id = json_object_get(root, "id");
    if (id && !json_is_string(id))
        return fail(p, 400, "bad_request", "'id' must be a string");
    if (id && !(v->id = strdup(json_string_value(id))))
        return fail(p, 500, "internal", "out of memory");
    const json_t *params;
    int binary_default = 0;
    if (get_params(p, root, "request", &params) != 0 ||
        get_bool(p, params, "binary_data_output", "request", &binary_default) != 0)
        return -1;
    const json_t *ins = json_object_get(root, "inputs");
    if (!json_is_array(ins) || json_array_size(ins) == 0)
        return fail(p, 400, "bad_request", "'inputs' must be a non-empty array");
    if (json_array_size(ins) > 1)
        return fail(p, 400, "bad_request",
                    V2_MODEL_NAME " takes exactly one input per request: 'input', "
                                  "'pixels' or 'jpeg'");
    if (parse_input(p, json_array_get(ins, 0), bin, binlen, parts) != 0)
        return -1;
    return parse_outputs(p, json_object_get(root, "outputs"), binary_default);
}

int v2_parse_infer(const uint8_t *body, size_t len, long header_len, const v2_limits *lim, budget *b, v2_infer *v,
                   request_part *parts, const char **code, char *err, size_t errlen)
{
    *v = (v2_infer){ .budget = b };
    parse p = { .lim = lim, .v = v, .err = err, .errlen = errlen };
    size_t hlen = len;
    const uint8_t *bin = NULL;
    if (header_len >= 0) {
        if ((size_t)header_len > len || header_len == 0) {
            fail(&p, 400, "bad_request", "Inference-Header-Content-Length is %ld; the body has %zu bytes", header_len,
                 len);
            goto out;
        }
        hlen = (size_t)header_len;
        bin = body + hlen;
    }
    if (hlen == 0) {
        fail(&p, 400, "bad_request", "the request body is empty; send the inference request JSON");
        goto out;
    }
    /* The JSON tree's memory, bounded from the text before parsing: every
     * value but the first follows a ',', '[', '{' or ':'. */
    size_t values = 1;
    for (size_t i = 0; i < hlen; i++)
        values += body[i] == ',' || body[i] == '[' || body[i] == '{' || body[i] == ':';
    p.values = values;
    size_t tree = values * JSON_BYTES_PER_VALUE + hlen;
    if (charge(&p, tree) != 0)
        goto out;
    json_error_t je;
    json_t *root = json_loadb((const char *)body, hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        fail(&p, 400, "bad_request", "malformed JSON at line %d column %d: %s", je.line, je.column,
             json_error_for_client(&je));
    else
        parse_document(&p, root, bin, bin ? len - hlen : 0, parts);
    json_decref(root);
    if (b) {
        budget_release(b, tree);
        v->charged -= tree;
    }
out:
    if (p.status) {
        v2_infer_free(v);
        *code = p.code;
        return p.status;
    }
    return 0;
}

void v2_infer_free(v2_infer *v)
{
    free(v->id);
    free(v->tensor);
    free(v->owned);
    if (v->budget && v->charged)
        budget_release(v->budget, v->charged);
    *v = (v2_infer){ 0 };
}

/* ---- responses ---------------------------------------------------------- */

char *v2_response_error(const char *message, size_t *len)
{
    char clean[1024];
    return json_dump_line(json_pack("{s:s}", "error", utf8_sanitize(clean, sizeof clean, message)), len);
}

char *v2_response_server(const char *version, size_t *len)
{
    return json_dump_line(json_pack("{s:s, s:s, s:[s,s,s,s,s]}", "name", "resnetd", "version", version, "extensions",
                                    "classification", "binary_tensor_data", "model_repository", "statistics",
                                    "model_configuration"),
                          len);
}

char *v2_response_model(int classes, const char *platform, size_t *len)
{
    return json_dump_line(
        json_pack("{s:s, s:[s], s:s, s:[{s:s,s:s,s:[i,i,i,i]}, {s:s,s:s,s:[i,i,i,i]}, {s:s,s:s,s:[i]}],"
                  " s:[{s:s,s:s,s:[i,i]}, {s:s,s:s,s:[i,i]}]}",
                  "name", V2_MODEL_NAME, "versions", V2_MODEL_VERSION, "platform", platform, "inputs", "name",
                  inputs[V2_IN_TENSOR].name, "datatype", inputs[V2_IN_TENSOR].datatype, "shape", -1, 3, RESNET18_IMG,
                  RESNET18_IMG, "name", inputs[V2_IN_PIXELS].name, "datatype", inputs[V2_IN_PIXELS].datatype, "shape",
                  -1, -1, -1, 3, "name", inputs[V2_IN_JPEG].name, "datatype", inputs[V2_IN_JPEG].datatype, "shape", -1,
                  "outputs", "name", output_names[V2_OUT_LOGITS], "datatype", "FP32", "shape", -1, classes, "name",
                  output_names[V2_OUT_PROBABILITIES], "datatype", "FP32", "shape", -1, classes),
        len);
}

char *v2_response_config(int classes, int max_batch, const int *preferred, int npreferred, long max_queue_delay_us,
                         const char *backend, int gpu, const int *gpus, int ngpus, size_t *len)
{
    json_t *pref = json_array(), *devs = json_array();
    for (int i = 0; pref && i < npreferred; i++)
        json_array_append_new(pref, json_integer(preferred[i]));
    for (int i = 0; devs && i < ngpus; i++)
        json_array_append_new(devs, json_integer(gpus[i]));
    json_t *group = json_pack("{s:s, s:s, s:i}", "name", V2_MODEL_NAME "_0", "kind", gpu ? "KIND_GPU" : "KIND_CPU",
                              "count", 1);
    if (group && gpu)
        json_object_set_new(group, "gpus", devs);
    else
        json_decref(devs);
    /* Triton's dims leave out the batch dimension (max_batch_size > 0);
     * one JPEG per image is a BYTES element of shape [1] reshaped to []. */
    return json_dump_line(
        json_pack("{s:s, s:s, s:s, s:i, s:{s:{s:i}},"
                  " s:[{s:s, s:s, s:[i,i,i]}, {s:s, s:s, s:[i,i,i]}, {s:s, s:s, s:[i], s:{s:[]}}],"
                  " s:[{s:s, s:s, s:[i]}, {s:s, s:s, s:[i]}],"
                  " s:{s:o, s:I}, s:[o]}",
                  "name", V2_MODEL_NAME, "platform", "", "backend", backend, "max_batch_size", max_batch,
                  "version_policy", "latest", "num_versions", 1, "input", "name", inputs[V2_IN_TENSOR].name,
                  "data_type", "TYPE_FP32", "dims", 3, RESNET18_IMG, RESNET18_IMG, "name", inputs[V2_IN_PIXELS].name,
                  "data_type", "TYPE_UINT8", "dims", -1, -1, 3, "name", inputs[V2_IN_JPEG].name, "data_type",
                  "TYPE_STRING", "dims", 1, "reshape", "shape", "output", "name", output_names[V2_OUT_LOGITS],
                  "data_type", "TYPE_FP32", "dims", classes, "name", output_names[V2_OUT_PROBABILITIES], "data_type",
                  "TYPE_FP32", "dims", classes, "dynamic_batching", "preferred_batch_size", pref,
                  "max_queue_delay_microseconds", (json_int_t)max_queue_delay_us, "instance_group", group),
        len);
}

char *v2_response_index(int ready, size_t *len)
{
    return json_dump_line(json_pack("[{s:s, s:s, s:s, s:s}]", "name", V2_MODEL_NAME, "version", V2_MODEL_VERSION,
                                    "state", ready ? "READY" : "UNAVAILABLE", "reason", ready ? "" : "not ready"),
                          len);
}

/* A growing byte buffer for the binary section. */
typedef struct bytes {
    uint8_t *p;
    size_t len, cap;
    int oom;
} bytes;

static void put(bytes *b, const void *data, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void put_u32le(bytes *b, uint32_t x)
{
    uint8_t le[4] = { (uint8_t)x, (uint8_t)(x >> 8), (uint8_t)(x >> 16), (uint8_t)(x >> 24) };
    put(b, le, 4);
}

/* Image i's values of output o: the logits or their softmax. */
static void output_values(const v2_output *o, const float *logits, int classes, float *out)
{
    if (o->kind == V2_OUT_LOGITS)
        memcpy(out, logits, (size_t)classes * sizeof *out);
    else
        topk_softmax_all(logits, classes, out);
}

/* One output: its JSON description (data inline, or its size) and, when
 * binary, its bytes appended to bin. */
static json_t *output_json(const v2_infer *v, const v2_output *o, const float *logits, int classes,
                           const labels *const *labs, float *vals, topk_entry *top, bytes *bin)
{
    int n = v->n, k = o->classification;
    json_t *j = json_pack("{s:s, s:s, s:[i,i]}", "name", output_names[o->kind], "datatype", k ? "BYTES" : "FP32",
                          "shape", n, k ? k : classes);
    json_t *data = o->binary ? NULL : json_array();
    if (!j || (!o->binary && !data))
        goto oom;
    size_t start = bin->len;
    for (int i = 0; i < n; i++) {
        output_values(o, logits + (size_t)i * classes, classes, vals);
        if (!k) {
            if (o->binary)
                put(bin, vals, (size_t)classes * sizeof *vals);
            else
                for (int c = 0; c < classes; c++)
                    if (json_array_append_new(data, json_real(vals[c])) != 0)
                        goto oom;
            continue;
        }
        /* Ranked by the output's own values, as Triton does; the softmax is
         * monotonic, so both outputs rank the classes alike. */
        int ranked = topk_softmax(vals, classes, k, top);
        const labels *lab = labs ? labs[i] : NULL;
        for (int r = 0; r < ranked; r++) {
            char s[512];
            int idx = top[r].index;
            int sl = snprintf(s, sizeof s, "%f:%d:%s", (double)vals[idx], idx,
                              lab && idx < lab->count ? lab->names[idx] : "");
            if (sl < 0 || (size_t)sl >= sizeof s)
                sl = (int)strlen(s);
            if (o->binary) {
                put_u32le(bin, (uint32_t)sl);
                put(bin, s, (size_t)sl);
            } else if (json_array_append_new(data, json_stringn(s, (size_t)sl)) != 0) {
                goto oom;
            }
        }
    }
    if (bin->oom)
        goto oom;
    if (o->binary) {
        if (json_object_set_new(j, "parameters",
                                json_pack("{s:I}", "binary_data_size", (json_int_t)(bin->len - start))) != 0)
            goto oom;
    } else if (json_object_set_new(j, "data", data) != 0) {
        data = NULL;
        goto oom;
    }
    return j;
oom:
    json_decref(data);
    json_decref(j);
    return NULL;
}

char *v2_response_infer(const v2_infer *v, const float *logits, int classes, const labels *const *labs, size_t *len,
                        size_t *json_len)
{
    bytes bin = { 0 };
    char *out = NULL;
    float *vals = malloc((size_t)classes * sizeof *vals);
    topk_entry *top = malloc((size_t)classes * sizeof *top);
    json_t *outs = json_array();
    json_t *root = json_pack("{s:s, s:s}", "model_name", V2_MODEL_NAME, "model_version", V2_MODEL_VERSION);
    if (!vals || !top || !outs || !root)
        goto done;
    if (v->id && json_object_set_new(root, "id", json_string(v->id)) != 0)
        goto done;
    for (int i = 0; i < v->noutputs; i++) {
        json_t *o = output_json(v, &v->outputs[i], logits, classes, labs, vals, top, &bin);
        if (!o || json_array_append_new(outs, o) != 0)
            goto done;
    }
    if (json_object_set_new(root, "outputs", outs) != 0) {
        outs = NULL;
        goto done;
    }
    outs = NULL;
    size_t jl;
    char *js = json_dump_line(root, &jl);
    root = NULL;
    if (!js)
        goto done;
    int any_binary = 0;
    for (int i = 0; i < v->noutputs; i++)
        any_binary |= v->outputs[i].binary;
    if (!any_binary) {
        *len = jl;
        *json_len = 0;
        out = js;
        goto done;
    }
    out = realloc(js, jl + bin.len + 1);
    if (!out) {
        free(js);
        goto done;
    }
    if (bin.len)
        memcpy(out + jl, bin.p, bin.len);
    out[jl + bin.len] = '\0';
    *len = jl + bin.len;
    *json_len = jl;
done:
    json_decref(outs);
    json_decref(root);
    free(bin.p);
    free(vals);
    free(top);
    return out;
}
