/* Loads the class-name list: one UTF-8 name per line, index order, exact count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "model/labels.h"
#include "util/textfile.h"
#include "util/utf8.h"

/* 1000 ImageNet names take some 20 KB: a file far past a KiB a name is
 * not a labels file. */
#define LABELS_BYTES_PER_NAME 1024
#define LABELS_FILE_MIN_CAP ((size_t)1 << 20)

int labels_load(const char *path, int expect, labels *l, char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    char *text;
    size_t len, cap = (size_t)(expect > 0 ? expect : 0) * LABELS_BYTES_PER_NAME;
    if (textfile_read(path, cap > LABELS_FILE_MIN_CAP ? cap : LABELS_FILE_MIN_CAP, &text, &len, err, errlen) != 0)
        return -1;
    if (memchr(text, '\0', len)) {
        snprintf(err, errlen, "%s: contains a NUL byte", path);
        goto fail;
    }
    int lines = 0;
    for (size_t i = 0; i < len; i++)
        lines += text[i] == '\n';
    if (len > 0 && text[len - 1] != '\n')
        lines++;
    if (lines != expect) {
        snprintf(err, errlen,
                 "%s: has %d lines, but the model has %d classes (one class name per line, "
                 "in class-index order)",
                 path, lines, expect);
        goto fail;
    }
    l->names = calloc((size_t)expect, sizeof *l->names);
    if (!l->names)
        goto nomem;
    char *p = text;
    for (int i = 0; i < expect; i++) {
        char *nl = strchr(p, '\n');
        if (nl)
            *nl = '\0';
        size_t n = strlen(p);
        if (n > 0 && p[n - 1] == '\r')
            p[--n] = '\0';
        if (n == 0) {
            snprintf(err, errlen, "%s:%d: empty class name", path, i + 1);
            goto fail;
        }
        /* Labels are served in JSON, which must be UTF-8. */
        size_t bad = utf8_invalid_at(p, n);
        if (bad != n) {
            snprintf(err, errlen, "%s:%d: not UTF-8 (byte 0x%02X at column %zu); save the file as UTF-8", path, i + 1,
                     (unsigned char)p[bad], bad + 1);
            goto fail;
        }
        l->names[i] = p;
        p = nl ? nl + 1 : p + n;
    }
    l->text = text;
    l->count = expect;
    return 0;
nomem:
    snprintf(err, errlen, "%s: out of memory", path);
fail:
    free(l->names);
    free(text);
    memset(l, 0, sizeof *l);
    return -1;
}

void labels_free(labels *l)
{
    free(l->names);
    free(l->text);
    memset(l, 0, sizeof *l);
}

const char *labels_default_path(void)
{
    static const char installed[] = RESNETD_DATADIR "/imagenet-classes.txt";
    static const char source[] = RESNETD_SRCDIR "/etc/imagenet-classes.txt";
    return access(installed, R_OK) == 0 || access(source, R_OK) != 0 ? installed : source;
}
