/* The device-independent parts of the engine interface (engine/engine.h). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "engine/engine.h"

int engine_submit(engine *e, int slot, int n, char *err, size_t errlen)
{
    if (slot < 0 || slot >= e->nslots) {
        snprintf(err, errlen, "slot %d out of range (engine has %d)", slot, e->nslots);
        return -1;
    }
    if (n < 1 || n > e->max_batch) {
        snprintf(err, errlen, "batch of %d images outside 1..%d", n, e->max_batch);
        return -1;
    }
    return e->ops->submit(e->ctx, slot, n, err, errlen);
}

int engine_wait(engine *e, int slot, char *err, size_t errlen)
{
    if (slot < 0 || slot >= e->nslots) {
        snprintf(err, errlen, "slot %d out of range (engine has %d)", slot, e->nslots);
        return -1;
    }
    return e->ops->wait(e->ctx, slot, err, errlen);
}

void engine_destroy(engine *e)
{
    if (e)
        e->ops->destroy(e->ctx);
}

int engine_warm_up(engine *e, char *err, size_t errlen)
{
    memset(e->input[0], 128, (size_t)e->max_batch * RESNET18_INPUT_BYTES);
    if (engine_submit(e, 0, e->max_batch, err, errlen) != 0 || engine_wait(e, 0, err, errlen) != 0)
        return -1;
    return 0;
}

int engine_infer(engine *e, const uint8_t *images, int n, float *logits, char *err, size_t errlen)
{
    if (n < 1 || n > e->max_batch) {
        snprintf(err, errlen, "batch of %d images outside 1..%d", n, e->max_batch);
        return -1;
    }
    memcpy(e->input[0], images, (size_t)n * RESNET18_INPUT_BYTES);
    if (engine_submit(e, 0, n, err, errlen) != 0 || engine_wait(e, 0, err, errlen) != 0)
        return -1;
    memcpy(logits, e->logits[0], (size_t)n * (size_t)e->classes * sizeof(float));
    return 0;
}

const char *engine_device_name(engine_device d)
{
    switch (d) {
    case ENGINE_DEVICE_CPU: return "cpu";
    case ENGINE_DEVICE_CUDA: return "cuda";
    default: return "auto";
    }
}

const char *engine_precision_name(engine_precision p)
{
    switch (p) {
    case ENGINE_PRECISION_FP32: return "fp32";
    case ENGINE_PRECISION_FP16: return "fp16";
    case ENGINE_PRECISION_INT8: return "int8";
    default: return "default";
    }
}

int engine_parse_device(const char *s, engine_device *d, int *index)
{
    *index = 0;
    if (strcmp(s, "cpu") == 0) {
        *d = ENGINE_DEVICE_CPU;
        return 0;
    }
    if (strcmp(s, "auto") == 0) {
        *d = ENGINE_DEVICE_AUTO;
        return 0;
    }
    if (strcmp(s, "cuda") == 0) {
        *d = ENGINE_DEVICE_CUDA;
        return 0;
    }
    if (strncmp(s, "cuda:", 5) == 0 && s[5] >= '0' && s[5] <= '9') {
        char *end;
        long v = strtol(s + 5, &end, 10);
        if (*end == '\0' && v >= 0 && v < 64) {
            *d = ENGINE_DEVICE_CUDA;
            *index = (int)v;
            return 0;
        }
    }
    return -1;
}

int engine_parse_devices(const char *s, engine_device *d, int *index, int max, int *n)
{
    *n = 0;
    if (strcmp(s, "cuda:all") == 0) {
        *d = ENGINE_DEVICE_CUDA;
        return 0;
    }
    if (strncmp(s, "cuda:", 5) != 0 || !strchr(s, ',')) {
        if (engine_parse_device(s, d, index) != 0)
            return -1;
        *n = 1;
        return 0;
    }
    for (const char *p = s + 5;; p++) {
        char *end;
        if (*p < '0' || *p > '9' || *n >= max)
            return -1;
        long v = strtol(p, &end, 10);
        if (v >= 64 || (*end != ',' && *end != '\0'))
            return -1;
        for (int i = 0; i < *n; i++)
            if (index[i] == v)
                return -1;
        index[(*n)++] = (int)v;
        if (*end == '\0')
            break;
        p = end;
    }
    *d = ENGINE_DEVICE_CUDA;
    return 0;
}

int engine_parse_precision(const char *s, engine_precision *p)
{
    if (strcmp(s, "fp32") == 0) {
        *p = ENGINE_PRECISION_FP32;
        return 0;
    }
    if (strcmp(s, "fp16") == 0) {
        *p = ENGINE_PRECISION_FP16;
        return 0;
    }
    if (strcmp(s, "int8") == 0) {
        *p = ENGINE_PRECISION_INT8;
        return 0;
    }
    if (strcmp(s, "default") == 0 || strcmp(s, "auto") == 0) {
        *p = ENGINE_PRECISION_DEFAULT;
        return 0;
    }
    return -1;
}

size_t engine_device_memory(const engine *e)
{
    return e->ops->device_memory ? e->ops->device_memory(e->ctx) : 0;
}

size_t engine_pinned_memory(const engine *e)
{
    return e->ops->pinned_memory ? e->ops->pinned_memory(e->ctx) : 0;
}

/* The keys of engine_tuning, each with the values it takes. */
static const struct tuning_key {
    const char *key;
    size_t offset;
    engine_tune allowed[3];
} tuning_keys[] = {
    { "autotune", offsetof(engine_tuning, autotune), { ENGINE_TUNE_OFF, ENGINE_TUNE_LOG } },
    { "stem", offsetof(engine_tuning, stem), { ENGINE_TUNE_SEPARATE } },
    { "pool", offsetof(engine_tuning, pool), { ENGINE_TUNE_SEPARATE } },
    { "downsample", offsetof(engine_tuning, downsample), { ENGINE_TUNE_INSIDE, ENGINE_TUNE_SEPARATE } },
    { "pdl", offsetof(engine_tuning, pdl), { ENGINE_TUNE_ON, ENGINE_TUNE_OFF } },
};
static const char *const tune_names[] = { "auto", "off", "on", "log", "inside", "separate" };

int engine_tuning_parse(const char *text, engine_tuning *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    for (const char *p = text; p && *p;) {
        const char *end = strchr(p, ','), *eq = strchr(p, '=');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (end && end[1] == '\0') {
            snprintf(err, errlen, "gpu tuning: '%s' ends with a comma", text);
            return -1;
        }
        if (!eq || eq >= p + len) {
            snprintf(err, errlen, "gpu tuning: '%.*s' is not key=value", (int)len, p);
            return -1;
        }
        const struct tuning_key *k = NULL;
        for (size_t i = 0; i < sizeof tuning_keys / sizeof tuning_keys[0]; i++)
            if (strlen(tuning_keys[i].key) == (size_t)(eq - p) && strncmp(p, tuning_keys[i].key, eq - p) == 0)
                k = &tuning_keys[i];
        const char *v = eq + 1;
        size_t vlen = p + len - v;
        int value = -1;
        for (int j = 0; k && j < 3 && k->allowed[j] != ENGINE_TUNE_AUTO; j++)
            if (strlen(tune_names[k->allowed[j]]) == vlen && strncmp(v, tune_names[k->allowed[j]], vlen) == 0)
                value = k->allowed[j];
        if (vlen == 4 && strncmp(v, "auto", 4) == 0)
            value = ENGINE_TUNE_AUTO;
        if (!k || value < 0) {
            snprintf(err, errlen,
                     "gpu tuning: unknown %s in '%.*s' (autotune=off|log, stem=separate, "
                     "pool=separate, downsample=inside|separate, pdl=on|off)",
                     k ? "value" : "key", (int)len, p);
            return -1;
        }
        *(engine_tune *)((char *)t + k->offset) = (engine_tune)value;
        p = end ? end + 1 : p + len;
    }
    return 0;
}

void engine_tuning_format(const engine_tuning *t, char *out, size_t outlen)
{
    size_t used = 0;
    if (outlen > 0)
        out[0] = '\0';
    for (size_t i = 0; i < sizeof tuning_keys / sizeof tuning_keys[0]; i++) {
        engine_tune v = *(const engine_tune *)((const char *)t + tuning_keys[i].offset);
        if (v == ENGINE_TUNE_AUTO || used >= outlen)
            continue;
        int n = snprintf(out + used, outlen - used, "%s%s=%s", used ? "," : "", tuning_keys[i].key,
                         (unsigned)v < sizeof tune_names / sizeof tune_names[0] ? tune_names[v] : "?");
        used += n > 0 ? (size_t)n : 0;
    }
}
