/* JSON answers as the daemon writes them: compact, 9 significant digits for
 * reals (every FP32 value round-trips), and a newline at the end (a
 * terminal shows the prompt on its own line). Header-only: daemon/api/v2.c is
 * also built alone for its fuzz target. */
#ifndef RESNETD_JSONOUT_H
#define RESNETD_JSONOUT_H

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* Dumps and frees j; the text (malloc'd) and its length, or NULL. */
static inline char *json_dump_line(json_t *j, size_t *len)
{
    if (!j)
        return NULL;
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(j);
    if (!s)
        return NULL;
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (!t) {
        free(s);
        return NULL;
    }
    t[n] = '\n';
    t[n + 1] = '\0';
    *len = n + 1;
    return t;
}

/* A parse error's text for a client: jansson names its own flag for a
 * \u0000 in a string, which means nothing to one. */
static inline const char *json_error_for_client(const json_error_t *je)
{
    return strstr(je->text, "JSON_ALLOW_NUL") ? "a string contains \\u0000 (NUL), which is not allowed" : je->text;
}

#endif
