/* Client connections: a table of every open one, and the reaper thread
 * that drops the ones too slow to be worth a slot (slowloris).
 *
 * libmicrohttpd's connection timeout is an idle timeout: each byte resets
 * it, so a client sending one byte every few seconds would hold its slot
 * forever. Here a request must meet two bounds instead:
 *   - its headers arrive complete within header_timeout of the connection
 *     opening (or of the previous answer on a kept-alive connection);
 *   - its body then arrives at an average of at least min_rate bytes/s,
 *     measured from the end of the headers, once header_timeout has passed.
 * While the server holds the request (decoding, queued, answering) the
 * client is not timed.
 *
 * Threads: libmicrohttpd's threads open, close and move connections
 * between phases; the reaper reads them; one mutex guards the table. A
 * connection leaves the table (NOTIFY_CLOSED) before libmicrohttpd closes
 * its socket, so the reaper's shutdown() never reaches a reused fd. The
 * reaper only shuts the socket down: libmicrohttpd then sees the end of
 * the stream and closes the connection through its normal path. */
#ifndef RESNETD_CONN_H
#define RESNETD_CONN_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    CONN_HEADERS,           /* waiting for a request's headers */
    CONN_BODY,              /* reading a request body */
    CONN_SERVER,            /* the server's turn: processing or answering */
} conn_phase;

typedef enum {
    CONN_OK,
    CONN_SLOW_HEADERS,      /* headers not complete within header_timeout */
    CONN_SLOW_BODY,         /* body below min_rate */
} conn_verdict;

typedef struct conn_limits {
    uint64_t header_timeout_us;
    uint64_t min_rate;      /* body bytes per second; 0: no minimum */
} conn_limits;

/* The pure decision: a connection in phase since since_us that has
 * received body bytes in that phase, judged at now_us. */
conn_verdict conn_judge(const conn_limits *l, conn_phase phase, uint64_t since_us, uint64_t body_bytes,
                        uint64_t now_us);

typedef struct conn conn;
typedef struct conn_table conn_table;

/* Starts the reaper (start-up: errors name the reason). */
conn_table *conn_table_start(const conn_limits *l, char *err, size_t errlen);
/* Stops the reaper and frees the table; every connection must be closed. */
void conn_table_stop(conn_table *t);

/* A new connection on socket fd, in CONN_HEADERS; NULL out of memory (the
 * connection is then not timed, only counted by libmicrohttpd). */
conn *conn_open(conn_table *t, int fd);
/* Before libmicrohttpd closes the socket. NULL is ignored. */
void conn_close(conn_table *t, conn *c);

/* Enters a phase (its clock and byte count restart). NULL is ignored. */
void conn_set_phase(conn_table *t, conn *c, conn_phase p);
/* Body bytes received in CONN_BODY. */
void conn_add_body(conn_table *t, conn *c, size_t n);
/* Did the reaper drop this connection? */
int conn_dropped(conn_table *t, conn *c);

long conn_count(conn_table *t);
/* Connections dropped for being too slow, since start. */
unsigned long long conn_dropped_total(conn_table *t);

#endif
