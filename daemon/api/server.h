/* The HTTP front end: routing, body limits, and the glue that turns a
 * POST /classify into queued images and, once the pipeline has reported
 * every image, into one answer.
 *
 * The HTTP layer (daemon/http/http.h, libmicrohttpd) runs a few worker threads
 * on epoll; they parse and answer, and hand complete bodies to the
 * decode stage (daemon/pipeline/decode.h: decode_threads threads, shared by every
 * connection). A request waiting for a decoder or for its batch holds no
 * thread, its connection suspended. The pipeline calls classify_sink (daemon/api/classify.h) from the batcher and
 * completion threads; the last report for a request wakes its connection. */
#ifndef RESNETD_SERVER_H
#define RESNETD_SERVER_H

#include <stddef.h>
#include "daemon/http/budget.h"
#include "daemon/config_table.h"
#include "daemon/http/http.h"
#include "daemon/pipeline/infer.h"
#include "daemon/pipeline/pipeline.h"
#include "daemon/pipeline/queue.h"
#include "daemon/pipeline/reload.h"
#include "daemon/api/response.h"

typedef struct server server;

/* Starts the decode threads and the slow-connection reaper, binds
 * cfg->listen and starts the HTTP worker threads. inf: the ninf engines'
 * pipelines (readiness, Retry-After, the served model); dj: a device JPEG
 * decoder whose header check the decode threads use, or NULL to decode
 * every image on the CPU; route: the GPU/CPU costs the decode threads
 * record and route by (with dj). Request bodies are charged to `bodies`
 * (past its cap: 503). */
server *server_start(const config *cfg, const response_service *svc, queue *q, infer *const *inf, int ninf,
                     reloader *reload, devjpeg *dj, decode_route *route, budget *bodies, const http_tls *tls, char *err,
                     size_t errlen);

/* The bound port (useful with port 0). */
int server_port(const server *s);

/* Warm-up done: /readyz may answer 200 (while the engine is healthy). */
void server_set_warm(server *s);

/* SIGTERM: /readyz answers 503, new /classify requests on open connections
 * get 503, the listening socket is closed; accepted requests carry on. */
void server_begin_drain(server *s);

/* Requests whose headers have arrived, not yet completed (answered and
 * sent, or dropped). */
long server_active(server *s);

/* Requests waiting for a decoder or the pipeline (their connections
 * suspended). */
long server_suspended(server *s);

/* Of those, requests a decode thread is decoding now. */
long server_decoding(server *s);

/* Drain timeout: requests still waiting for a decoder are answered 503, and
 * any request completing its body later too; decodes under way stop before
 * their next image and are answered 503 (an image being decoded is
 * finished first). Returns how many waiting requests were answered. */
int server_cancel_decodes(server *s);

/* Stops the HTTP layer, closing any connection still open, then the decode
 * threads. Only once server_suspended() is 0: no request may still wait
 * for its answer. */
void server_stop(server *s);

#endif
