/* The GET endpoints and the repository extension (daemon/api/endpoints.h). */
#include <config.h> /* autoconf's (PACKAGE_VERSION), not daemon/config_table.h */
#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/api/answer.h"
#include "daemon/api/endpoints.h"
#include "daemon/api/metrics.h"
#include "daemon/api/server_impl.h"
#include "daemon/api/stats.h"
#include "daemon/api/v2.h"
#include "util/clock.h"

/* A failing engine fails its batches: the server is not ready until each
 * engine has run a batch again, so a balancer sends traffic elsewhere. */
static int all_healthy(server *s)
{
    for (int i = 0; i < s->ninf; i++)
        if (!infer_healthy(s->inf[i]))
            return 0;
    return 1;
}

static int is_ready(server *s, const char **why)
{
    if (atomic_load(&s->draining))
        *why = "draining";
    else if (!atomic_load(&s->warm))
        *why = "warming up";
    else if (!all_healthy(s))
        *why = "the engine failed its last batch";
    else
        return 1;
    return 0;
}

/* A probe's 200: an empty body, as the protocol's health endpoints answer. */
static int answer_empty(server *s, request *r, http_conn *c)
{
    return answer_body(s, r, c, 200, strdup(""), 0, "text/plain", 0, NULL, 0);
}

int endpoint_get(server *s, request *r, http_conn *c)
{
    size_t len = 0;
    const char *why;
    char *body;
    switch (r->route) {
    case ROUTE_V2_SERVER:
        body = v2_response_server(PACKAGE_VERSION, &len);
        return answer_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
    case ROUTE_V2_LIVE: return answer_empty(s, r, c);
    case ROUTE_V2_READY:
    case ROUTE_V2_MODEL_READY:
        if (!is_ready(s, &why)) {
            char msg[128];
            snprintf(msg, sizeof msg, "not ready: %s", why);
            return answer_error(s, r, c, 503, "not_ready", msg, 1, NULL, 0);
        }
        return answer_empty(s, r, c);
    case ROUTE_V2_CONFIG: {
        int pref[64], gpus[ENGINE_MAX_DEVICES], ngpus = 0;
        char perr[160];
        int npref = config_preferred_sizes(s->svc->preferred_batch_sizes, pref, 64, perr, sizeof perr);
        if (npref < 0) /* checked at start-up */
            npref = 0;
        int gpu = strcmp(s->svc->device, "cuda") == 0;
        for (const char *p = s->svc->engines; gpu && p && (p = strstr(p, "cuda:")) && ngpus < ENGINE_MAX_DEVICES;) {
            p += 5;
            gpus[ngpus++] = atoi(p);
        }
        char backend[64];
        snprintf(backend, sizeof backend, "resnetd_%s", s->svc->device);
        body = v2_response_config(answer_classes(s), s->svc->max_batch_size, pref, npref, s->svc->max_queue_delay_us,
                                  backend, gpu, gpus, ngpus, &len);
        return answer_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
    }
    case ROUTE_V2_STATS:
    case ROUTE_V2_STATS_ALL:
        body = stats_render(V2_MODEL_NAME, V2_MODEL_VERSION, &len);
        return answer_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
    case ROUTE_V2_MODEL: {
        char platform[64];
        snprintf(platform, sizeof platform, "resnetd_%s", s->svc->device);
        body = v2_response_model(answer_classes(s), platform, &len);
        return answer_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
    }
    case ROUTE_HEALTHZ:
        body = response_status("ok", &len);
        return answer_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
    case ROUTE_READYZ:
        if (!is_ready(s, &why)) {
            char msg[128];
            snprintf(msg, sizeof msg, "not ready: %s", why);
            return answer_error(s, r, c, 503, "not_ready", msg, 1, NULL, 0);
        }
        body = response_status("ready", &len);
        return answer_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
    case ROUTE_METRICS: {
        metrics_set_ready(is_ready(s, &why));
        /* Through c: s->http is not set yet for a request that arrives
         * while http_start returns. */
        metrics_set_connections(http_connections(http_server_of(c)), http_dropped_slow(http_server_of(c)));
        http_counters hc;
        http_counters_get(http_server_of(c), &hc);
        metrics_set_admission(&(metrics_admission){ .refused_limit = hc.refused_limit,
                                                    .refused_client = hc.refused_client,
                                                    .refused_fds = hc.refused_fds,
                                                    .evicted = hc.evicted,
                                                    .not_http = hc.not_http,
                                                    .incomplete_head = hc.incomplete_head,
                                                    .first_byte_timeout = hc.first_byte_timeout,
                                                    .pending = hc.pending });
        metrics_set_body_memory(budget_used(s->bodies), budget_cap(s->bodies));
        body = metrics_render(&len);
        return answer_body(s, r, c, 200, body, len, "text/plain; version=0.0.4; charset=utf-8", 0, NULL, 0);
    }
    default: {
        served_model *m = infer_model(s->inf[0]);
        body = response_model(s->svc, m, &len);
        served_model_unref(m);
        return answer_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
    }
    }
}

/* ---- POST /v2/repository/models/resnet18/load --------------------------- */

/* The Open Inference Protocol's model repository extension: reloads the
 * weights and labels the configuration names (reload.h). Like a classify
 * request the connection is suspended one call after the body ends and
 * resumed by the reloader's answer; errors are the protocol's
 * {"error": "..."}. */

#define LOAD_MAX_BODY 65536

/* Past 64 KiB the rest is read and dropped, and answered 413 at the end. */
int endpoint_load_body(request *r, const char *data, size_t n)
{
    if (r->too_large || r->over_budget)
        return 0;
    int rc = r->len + n > LOAD_MAX_BODY ? -1 : request_append(r, (const uint8_t *)data, n);
    if (rc == -2)
        r->over_budget = 1;
    else if (rc != 0)
        r->too_large = 1;
    return 0;
}

/* The body is empty, or a JSON object whose "parameters", if any, are
 * empty: resnetd loads the files its configuration names, never others. */
int endpoint_load_check(server *s, request *r, http_conn *c)
{
    char why[256];
    if (r->too_large)
        return answer_error(s, r, c, 413, "too_large", "the load request's body is larger than 64 KiB", 0, NULL, 0);
    if (r->over_budget)
        return answer_error(s, r, c, 503, "memory_full", answer_memory_full, answer_retry_after(s), NULL, 0);
    if (reload_parse_request(r->body, r->len, why, sizeof why) != 0)
        return answer_error(s, r, c, 400, "bad_request", why, 0, NULL, 0);
    request_drop_body(r);
    if (atomic_load(&s->draining))
        return answer_error(s, r, c, 503, "shutting_down", "the server is shutting down", 1, NULL, 0);
    if (!atomic_load(&s->warm)) /* the engines are still being warmed up */
        return answer_error(s, r, c, 503, "not_ready", "the server is starting; load once it is ready", 1, NULL, 0);
    r->state = REQ_SUBMITTING;
    return 0;
}

/* On the reloader thread, with the connection suspended: a failed load
 * is the request's 400, a refused one (stopping, too many waiting) 503. */
static void load_done(void *cls, int rc, const char *message)
{
    request *r = cls;
    if (rc != 0) {
        r->fail_status = rc == RELOAD_REFUSED ? 503 : 400;
        snprintf(r->fail_msg, sizeof r->fail_msg, "%s", message);
    }
    http_wake(r->conn);
}

void endpoint_load_suspend(server *s, request *r)
{
    r->state = REQ_QUEUED;
    atomic_fetch_add(&s->suspended, 1);
    if (reloader_request(s->reload, load_done, r) != 0)
        load_done(r, RELOAD_REFUSED,
                  "a reload is refused now: the server is stopping, or 64 load requests are waiting");
}

int endpoint_load_answer(server *s, request *r, http_conn *c)
{
    atomic_fetch_sub(&s->suspended, 1);
    r->state = REQ_ANSWERED;
    if (r->fail_status)
        return answer_error(s, r, c, r->fail_status, r->fail_status == 503 ? "shutting_down" : "load_failed",
                            r->fail_msg, r->fail_status == 503 ? answer_retry_after(s) : 0, NULL, 0);
    char *empty = calloc(1, 1);
    return answer_body(s, r, c, 200, empty, 0, "application/json", 0, NULL, 0);
}

/* ---- POST /v2/repository/index ------------------------------------------ */

/* The repository extension's index: the one model and its state. The body
 * is empty or a JSON object whose "ready", if true, lists only ready
 * models (Triton's request). */
int endpoint_index_answer(server *s, request *r, http_conn *c)
{
    const char *why;
    int only_ready = 0;
    if (r->too_large)
        return answer_error(s, r, c, 413, "too_large", "the index request's body is larger than 64 KiB", 0, NULL, 0);
    if (r->over_budget)
        return answer_error(s, r, c, 503, "memory_full", answer_memory_full, answer_retry_after(s), NULL, 0);
    if (r->len > 0) {
        json_error_t jerr;
        json_t *j = json_loadb((const char *)r->body, r->len, 0, &jerr);
        if (!json_is_object(j)) {
            json_decref(j);
            return answer_error(s, r, c, 400, "bad_request", "the index request's body must be a JSON object", 0, NULL,
                                0);
        }
        only_ready = json_is_true(json_object_get(j, "ready"));
        json_decref(j);
    }
    request_drop_body(r);
    int ready = is_ready(s, &why);
    size_t len = 0;
    char *body = only_ready && !ready ? strdup("[]\n") : v2_response_index(ready, &len);
    if (body && len == 0)
        len = strlen(body);
    r->state = REQ_ANSWERED;
    return answer_body(s, r, c, 200, body, len, "application/json", 0, NULL, 0);
}
