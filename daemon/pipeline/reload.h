/* The hot reload of the served model (daemon/pipeline/served_model.h).
 *
 * The reloader is one thread. A reload (SIGHUP, or POST
 * /v2/repository/models/resnet18/load) reads the configuration again as at
 * start-up, loads the weights and labels it names, builds a second engine
 * like each running one (one per GPU) and warms it up beside it, then has
 * each pipeline swap engines between two batches (infer_swap); an old
 * engine is destroyed once its last batch has been answered. Nothing is dropped: requests keep
 * queueing meanwhile. A failed load changes nothing and says why. Options
 * other than weights and labels are not applied (they size buffers and
 * threads): a changed one is named in the log as needing a restart.
 * Requests that arrive during a reload are served by the next one, so
 * their answer reflects files as they were when they asked. */
#ifndef RESNETD_RELOAD_H
#define RESNETD_RELOAD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include "daemon/config_table.h"
#include "daemon/pipeline/served_model.h"

/* A repository load request's body: empty, or a JSON object with no (or
 * empty) "parameters". 0, or -1 with why. */
int reload_parse_request(const uint8_t *body, size_t len, char *why, size_t whylen);

struct infer;

/* done(cls, 0, message) after a successful reload, done(cls, -1, why)
 * after a failed one, done(cls, RELOAD_REFUSED, why) when it was not tried
 * (the server drains); called on the reloader thread, or in
 * reloader_drain / reloader_stop. */
#define RELOAD_REFUSED (-2)
typedef void (*reload_done_fn)(void *cls, int rc, const char *message);

typedef struct reloader reloader;

/* argc/argv: the daemon's command line, read again on each reload; given:
 * the configuration start-up read (before "auto" was resolved), which a
 * reload compares with. inf: the ninf engines' pipelines; each new engine
 * is like the one it replaces (device, precision, max batch, slots;
 * given's engine_threads). */
reloader *reloader_start(int argc, char **argv, const config *given, struct infer *const *inf, int ninf, char *err,
                         size_t errlen);

/* Asks for a reload; done (may be NULL) hears the outcome. -1 once
 * stopping. Never blocks on the reload itself. */
int reloader_request(reloader *rl, reload_done_fn done, void *cls);

/* The server drains: new requests are refused, those waiting are answered
 * RELOAD_REFUSED now (so the drain does not wait for another reload), and
 * a reload under way finishes and answers its own. */
void reloader_drain(reloader *rl);
/* Lets a reload under way finish, answers requests not yet started with
 * RELOAD_REFUSED and joins the thread. */
void reloader_stop(reloader *rl);
void reloader_destroy(reloader *rl);

#endif
