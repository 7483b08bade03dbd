/* libFuzzer target: the config-file parser (config_parse_text, what
 * config_load_file runs on a file's bytes), then the cross-option checks
 * on whatever it accepted. */
#include <stdint.h>
#include <stdlib.h>
#include "daemon/config_table.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    config c;
    char err[1024] = "";
    config_defaults(&c);
    if (config_parse_text(&c, "fuzz.conf", (const char *)data, size, err, sizeof err) != 0) {
        if (!err[0])
            abort();
        return 0;
    }
    (void)config_validate(&c, err, sizeof err);
    config_resolve(&c, 0, 4, 0);
    return 0;
}
