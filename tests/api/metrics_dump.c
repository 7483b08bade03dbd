/* Prints metrics_render() after filling every metric with sample values (or
 * none with --empty), so that tests/api/test_metrics_promtool.sh can feed the
 * exact text the daemon serves to `promtool check metrics`. */
#include "daemon/api/metrics.h"
#include "engine/calib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* NVML's readings for two GPUs, the second without an energy counter. */
static int two_gpus(metrics_gpu_reading *out, int max)
{
    const metrics_gpu_reading g[2] = {
        { "0", 0.97, 412.5, 123456.789, 70e9, 80e9 },
        { "1", 0.0, 61.0, -1, 1.5e9, 80e9 },
    };
    int n = max < 2 ? max : 2;
    for (int i = 0; i < n; i++)
        out[i] = g[i];
    return n;
}

static void fill(void)
{
    static const int codes[] = { 200, 200, 200, 400, 404, 405, 413, 415, 418, 500, 503, 504 };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        metrics_observe_request(codes[i], 0.0005 * (double)(i + 1));
    metrics_observe_request(200, 30);
    for (int i = 1; i <= 600; i += 37) {
        metrics_observe_batch(i);
        metrics_add_images(i);
        metrics_observe_infer(0.001 * i);
    }
    for (int i = 0; i < 100; i++) {
        metrics_observe_queue(0.00001 * i * i);
        metrics_observe_decode(0.0002 + 0.00001 * i);
    }
    metrics_observe_queue(NAN);
    for (int r = 0; r < METRICS_REJECT_COUNT; r += 2)
        metrics_reject((metrics_reject_reason)r);
    metrics_set_queue_depth(17);
    metrics_add_batches_in_flight(2);
    metrics_set_ready(1);
    metrics_set_memory((size_t)5 << 30, (size_t)64 << 20);
    for (int c = -1; c < 3; c++)
        metrics_set_decode_cost(c, 150ull + 4000ull * (unsigned long long)(c + 1));
    metrics_set_gpu_probe(two_gpus);
    metrics_set_int8("float:layer1", &(calib_check){ .images = 357, .agreement = 99.4, .rel_l2 = 0.0132 });
}

int main(int argc, char **argv)
{
    int empty = argc > 1 && strcmp(argv[1], "--empty") == 0;
    if (argc > 2 || (argc == 2 && !empty)) {
        fprintf(stderr, "usage: %s [--empty]\n", argv[0]);
        return 2;
    }
    if (empty) {
        metrics_init(NULL, NULL, NULL);
    } else {
        metrics_init("0.1.0-\"test\"\\", "cpu", "fp32");
        fill();
    }
    size_t len;
    char *text = metrics_render(&len);
    if (text == NULL) {
        fprintf(stderr, "metrics_dump: metrics_render failed\n");
        return 1;
    }
    int ok = fwrite(text, 1, len, stdout) == len && fflush(stdout) == 0;
    free(text);
    if (!ok) {
        perror("metrics_dump: write");
        return 1;
    }
    return 0;
}
