/* Prometheus text-format parsing (see prom.h). Only sample lines matter:
 * name, optional {labels}, value, optional timestamp. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "client/prom.h"

static int name_char(int c, int first)
{
    return isalpha(c) || c == '_' || c == ':' || (!first && isdigit(c));
}

static int add(prom_set *s, const char *name, size_t nlen, const char *labels, size_t llen, double v)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        prom_sample *p = realloc(s->v, cap * sizeof *p);
        if (!p)
            return -1;
        s->v = p;
        s->cap = cap;
    }
    prom_sample *x = &s->v[s->n];
    x->name = strndup(name, nlen);
    x->labels = strndup(labels, llen);
    x->value = v;
    if (!x->name || !x->labels) {
        free(x->name);
        free(x->labels);
        return -1;
    }
    s->n++;
    return 0;
}

int prom_parse(const char *text, prom_set *out, char *err, size_t errlen)
{
    int lineno = 0;
    for (const char *line = text; *line;) {
        const char *eol = strchr(line, '\n');
        const char *next = eol ? eol + 1 : line + strlen(line);
        if (!eol)
            eol = next;
        lineno++;
        const char *p = line;
        while (p < eol && (*p == ' ' || *p == '\t'))
            p++;
        if (p == eol || *p == '#') {
            line = next;
            continue;
        }
        const char *name = p;
        if (!name_char((unsigned char)*p, 1))
            goto bad;
        while (p < eol && name_char((unsigned char)*p, 0))
            p++;
        size_t nlen = (size_t)(p - name);
        const char *labels = p;
        size_t llen = 0;
        if (p < eol && *p == '{') {
            labels = ++p;
            int quoted = 0;
            while (p < eol && (quoted || *p != '}')) {
                if (quoted && *p == '\\' && p + 1 < eol)
                    p++;
                else if (*p == '"')
                    quoted = !quoted;
                p++;
            }
            if (p == eol)
                goto bad;
            llen = (size_t)(p - labels);
            p++;
        }
        if (p == eol || (*p != ' ' && *p != '\t'))
            goto bad;
        char *end;
        double v = strtod(p, &end);
        if (end == p || (end < eol && *end != ' ' && *end != '\t' && *end != '\r'))
            goto bad;
        if (add(out, name, nlen, labels, llen, v) != 0) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        line = next;
    }
    return 0;
bad:
    snprintf(err, errlen, "metrics line %d is not a sample", lineno);
    return -1;
}

double prom_sum(const prom_set *s, const char *name, int *found)
{
    double sum = 0;
    *found = 0;
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->v[i].name, name) == 0) {
            sum += s->v[i].value;
            *found = 1;
        }
    return sum;
}

int prom_label(const char *labels, const char *key, char *buf, size_t n)
{
    size_t klen = strlen(key);
    const char *p = labels;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        const char *k = p;
        while (*p && *p != '=')
            p++;
        if (*p != '=' || p[1] != '"')
            return -1;
        int match = (size_t)(p - k) == klen && strncmp(k, key, klen) == 0;
        p += 2;
        size_t o = 0;
        while (*p && *p != '"') {
            if (*p == '\\' && p[1])
                p++;
            if (match && o + 1 < n)
                buf[o++] = *p;
            p++;
        }
        if (*p != '"')
            return -1;
        p++;
        if (match) {
            if (n)
                buf[o] = '\0';
            return 0;
        }
    }
    return -1;
}

void prom_free(prom_set *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->v[i].name);
        free(s->v[i].labels);
    }
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}
