/* resnetd: start-up, signals and graceful drain.
 *
 * Start-up aborts with a one-line message on any problem (bad config,
 * weights, labels, no device). Order: config -> weights -> labels (one per class) ->
 * engine -> queue/infer -> decode threads and HTTP server (healthz
 * answers) -> warm-up batch -> batcher -> ready (readyz 200, READY=1 to
 * systemd).
 *
 * SIGTERM/SIGINT drain: readiness 503, no new connections, every accepted
 * request answered, exit 0; a second signal exits at once. SIGHUP and
 * SIGUSR1 are logged and otherwise ignored (resnetd logs to stderr, so
 * there is no log file to reopen, and the configuration is read only at
 * start-up): a stray `kill -HUP` or logrotate must never drop requests.
 * Signals cannot be blocked in every thread (libraries start threads
 * before main), so a handler that may run on any thread writes the signal
 * to a self-pipe; the main thread polls it, which also paces the systemd
 * watchdog. */
#define _GNU_SOURCE  /* pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <config.h>  /* autoconf's, not daemon/config.h: <> skips this directory */
#include "daemon/batcher.h"
#include "daemon/budget.h"
#include "daemon/config.h"
#include "daemon/infer.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "daemon/notify.h"
#include "daemon/queue.h"
#include "daemon/server.h"
#include "model/clock.h"
#include "model/devjpeg.h"
#include "model/engine.h"
#include "model/labels.h"
#include "model/resnet18.h"

#define SYNTHETIC_SEED 20240601u
/* After drain_timeout_ms, queued requests are answered 503; batches already
 * in the engine, and images being decoded, get this much longer to finish. */
#define DRAIN_GRACE_MS 5000

/* The labels file: --labels, else labels_default_path() (the installed
 * copy, or the source tree's when resnetd runs uninstalled). */
static const char *labels_path(const config *c)
{
    if (c->labels[0])
        return c->labels;
    const char *p = labels_default_path();
    if (strncmp(p, RESNETD_DATADIR "/", strlen(RESNETD_DATADIR "/")) != 0)
        log_info("not installed: using labels from %s", p);
    return p;
}

/* CPUs this process may run on (taskset, cgroup cpusets), which is what the
 * "auto" thread counts should follow, not every CPU online. */
static long usable_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

static engine *create_engine(const config *given, config *resolved, const resnet18_weights *w,
                             char *err, size_t errlen)
{
    engine_config ec = { 0 };
    if (engine_parse_device(given->device, &ec.device, &ec.device_index) != 0 ||
        engine_parse_precision(given->precision, &ec.precision) != 0) {
        snprintf(err, errlen, "bad device or precision");   /* validated by config already */
        return NULL;
    }
    long ncpus = usable_cpus();
    *resolved = *given;
    config_resolve(resolved, ec.device == ENGINE_DEVICE_CUDA, ncpus);
    ec.max_batch = (int)resolved->max_batch_size;
    ec.threads = (int)given->engine_threads;
    engine *e = engine_create(w, &ec, err, errlen);
    if (!e)
        return NULL;
    /* device=auto: the defaults depend on what engine_create found. */
    if (ec.device == ENGINE_DEVICE_AUTO && e->device == ENGINE_DEVICE_CUDA) {
        *resolved = *given;
        config_resolve(resolved, 1, ncpus);
        if (resolved->max_batch_size != ec.max_batch) {
            engine_destroy(e);
            ec.device = ENGINE_DEVICE_CUDA;
            ec.max_batch = (int)resolved->max_batch_size;
            e = engine_create(w, &ec, err, errlen);
        }
    }
    return e;
}

/* The batching policy for the engine that was created: the checks that
 * need the resolved max batch ("auto" options, CUDA or CPU) are here, and
 * --check-config runs them too. */
static int engine_policy(const config *rc, const engine *e, batcher_policy *policy, char *err, size_t errlen)
{
    *policy = (batcher_policy){ .max_batch = e->max_batch, .max_delay_us = (uint64_t)rc->max_queue_delay_us };
    policy->npreferred = config_preferred_sizes(rc->preferred_batch_sizes, policy->preferred,
                                                BATCHER_MAX_PREFERRED, err, errlen);
    if (policy->npreferred < 0)
        return -1;
    for (int i = 0; i < policy->npreferred; i++)
        if (policy->preferred[i] > e->max_batch) {
            snprintf(err, errlen, "preferred_batch_sizes: %d is larger than the %s engine's max batch %d "
                     "(max_batch_size)", policy->preferred[i], engine_device_name(e->device), e->max_batch);
            return -1;
        }
    return 0;
}

/* decode = gpu demands the device decoder; auto takes it when there is
 * one and says why not otherwise. */
static int create_devjpeg(const config *rc, engine *e, devjpeg **out)
{
    char err[512];
    devjpeg_mode mode;
    *out = NULL;
    if (devjpeg_parse_mode(rc->decode, &mode) != 0 || mode == DEVJPEG_MODE_CPU)
        return 0;
    if (mode == DEVJPEG_MODE_AUTO && e->device != ENGINE_DEVICE_CUDA)
        return 0;
    *out = devjpeg_create(e, (size_t)rc->gpu_decode_memory, (int)rc->decode_threads, mode == DEVJPEG_MODE_GPU_EXACT,
                          err, sizeof err);
    if (*out)
        return 0;
    if (mode != DEVJPEG_MODE_AUTO) {
        log_error("decode = %s: %s", rc->decode, err);
        return -1;
    }
    log_info("decode = auto: decoding JPEGs on the CPU (%s)", err);
    return 0;
}

static int warm_up(engine *e, char *err, size_t errlen)
{
    /* A full batch of mid-grey images: touches every buffer the engine
     * will use, so the first client does not pay for it. */
    memset(e->input[0], 128, (size_t)e->max_batch * RESNET18_INPUT_BYTES);
    if (engine_submit(e, 0, e->max_batch, err, errlen) != 0 || engine_wait(e, 0, err, errlen) != 0)
        return -1;
    return 0;
}

static int sig_pipe[2] = { -1, -1 };
static volatile sig_atomic_t signals_seen;

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    if (sig == SIGHUP || sig == SIGUSR1) {
        ssize_t w = write(sig_pipe[1], &b, 1);
        (void)w;
        errno = saved;
        return;
    }
    if (signals_seen++ > 0) {
        static const char msg[] = "resnetd: second signal: exiting without finishing the drain\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
        _exit(1);
    }
    ssize_t w = write(sig_pipe[1], &b, 1);
    (void)w;
    errno = saved;
}

static int signals_setup(void)
{
    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
        return -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0 ||
        sigaction(SIGHUP, &sa, NULL) != 0 || sigaction(SIGUSR1, &sa, NULL) != 0)
        return -1;
    sa.sa_handler = SIG_IGN;
    return sigaction(SIGPIPE, &sa, NULL);
}

/* The first SIGTERM/SIGINT within ms milliseconds, or 0. SIGHUP and
 * SIGUSR1 are logged on the way. */
static int signal_wait(long ms)
{
    uint64_t deadline = clock_now_us() + (uint64_t)(ms < 0 ? 0 : ms) * 1000u;
    for (;;) {
        long left = ms < 0 ? -1 : (long)((deadline > clock_now_us() ? deadline - clock_now_us() : 0) / 1000u);
        struct pollfd pfd = { .fd = sig_pipe[0], .events = POLLIN };
        int n = poll(&pfd, 1, (int)left);
        if (n < 0 && errno == EINTR)
            continue;
        unsigned char b;
        if (n <= 0 || read(sig_pipe[0], &b, 1) != 1)
            return 0;
        if (b != SIGHUP && b != SIGUSR1)
            return b;
        log_info("%s: ignored (logs go to stderr; the configuration is read at start-up only)", strsignal(b));
    }
}

/* Waits up to ms until count(srv) is 0 (a second signal exits meanwhile,
 * from the handler). */
static int wait_for_zero(server *srv, long (*count)(server *), long ms)
{
    uint64_t deadline = clock_now_us() + (uint64_t)ms * 1000u;
    while (count(srv) > 0) {
        if (clock_now_us() >= deadline)
            return -1;
        struct timespec ts = { 0, 20 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    return 0;
}

int main(int argc, char **argv)
{
    char err[1024];
    config cfg, rc;
    config_cli cli;
    if (config_load(&cfg, &cli, argc, argv, err, sizeof err) != 0) {
        fprintf(stderr, "resnetd: %s\n", err);
        return 2;
    }
    if (cli.help) {
        config_print_help(stdout, "resnetd");
        return 0;
    }
    if (cli.version) {
        printf("resnetd %s\n", PACKAGE_VERSION);
        return 0;
    }
    if (config_validate(&cfg, err, sizeof err) != 0) {
        log_error("%s%s%s", cli.config_path ? cli.config_path : "", cli.config_path ? ": " : "", err);
        return 1;
    }
    /* Weights first: their head sets how many class names the labels need. */
    int synthetic = strcmp(cfg.weights, "synthetic") == 0;
    resnet18_weights w;
    int wrc = synthetic ? weights_synthetic(SYNTHETIC_SEED, &w, err, sizeof err)
                        : weights_load(cfg.weights, &w, err, sizeof err);
    if (wrc != 0) {
        log_error("%s", err);
        return 1;
    }
    const char *lpath = labels_path(&cfg);
    labels lab;
    if (labels_load(lpath, w.classes, &lab, err, sizeof err) != 0) {
        log_error("labels: %s; weights %s", err, cfg.weights);
        weights_free(&w);
        return 1;
    }
    if (synthetic && !cli.check_config)
        log_warn("--weights synthetic: random weights, for load testing only; every answer is marked");

    if (signals_setup() != 0) {
        log_error("cannot set up signal handling: %s", strerror(errno));
        return 1;
    }

    engine *e = create_engine(&cfg, &rc, &w, err, sizeof err);
    if (!e) {
        log_error("engine: %s", err);
        return 1;
    }
    batcher_policy policy;
    if (engine_policy(&rc, e, &policy, err, sizeof err) != 0) {
        log_error("%s", err);
        return 1;
    }
    const char *device = engine_device_name(e->device);
    const char *precision = engine_precision_name(e->precision);
    devjpeg *dj = NULL;
    if (create_devjpeg(&rc, e, &dj) != 0)
        return 1;
    /* --check-config stops here: after every check start-up makes before
     * it binds the port, the engine's (the resolved max batch) and the
     * device decoder's included. */
    if (cli.check_config) {
        printf("resnetd: configuration OK (weights %s, %d classes, labels %s, %s engine, max batch %d, "
               "%s decode)\n", cfg.weights, e->classes, lpath, device, e->max_batch, dj ? "gpu" : "cpu");
        devjpeg_destroy(dj);
        engine_destroy(e);
        weights_free(&w);
        labels_free(&lab);
        return 0;
    }
    metrics_init(PACKAGE_VERSION, device, precision);
    /* Engine and decoder buffers are all allocated at creation, so this is set once. */
    metrics_set_memory((e->ops->device_memory ? e->ops->device_memory(e->ctx) : 0) +
                           (dj ? devjpeg_device_memory(dj) : 0),
                       e->ops->pinned_memory ? e->ops->pinned_memory(e->ctx) : 0);

    response_service svc = {
        .device = device, .device_index = e->device_index, .precision = precision,
        .synthetic = synthetic, .classes = e->classes, .labels = &lab, .labels_path = lpath,
        .weights_path = cfg.weights, .weights_sha256 = w.sha256,
        .max_batch_size = e->max_batch, .max_queue_delay_us = rc.max_queue_delay_us,
        .preferred_batch_sizes = rc.preferred_batch_sizes, .queue_capacity = (int)rc.queue_capacity,
        .request_timeout_ms = rc.request_timeout_ms, .max_body_bytes = rc.max_body_bytes,
        .max_pixels = rc.max_pixels, .decode = dj ? (strcmp(rc.decode, "gpu-exact") == 0 ? "gpu-exact" : "gpu") : "cpu",
    };

    /* Request bodies being received or decoded; decode buffers may be
     * charged here too. */
    budget bodies;
    budget_init(&bodies, (size_t)rc.body_memory_bytes);
    queue *q = NULL;
    infer *inf = NULL;
    server *srv = NULL;
    batcher *bat = NULL;
    if (!(q = queue_create((int)rc.queue_capacity, err, sizeof err)) ||
        !(inf = infer_create(e, dj, &server_sink, err, sizeof err)) ||
        !(srv = server_start(&rc, &svc, q, inf, dj, &bodies, err, sizeof err))) {
        log_error("%s", err);
        return 1;
    }
    log_info("listening on %s (port %d): %s engine, %s, %d classes, max batch %d, max queue delay %ld us, "
             "queue %ld, %ld HTTP threads, %ld decode threads, JPEG decoding on the %s", rc.listen, server_port(srv),
             device, precision, e->classes, e->max_batch, rc.max_queue_delay_us, rc.queue_capacity, rc.threads,
             rc.decode_threads, dj ? (strcmp(rc.decode, "gpu-exact") == 0 ? "GPU (nvJPEG hardware, libjpeg-exact)"
                                                                   : "GPU (nvJPEG hardware)")
                                 : "CPU (libjpeg-turbo)");

    uint64_t t0 = clock_now_us();
    if (warm_up(e, err, sizeof err) != 0) {
        log_error("warm-up batch failed: %s", err);
        return 1;
    }
    if (!(bat = batcher_start(q, inf, &policy, &server_sink, dj, (uint64_t)rc.max_pixels, err, sizeof err))) {
        log_error("%s", err);
        return 1;
    }
    server_set_warm(srv);
    metrics_set_ready(1);
    notify_send("READY=1");
    log_info("ready (warm-up batch of %d took %.1f ms)", e->max_batch, (double)(clock_now_us() - t0) / 1e3);

    uint64_t watchdog = notify_watchdog_usec();
    int sig;
    while ((sig = signal_wait(watchdog ? (long)(watchdog / 2000u) : -1)) == 0)
        if (watchdog)
            notify_send("WATCHDOG=1");

    log_info("%s: draining (up to %ld ms)", strsignal(sig), rc.drain_timeout_ms);
    notify_send("STOPPING=1");
    metrics_set_ready(0);
    server_begin_drain(srv);
    queue_set_flush(q, 1);
    if (wait_for_zero(srv, server_active, rc.drain_timeout_ms) != 0) {
        /* Not yet decoded: 503 (decodes under way finish and are queued). */
        int undecoded = server_cancel_decodes(srv);
        queue_item left[256];
        int n, failed = 0;
        while ((n = queue_take_all(q, left, 256)) > 0)
            for (int i = 0; i < n; i++, failed++) {
                queue_release(q, &left[i].slot, 1);
                server_sink.fail(left[i].req, left[i].image, 503, "shutting_down",
                                 "the server stopped before this request ran");
            }
        log_warn("drain timeout: %d requests waiting for a decoder and %d queued images answered 503; "
                 "%ld requests being decoded stop before their next image; "
                 "closing %ld unfinished connections", undecoded, failed, server_decoding(srv), server_active(srv));
        /* Batches already in the engine finish and are answered, decodes
         * finish their current image; libmicrohttpd must not be stopped
         * while any connection is suspended. */
        if (wait_for_zero(srv, server_suspended, DRAIN_GRACE_MS) != 0) {
            long decoding = server_decoding(srv);
            log_error("%ld requests still unanswered after %d ms more (%ld decoding an image, %ld in the "
                      "engine); exiting", server_suspended(srv), DRAIN_GRACE_MS, decoding,
                      server_suspended(srv) - decoding);
            _exit(1);
        }
        /* Let the 503s just queued reach their clients. */
        wait_for_zero(srv, server_active, 250);
    }
    queue_stop(q);
    batcher_join(bat);
    infer_stop(inf);
    server_stop(srv);
    infer_destroy(inf);
    queue_destroy(q);
    devjpeg_destroy(dj);
    engine_destroy(e);
    weights_free(&w);
    labels_free(&lab);
    log_info("stopped");
    return 0;
}
