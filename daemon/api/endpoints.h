/* The front end's other endpoints: the GETs (health, readiness, metrics,
 * model metadata, v2 server/model/config/statistics) and the repository
 * extension's POSTs (load: a hot reload; index). */
#ifndef RESNETD_ENDPOINTS_H
#define RESNETD_ENDPOINTS_H

#include <stddef.h>
#include "daemon/http/http.h"
#include "daemon/api/request.h"
#include "daemon/api/server_impl.h"

/* Answers a GET or HEAD on r->route. */
int endpoint_get(server *s, request *r, http_conn *c);

/* A load request's body, buffered (bounded); then checked, and the reload
 * asked for, the connection waiting for its outcome; then answered. */
int endpoint_load_body(request *r, const char *data, size_t n);
int endpoint_load_check(server *s, request *r, http_conn *c);
void endpoint_load_suspend(server *s, request *r);
int endpoint_load_answer(server *s, request *r, http_conn *c);

/* POST /v2/repository/index: the one model and its state. */
int endpoint_index_answer(server *s, request *r, http_conn *c);

#endif
