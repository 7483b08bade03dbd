/* resnetd: start-up, signals and graceful drain.
 *
 * Start-up aborts with a one-line message on any problem (bad config,
 * weights, labels, no device). Order: config -> weights -> labels (one per class) ->
 * engine -> queue/infer -> decode threads and HTTP server (healthz
 * answers) -> warm-up batch -> batcher -> ready (readyz 200, READY=1 to
 * systemd).
 *
 * SIGTERM/SIGINT drain: readiness 503, no new connections, every accepted
 * request answered, exit 0; a second signal exits at once. SIGHUP reloads
 * the weights and labels without dropping a request (daemon/pipeline/reload.h);
 * SIGUSR1 is logged and ignored (resnetd logs to stderr: there is no log
 * file to reopen, and a stray signal from logrotate must not kill it).
 * Signals cannot be blocked in every thread (libraries start threads
 * before main), so a handler that may run on any thread writes the signal
 * to a self-pipe; the main thread polls it, which also paces the systemd
 * watchdog. */
#define _GNU_SOURCE /* pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/resource.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <config.h> /* autoconf's, not daemon/config_table.h: <> skips this directory */
#include "daemon/pipeline/batcher.h"
#include "daemon/http/budget.h"
#include "daemon/api/classify.h"
#include "daemon/config_table.h"
#include "daemon/pipeline/infer.h"
#include "daemon/api/gputel.h"
#include "daemon/log.h"
#include "daemon/api/metrics.h"
#include "daemon/notify.h"
#include "daemon/pipeline/queue.h"
#include "daemon/api/server.h"
#include "engine/calib.h"
#include "util/clock.h"
#include "image/devjpeg.h"
#include "image/devjpeg_registry.h"
#include "engine/engine.h"
#include "engine/engine_cpu.h"
#include "engine/engine_registry.h"
#include "model/labels.h"
#include "model/resnet18.h"
#include "util/textfile.h"
#include "util/utf8.h"

/* After drain_timeout_ms, queued requests are answered 503; batches already
 * in the engine, and images being decoded, get this much longer to finish. */
#define DRAIN_GRACE_MS 5000

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

/* A cgroup's memory limit: the file below root/<dir>, or -1 (none, "max",
 * or v1's "unlimited", a number near 2^63). */
static long long cgroup_limit(const char *root, const char *dir, const char *file)
{
    char path[4300], buf[64];
    snprintf(path, sizeof path, "%s%s/%s", root, strcmp(dir, "/") == 0 ? "" : dir, file);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long long v = -1;
    if (fgets(buf, sizeof buf, f) && strncmp(buf, "max", 3) != 0)
        v = strtoll(buf, NULL, 10);
    fclose(f);
    return v > 0 && v < (1LL << 60) ? v : -1;
}

/* Memory this process may use, which the "auto" memory budget follows: the
 * physical memory, or less where a cgroup (systemd's MemoryMax=, a
 * container's limit; v2, or v1's memory controller) caps this process's
 * group or one above it; 0 when unknown. */
static long long usable_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    long long mem = pages > 0 && page > 0 ? (long long)pages * page : 0;
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f)
        return mem;
    char line[4096], dir[4096];
    while (fgets(line, sizeof line, f)) {
        const char *root, *file, *p;
        if (strncmp(line, "0::", 3) == 0) {
            root = "/sys/fs/cgroup", file = "memory.max", p = line + 3;
        } else if ((p = strstr(line, ":memory:")) != NULL) {
            root = "/sys/fs/cgroup/memory", file = "memory.limit_in_bytes", p += 8;
        } else {
            continue;
        }
        snprintf(dir, sizeof dir, "%.4000s", p);
        dir[strcspn(dir, "\n")] = '\0';
        for (;;) { /* this group, then each one above it */
            long long lim = cgroup_limit(root, dir, file);
            if (lim > 0 && (mem == 0 || lim < mem))
                mem = lim;
            /* up to the hierarchy's root, read last: in a container it is
             * the container's own group, where its limit is */
            char *slash = strrchr(dir, '/');
            if (!slash || strcmp(dir, "/") == 0)
                break;
            slash[slash == dir] = '\0';
        }
    }
    fclose(f);
    return mem;
}

/* The engine for device (d, index) as given configures it; *resolved gets
 * given with its "auto" options resolved for the device found. */
static engine *create_engine(const config *given, engine_device d, int index, config *resolved,
                             const resnet18_weights *w, const calib_table *calib, char *err, size_t errlen)
{
    engine_config ec = { .device = d, .device_index = index, .calib = calib };
    if (engine_parse_precision(given->precision, &ec.precision) != 0) {
        snprintf(err, errlen, "bad precision"); /* validated by config already */
        return NULL;
    }
    long ncpus = usable_cpus();
    long long memory = usable_memory();
    *resolved = *given;
    config_resolve(resolved, ec.device == ENGINE_DEVICE_CUDA, ncpus, memory);
    ec.max_batch = (int)resolved->max_batch_size;
    ec.threads = (int)given->engine_threads;
    ec.deterministic = config_bool(given->deterministic);
    if (engine_tuning_parse(given->gpu_tuning, &ec.tuning, err, errlen) != 0)
        return NULL; /* validated by config already */
    engine *e = engine_create(w, &ec, err, errlen);
    if (!e)
        return NULL;
    /* device=auto: the defaults depend on what engine_create found. */
    if (ec.device == ENGINE_DEVICE_AUTO && e->device == ENGINE_DEVICE_CUDA) {
        *resolved = *given;
        config_resolve(resolved, 1, ncpus, memory);
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
static int engine_policy(const config *rc, const engine *e, batch_policy *policy, char *err, size_t errlen)
{
    *policy = (batch_policy){ .max_batch = e->max_batch, .max_delay_us = (uint64_t)rc->max_queue_delay_us };
    policy->npreferred = config_preferred_sizes(rc->preferred_batch_sizes, policy->preferred, BATCH_MAX_PREFERRED, err,
                                                errlen);
    if (policy->npreferred < 0)
        return -1;
    for (int i = 0; i < policy->npreferred; i++)
        if (policy->preferred[i] > e->max_batch) {
            snprintf(err, errlen,
                     "preferred_batch_sizes: %d is larger than the %s engine's max batch %d "
                     "(max_batch_size)",
                     policy->preferred[i], engine_device_name(e->device), e->max_batch);
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
    size_t arena = rc->gpu_decode_memory == CONFIG_AUTO ? 0 : (size_t)rc->gpu_decode_memory;
    *out = devjpeg_create(e, arena, (int)rc->decode_threads, mode == DEVJPEG_MODE_GPU_EXACT, err, sizeof err);
    if (*out)
        return 0;
    if (mode != DEVJPEG_MODE_AUTO) {
        log_error("decode = %s: %s", rc->decode, err);
        return -1;
    }
    log_info("decode = auto: decoding JPEGs on the CPU (%s)", err);
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
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGHUP, &sa, NULL) != 0 ||
        sigaction(SIGUSR1, &sa, NULL) != 0)
        return -1;
    sa.sa_handler = SIG_IGN;
    return sigaction(SIGPIPE, &sa, NULL);
}

/* The first SIGTERM/SIGINT within ms milliseconds, or 0. On the way
 * SIGHUP asks rl for a reload (it logs the outcome); SIGUSR1 is logged. */
static int signal_wait(reloader *rl, long ms)
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
        if (b == SIGUSR1)
            log_info("%s: ignored (logs go to stderr)", strsignal(b));
        else if (reloader_request(rl, NULL, NULL) == 0)
            log_info("%s: reloading the weights and labels", strsignal(b));
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

/* Exit statuses that restarting cannot fix (the unit's
 * RestartPreventExitStatus): a configuration that does not parse or is
 * invalid, and a file it names (weights, labels, calibration) that cannot
 * be loaded. Anything else that fails at start-up (the engine, the GPU)
 * exits 1 and may succeed on a restart. */
#define EXIT_BAD_CONFIG 2
#define EXIT_BAD_FILE 3
#define TLS_PEM_MAX (1 << 20) /* a certificate chain or key file */

/* Every connection, open or waiting for its first bytes, is a descriptor:
 * the soft limit is raised to the hard one (the soft default, 1024, is
 * below what the default connection_limit needs), and a limit still too
 * low is named at start-up rather than found under load. */
static void raise_fd_limit(const config *c)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0 && getrlimit(RLIMIT_NOFILE, &rl) != 0)
            return;
    }
    rlim_t need = (rlim_t)c->connection_limit * 2 + 256; /* open + waiting, files, threads */
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need)
        log_warn("the file descriptor limit (%llu) is below what connection_limit %ld needs (%llu): beyond it "
                 "connections get 503; raise LimitNOFILE or ulimit -n",
                 (unsigned long long)rl.rlim_cur, c->connection_limit, (unsigned long long)need);
}

/* HTTPS: both PEM files read at start-up, so that a wrong path exits 3
 * (EXIT_BAD_FILE). pem[0], pem[1]: the certificate and key, or NULL. */
static int read_tls(const config *cfg, const char *config_path, char *pem[2])
{
    if (!cfg->tls_certificate[0])
        return 0;
    static const char *const keys[2] = { "tls_certificate", "tls_key" };
    const char *paths[2] = { cfg->tls_certificate, cfg->tls_key };
    char err[1024];
    for (int i = 0; i < 2; i++) {
        size_t len;
        if (textfile_read(paths[i], TLS_PEM_MAX, &pem[i], &len, err, sizeof err) != 0 || strlen(pem[i]) != len ||
            !strstr(pem[i], "-----BEGIN ")) {
            char where[CONFIG_PATH_MAX + 64];
            config_where(cfg, config_path, keys[i], where, sizeof where);
            log_error("%s: %s", where, pem[i] ? "not a PEM file" : err);
            return -1;
        }
    }
    return 0;
}

/* The engines and their device decoders, one per device. */
typedef struct engine_set {
    int n;
    engine *eng[ENGINE_MAX_DEVICES];
    devjpeg *dj[ENGINE_MAX_DEVICES];
    char labels[ENGINE_MAX_DEVICES * 12]; /* "cuda:0,cuda:1" */
    size_t gpu_bytes, pinned_bytes; /* all allocated at creation: set once */
} engine_set;

/* One engine per device: a pipeline each (its slots, device JPEG decoder,
 * batcher thread), all fed from one queue, so whichever engine has a free
 * slot takes the next batch. rc: the configuration resolved for the first
 * engine. Says why and returns -1 on failure. */
static int open_engines(const config *cfg, config *rc, const resnet18_weights *w, const calib_table *calib,
                        engine_set *es)
{
    char err[1024];
    engine_device kind;
    int devs[ENGINE_MAX_DEVICES];
    memset(es, 0, sizeof *es);
    if (engine_parse_devices(cfg->device, &kind, devs, ENGINE_MAX_DEVICES, &es->n) != 0)
        return -1; /* validated by config already */
    if (es->n == 0) { /* cuda:all */
        es->n = engine_cuda_device_count();
        if (es->n == 0) {
            log_error("device = cuda:all: no CUDA device is usable");
            return -1;
        }
        es->n = es->n > ENGINE_MAX_DEVICES ? ENGINE_MAX_DEVICES : es->n;
        for (int i = 0; i < es->n; i++)
            devs[i] = i;
    }
    for (int i = 0; i < es->n; i++) {
        if (!(es->eng[i] = create_engine(cfg, kind, devs[i], rc, w, calib, err, sizeof err))) {
            log_error("engine: %s", err);
            return -1;
        }
        if (create_devjpeg(rc, es->eng[i], &es->dj[i]) != 0)
            return -1;
        char label[32];
        infer_engine_label(es->eng[i], label, sizeof label);
        snprintf(es->labels + strlen(es->labels), sizeof es->labels - strlen(es->labels), "%s%s", i ? "," : "", label);
        es->gpu_bytes += engine_device_memory(es->eng[i]) + (es->dj[i] ? devjpeg_device_memory(es->dj[i]) : 0);
        es->pinned_bytes += engine_pinned_memory(es->eng[i]);
    }
    /* decode = auto: the server leaves a JPEG compressed for whichever
     * engine takes it, so either every engine has a device decoder or none
     * does. */
    int with_decoder = 0;
    for (int i = 0; i < es->n; i++)
        with_decoder += es->dj[i] != NULL;
    if (with_decoder > 0 && with_decoder < es->n) {
        log_info("decode = auto: only %d of %d GPUs have a device JPEG decoder; decoding JPEGs on the CPU",
                 with_decoder, es->n);
        for (int i = 0; i < es->n; i++) {
            es->gpu_bytes -= es->dj[i] ? devjpeg_device_memory(es->dj[i]) : 0;
            devjpeg_destroy(es->dj[i]);
            es->dj[i] = NULL;
        }
    }
    return 0;
}

static void log_listening(const config *rc, server *srv, const engine_set *es, int tls)
{
    const engine *e = es->eng[0];
    const char *decode = !es->dj[0]                             ? "CPU (libjpeg-turbo)"
                         : strcmp(rc->decode, "gpu-exact") == 0 ? "GPU (nvJPEG hardware, libjpeg-exact)"
                                                                : "GPU (nvJPEG hardware)";
    log_info("listening on %s%s (port %d): %s engine%s, %s, %d classes, max batch %d, max queue delay %ld us, "
             "queue %ld, %ld HTTP threads, %ld decode threads, JPEG decoding on the %s",
             tls ? "https://" : "", rc->listen, server_port(srv),
             es->n > 1 ? es->labels : engine_device_name(e->device), es->n > 1 ? "s" : "",
             engine_precision_name(e->precision), e->classes, e->max_batch, rc->max_queue_delay_us, rc->queue_capacity,
             rc->threads, rc->decode_threads, decode);
}

/* Metrics from start-up on: build, model, memory, and NVML's GPU telemetry
 * where there is a CUDA engine. */
static void metrics_start(const served_model *model, const engine_set *es)
{
    const engine *e = es->eng[0];
    metrics_init(PACKAGE_VERSION, engine_device_name(e->device), engine_precision_name(e->precision));
    metrics_set_model(model->version, (double)model->loaded_unix_ms / 1e3);
    metrics_set_int8(served_model_int8_mix(model), &model->int8_check);
    metrics_set_memory(es->gpu_bytes, es->pinned_bytes);
    if (e->device != ENGINE_DEVICE_CUDA)
        return;
    int cuda[ENGINE_MAX_DEVICES];
    for (int i = 0; i < es->n; i++)
        cuda[i] = es->eng[i]->device_index;
    int found = gputel_open(cuda, es->n);
    if (found > 0)
        metrics_set_gpu_probe(gputel_read);
    log_info("GPU telemetry (utilisation, power, energy, memory) in /metrics: %s", found == es->n ? "from NVML"
                                                                                   : found > 0
                                                                                       ? "from NVML, for some GPUs only"
                                                                                       : "none (no NVML)");
}

/* A warm-up batch on each engine, then its batcher thread. */
static int start_batchers(const config *rc, const engine_set *es, infer *const *inf, queue *q,
                          const batch_policy *policy, batcher **bat)
{
    char err[1024];
    for (int i = 0; i < es->n; i++) {
        if (engine_warm_up(es->eng[i], err, sizeof err) != 0) {
            log_error("warm-up batch failed on %s: %s", es->labels, err);
            return -1;
        }
        if (!(bat[i] = batcher_start(q, inf[i], policy, &classify_sink, es->dj[i], (uint64_t)rc->max_pixels, err,
                                     sizeof err))) {
            log_error("%s", err);
            return -1;
        }
    }
    return 0;
}

/* What runs between start-up and exit: the queue, one pipeline per engine,
 * the reloader and the server. */
typedef struct running {
    budget bodies; /* request bodies being received or decoded, decode buffers */
    decode_route route; /* GPU/CPU decode costs, measured by the completion and decode threads */
    queue *q;
    infer *inf[ENGINE_MAX_DEVICES];
    batcher *bat[ENGINE_MAX_DEVICES];
    reloader *rl;
    server *srv;
} running;

static int run_start(running *r, int argc, char **argv, const config *cfg, const config *rc,
                     const response_service *svc, const engine_set *es, served_model *model, const http_tls *tls)
{
    char err[1024];
    budget_init(&r->bodies, (size_t)rc->body_memory_bytes);
    if (!(r->q = queue_create((int)rc->queue_capacity, err, sizeof err))) {
        log_error("%s", err);
        return -1;
    }
    decode_route_init(&r->route, es->n);
    decode_route *rt = es->dj[0] ? &r->route : NULL;
    for (int c = -1; rt && c < ROUTE_CPU_CLASSES; c++) /* the seeds, until measured */
        metrics_set_decode_cost(c, c < 0 ? decode_route_gpu_ps(rt) : decode_route_cpu_ps(rt, c));
    for (int i = 0; i < es->n; i++)
        if (!(r->inf[i] = infer_create(es->eng[i], model, es->dj[i], rt, &classify_sink, err, sizeof err))) {
            log_error("%s", err);
            return -1;
        }
    raise_fd_limit(rc);
    if (!(r->rl = reloader_start(argc, argv, cfg, r->inf, es->n, err, sizeof err)) ||
        !(r->srv = server_start(rc, svc, r->q, r->inf, es->n, r->rl, es->dj[0], rt, &r->bodies, tls, err,
                                sizeof err))) {
        log_error("%s", err);
        return -1;
    }
    return 0;
}

/* After the drain: every thread joined, everything freed, the engines a
 * reload may have swapped in included. */
static void run_stop(running *r, engine_set *es)
{
    reloader_stop(r->rl);
    queue_stop(r->q);
    for (int i = 0; i < es->n; i++)
        batcher_join(r->bat[i]);
    for (int i = 0; i < es->n; i++)
        infer_stop(r->inf[i]);
    server_stop(r->srv);
    for (int i = 0; i < es->n; i++) {
        engine *cur = infer_engine(r->inf[i]); /* a reload may have replaced the first */
        infer_destroy(r->inf[i]);
        devjpeg_destroy(es->dj[i]);
        engine_destroy(cur);
    }
    queue_destroy(r->q);
    reloader_destroy(r->rl);
}

/* SIGTERM/SIGINT: stop taking requests and answer every one accepted, within
 * drain_timeout_ms (then 503s), or exit(1) if some still cannot be. */
static void drain(int sig, const config *rc, server *srv, reloader *rl, queue *q)
{
    log_info("%s: draining (up to %ld ms)", strsignal(sig), rc->drain_timeout_ms);
    notify_send("STOPPING=1");
    metrics_set_ready(0);
    server_begin_drain(srv);
    reloader_drain(rl);
    queue_set_flush(q, 1);
    if (wait_for_zero(srv, server_active, rc->drain_timeout_ms) != 0) {
        /* Not yet decoded: 503 (decodes under way finish and are queued). */
        int undecoded = server_cancel_decodes(srv);
        queue_item left[256];
        int n, failed = 0;
        while ((n = queue_take_all(q, left, 256)) > 0)
            for (int i = 0; i < n; i++, failed++) {
                queue_release(q, &left[i].slot, 1);
                classify_sink.fail(left[i].req, left[i].image, 503, "shutting_down",
                                   "the server stopped before this request ran");
            }
        log_warn("drain timeout: %d requests waiting for a decoder and %d queued images answered 503; "
                 "%ld requests being decoded stop before their next image; "
                 "closing %ld unfinished connections",
                 undecoded, failed, server_decoding(srv), server_active(srv));
        /* Batches already in the engine finish and are answered, decodes
         * finish their current image; the HTTP layer must not be stopped
         * while any request waits for its answer. */
        if (wait_for_zero(srv, server_suspended, DRAIN_GRACE_MS) != 0) {
            long decoding = server_decoding(srv);
            log_error("%ld requests still unanswered after %d ms more (%ld decoding an image, %ld in the "
                      "engine); exiting",
                      server_suspended(srv), DRAIN_GRACE_MS, decoding, server_suspended(srv) - decoding);
            _exit(1);
        }
        /* Let the 503s just queued reach their clients. */
        wait_for_zero(srv, server_active, 250);
    }
}

/* INT8: the table must exist, be whole, and be made for these weights;
 * *out points at it (NULL at other precisions). 0, or -1 after logging. */
static int load_int8_table(const config *cfg, const resnet18_weights *w, calib_table *calib, calib_table **out)
{
    char err[1024];
    *out = NULL;
    if (strcmp(cfg->precision, "int8") != 0)
        return 0;
    if (calib_load(cfg->calibration, calib, err, sizeof err) != 0 ||
        calib_check_weights(calib, cfg->calibration, w, cfg->weights, err, sizeof err) != 0) {
        log_error("%s", err);
        return -1;
    }
    *out = calib;
    return 0;
}

/* --check-config's last word, after every check start-up makes before it
 * binds the port; then the engines and the model go. */
static void report_config_ok(const config *cfg, served_model *model, engine_set *es)
{
    const engine *e = es->eng[0];
    printf("resnetd: configuration OK (weights %s, %d classes, labels %s, %s engine%s, %s, max batch %d, "
           "%s decode)\n",
           cfg->weights, e->classes, model->labels_path, es->labels, es->n > 1 ? "s" : "",
           engine_precision_name(e->precision), e->max_batch, es->dj[0] ? "gpu" : "cpu");
    for (int i = 0; i < es->n; i++) {
        devjpeg_destroy(es->dj[i]);
        engine_destroy(es->eng[i]);
    }
    served_model_unref(model);
}

/* What the model metadata reports about the service (rc: resolved). */
static response_service service_of(const config *rc, const engine_set *es)
{
    const engine *e = es->eng[0];
    return (response_service){
        .device = engine_device_name(e->device),
        .device_index = e->device_index,
        .engines = es->labels,
        .precision = engine_precision_name(e->precision),
        .deterministic = e->deterministic,
        .max_batch_size = e->max_batch,
        .max_queue_delay_us = rc->max_queue_delay_us,
        .preferred_batch_sizes = rc->preferred_batch_sizes,
        .queue_capacity = (int)rc->queue_capacity,
        .request_timeout_ms = rc->request_timeout_ms,
        .max_body_bytes = rc->max_body_bytes,
        .max_pixels = rc->max_pixels,
        .decode = es->dj[0] ? (strcmp(rc->decode, "gpu-exact") == 0 ? "gpu-exact" : "gpu") : "cpu",
    };
}

int main(int argc, char **argv)
{
    char err[1024];
    config cfg, rc;
    config_cli cli;
    if (config_load(&cfg, &cli, argc, argv, err, sizeof err) != 0) {
        char clean[1024]; /* config text is quoted: bytes that are not UTF-8 as \xNN */
        fprintf(stderr, "resnetd: %s\n", utf8_sanitize(clean, sizeof clean, err));
        return EXIT_BAD_CONFIG;
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
        return EXIT_BAD_CONFIG;
    }
    resnet18_weights w;
    const char *key;
    served_model *model = served_model_load(&cfg, 1, &w, &key, err, sizeof err);
    if (!model) {
        /* Which option, and where it was set: the file's line or the flag. */
        char where[CONFIG_PATH_MAX + 64];
        config_where(&cfg, cli.config_path, key, where, sizeof where);
        log_error("%s: %s", where, err);
        return EXIT_BAD_FILE;
    }
    char *tls_pem[2] = { NULL, NULL };
    if (read_tls(&cfg, cli.config_path, tls_pem) != 0)
        return EXIT_BAD_FILE;
    http_tls tls = { tls_pem[0], tls_pem[1] };
    if (model->synthetic && !cli.check_config)
        log_warn("--weights synthetic: random weights, for load testing only; every answer is marked");
    calib_table calib, *calib_ptr = NULL;
    if (load_int8_table(&cfg, &w, &calib, &calib_ptr) != 0)
        return EXIT_BAD_FILE;
    if (calib_ptr)
        served_model_set_int8(model, calib_ptr);

    if (signals_setup() != 0) {
        log_error("cannot set up signal handling: %s", strerror(errno));
        return 1;
    }

    engine_set es;
    if (open_engines(&cfg, &rc, &w, calib_ptr, &es) != 0)
        return 1;
    weights_free(&w); /* the engines hold their own copies */
    engine *e = es.eng[0];
    batch_policy policy;
    if (engine_policy(&rc, e, &policy, err, sizeof err) != 0) {
        log_error("%s", err);
        return 1;
    }
    /* --check-config stops here: after every check start-up makes before
     * it binds the port, the engine's (the resolved max batch) and the
     * device decoder's included. */
    if (cli.check_config) {
        report_config_ok(&cfg, model, &es);
        return 0;
    }
    metrics_start(model, &es);
    response_service svc = service_of(&rc, &es);

    static running run; /* the pipeline's objects live until main returns */
    if (run_start(&run, argc, argv, &cfg, &rc, &svc, &es, model, tls_pem[0] ? &tls : NULL) != 0)
        return 1;
    server *srv = run.srv;
    queue *q = run.q;
    reloader *rl = run.rl;
    log_listening(&rc, srv, &es, tls_pem[0] != NULL);
    const char *tile = engine_cpu_int8_tile(e);
    if (tile)
        log_info("int8 on the cpu: the %s tile (RESNETD_CPU_INT8_GEMM=generic|avx2|vnni|amx forces one)", tile);

    uint64_t t0 = clock_now_us();
    if (start_batchers(&rc, &es, run.inf, q, &policy, run.bat) != 0)
        return 1;
    server_set_warm(srv);
    metrics_set_ready(1);
    notify_send("READY=1");
    /* Last: tests and operators take this line to mean /readyz answers 200. */
    log_info("ready (warm-up batch of %d took %.1f ms)", e->max_batch, (double)(clock_now_us() - t0) / 1e3);

    uint64_t watchdog = notify_watchdog_usec();
    int sig;
    while ((sig = signal_wait(rl, watchdog ? (long)(watchdog / 2000u) : -1)) == 0)
        if (watchdog)
            notify_send("WATCHDOG=1");

    drain(sig, &rc, srv, rl, q);
    run_stop(&run, &es);
    free(tls_pem[0]);
    free(tls_pem[1]);
    served_model_unref(model);
    metrics_set_gpu_probe(NULL);
    gputel_close();
    log_info("stopped");
    return 0;
}
