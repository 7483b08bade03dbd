/* How the front end answers (daemon/api/server.c, classify.c, endpoints.c):
 * every answer goes through answer_body, which records the request's status
 * and closes the connection while draining; errors have the API's JSON form
 * (the protocol's on /v2 paths) and are counted as rejections by reason.
 * Also what a request may carry now: images, classes, and the Retry-After
 * of a 503. */
#ifndef RESNETD_ANSWER_H
#define RESNETD_ANSWER_H

#include <stddef.h>
#include "daemon/http/http.h"
#include "daemon/api/request.h"
#include "daemon/api/server_impl.h"

/* Answers r with body (malloc'd, the HTTP layer's from here; NULL after an
 * allocation failure: a 500). retry_after > 0 and allow add those headers. */
int answer_body(server *s, request *r, http_conn *c, int status, char *body, size_t len, const char *ctype,
                int retry_after, const char *allow, int close_conn);
/* An error answer: {"error": {"status", "code", "message"}}, or v2's form. */
int answer_error(server *s, request *r, http_conn *c, int status, const char *code, const char *message,
                 int retry_after, const char *allow, int close_conn);

/* The 503 memory_full message: the bodies being received fill the budget. */
extern const char answer_memory_full[];

/* Images one request may carry: 64, or fewer when the queue holds fewer. */
int answer_max_images(server *s);
/* The served model's class count now (a reload may change it). */
int answer_classes(server *s);
/* Seconds a client refused with 503 should wait, from the queue and the
 * engines' rate. */
int answer_retry_after(server *s);

#endif
