/* Admission, what the HTTP layer (daemon/http/http.c) does before a connection
 * reaches libmicrohttpd: one thread accepts on the listening socket and
 * holds each new connection until its first bytes come, checks that they
 * look like HTTP (or TLS, on an HTTPS listener), and hands it over while
 * fewer than connection_limit are open.
 *
 * This is what keeps idle sockets from taking the service down: they wait
 * here, outside the limit, in a table of pending_limit entries (the oldest
 * closed when it is full), and past a first-byte timeout (header_timeout,
 * a second under pressure). Each address (an IPv6 /64) may hold
 * client_limit connections, pending and open together; more get 503 + Retry-After.
 * At the limit, open connections that have waited a quarter of a second
 * or more for a complete head are closed, oldest first (the evict
 * callback), for requests that wait; one that
 * gets no slot within a second gets 503. Bytes that are not HTTP get 400
 * at once. Plain-HTTP answers are written without blocking; all refusals
 * are counted. */
#ifndef RESNETD_ADMIT_H
#define RESNETD_ADMIT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

typedef struct admit admit;
typedef struct admit_client admit_client; /* one address's count */

typedef struct admit_limits {
    long connection_limit; /* open (handed over) at once */
    long client_limit; /* per address, pending and open; 0: none */
    long pending_limit; /* waiting for first bytes or a slot */
    uint64_t header_timeout_us; /* the first byte's bound without pressure */
    int tls; /* the listener speaks HTTPS */
} admit_limits;

typedef struct admit_ops {
    void *cls;
    /* Connections handed over and not yet closed. */
    long (*open)(void *cls);
    /* Takes fd (closing it on failure); 0 when taken. */
    int (*hand_over)(void *cls, int fd, const struct sockaddr *addr, socklen_t alen);
    /* Closes up to n open connections that have no complete head, oldest
     * first; returns how many. Each one's close is reported with
     * admit_closed(..., 1). */
    long (*evict)(void *cls, long n);
} admit_ops;

typedef struct admit_counters {
    unsigned long long refused_limit, refused_client, refused_fds;
    unsigned long long evicted, first_byte_timeout, not_http;
    long pending;
} admit_counters;

/* Starts the acceptor on lfd (listening, non-blocking; admission closes
 * it), storing it in *slot before its thread can hand anything over (the
 * callbacks of a connection it hands over use *slot). Start-up only: err
 * names the reason. Returns 0 or -1. */
int admit_start(admit **slot, int lfd, const admit_limits *l, const admit_ops *ops, char *err, size_t errlen);

/* Stops accepting and closes the listening socket; connections already
 * pending are still handed over. */
void admit_quiesce(admit *a);

/* Stops the thread and closes the connections still pending (a request
 * that came gets 503). Connections handed over may still report their
 * close (admit_closed) until admit_free. */
void admit_stop(admit *a);
void admit_free(admit *a);

/* The address entry of a connection handed over (for admit_closed);
 * NULL if none (the address was never admitted). */
admit_client *admit_client_of(admit *a, const struct sockaddr *addr);

/* A handed-over connection closed; evicted: admit's evict closed it. */
void admit_closed(admit *a, admit_client *cl, int evicted);

/* From evict, for each connection before it is shut down. */
void admit_evicting(admit *a);

/* More than three quarters of connection_limit open, or the pending table
 * half full: heads are due within a second. */
int admit_pressure(admit *a);

void admit_counters_get(admit *a, admit_counters *out);

/* An error answer of the API's form ({"error": {status, code, message}};
 * v2: the Open Inference Protocol's {"error": message}) with Connection:
 * close, into buf. message must need no JSON escaping. Returns its length
 * (0 if it does not fit). */
size_t admit_error_answer(char *buf, size_t cap, int status, const char *code, const char *message, int v2,
                          int retry_after);

/* Writes n bytes without blocking; 0 when all went. */
int admit_send(int fd, const char *buf, size_t n);

#endif
