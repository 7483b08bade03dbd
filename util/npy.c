/* NumPy .npy v1.0 read/write: a magic, a Python-dict header padded to 64
 * bytes, then raw little-endian C-order data. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util/npy.h"

int npy_write_f32(const char *path, const float *data, int ndim, const size_t *shape, char *err, size_t errlen)
{
    char shp[128] = "";
    size_t count = 1, o = 0;
    for (int i = 0; i < ndim; i++) {
        o += (size_t)snprintf(shp + o, sizeof shp - o, "%zu,%s", shape[i], i + 1 < ndim ? " " : "");
        count *= shape[i];
    }
    if (ndim > 1)
        shp[o - 1] = '\0'; /* (a, b) not (a, b,) */
    char hdr[256];
    int n = snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", shp);
    int total = 10 + n + 1;
    int pad = (64 - total % 64) % 64;
    memset(hdr + n, ' ', (size_t)pad);
    hdr[n + pad] = '\n';
    uint16_t hlen = (uint16_t)(n + pad + 1);
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    unsigned char magic[10] = {
        0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff), (unsigned char)(hlen >> 8)
    };
    int ok = fwrite(magic, 1, 10, f) == 10 && fwrite(hdr, 1, hlen, f) == hlen &&
             fwrite(data, sizeof(float), count, f) == count;
    if (fclose(f) != 0)
        ok = 0;
    if (!ok) {
        snprintf(err, errlen, "%s: write failed", path);
        return -1;
    }
    return 0;
}

int npy_read(const char *path, npy_array *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    unsigned char magic[10];
    char hdr[1024];
    if (fread(magic, 1, 10, f) != 10 || memcmp(magic, "\x93NUMPY", 6) != 0 || magic[6] != 1) {
        snprintf(err, errlen, "%s: not a v1 .npy file", path);
        goto fail;
    }
    size_t hlen = magic[8] | (size_t)magic[9] << 8;
    if (hlen >= sizeof hdr || fread(hdr, 1, hlen, f) != hlen) {
        snprintf(err, errlen, "%s: bad header", path);
        goto fail;
    }
    hdr[hlen] = '\0';
    const char *d = strstr(hdr, "'descr': '");
    const char *s = strstr(hdr, "'shape': (");
    if (!d || !s || strstr(hdr, "'fortran_order': True")) {
        snprintf(err, errlen, "%s: unsupported header %s", path, hdr);
        goto fail;
    }
    d += 10;
    size_t dl = strcspn(d, "'");
    if (dl >= sizeof a->dtype) {
        snprintf(err, errlen, "%s: unsupported dtype", path);
        goto fail;
    }
    memcpy(a->dtype, d, dl);
    size_t esize = strcmp(a->dtype, "<f4") == 0 ? 4 : strcmp(a->dtype, "|u1") == 0 ? 1 : 0;
    if (!esize) {
        snprintf(err, errlen, "%s: unsupported dtype %s", path, a->dtype);
        goto fail;
    }
    s += 10;
    a->count = 1;
    while (*s && *s != ')') {
        char *end;
        unsigned long long v = strtoull(s, &end, 10);
        if (end == s)
            break;
        if (a->ndim == NPY_MAX_DIMS) {
            snprintf(err, errlen, "%s: too many dimensions", path);
            goto fail;
        }
        a->shape[a->ndim++] = v;
        a->count *= v;
        s = end;
        while (*s == ',' || *s == ' ')
            s++;
    }
    a->data = malloc(a->count * esize + 1);
    if (!a->data || fread(a->data, esize, a->count, f) != a->count) {
        snprintf(err, errlen, "%s: short data", path);
        goto fail;
    }
    fclose(f);
    return 0;
fail:
    fclose(f);
    npy_free(a);
    return -1;
}

void npy_free(npy_array *a)
{
    free(a->data);
    memset(a, 0, sizeof *a);
}
