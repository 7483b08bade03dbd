/* resnetd's HTTP/1.1 server on libmicrohttpd: listening, connections,
 * parsing, framing (chunked, keep-alive, pipelining, 100-continue) and the
 * refusals libmicrohttpd answers itself (malformed or oversized heads,
 * bad chunking; protocol/API.md lists them). It knows no routes: a handler
 * (the server, daemon/api/server.h) answers.
 *
 * Threads: libmicrohttpd's pool of epoll threads; a connection stays on
 * one of them for life, and every handler callback for it runs there, one
 * at a time, so a request's state needs no lock. Other threads (decoders,
 * the pipeline) only call http_wake; the connection's thread then calls
 * handler->wake, where the answer is given. A connection waiting for its
 * answer is suspended (libmicrohttpd does not watch it): it cannot be
 * closed under a pending wake.
 *
 * Every request whose head reaches a callback is ended by handler->done
 * exactly once. A head whose body framing libmicrohttpd would read but we
 * refuse (request smuggling: two Content-Lengths, one beside
 * Transfer-Encoding; codings other than chunked; an unknown Expect) comes
 * with status set, for the handler to answer in its own format.
 *
 * Slow clients (slowloris): a request's head must arrive within
 * header_timeout of the connection opening (or of the previous answer),
 * and its body at min_rate bytes/s on average once header_timeout has
 * passed (daemon/http/conn.h decides); such connections are closed. A
 * connection silent for idle_timeout is closed. While the handler holds
 * a request the client is not timed.
 *
 * Admission (connection pressure): the layer accepts connections itself.
 * A connection is handed to libmicrohttpd only once its first bytes look
 * like HTTP (or TLS on an HTTPS listener): idle sockets wait outside the
 * connection limit, in a table of their own, and other bytes get 400 at
 * once. An address over client_limit (pending and open together) gets
 * 503 with Retry-After; under pressure (the table half full, or three
 * quarters of connection_limit open) the first byte and a head are due
 * within a second. At the limit, open connections without a complete
 * head are closed, oldest first, for requests that wait; a request that
 * cannot get a slot within a second gets 503. Plain-HTTP refusals are
 * written without blocking, and every refusal is counted
 * (http_counters). */
#ifndef RESNETD_HTTP_H
#define RESNETD_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define HTTP_MAX_HEADERS 100 /* headers kept; more are ignored */
#define HTTP_MAX_ARGS 32 /* query arguments kept; more are ignored */

typedef struct http_field {
    const char *name;
    const char *value;
} http_field;

/* A request's head, valid during the request callback. */
typedef struct http_head {
    const char *method;
    const char *path; /* percent-decoded (the unescape function) */
    int minor; /* HTTP/1.minor: 0 or 1 */
    int nheaders;
    http_field headers[HTTP_MAX_HEADERS];
    int nargs;
    http_field args[HTTP_MAX_ARGS]; /* the query's, '+' and %XX decoded */
    int chunked;
    uint64_t content_length; /* without chunked; 0 when absent */
    /* Refused by the layer: status != 0, and what to answer. */
    int status;
    const char *code;
    const char *message;
    char trimmed[4096]; /* values copied without trailing whitespace */
    size_t trimmed_len;
} http_head;

/* A header's value by name (case-insensitive), or NULL. */
const char *http_header(const http_head *h, const char *name);
/* A query argument's value, or NULL. */
const char *http_arg(const http_head *h, const char *key);

typedef struct http_server http_server;
typedef struct http_conn http_conn;

/* HTTPS: PEM text of the certificate chain and its key (libmicrohttpd
 * with GnuTLS). */
typedef struct http_tls {
    const char *cert_pem;
    const char *key_pem;
} http_tls;

typedef struct http_limits {
    int threads; /* worker threads */
    long connection_limit; /* connections libmicrohttpd serves at once */
    long client_limit; /* connections from one address (waiting or open); 0: no limit */
    long pending_limit; /* connections waiting for their first bytes; 0: connection_limit */
    uint64_t header_timeout_us;
    uint64_t min_rate; /* body bytes/s; 0: none */
    uint64_t idle_timeout_us; /* a connection silent this long is closed */
    size_t conn_memory; /* a connection's buffers: the head must fit (431) */
    int backlog;
    const http_tls *tls; /* NULL: plain HTTP */
} http_limits;

typedef enum {
    HTTP_END_DELIVERED, /* its answer was sent */
    HTTP_END_GONE, /* the connection closed first */
    HTTP_END_SLOW, /* closed as a slow client (conn.h) */
    HTTP_END_INCOMPLETE, /* the client ended its side mid-request: the layer answered 400 */
} http_end;

typedef struct http_handler {
    void *cls;
    /* A request's head. Returns the request's context, or NULL when out
     * of memory (the connection is closed). May answer at once with
     * http_respond (a body is then not read). */
    void *(*request)(void *cls, http_conn *c, const http_head *h);
    /* Body bytes as they arrive (not called once answered). */
    void (*body)(void *cls, http_conn *c, void *req, const char *data, size_t n);
    /* The body is complete (or there was none). */
    void (*body_end)(void *cls, http_conn *c, void *req);
    /* After http_wake, on the connection's worker. */
    void (*wake)(void *cls, http_conn *c, void *req);
    /* The request ended (how). The context is the handler's to free. */
    void (*done)(void *cls, void *req, http_end how);
    /* Percent-decodes the path and query in place; returns the length. */
    size_t (*unescape)(char *s);
} http_handler;

typedef struct http_response {
    int status;
    char *body; /* malloc'd, freed by the layer; NULL: none */
    size_t len;
    const char *content_type;
    int retry_after; /* seconds; 0: no Retry-After */
    const char *allow; /* Allow, or NULL */
    const char *extra_name; /* one more header, or NULL */
    const char *extra_value;
    int close; /* close the connection after this answer */
} http_response;

/* Binds addr and starts the threads (start-up: err names the reason). */
http_server *http_start(const struct sockaddr *addr, socklen_t addrlen, const http_limits *l, const http_handler *h,
                        char *err, size_t errlen);
int http_port(const http_server *s);

/* Answers the request on c: only from a handler callback for c. The body
 * is the layer's from here, also on failure. A HEAD request gets the
 * headers only. Returns 0, or -1 when the answer cannot be sent (the
 * connection is closed and done() reports it undelivered). Given while
 * the body is still arriving (over a limit, say), the answer goes at once
 * and the connection closes after the body; over HTTPS it goes when the body
 * has ended. Either way the rest is read and dropped, 64 MiB at most. */
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

/* What admission did since start (counters) and holds now. */
typedef struct http_counters {
    unsigned long long refused_limit; /* 503: no slot came free within a second */
    unsigned long long refused_client; /* 503: the address is over client_limit */
    unsigned long long refused_fds; /* 503: out of file descriptors */
    unsigned long long evicted; /* closed without a complete head, for a waiting request */
    unsigned long long first_byte_timeout; /* closed having sent nothing (in dropped_slow too) */
    unsigned long long not_http; /* 400: the first bytes were not HTTP */
    unsigned long long incomplete_head; /* 400: the client closed its side mid-head */
    long pending; /* waiting for their first bytes or a slot */
} http_counters;
void http_counters_get(http_server *s, http_counters *out);

/* Stops accepting and closes the listening socket; open connections
 * carry on, and each closes after its next answer. */
void http_quiesce(http_server *s);

/* Closes every connection (requests still open end undelivered) and
 * stops the threads. No request may be waiting for a wake. */
void http_stop(http_server *s);

#endif
