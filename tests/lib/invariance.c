/* Batch invariance of an engine's logits (tests/lib/invariance.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/lib/invariance.h"
#include "tests/lib/testutil.h"

static void infer(engine *e, int slot, int n)
{
    char err[512] = "";
    for (size_t i = 0; i < (size_t)e->max_batch * (size_t)e->classes; i++)
        e->logits[slot][i] = NAN;
    for (int i = 0; i < n; i++)
        e->input_f32[slot][i] = NULL;
    ck_assert_msg(engine_submit(e, slot, n, err, sizeof err) == 0, "submit: %s", err);
    ck_assert_msg(engine_wait(e, slot, err, sizeof err) == 0, "wait: %s", err);
}

int invariance_all_sizes(int max, int *out)
{
    for (int i = 0; i < max; i++)
        out[i] = i + 1;
    return max;
}

int invariance_check(engine *e, const uint8_t *images, int nimages, const int *sizes, int nsizes, const char *what,
                     int must_hold)
{
    ck_assert_int_ge(nimages, 3);
    const size_t C = (size_t)e->classes, row = C * sizeof(float);
    float *ref = malloc(2 * row);
    ck_assert_ptr_nonnull(ref);
    for (int p = 0; p < 2; p++) {
        memcpy(e->input[0], images + (size_t)p * RESNET18_INPUT_BYTES, RESNET18_INPUT_BYTES);
        infer(e, 0, 1);
        memcpy(ref + (size_t)p * C, e->logits[0], row);
        for (size_t k = 0; k < C; k++)
            ck_assert_msg(isfinite(ref[(size_t)p * C + k]), "%s: probe %d alone: logit %zu not finite", what, p, k);
    }
    int batches = 0, filler = 2, placements = 0, differ = 0, first_n = 0, first_i = 0;
    for (int s = 0; s < nsizes; s++) {
        const int n = sizes[s];
        ck_assert_msg(n >= 1 && n <= e->max_batch, "%s: size %d outside 1..%d", what, n, e->max_batch);
        for (int r = 0; r < 3; r++) {
            const int slot = batches % e->nslots;
            for (int i = 0; i < n; i++) {
                int k = (i + r) % 3;
                int src = k < 2 ? k : filler;
                if (k == 2 && ++filler == nimages)
                    filler = 2;
                memcpy(e->input[slot] + (size_t)i * RESNET18_INPUT_BYTES, images + (size_t)src * RESNET18_INPUT_BYTES,
                       RESNET18_INPUT_BYTES);
            }
            infer(e, slot, n);
            batches++;
            for (int i = 0; i < n; i++) {
                int k = (i + r) % 3;
                if (k == 2)
                    continue;
                const float *got = e->logits[slot] + (size_t)i * C, *want = ref + (size_t)k * C;
                placements++;
                if (memcmp(got, want, row) == 0)
                    continue;
                if (differ++ == 0) {
                    first_n = n;
                    first_i = i;
                }
                if (!must_hold)
                    continue;
                size_t j = 0;
                while (memcmp(&got[j], &want[j], sizeof(float)) == 0)
                    j++;
                ck_abort_msg("%s: probe %d at position %d of a batch of %d: logit %zu is %.9g, alone %.9g "
                             "(not the same bits)",
                             what, k, i, n, j, (double)got[j], (double)want[j]);
            }
        }
    }
    if (differ)
        fprintf(stderr,
                "  invariance %s: %d of %d placements differ from the probe alone (first: position %d "
                "of %d)\n",
                what, differ, placements, first_i, first_n);
    else
        fprintf(stderr, "  invariance %s: %d placements in %d batches, all the same bits\n", what, placements, batches);
    free(ref);
    return differ;
}
