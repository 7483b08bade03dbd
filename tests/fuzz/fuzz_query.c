/* libFuzzer target: what the query string goes through: our unescape
 * callback, then ?top_k=, and the UTF-8 sanitiser error messages use.
 * Properties: unescaping never lengthens and never yields a NUL; top_k is
 * 1..max (the class count) when accepted; sanitised text is valid UTF-8. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/api/request.h"
#include "util/utf8.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    size_t before = strlen(s);
    size_t n = request_unescape(s);
    if (n > before || n != strlen(s))
        abort();
    static const int maxes[] = { 1, 10, 1000, 100000 }; /* class counts of possible heads */
    for (size_t i = 0; i < sizeof maxes / sizeof maxes[0]; i++) {
        int k = -7;
        if (request_parse_top_k(s, maxes[i], &k) == 0 && (k < 1 || k > maxes[i]))
            abort();
    }
    char clean[256];
    utf8_sanitize(clean, sizeof clean, s);
    if (utf8_invalid_at(clean, strlen(clean)) != strlen(clean))
        abort();
    free(s);
    return 0;
}
