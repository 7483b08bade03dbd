/* resnetd's HTTP/1.1 server: sockets, connections, framing and limits.
 * It knows no routes: a handler (the server, daemon/server.h) answers.
 *
 * Threads: one acceptor hands each new connection to the worker with the
 * fewest; a worker owns its connections for life and runs every handler
 * callback for them, one at a time, so a request's state needs no lock on
 * the worker. Other threads (decoders, the pipeline) only call http_wake;
 * the worker then calls handler->wake for that request, where the answer
 * is given. A connection waiting for its answer is out of epoll: it
 * cannot be closed under a pending wake.
 *
 * Every request the layer reads a line of is handed to handler->request
 * exactly once and ended by handler->done exactly once, also the ones it
 * refuses itself (malformed, too large, unsupported, too slow): they come
 * with head->status set, and the handler answers them in its own format.
 *
 * Slow clients (slowloris): a request's head must arrive within
 * header_timeout of the connection opening (or of the previous answer),
 * and its body at min_rate bytes/s on average once header_timeout has
 * passed (daemon/conn.h decides); an answer not taken by the client for
 * idle_timeout is dropped. While the handler holds a request the client is
 * not timed. */
#ifndef RESNETD_HTTP_H
#define RESNETD_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include "daemon/httpparse.h"

typedef struct http_server http_server;
typedef struct http_conn http_conn;

typedef struct http_limits {
    int threads;                /* worker threads */
    long connection_limit;      /* open connections; more are closed at once */
    uint64_t header_timeout_us;
    uint64_t min_rate;          /* body bytes/s; 0: none */
    uint64_t idle_timeout_us;   /* an answer not read, a body stalled (min_rate 0) */
    size_t conn_memory;         /* a connection's read buffer at most: the head must fit (431) */
    int backlog;
} http_limits;

typedef struct http_handler {
    void *cls;
    /* A request's head, complete or refused (h->status). Returns the
     * request's context, or NULL when out of memory (the connection is
     * closed). May answer at once with http_respond. */
    void *(*request)(void *cls, http_conn *c, const http_head *h);
    /* Body bytes as they arrive (not called once answered). */
    void (*body)(void *cls, http_conn *c, void *req, const char *data, size_t n);
    /* The body is complete (or there was none). */
    void (*body_end)(void *cls, http_conn *c, void *req);
    /* The body broke off (bad chunked encoding: 400; too slow: 408): the
     * handler answers with this status unless it has answered already. */
    void (*body_error)(void *cls, http_conn *c, void *req, int status, const char *code, const char *message);
    /* After http_wake, on the connection's worker. */
    void (*wake)(void *cls, http_conn *c, void *req);
    /* The request ended: its answer was sent (delivered), or the
     * connection closed first. The context is the handler's to free. */
    void (*done)(void *cls, void *req, int delivered);
    /* Percent-decodes the path and query in place; returns the length. */
    size_t (*unescape)(char *s);
} http_handler;

typedef struct http_response {
    int status;
    char *body;                 /* malloc'd, freed by the layer; NULL: none */
    size_t len;
    const char *content_type;
    int retry_after;            /* seconds; 0: no Retry-After */
    const char *allow;          /* Allow, or NULL */
    const char *extra_name;     /* one more header, or NULL */
    const char *extra_value;
    int close;                  /* close the connection after this answer */
} http_response;

/* Binds addr and starts the threads (start-up: err names the reason). */
http_server *http_start(const struct sockaddr *addr, socklen_t addrlen, const http_limits *l,
                        const http_handler *h, char *err, size_t errlen);
int http_port(const http_server *s);

/* Answers the request on c: only from a handler callback for c. The body
 * is the layer's from here, also on failure. A HEAD request gets the
 * headers only. Returns 0, or -1 when the answer cannot be sent (the
 * connection is closed and done() reports it undelivered). */
int http_respond(http_conn *c, const http_response *r);

/* Closes c after the current callback without an answer. */
void http_drop(http_conn *c);

/* From any thread: calls handler->wake for c's request on its worker.
 * Once per wait: only while the request waits for its answer (after
 * body_end), never after done(). */
void http_wake(http_conn *c);

/* c's socket (for the pipeline's client-gone check). */
int http_fd(const http_conn *c);

/* The server c belongs to (valid in callbacks from the first one on). */
http_server *http_server_of(const http_conn *c);

/* The worker thread c is on, 0 to threads - 1: callbacks for c may use
 * that thread's own state without a lock. */
int http_worker(const http_conn *c);

/* Open connections; connections dropped as too slow since start. */
long http_connections(http_server *s);
unsigned long long http_dropped_slow(http_server *s);

/* Stops accepting and closes the listening socket; open connections
 * carry on, and each closes after its next answer. */
void http_quiesce(http_server *s);

/* Closes every connection (requests still open end undelivered) and
 * stops the threads. No request may be waiting for a wake. */
void http_stop(http_server *s);

#endif
