/* Loads the class-name list: one name per line, index order, exact count. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "model/labels.h"

int labels_load(const char *path, int expect, labels *l, char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap + 1);
    if (!text)
        goto nomem;
    for (;;) {
        size_t r = fread(text + len, 1, cap - len, f);
        len += r;
        if (len < cap)
            break;
        char *t = realloc(text, cap * 2 + 1);
        if (!t)
            goto nomem;
        text = t;
        cap *= 2;
    }
    if (ferror(f)) {
        snprintf(err, errlen, "%s: read error", path);
        goto fail;
    }
    fclose(f);
    f = NULL;
    text[len] = '\0';
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
        snprintf(err, errlen, "%s: has %d lines, expected %d class names", path, lines, expect);
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
        l->names[i] = p;
        p = nl ? nl + 1 : p + n;
    }
    l->text = text;
    l->count = expect;
    return 0;
nomem:
    snprintf(err, errlen, "%s: out of memory", path);
fail:
    if (f)
        fclose(f);
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
