/* Triton's statistics extension (GET /v2/models/resnet18/stats): counts
 * and cumulative times of the model's inference requests and of its
 * batches by size, in Triton's shape, so that Triton's tools
 * (tritonclient's get_inference_statistics, perf_analyzer, dashboards)
 * read them. Mapping: success/fail are /classify and v2 infer requests by
 * outcome with their whole duration; queue, compute_input (JPEG decode on
 * the CPU and the GPU decode stage), compute_infer (submit to logits) and
 * compute_output (the answer's formatting) are the successful requests'
 * (per request, its slowest image); batch_stats are the engine's batches.
 * Process-wide atomics, like metrics. */
#ifndef RESNETD_STATS_H
#define RESNETD_STATS_H

#include <stddef.h>
#include <stdint.h>

#define STATS_MAX_BATCH 1024

/* An inference request ended: ok (200, delivered) or not, after total_ns;
 * for an ok one, its images and stage times. */
void stats_request(int ok, uint64_t total_ns, int images, uint64_t queue_ns, uint64_t input_ns, uint64_t infer_ns,
                   uint64_t output_ns);

/* The engine ran a batch of size images (input_ns: its GPU decode stage, 0
 * when the CPU decoded them). */
void stats_batch(int size, uint64_t input_ns, uint64_t infer_ns);

/* {"model_stats": [...]} for the one model (name, version); malloc'd, one
 * line with a newline. NULL when out of memory. */
char *stats_render(const char *name, const char *version, size_t *len);

#endif
