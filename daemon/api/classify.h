/* The inference flow of the front end: POST /classify and v2 infer, from
 * their headers to their answer. Headers are checked before the body is
 * read (classify_begin, classify_v2_begin), the body is buffered against
 * the memory budget (classify_body), parsed and its queue slots reserved
 * (classify_submit, classify_v2_submit), then the connection waits while
 * the decode stage and the pipeline work (classify_suspend); the pipeline
 * reports each image to classify_sink, and the last report wakes the
 * connection for classify_answer. Each returns the HTTP layer's answer code
 * (daemon/http/http.h) where it answers. */
#ifndef RESNETD_CLASSIFY_H
#define RESNETD_CLASSIFY_H

#include <stddef.h>
#include "daemon/http/http.h"
#include "daemon/pipeline/pipeline.h"
#include "daemon/api/request.h"
#include "daemon/api/server_impl.h"

extern const pipeline_sink classify_sink;

int classify_begin(server *s, request *r, http_conn *c, const http_head *h);
int classify_v2_begin(server *s, request *r, http_conn *c, const http_head *h);
int classify_body(server *s, request *r, const char *data, size_t n);
/* The checks of a complete or oversized body that need no parsing (over
 * the limit, over the budget, empty): answers and returns 1 when one fails. */
int classify_refuse_body(server *s, request *r, http_conn *c, int *rc);
int classify_submit(server *s, request *r, http_conn *c);
int classify_v2_submit(server *s, request *r, http_conn *c);
void classify_suspend(server *s, request *r, http_conn *c);
int classify_answer(server *s, request *r, http_conn *c);

#endif
