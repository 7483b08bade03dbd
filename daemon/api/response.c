/* JSON rendering with jansson. A failed allocation anywhere yields NULL,
 * which the server turns into a bare 500. Every string is UTF-8: error
 * messages are sanitised here, labels are checked when they load. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/api/jsonout.h"
#include "daemon/api/response.h"
#include "util/utf8.h"

char *response_classify(const response_service *svc, const request *r, uint64_t total_us, size_t *len)
{
    json_t *results = json_array();
    for (int i = 0; results && i < r->nimages; i++) {
        json_t *preds = json_array();
        const topk_entry *top = r->topk + (size_t)i * (size_t)r->top_k;
        const labels *lab = &r->models[i]->lab;
        for (int k = 0; preds && k < r->top_k; k++) {
            const char *label = top[k].index < lab->count ? lab->names[top[k].index] : "";
            if (json_array_append_new(preds, json_pack("{s:i, s:s, s:f}", "index", top[k].index, "label", label,
                                                       "score", (double)top[k].score)) != 0) {
                json_decref(preds);
                preds = NULL;
            }
        }
        if (!preds || json_array_append_new(results, json_pack("{s:o}", "predictions", preds)) != 0) {
            json_decref(results);
            results = NULL;
        }
    }
    if (!results)
        return NULL;
    /* The first image's model; another only if a reload fell between its batches. */
    const served_model *m = r->models[0];
    json_t *o = json_pack("{s:s, s:i, s:s, s:s, s:o, s:i, s:{s:I, s:I, s:I, s:I, s:I}}", "model", "resnet18",
                          "model_version", m->version, "device", svc->device, "precision", svc->precision, "results",
                          results, "batch_size", r->batch_size, "timings_us", "decode", (json_int_t)r->decode_us,
                          "queue", (json_int_t)r->queue_us, "gpu_decode", (json_int_t)r->gpu_decode_us, "infer",
                          (json_int_t)r->infer_us, "total", (json_int_t)total_us);
    if (o && m->synthetic && json_object_set_new(o, "synthetic_weights", json_true()) != 0) {
        json_decref(o);
        return NULL;
    }
    return json_dump_line(o, len);
}

/* Messages echo client bytes (a path, a content type), which need not be
 * UTF-8: json_pack would refuse them, and the answer would be a 500. */
char *response_error(int status, const char *code, const char *message, size_t *len)
{
    char clean[1024];
    message = utf8_sanitize(clean, sizeof clean, message);
    return json_dump_line(json_pack("{s:{s:i, s:s, s:s}}", "error", "status", status, "code", code, "message", message),
                          len);
}

/* INT8: the calibration table's method, its precision mix and what its
 * check measured (null when it was never checked). */
static json_t *int8_info(const served_model *m)
{
    const calib_check *c = &m->int8_check;
    json_t *check = c->images > 0 ? json_pack("{s:i, s:f, s:f}", "images", c->images, "top1_agreement", c->agreement,
                                              "rel_l2", c->rel_l2)
                                  : json_null();
    return json_pack("{s:s, s:s, s:o}", "calibration", m->int8_calibration, "mix", served_model_int8_mix(m), "check",
                     check);
}

char *response_model(const response_service *svc, const served_model *m, size_t *len)
{
    json_t *o = json_pack(
        "{s:s, s:i, s:s, s:i, s:s, s:s, s:b, s:b, s:i, s:i, s:{s:s, s:i}, s:{s:i, s:I, s:s, s:i, s:I},"
        " s:{s:s, s:s, s:I}, s:{s:I, s:I}, s:{s:i, s:i, s:i}}",
        "name", "resnet18", "version", m->version, "device", svc->device, "device_index", svc->device_index,
        "precision", svc->precision, "decode", svc->decode ? svc->decode : "cpu", "deterministic", svc->deterministic,
        "synthetic_weights", m->synthetic, "classes", m->classes, "label_count", m->lab.count, "labels", "path",
        m->labels_path, "count", m->lab.count, "batching", "max_batch_size", svc->max_batch_size, "max_queue_delay_us",
        (json_int_t)svc->max_queue_delay_us, "preferred_batch_sizes", svc->preferred_batch_sizes, "queue_capacity",
        svc->queue_capacity, "request_timeout_ms", (json_int_t)svc->request_timeout_ms, "weights", "path",
        m->weights_path, "sha256", m->sha256, "loaded_at_unix_ms", (json_int_t)m->loaded_unix_ms, "limits",
        "max_body_bytes", (json_int_t)svc->max_body_bytes, "max_pixels", (json_int_t)svc->max_pixels, "input", "height",
        224, "width", 224, "channels", 3);
    json_t *engines = json_array();
    int ok = o && engines;
    for (const char *p = svc->engines ? svc->engines : ""; ok && *p;) {
        size_t n = strcspn(p, ",");
        ok = json_array_append_new(engines, json_stringn(p, n)) == 0;
        p += n + (p[n] == ',');
    }
    if (!ok || json_object_set_new(o, "engines", engines) != 0) {
        if (!ok)
            json_decref(engines);
        json_decref(o);
        return NULL;
    }
    if (m->int8_calibration[0] && json_object_set_new(o, "int8", int8_info(m)) != 0) {
        json_decref(o);
        return NULL;
    }
    return json_dump_line(o, len);
}

char *response_status(const char *status, size_t *len)
{
    return json_dump_line(json_pack("{s:s}", "status", status), len);
}
