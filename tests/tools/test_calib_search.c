/* Tests for tools/calib_search.c, resnetd-calibrate --target-agreement's
 * decision, with a fake scorer in place of the engines: the mixes are
 * tried in the measured speed order, the search stops at the first mix
 * that meets the target, ties go to the smaller rel L2 and then to the
 * faster mix, and without a winner the most agreeing candidate is chosen. */
#include <string.h>
#include "tools/calib_search.h"
#include "tests/lib/testutil.h"

#define NMETHODS 3

/* The fake scorer: fixed scores, and a log of what was asked. */
typedef struct fake {
    calib_score score[CALIB_NMIXES][NMETHODS];
    int calls;
    calib_mix asked[CALIB_NMIXES * NMETHODS];
    int fail_at; /* the call that fails (-1: none) */
} fake;

static int fake_eval(void *ctx, calib_mix mix, int method, calib_score *s)
{
    fake *f = ctx;
    if (f->calls == f->fail_at)
        return -1;
    ck_assert_int_eq(method, f->calls % NMETHODS); /* every method of a mix, in order */
    f->asked[f->calls++] = mix;
    *s = f->score[mix][method];
    return 0;
}

/* agree of 100 images at rel L2 0.05 for every candidate. */
static void fill(fake *f, int agree)
{
    memset(f, 0, sizeof *f);
    f->fail_at = -1;
    for (int m = 0; m < CALIB_NMIXES; m++)
        for (int k = 0; k < NMETHODS; k++)
            f->score[m][k] = (calib_score){ .agree = agree, .images = 100, .rel_l2 = 0.05 };
}

START_TEST(test_mixes_are_ordered_by_measured_speed_not_by_name)
{
    calib_mix order[CALIB_NMIXES] = { CALIB_MIX_INT8,     CALIB_MIX_STEM,   CALIB_MIX_LAYER1_0, CALIB_MIX_LAYER1,
                                      CALIB_MIX_LAYER2_0, CALIB_MIX_LAYER2, CALIB_MIX_LAYER3_0, CALIB_MIX_LAYER3 };
    const double img_s[CALIB_NMIXES] = {
        [CALIB_MIX_INT8] = 900,     [CALIB_MIX_STEM] = 1200,  [CALIB_MIX_LAYER1_0] = 100, [CALIB_MIX_LAYER1] = 900,
        [CALIB_MIX_LAYER2_0] = 200, [CALIB_MIX_LAYER2] = 300, [CALIB_MIX_LAYER3_0] = 250, [CALIB_MIX_LAYER3] = 950
    };
    calib_search_order(order, CALIB_NMIXES, img_s);
    const calib_mix want[CALIB_NMIXES] = {
        CALIB_MIX_STEM,   CALIB_MIX_LAYER3,   CALIB_MIX_INT8,     CALIB_MIX_LAYER1,
        CALIB_MIX_LAYER2, CALIB_MIX_LAYER3_0, CALIB_MIX_LAYER2_0, CALIB_MIX_LAYER1_0
    };
    for (int i = 0; i < CALIB_NMIXES; i++)
        ck_assert_int_eq(order[i], want[i]); /* int8 before layer1: equal speeds keep their order */
}
END_TEST

START_TEST(test_search_stops_at_the_first_mix_that_meets_the_target)
{
    fake f;
    fill(&f, 90);
    f.score[CALIB_MIX_INT8][2].agree = 98;
    f.score[CALIB_MIX_STEM][0] = (calib_score){ .agree = 99, .images = 100, .rel_l2 = 0.04 };
    f.score[CALIB_MIX_STEM][1] = (calib_score){ .agree = 100, .images = 100, .rel_l2 = 0.03 };
    f.score[CALIB_MIX_LAYER1][0].agree = 100;
    const calib_mix order[] = { CALIB_MIX_INT8, CALIB_MIX_STEM, CALIB_MIX_LAYER1 };
    calib_search_result r;
    ck_assert_int_eq(calib_search_run(order, 3, NMETHODS, 99, fake_eval, &f, &r), 0);
    ck_assert_int_eq(r.mix, CALIB_MIX_STEM);
    ck_assert_int_eq(r.method, 1); /* the most agreeing at that mix, not the first to meet */
    ck_assert_int_eq(r.met, 1);
    ck_assert_int_eq(r.score.agree, 100);
    ck_assert_int_eq(r.tried, 2 * NMETHODS);
    ck_assert_int_eq(f.calls, 2 * NMETHODS); /* the slower layer1 never scored */
    for (int i = 0; i < f.calls; i++)
        ck_assert_int_eq(f.asked[i], order[i / NMETHODS]);
}
END_TEST

START_TEST(test_the_fastest_mix_wins_when_it_meets_the_target)
{
    fake f;
    fill(&f, 99);
    const calib_mix order[] = { CALIB_MIX_LAYER2, CALIB_MIX_INT8 };
    calib_search_result r;
    ck_assert_int_eq(calib_search_run(order, 2, NMETHODS, 99, fake_eval, &f, &r), 0);
    ck_assert_int_eq(r.mix, CALIB_MIX_LAYER2);
    ck_assert_int_eq(r.method, 0);
    ck_assert_int_eq(f.calls, NMETHODS);
}
END_TEST

START_TEST(test_equal_agreement_goes_to_the_smaller_rel_l2)
{
    fake f;
    fill(&f, 97);
    f.score[CALIB_MIX_INT8][2].rel_l2 = 0.01;
    const calib_mix order[] = { CALIB_MIX_INT8 };
    calib_search_result r;
    ck_assert_int_eq(calib_search_run(order, 1, NMETHODS, 95, fake_eval, &f, &r), 0);
    ck_assert_int_eq(r.method, 2);
    ck_assert_int_eq(r.met, 1);
}
END_TEST

START_TEST(test_without_a_winner_the_most_agreeing_of_all_is_chosen)
{
    fake f;
    fill(&f, 90);
    f.score[CALIB_MIX_STEM][1].agree = 95;
    f.score[CALIB_MIX_LAYER1][2] = (calib_score){ .agree = 95, .images = 100, .rel_l2 = 0.05 };
    const calib_mix order[] = { CALIB_MIX_INT8, CALIB_MIX_STEM, CALIB_MIX_LAYER1 };
    calib_search_result r;
    ck_assert_int_eq(calib_search_run(order, 3, NMETHODS, 99.5, fake_eval, &f, &r), 0);
    ck_assert_int_eq(r.met, 0);
    ck_assert_int_eq(r.tried, 3 * NMETHODS);
    ck_assert_int_eq(r.mix, CALIB_MIX_STEM); /* a full tie with layer1: the faster mix */
    ck_assert_int_eq(r.method, 1);
    ck_assert_int_eq(r.score.agree, 95);
}
END_TEST

START_TEST(test_agreement_exactly_at_the_target_meets_it)
{
    calib_score s = { .agree = 99, .images = 100, .rel_l2 = 0.1 };
    ck_assert(calib_search_meets(&s, 99));
    ck_assert(!calib_search_meets(&s, 99.01));
    s = (calib_score){ .agree = 356, .images = 357 };
    ck_assert(calib_search_meets(&s, 99.7));
    ck_assert(!calib_search_meets(&s, 99.8));
}
END_TEST

START_TEST(test_a_failed_score_abandons_the_search)
{
    fake f;
    fill(&f, 100);
    f.fail_at = 1;
    const calib_mix order[] = { CALIB_MIX_INT8 };
    calib_search_result r;
    ck_assert_int_eq(calib_search_run(order, 1, NMETHODS, 0, fake_eval, &f, &r), -1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("calib_search");
    TCase *tc = tcase_create("calib_search");
    tcase_add_test(tc, test_mixes_are_ordered_by_measured_speed_not_by_name);
    tcase_add_test(tc, test_search_stops_at_the_first_mix_that_meets_the_target);
    tcase_add_test(tc, test_the_fastest_mix_wins_when_it_meets_the_target);
    tcase_add_test(tc, test_equal_agreement_goes_to_the_smaller_rel_l2);
    tcase_add_test(tc, test_without_a_winner_the_most_agreeing_of_all_is_chosen);
    tcase_add_test(tc, test_agreement_exactly_at_the_target_meets_it);
    tcase_add_test(tc, test_a_failed_score_abandons_the_search);
    suite_add_tcase(s, tc);
    return testutil_run(s);
}
