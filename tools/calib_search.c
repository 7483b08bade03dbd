/* resnetd-calibrate's search decision (tools/calib_search.h). */
#include "tools/calib_search.h"

void calib_search_order(calib_mix *mixes, int n, const double img_s[CALIB_NMIXES])
{
    /* Insertion sort: CALIB_NMIXES (8) at most, and it is stable. */
    for (int i = 1; i < n; i++) {
        calib_mix m = mixes[i];
        int j = i;
        for (; j > 0 && img_s[m] > img_s[mixes[j - 1]]; j--)
            mixes[j] = mixes[j - 1];
        mixes[j] = m;
    }
}

int calib_search_better(const calib_score *a, const calib_score *b)
{
    if (a->agree != b->agree)
        return a->agree > b->agree;
    return a->rel_l2 < b->rel_l2;
}

int calib_search_meets(const calib_score *s, double target)
{
    return s->images > 0 && 100.0 * s->agree / s->images >= target;
}

int calib_search_run(const calib_mix *mixes, int nmixes, int nmethods, double target, calib_search_eval eval, void *ctx,
                     calib_search_result *r)
{
    calib_search_result best = { .tried = 0 };
    int have = 0;
    for (int i = 0; i < nmixes; i++) {
        calib_search_result here = { .tried = 0 };
        for (int k = 0; k < nmethods; k++) {
            calib_score s;
            if (eval(ctx, mixes[i], k, &s) != 0)
                return -1;
            best.tried++;
            if (k == 0 || calib_search_better(&s, &here.score))
                here = (calib_search_result){ .mix = mixes[i], .method = k, .score = s };
        }
        if (nmethods > 0 && calib_search_meets(&here.score, target)) {
            *r = here;
            r->met = 1;
            r->tried = best.tried;
            return 0;
        }
        if (nmethods > 0 && (!have || calib_search_better(&here.score, &best.score))) {
            const int tried = best.tried;
            best = here;
            best.tried = tried;
            have = 1;
        }
    }
    *r = best;
    r->met = 0;
    return 0;
}
