/* What the front end's files share (daemon/api/server.c, answer.c, classify.c,
 * endpoints.c): the server's state and its routes. Not for other modules. */
#ifndef RESNETD_SERVER_IMPL_H
#define RESNETD_SERVER_IMPL_H

#include <stdatomic.h>
#include "daemon/http/accesslog.h"
#include "daemon/http/budget.h"
#include "daemon/pipeline/decode.h"
#include "daemon/http/http.h"
#include "daemon/pipeline/infer.h"
#include "daemon/pipeline/queue.h"
#include "daemon/pipeline/reload.h"
#include "daemon/api/response.h"

/* daemon/api/server.h's, repeated (C11 allows it): the front end's files need
 * the type, not the server's interface. */
typedef struct server server;

enum {
    ROUTE_CLASSIFY,
    ROUTE_HEALTHZ,
    ROUTE_READYZ,
    ROUTE_METRICS,
    ROUTE_MODEL,
    ROUTE_V2_SERVER,
    ROUTE_V2_LIVE,
    ROUTE_V2_READY,
    ROUTE_V2_MODEL,
    ROUTE_V2_MODEL_READY,
    ROUTE_V2_INFER,
    ROUTE_V2_CONFIG,
    ROUTE_V2_STATS,
    ROUTE_V2_STATS_ALL,
    ROUTE_LOAD,
    ROUTE_INDEX,
};

struct server {
    http_server *http;
    const response_service *svc;
    queue *q;
    infer *const *inf; /* one per engine (device = cuda:all: one per GPU) */
    int ninf;
    reloader *reload;
    decode_stage *decode;
    budget *bodies;
    long max_body_bytes;
    long max_pixels;
    long request_timeout_ms;
    accesslog *alog; /* or NULL */
    atomic_ullong request_ids;
    int port;
    atomic_int warm;
    atomic_int draining;
    atomic_long active;
    atomic_long suspended; /* requests whose images are in the pipeline */
};

#endif
