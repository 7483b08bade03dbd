/* Tests daemon/api/v2.c: v2 paths, the inference request parser (JSON data,
 * the binary tensor data extension, every refusal with its status), the
 * memory it charges to the budget, and the response bodies (JSON and
 * binary outputs, classification strings). Runs under ASan in CI: every
 * refusal must leave nothing allocated and nothing charged. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/api/v2.h"
#include "model/resnet18.h"
#include "tests/lib/testutil.h"

static const v2_limits lim = { .max_images = 8, .max_pixels = 1000, .classes = 4 };

START_TEST(routes_follow_the_spec_paths)
{
    static const struct {
        const char *url;
        v2_route want;
    } t[] = {
        { "/v2", V2_SERVER_META },
        { "/v2/health/live", V2_LIVE },
        { "/v2/health/ready", V2_READY },
        { "/v2/models/resnet18", V2_MODEL_META },
        { "/v2/models/resnet18/versions/1", V2_MODEL_META },
        { "/v2/models/resnet18/ready", V2_MODEL_READY },
        { "/v2/models/resnet18/versions/1/ready", V2_MODEL_READY },
        { "/v2/models/resnet18/infer", V2_INFER },
        { "/v2/models/resnet18/versions/1/infer", V2_INFER },
        { "/v2/models/resnet50", V2_UNKNOWN_MODEL },
        { "/v2/models/resnet18/versions/2", V2_UNKNOWN_MODEL },
        { "/v2/models/resnet18/versions/10/infer", V2_UNKNOWN_MODEL },
        { "/v2/models/resnet1", V2_UNKNOWN_MODEL },
        { "/v2/models/resnet18x/infer", V2_UNKNOWN_MODEL },
        { "/v2/models/", V2_UNKNOWN_PATH },
        { "/v2/models/resnet18/versions/", V2_UNKNOWN_PATH },
        { "/v2/models/resnet18/stats", V2_MODEL_STATS },
        { "/v2/models/resnet18/versions/1/config", V2_MODEL_CONFIG },
        { "/v2/models/resnet18/config", V2_MODEL_CONFIG },
        { "/v2/models/stats", V2_STATS },
        { "/v2/models/resnet50/stats", V2_UNKNOWN_MODEL },
        { "/v2/models/resnet18/statsx", V2_UNKNOWN_PATH },
        { "/v2/repository/index", V2_UNKNOWN_PATH },
        { "/v2/", V2_UNKNOWN_PATH },
        { "/v2x", V2_NOT_V2 },
        { "/classify", V2_NOT_V2 },
        { "", V2_NOT_V2 },
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        ck_assert_msg(v2_route_of(t[i].url) == t[i].want, "%s: %d, want %d", t[i].url, v2_route_of(t[i].url),
                      t[i].want);
}
END_TEST

START_TEST(header_length_is_a_plain_bounded_number)
{
    ck_assert_int_eq(v2_parse_header_length("0", 10), 0);
    ck_assert_int_eq(v2_parse_header_length("10", 10), 10);
    ck_assert_int_eq(v2_parse_header_length("11", 10), -1);
    ck_assert_int_eq(v2_parse_header_length("-1", 10), -1);
    ck_assert_int_eq(v2_parse_header_length("+1", 10), -1);
    ck_assert_int_eq(v2_parse_header_length("1x", 10), -1);
    ck_assert_int_eq(v2_parse_header_length("", 10), -1);
    ck_assert_int_eq(v2_parse_header_length("99999999999999999999999", (size_t)-1), -1);
}
END_TEST

/* Parses text (+ bin as the binary section when given) with a budget. The
 * body is freed on return: callers look only at what v owns. */
static int parse_with(const char *text, const uint8_t *bin, size_t binlen, budget *b, v2_infer *v, request_part *parts,
                      char *err)
{
    size_t tl = strlen(text);
    uint8_t *body = malloc(tl + binlen + 1);
    ck_assert_ptr_nonnull(body);
    memcpy(body, text, tl);
    if (binlen)
        memcpy(body + tl, bin, binlen);
    const char *code = NULL;
    int rc = v2_parse_infer(body, tl + binlen, bin ? (long)tl : -1, &lim, b, v, parts, &code, err, 256);
    if (rc != 0) {
        ck_assert_msg(code && err[0], "a refusal names a code and a reason");
        ck_assert_ptr_null(v->tensor);
        ck_assert_ptr_null(v->owned);
        ck_assert_ptr_null(v->id);
    }
    free(body);
    return rc;
}

START_TEST(json_pixels_nested_or_flat_give_the_same_bytes)
{
    budget b;
    budget_init(&b, 1 << 20);
    request_part parts[8];
    char err[256] = "";
    v2_infer v;
    const char *flat = "{\"id\":\"r1\",\"inputs\":[{\"name\":\"pixels\",\"datatype\":\"UINT8\",\"shape\":[1,1,2,3],"
                       "\"data\":[1,2,3,4,5,255]}]}";
    ck_assert_msg(parse_with(flat, NULL, 0, &b, &v, parts, err) == 0, "%s", err);
    ck_assert_int_eq(v.kind, V2_IN_PIXELS);
    ck_assert(v.n == 1 && v.h == 1 && v.w == 2);
    ck_assert_mem_eq(v.pixels, "\x01\x02\x03\x04\x05\xff", 6);
    ck_assert_str_eq(v.id, "r1");
    ck_assert_int_eq(v.noutputs, V2_NOUTPUTS); /* none listed: every output */
    ck_assert(budget_used(&b) > 0 && budget_used(&b) == v.charged);
    v2_infer_free(&v);
    ck_assert_uint_eq(budget_used(&b), 0);
    const char *nested = "{\"inputs\":[{\"name\":\"pixels\",\"datatype\":\"UINT8\",\"shape\":[1,1,2,3],"
                         "\"data\":[[[[1,2,3],[4,5,255]]]]}]}";
    ck_assert_msg(parse_with(nested, NULL, 0, &b, &v, parts, err) == 0, "%s", err);
    ck_assert_mem_eq(v.pixels, "\x01\x02\x03\x04\x05\xff", 6);
    v2_infer_free(&v);
    ck_assert_uint_eq(budget_used(&b), 0);
}
END_TEST

START_TEST(binary_tensor_and_bytes_are_read_from_the_section)
{
    budget b;
    budget_init(&b, 4 << 20);
    request_part parts[8];
    char err[256] = "";
    v2_infer v;
    size_t nf = (size_t)3 * RESNET18_IMG * RESNET18_IMG;
    float *t = malloc(nf * sizeof *t);
    ck_assert_ptr_nonnull(t);
    for (size_t i = 0; i < nf; i++)
        t[i] = (float)i * 0.25f - 7.0f;
    char doc[256];
    snprintf(doc, sizeof doc,
             "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,3,224,224],"
             "\"parameters\":{\"binary_data_size\":%zu}}],\"outputs\":[{\"name\":\"probabilities\","
             "\"parameters\":{\"classification\":99,\"binary_data\":true}}]}",
             nf * sizeof *t);
    ck_assert_msg(parse_with(doc, (const uint8_t *)t, nf * sizeof *t, &b, &v, parts, err) == 0, "%s", err);
    ck_assert_int_eq(v.kind, V2_IN_TENSOR);
    ck_assert_mem_eq(v.tensor, t, nf * sizeof *t);
    ck_assert_int_eq(v.noutputs, 1);
    ck_assert(v.outputs[0].kind == V2_OUT_PROBABILITIES && v.outputs[0].binary);
    ck_assert_int_eq(v.outputs[0].classification, lim.classes); /* clamped, as Triton */
    v2_infer_free(&v);
    free(t);

    const uint8_t bytes[] = { 2, 0, 0, 0, 0xff, 0xd8, 0, 0, 0, 0, 1, 0, 0, 0, 'x' };
    const char *jd = "{\"inputs\":[{\"name\":\"jpeg\",\"datatype\":\"BYTES\",\"shape\":[3,1],"
                     "\"parameters\":{\"binary_data_size\":15}}]}";
    uint8_t *body = malloc(strlen(jd) + sizeof bytes);
    ck_assert_ptr_nonnull(body);
    memcpy(body, jd, strlen(jd));
    memcpy(body + strlen(jd), bytes, sizeof bytes);
    const char *code;
    ck_assert_int_eq(
        v2_parse_infer(body, strlen(jd) + sizeof bytes, (long)strlen(jd), &lim, &b, &v, parts, &code, err, sizeof err),
        0);
    ck_assert_int_eq(v.n, 3);
    ck_assert(parts[0].len == 2 && parts[0].data == body + strlen(jd) + 4);
    ck_assert(parts[1].len == 0 && parts[2].len == 1 && parts[2].data[0] == 'x');
    v2_infer_free(&v);
    free(body);
    ck_assert_uint_eq(budget_used(&b), 0);
}
END_TEST

/* Each refusal: its status, nothing left allocated or charged. */
START_TEST(hostile_requests_are_refused_with_their_status)
{
    static const struct {
        int status;
        const char *doc;
        const char *bin; /* binary section, or NULL */
        size_t binlen;
    } t[] = {
        { 400, "{", NULL, 0 },
        { 400, "[]", NULL, 0 },
        { 400, "{\"inputs\":[]}", NULL, 0 },
        { 400, "{\"a\":1,\"a\":2,\"inputs\":[]}", NULL, 0 },
        { 400, "{\"inputs\":[{\"name\":\"pixels\",\"datatype\":\"FP32\",\"shape\":[1,1,1,3],\"data\":[0,0,0]}]}", NULL,
          0 },
        { 400, "{\"inputs\":[{\"name\":\"pixels\",\"datatype\":\"UINT8\",\"shape\":[1,1,1,3],\"data\":[0,0]}]}", NULL,
          0 },
        { 400, "{\"inputs\":[{\"name\":\"pixels\",\"datatype\":\"UINT8\",\"shape\":[1,1,1,3],\"data\":[0,0,0,0]}]}",
          NULL, 0 },
        { 400, "{\"inputs\":[{\"name\":\"pixels\",\"datatype\":\"UINT8\",\"shape\":[1,1,1,3],\"data\":[0,0,256]}]}",
          NULL, 0 },
        { 400,
          "{\"inputs\":[{\"name\":\"pixels\",\"datatype\":\"UINT8\",\"shape\":[1,1,1,3],\"data\":[[[[[[[[[0]]]]]]]]]}]"
          "}",
          NULL, 0 },
        { 400,
          "{\"inputs\":[{\"name\":\"pixels\",\"datatype\":\"UINT8\",\"shape\":[1,1,1,3],"
          "\"parameters\":{\"binary_data_size\":3}}]}",
          "\0\0", 2 },
        { 400,
          "{\"inputs\":[{\"name\":\"pixels\",\"datatype\":\"UINT8\",\"shape\":[1,1,1,3],"
          "\"parameters\":{\"binary_data_size\":2}}]}",
          "\0\0", 2 },
        { 400, "{\"inputs\":[{\"name\":\"pixels\",\"datatype\":\"UINT8\",\"shape\":[1,1,1,3],\"data\":[0,0,0]}]}", "\0",
          1 },
        { 400,
          "{\"inputs\":[{\"name\":\"jpeg\",\"datatype\":\"BYTES\",\"shape\":[1],"
          "\"parameters\":{\"binary_data_size\":5}}]}",
          "\xff\xff\xff\x7f\0", 5 },
        { 400,
          "{\"inputs\":[{\"name\":\"jpeg\",\"datatype\":\"BYTES\",\"shape\":[2],"
          "\"parameters\":{\"binary_data_size\":6}}]}",
          "\1\0\0\0x\0", 6 },
        { 400, "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[1,3,224,224],\"data\":[1e39]}]}",
          NULL, 0 },
        { 400, "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[0,3,224,224],\"data\":[]}]}", NULL,
          0 },
        { 400, "{\"id\":1,\"inputs\":[{\"name\":\"jpeg\",\"datatype\":\"BYTES\",\"shape\":[1],\"data\":[\"x\"]}]}",
          NULL, 0 },
        { 400,
          "{\"inputs\":[{\"name\":\"jpeg\",\"datatype\":\"BYTES\",\"shape\":[1],\"data\":[\"x\"]}],"
          "\"outputs\":[{\"name\":\"logits\",\"parameters\":{\"classification\":0}}]}",
          NULL, 0 },
        { 413, "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[9,3,224,224],\"data\":[]}]}", NULL,
          0 },
        { 413,
          "{\"inputs\":[{\"name\":\"pixels\",\"datatype\":\"UINT8\",\"shape\":[1,4611686018427387904,"
          "4611686018427387904,3],\"data\":[]}]}",
          NULL, 0 },
        { 413, "{\"inputs\":[{\"name\":\"pixels\",\"datatype\":\"UINT8\",\"shape\":[1,100,11,3],\"data\":[]}]}", NULL,
          0 },
    };
    budget b;
    budget_init(&b, 8 << 20);
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        request_part parts[8];
        char err[256] = "";
        v2_infer v;
        int rc = parse_with(t[i].doc, (const uint8_t *)t[i].bin, t[i].binlen, &b, &v, parts, err);
        ck_assert_msg(rc == t[i].status, "case %zu: %d (%s), want %d", i, rc, err, t[i].status);
        ck_assert_msg(budget_used(&b) == 0, "case %zu left %zu bytes charged", i, budget_used(&b));
    }
    /* A NUL in a string: said plainly, not as jansson's flag (issue 39, F7). */
    request_part parts[8];
    char err[256] = "";
    v2_infer v;
    ck_assert_int_eq(parse_with("{\"id\":\"a\\u0000b\",\"inputs\":[]}", NULL, 0, &b, &v, parts, err), 400);
    ck_assert_msg(strstr(err, "contains \\u0000 (NUL)") && !strstr(err, "JSON_"), "%s", err);
}
END_TEST

/* Too few data elements for the shape: the error counts them exactly, also
 * where the document is too small to fill the shape at all (refused before
 * anything is allocated for it). */
START_TEST(too_few_elements_are_counted_exactly)
{
    static const struct {
        const char *doc, *want;
    } t[] = {
        { "{\"inputs\":[{\"name\":\"pixels\",\"datatype\":\"UINT8\",\"shape\":[1,1,1,3],\"data\":[0,0]}]}",
          "has 2 data elements; its shape needs 3" },
        { "{\"inputs\":[{\"name\":\"pixels\",\"datatype\":\"UINT8\",\"shape\":[1,20,30,3],\"data\":[[0,1],[2]]}]}",
          "has 3 data elements; its shape needs 1800" },
    };
    budget b;
    budget_init(&b, 8 << 20);
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        request_part parts[8];
        char err[256] = "";
        v2_infer v;
        ck_assert_int_eq(parse_with(t[i].doc, NULL, 0, &b, &v, parts, err), 400);
        ck_assert_msg(strstr(err, t[i].want), "case %zu: '%s', want '%s'", i, err, t[i].want);
        ck_assert_uint_eq(budget_used(&b), 0);
    }
}
END_TEST

START_TEST(a_budget_too_small_for_the_json_refuses_it)
{
    budget b;
    budget_init(&b, 256);
    request_part parts[8];
    char err[256] = "";
    v2_infer v;
    const char *doc = "{\"inputs\":[{\"name\":\"pixels\",\"datatype\":\"UINT8\",\"shape\":[1,1,2,3],"
                      "\"data\":[1,2,3,4,5,6]}]}";
    ck_assert_int_eq(parse_with(doc, NULL, 0, &b, &v, parts, err), 413);
    ck_assert_uint_eq(budget_used(&b), 0);
    budget_init(&b, 4096); /* it fits, but not while most of the budget is in use: 503 */
    ck_assert(budget_try_acquire(&b, 4000) == 0);
    ck_assert_int_eq(parse_with(doc, NULL, 0, &b, &v, parts, err), 503);
    budget_release(&b, 4000);
}
END_TEST

START_TEST(responses_carry_outputs_as_asked)
{
    budget b;
    budget_init(&b, 1 << 20);
    request_part parts[8];
    char err[256] = "";
    v2_infer v;
    const char *doc = "{\"id\":\"x\",\"inputs\":[{\"name\":\"pixels\",\"datatype\":\"UINT8\",\"shape\":[2,1,1,3],"
                      "\"data\":[0,0,0,1,1,1]}],\"outputs\":[{\"name\":\"logits\",\"parameters\":"
                      "{\"classification\":2}},{\"name\":\"probabilities\",\"parameters\":{\"binary_data\":true}}]}";
    ck_assert_msg(parse_with(doc, NULL, 0, &b, &v, parts, err) == 0, "%s", err);
    const float logits[8] = { 1, 3, 2, 0, -1, -1, 5, -1 };
    const char *names[4] = { "a", "b", "c", "d" };
    labels lab = { .names = (char **)names, .count = 4 };
    const labels *labs[2] = { &lab, &lab };
    size_t len, jl;
    char *body = v2_response_infer(&v, logits, 4, labs, &len, &jl);
    ck_assert_ptr_nonnull(body);
    ck_assert_uint_eq(len, jl + 2 * 4 * sizeof(float));
    json_error_t je;
    json_t *j = json_loadb(body, jl, 0, &je);
    ck_assert_msg(j != NULL, "%s", je.text);
    ck_assert_str_eq(json_string_value(json_object_get(j, "id")), "x");
    json_t *o0 = json_array_get(json_object_get(j, "outputs"), 0);
    json_t *d0 = json_object_get(o0, "data");
    ck_assert_str_eq(json_string_value(json_object_get(o0, "datatype")), "BYTES");
    ck_assert_str_eq(json_string_value(json_array_get(d0, 0)), "3.000000:1:b");
    ck_assert_str_eq(json_string_value(json_array_get(d0, 1)), "2.000000:2:c");
    ck_assert_str_eq(json_string_value(json_array_get(d0, 2)), "5.000000:2:c");
    ck_assert_str_eq(json_string_value(json_array_get(d0, 3)), "-1.000000:0:a"); /* ties: lower index */
    json_t *o1 = json_array_get(json_object_get(j, "outputs"), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(o1, "parameters"), "binary_data_size")), 32);
    float probs[8];
    memcpy(probs, body + jl, sizeof probs);
    float want[4];
    topk_softmax_all(logits, 4, want);
    ck_assert_mem_eq(probs, want, sizeof want);
    json_decref(j);
    free(body);
    v2_infer_free(&v);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("v2");
    TCase *tc = tcase_create("v2");
    tcase_add_test(tc, routes_follow_the_spec_paths);
    tcase_add_test(tc, too_few_elements_are_counted_exactly);
    tcase_add_test(tc, header_length_is_a_plain_bounded_number);
    tcase_add_test(tc, json_pixels_nested_or_flat_give_the_same_bytes);
    tcase_add_test(tc, binary_tensor_and_bytes_are_read_from_the_section);
    tcase_add_test(tc, hostile_requests_are_refused_with_their_status);
    tcase_add_test(tc, a_budget_too_small_for_the_json_refuses_it);
    tcase_add_test(tc, responses_carry_outputs_as_asked);
    suite_add_tcase(s, tc);
    return testutil_run(s);
}
