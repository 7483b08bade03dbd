/* resnetd-load: a load generator for resnetd that reports honest latency.
 * Closed loop (-c: a fixed number of requests outstanding) or open loop (-r:
 * requests at a fixed rate, Poisson or uniform, latency from the intended
 * send time so a backed-up server is not hidden). It reads the corpus into
 * memory, reads the server's /metrics before and after the measured phase,
 * and prints a text or JSON report. The engine is loadgen.c; this file is
 * options, the run's timeline, and the report.
 *
 * Exit status: 0 when the run completed (whatever the server answered),
 * 1 when it could not start (unreachable server, bad corpus), 2 for bad
 * arguments. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include "client/corpus.h"
#include "client/http_get.h"
#include "client/loadgen.h"
#include "client/prom.h"
#include "util/clock.h"

#define BOUNDARY "resnetd-load-7c1e9a4b2f0d"

/* Every option once: getopt's table and --help are built from it. */
enum {
    OPT_URL = 'u',
    OPT_CONNECTIONS = 'c',
    OPT_RATE = 'r',
    OPT_THREADS = 't',
    OPT_DURATION = 'd',
    OPT_REQUESTS = 'n',
    OPT_WARMUP = 'w',
    OPT_IMAGES = 'k',
    OPT_LIST = 'l',
    OPT_QUIET = 'q',
    OPT_HELP = 'h',
    OPT_ARRIVAL = 256,
    OPT_TIMEOUT,
    OPT_DRAIN,
    OPT_MULTIPART,
    OPT_METRICS_PATH,
    OPT_NO_METRICS,
    OPT_SEED,
    OPT_JSON
};

static const struct {
    const char *name;
    int id;
    const char *arg; /* NULL: a flag */
    const char *doc;
} option_table[] = {
    { "url", OPT_URL, "URL", "classify endpoint (default http://127.0.0.1:8080/classify)" },
    { "connections", OPT_CONNECTIONS, "N",
      "closed loop: requests outstanding; open loop: connection pool (default 16 / 64)" },
    { "rate", OPT_RATE, "R", "open loop at R requests/s (default: closed loop)" },
    { "arrival", OPT_ARRIVAL, "poisson|uniform", "open-loop arrivals (default poisson)" },
    { "threads", OPT_THREADS, "N", "client threads, each with its share of connections (default 1)" },
    { "duration", OPT_DURATION, "SECONDS", "measured phase length (default 10 unless -n)" },
    { "requests", OPT_REQUESTS, "N", "measured phase: N requests instead of a duration" },
    { "warmup", OPT_WARMUP, "SECONDS", "load before the measured phase, reported apart (default 0)" },
    { "timeout", OPT_TIMEOUT, "SECONDS", "per-request timeout from its send (default 30)" },
    { "drain-timeout", OPT_DRAIN, "SECONDS", "at the end, wait this long for answers (default 10)" },
    { "multipart", OPT_MULTIPART, NULL, "send multipart/form-data (field image) instead of raw image/jpeg" },
    { "images-per-request", OPT_IMAGES, "K", "images per request; K > 1 implies --multipart (default 1)" },
    { "list", OPT_LIST, "FILE", "add the JPEG paths listed in FILE, one per line" },
    { "metrics-path", OPT_METRICS_PATH, "PATH", "the server's metrics (default /metrics)" },
    { "no-metrics", OPT_NO_METRICS, NULL, "do not read the server's metrics" },
    { "seed", OPT_SEED, "N", "seed of the Poisson arrivals (default 1)" },
    { "json", OPT_JSON, NULL, "print the report as JSON on stdout" },
    { "quiet", OPT_QUIET, NULL, "no progress line" },
    { "help", OPT_HELP, NULL, "this help" },
};
#define N_OPTIONS (sizeof option_table / sizeof option_table[0])

typedef struct {
    const char *url;
    int connections; /* 0: default for the mode */
    double rate;
    load_arrival arrival;
    int threads;
    double duration, warmup, timeout, drain_timeout;
    unsigned long long requests;
    int multipart, images_per_request;
    const char *metrics_path;
    int no_metrics, json, quiet;
    unsigned long long seed;
    char **lists; /* --list files, loaded after parsing */
    int nlists;
} options;

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    interrupted = 1;
    signal(sig, SIG_DFL); /* a second one ends the process at once */
}

static void usage(FILE *f)
{
    fprintf(f, "usage: resnetd-load [options] DIR|FILE.jpg...\n"
               "Sends the JPEGs (loaded into memory first) to resnetd and reports throughput,\n"
               "latency percentiles, errors and the server's own view from /metrics.\n\n");
    for (size_t i = 0; i < N_OPTIONS; i++) {
        char left[64];
        if (option_table[i].id < 256)
            snprintf(left, sizeof left, "-%c, --%s%s%s", option_table[i].id, option_table[i].name,
                     option_table[i].arg ? " " : "", option_table[i].arg ? option_table[i].arg : "");
        else
            snprintf(left, sizeof left, "    --%s%s%s", option_table[i].name, option_table[i].arg ? " " : "",
                     option_table[i].arg ? option_table[i].arg : "");
        fprintf(f, "  %-34s %s\n", left, option_table[i].doc);
    }
}

static int bad_arg(const char *opt, const char *val, const char *why)
{
    fprintf(stderr, "resnetd-load: --%s %s: %s\n", opt, val, why);
    return -1;
}

static int parse_double(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        char why[96];
        snprintf(why, sizeof why, "expected a number in [%g, %g]", lo, hi);
        return bad_arg(opt, s, why);
    }
    *out = v;
    return 0;
}

static int parse_int(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        char why[96];
        snprintf(why, sizeof why, "expected an integer in [%ld, %ld]", lo, hi);
        return bad_arg(opt, s, why);
    }
    *out = v;
    return 0;
}

/* http://HOST[:PORT][/PATH]; HOST may be [v6]. Resolves into cfg. */
static int parse_url(const char *url, load_config *cfg)
{
    const char *p = url;
    if (strncmp(p, "http://", 7) != 0) {
        fprintf(stderr, "resnetd-load: %s: only http:// URLs are supported\n", url);
        return -1;
    }
    p += 7;
    const char *slash = strchr(p, '/');
    size_t hostport_len = slash ? (size_t)(slash - p) : strlen(p);
    const char *path = slash ? slash : "/classify";
    char hostport[300], host[300], port[16] = "80";
    if (hostport_len == 0 || hostport_len >= sizeof hostport || strlen(path) >= sizeof cfg->path) {
        fprintf(stderr, "resnetd-load: %s: bad host or path\n", url);
        return -1;
    }
    memcpy(hostport, p, hostport_len);
    hostport[hostport_len] = '\0';
    const char *colon;
    if (hostport[0] == '[') {
        const char *close = strchr(hostport, ']');
        if (!close || (close[1] != '\0' && close[1] != ':')) {
            fprintf(stderr, "resnetd-load: %s: bad IPv6 address\n", url);
            return -1;
        }
        snprintf(host, sizeof host, "%.*s", (int)(close - hostport - 1), hostport + 1);
        colon = close[1] == ':' ? close + 1 : NULL;
    } else {
        colon = strchr(hostport, ':');
        snprintf(host, sizeof host, "%.*s", colon ? (int)(colon - hostport) : (int)hostport_len, hostport);
    }
    if (colon) {
        long v;
        if (parse_int("url", colon + 1, 1, 65535, &v) != 0)
            return -1;
        snprintf(port, sizeof port, "%ld", v);
    }
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res;
    int e = getaddrinfo(host, port, &hints, &res);
    if (e != 0) {
        fprintf(stderr, "resnetd-load: %s: %s\n", host, gai_strerror(e));
        return -1;
    }
    memcpy(&cfg->addr, res->ai_addr, res->ai_addrlen);
    cfg->addrlen = res->ai_addrlen;
    freeaddrinfo(res);
    snprintf(cfg->host, sizeof cfg->host, "%s", hostport);
    snprintf(cfg->path, sizeof cfg->path, "%s", path);
    return 0;
}

/* 0, -1 on a bad argument, 1 after --help. Corpus paths are left in
 * argv[optind..] and o->lists. */
static int parse_options(int argc, char **argv, options *o)
{
    struct option longopts[N_OPTIONS + 1];
    char shortopts[2 * N_OPTIONS + 1];
    size_t ns = 0;
    for (size_t i = 0; i < N_OPTIONS; i++) {
        longopts[i] = (struct option){ option_table[i].name, option_table[i].arg ? required_argument : no_argument,
                                       NULL, option_table[i].id };
        if (option_table[i].id < 256) {
            shortopts[ns++] = (char)option_table[i].id;
            if (option_table[i].arg)
                shortopts[ns++] = ':';
        }
    }
    longopts[N_OPTIONS] = (struct option){ NULL, 0, NULL, 0 };
    shortopts[ns] = '\0';

    *o = (options){ .url = "http://127.0.0.1:8080/classify",
                    .arrival = LOAD_POISSON,
                    .threads = 1,
                    .duration = 0,
                    .timeout = 30,
                    .drain_timeout = 10,
                    .images_per_request = 1,
                    .metrics_path = "/metrics",
                    .seed = 1 };
    o->lists = calloc((size_t)argc, sizeof *o->lists);
    if (!o->lists) {
        fprintf(stderr, "resnetd-load: out of memory\n");
        return -1;
    }
    int id, have_duration = 0;
    long v;
    while ((id = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        const char *name = "?";
        for (size_t i = 0; i < N_OPTIONS; i++)
            if (option_table[i].id == id)
                name = option_table[i].name;
        switch (id) {
        case OPT_URL: o->url = optarg; break;
        case OPT_CONNECTIONS:
            if (parse_int(name, optarg, 1, 100000, &v) != 0)
                return -1;
            o->connections = (int)v;
            break;
        case OPT_RATE:
            if (parse_double(name, optarg, 1e-3, 1e7, &o->rate) != 0)
                return -1;
            break;
        case OPT_ARRIVAL:
            if (strcmp(optarg, "poisson") == 0)
                o->arrival = LOAD_POISSON;
            else if (strcmp(optarg, "uniform") == 0)
                o->arrival = LOAD_UNIFORM;
            else
                return bad_arg(name, optarg, "expected poisson or uniform");
            break;
        case OPT_THREADS:
            if (parse_int(name, optarg, 1, 256, &v) != 0)
                return -1;
            o->threads = (int)v;
            break;
        case OPT_DURATION:
            if (parse_double(name, optarg, 1e-3, 1e6, &o->duration) != 0)
                return -1;
            have_duration = 1;
            break;
        case OPT_REQUESTS:
            if (parse_int(name, optarg, 1, 2000000000L, &v) != 0)
                return -1;
            o->requests = (unsigned long long)v;
            break;
        case OPT_WARMUP:
            if (parse_double(name, optarg, 0, 1e6, &o->warmup) != 0)
                return -1;
            break;
        case OPT_TIMEOUT:
            if (parse_double(name, optarg, 1e-3, 1e6, &o->timeout) != 0)
                return -1;
            break;
        case OPT_DRAIN:
            if (parse_double(name, optarg, 0, 1e6, &o->drain_timeout) != 0)
                return -1;
            break;
        case OPT_MULTIPART: o->multipart = 1; break;
        case OPT_IMAGES:
            if (parse_int(name, optarg, 1, LOAD_MAX_IMAGES_PER_REQUEST, &v) != 0)
                return -1;
            o->images_per_request = (int)v;
            break;
        case OPT_LIST: o->lists[o->nlists++] = optarg; break;
        case OPT_METRICS_PATH:
            if (optarg[0] != '/')
                return bad_arg(name, optarg, "expected a path starting with /");
            o->metrics_path = optarg;
            break;
        case OPT_NO_METRICS: o->no_metrics = 1; break;
        case OPT_SEED:
            if (parse_int(name, optarg, 0, 2147483647L, &v) != 0)
                return -1;
            o->seed = (unsigned long long)v;
            break;
        case OPT_JSON: o->json = 1; break;
        case OPT_QUIET: o->quiet = 1; break;
        case OPT_HELP: usage(stdout); return 1;
        default: usage(stderr); return -1;
        }
    }
    if (have_duration && o->requests) {
        fprintf(stderr, "resnetd-load: give either --duration or --requests, not both\n");
        return -1;
    }
    if (!have_duration && !o->requests)
        o->duration = 10;
    if (o->images_per_request > 1)
        o->multipart = 1;
    if (!o->connections)
        o->connections = o->rate > 0 ? 64 : 16;
    if (o->connections < o->threads) {
        fprintf(stderr, "resnetd-load: %d connections cannot be shared by %d threads\n", o->connections, o->threads);
        return -1;
    }
    return 0;
}

static int load_corpus(int argc, char **argv, const options *o, corpus *images)
{
    char err[512];
    for (int i = 0; i < o->nlists; i++)
        if (corpus_add_list(images, o->lists[i], err, sizeof err) != 0)
            goto fail;
    for (int i = optind; i < argc; i++)
        if (corpus_add_path(images, argv[i], err, sizeof err) != 0)
            goto fail;
    if (images->n == 0) {
        snprintf(err, sizeof err, "no JPEG images given (a directory with .jpg files, files, or --list)");
        goto fail;
    }
    return 0;
fail:
    fprintf(stderr, "resnetd-load: %s\n", err);
    return -1;
}

/* --- the server's view: differences between two /metrics scrapes ------- */

typedef struct {
    int have;
    prom_set before, after;
    uint64_t before_ns, after_ns; /* when each scrape was answered */
} server_view;

#define MAX_REASONS 16

/* What the report says about the server; NAN where its metrics lack it. */
typedef struct {
    double mean_batch, batches, images;
    double queue_ms, decode_ms, infer_ms, request_ms; /* means */
    double cpu_cores; /* process_cpu_seconds_total over the scrapes' interval */
    int nreasons;
    char reason[MAX_REASONS][32];
    double rejected[MAX_REASONS];
} server_summary;

static int scrape(const load_config *cfg, const char *path, prom_set *out, char *err, size_t errlen)
{
    int status;
    char *body;
    size_t len;
    if (http_get((const struct sockaddr *)&cfg->addr, cfg->addrlen, cfg->host, path, 5000, &status, &body, &len, err,
                 errlen) != 0)
        return -1;
    int rc = 0;
    if (status != 200) {
        snprintf(err, errlen, "%s answered %d", path, status);
        rc = -1;
    } else {
        prom_free(out);
        rc = prom_parse(body, out, err, errlen);
    }
    free(body);
    return rc;
}

/* after - before of a metric (summed over labels); NAN if either lacks it. */
static double delta(const server_view *v, const char *name)
{
    int f1, f2;
    double b = prom_sum(&v->before, name, &f1), a = prom_sum(&v->after, name, &f2);
    return f1 && f2 ? a - b : NAN;
}

/* Mean of a histogram over the run, from its _sum and _count deltas. */
static double delta_mean(const server_view *v, const char *metric)
{
    char name[128];
    snprintf(name, sizeof name, "%s_sum", metric);
    double sum = delta(v, name);
    snprintf(name, sizeof name, "%s_count", metric);
    double count = delta(v, name);
    return count > 0 ? sum / count : NAN;
}

static void server_summarize(const server_view *v, server_summary *s)
{
    memset(s, 0, sizeof *s);
    s->mean_batch = delta_mean(v, "resnetd_batch_size");
    s->batches = delta(v, "resnetd_batch_size_count");
    s->images = delta(v, "resnetd_images_total");
    s->queue_ms = 1e3 * delta_mean(v, "resnetd_queue_duration_seconds");
    s->decode_ms = 1e3 * delta_mean(v, "resnetd_decode_duration_seconds");
    s->infer_ms = 1e3 * delta_mean(v, "resnetd_inference_duration_seconds");
    s->request_ms = 1e3 * delta_mean(v, "resnetd_request_duration_seconds");
    double wall = (double)(v->after_ns - v->before_ns) / 1e9;
    s->cpu_cores = wall > 0 ? delta(v, "process_cpu_seconds_total") / wall : NAN;
    for (size_t i = 0; i < v->after.n && s->nreasons < MAX_REASONS; i++) {
        const prom_sample *a = &v->after.v[i];
        char reason[32];
        if (strcmp(a->name, "resnetd_rejected_total") != 0 ||
            prom_label(a->labels, "reason", reason, sizeof reason) != 0)
            continue;
        double before = 0;
        for (size_t j = 0; j < v->before.n; j++)
            if (strcmp(v->before.v[j].name, a->name) == 0 && strcmp(v->before.v[j].labels, a->labels) == 0)
                before = v->before.v[j].value;
        snprintf(s->reason[s->nreasons], sizeof s->reason[0], "%s", reason);
        s->rejected[s->nreasons++] = a->value - before;
    }
}

/* --- report ------------------------------------------------------------- */

typedef struct {
    const options *o;
    const load_config *cfg;
    const corpus *images;
    const load_stats *m, *warm;
    double elapsed_s; /* measured phase: start to last answer */
    double cpu_user_s, cpu_sys_s, cpu_wall_s;
    const server_view *server;
} report;

static double ms(uint64_t ns)
{
    return (double)ns / 1e6;
}

static const double quantiles[] = { 0.5, 0.9, 0.99, 0.999 };
static const char *const quantile_names[] = { "p50", "p90", "p99", "p99.9" };

static void print_hist(const char *label, const histogram *h)
{
    if (h->total == 0) {
        printf("%-10s no successful answers\n", label);
        return;
    }
    printf("%-10s min %.2f", label, ms(h->min));
    for (int i = 0; i < 4; i++)
        printf("  %s %.2f", quantile_names[i], ms(histogram_quantile(h, quantiles[i])));
    printf("  max %.2f  mean %.2f ms\n", ms(h->max), histogram_mean(h) / 1e6);
}

static void print_text(const report *r)
{
    const load_stats *m = r->m;
    const options *o = r->o;
    if (o->rate > 0)
        printf("open loop, %.1f req/s %s, pool of %d connections", o->rate,
               o->arrival == LOAD_POISSON ? "Poisson" : "uniform", o->connections);
    else
        printf("closed loop, %d connections", o->connections);
    printf(", %d thread%s, %s, %d image%s per request, %zu images (%.1f MB) in memory\n", o->threads,
           o->threads > 1 ? "s" : "", o->multipart ? "multipart" : "raw image/jpeg", o->images_per_request,
           o->images_per_request > 1 ? "s" : "", r->images->n, (double)r->images->bytes / 1e6);
    if (r->warm->sent)
        printf("warm-up    %.1f s: sent %llu, answered %llu, ok %llu (not in the figures below)\n", o->warmup,
               (unsigned long long)r->warm->sent, (unsigned long long)r->warm->answered,
               (unsigned long long)r->warm->ok);
    printf("requests   sent %llu  answered %llu  ok %llu  lost %lld", (unsigned long long)m->sent,
           (unsigned long long)m->answered, (unsigned long long)m->ok, (long long)(m->sent - m->answered));
    if (o->rate > 0)
        printf("  unsent %llu", (unsigned long long)m->unsent);
    printf("\n");
    int any = 0;
    for (int s = 0; s < LOAD_STATUS_MAX; s++)
        if (m->status[s] && (s < 200 || s >= 300)) {
            printf("%s %d: %llu", any ? "," : "http errors", s, (unsigned long long)m->status[s]);
            any = 1;
        }
    if (any)
        printf("\n");
    any = 0;
    for (int e = 0; e < LOAD_ERR_COUNT; e++)
        if (m->errors[e]) {
            printf("%s %s: %llu", any ? "," : "transport ", load_error_name((load_error)e),
                   (unsigned long long)m->errors[e]);
            any = 1;
        }
    if (any)
        printf("\n");
    printf("throughput %.1f req/s  %.1f img/s (2xx)  over %.2f s\n", (double)m->ok / r->elapsed_s,
           (double)m->images_ok / r->elapsed_s, r->elapsed_s);
    print_hist("latency", &m->latency);
    if (o->rate > 0) {
        printf("           (open loop: from each request's intended send time)\n");
        print_hist("service", &m->service);
        printf("           (from the moment it was sent; latency - service = waiting to be sent)\n");
    }
    if (r->server->have) {
        server_summary sv;
        server_summarize(r->server, &sv);
        printf("server     mean batch %.2f (%.0f batches), images %.0f, CPU %.2f cores\n", sv.mean_batch, sv.batches,
               sv.images, sv.cpu_cores);
        printf("           mean ms: request %.2f  decode %.2f  queue %.2f  inference (per batch) %.2f\n", sv.request_ms,
               sv.decode_ms, sv.queue_ms, sv.infer_ms);
        printf("           rejected");
        for (int i = 0; i < sv.nreasons; i++)
            printf(" %s %.0f", sv.reason[i], sv.rejected[i]);
        printf("%s\n", sv.nreasons ? "" : " (no resnetd_rejected_total)");
    }
    printf("client CPU %.2f cores (user %.2f s, sys %.2f s over %.2f s)\n",
           (r->cpu_user_s + r->cpu_sys_s) / r->cpu_wall_s, r->cpu_user_s, r->cpu_sys_s, r->cpu_wall_s);
}

static json_t *hist_json(const histogram *h)
{
    json_t *j = json_object();
    json_object_set_new(j, "count", json_integer((json_int_t)h->total));
    if (h->total) {
        json_object_set_new(j, "min", json_real(ms(h->min)));
        for (int i = 0; i < 4; i++)
            json_object_set_new(j, quantile_names[i], json_real(ms(histogram_quantile(h, quantiles[i]))));
        json_object_set_new(j, "max", json_real(ms(h->max)));
        json_object_set_new(j, "mean", json_real(histogram_mean(h) / 1e6));
    }
    return j;
}

/* A number, or null where it is unknown (NAN). */
static json_t *num(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static int print_json(const report *r)
{
    const load_stats *m = r->m;
    const options *o = r->o;
    json_t *root = json_object();
    json_object_set_new(root, "mode", json_string(o->rate > 0 ? "open" : "closed"));
    if (o->rate > 0) {
        json_object_set_new(root, "rate", json_real(o->rate));
        json_object_set_new(root, "arrival", json_string(o->arrival == LOAD_POISSON ? "poisson" : "uniform"));
    }
    json_object_set_new(root, "connections", json_integer(o->connections));
    json_object_set_new(root, "threads", json_integer(o->threads));
    json_object_set_new(root, "multipart", json_boolean(o->multipart));
    json_object_set_new(root, "images_per_request", json_integer(o->images_per_request));
    json_object_set_new(root, "corpus_images", json_integer((json_int_t)r->images->n));
    json_object_set_new(root, "elapsed_s", json_real(r->elapsed_s));

    json_t *req = json_object();
    json_object_set_new(req, "sent", json_integer((json_int_t)m->sent));
    json_object_set_new(req, "answered", json_integer((json_int_t)m->answered));
    json_object_set_new(req, "ok", json_integer((json_int_t)m->ok));
    json_object_set_new(req, "lost", json_integer((json_int_t)(m->sent - m->answered)));
    json_object_set_new(req, "unsent", json_integer((json_int_t)m->unsent));
    json_object_set_new(req, "warmup_sent", json_integer((json_int_t)r->warm->sent));
    json_object_set_new(req, "warmup_answered", json_integer((json_int_t)r->warm->answered));
    json_object_set_new(root, "requests", req);

    json_t *status = json_object();
    for (int s = 0; s < LOAD_STATUS_MAX; s++)
        if (m->status[s]) {
            char k[16];
            snprintf(k, sizeof k, "%d", s);
            json_object_set_new(status, k, json_integer((json_int_t)m->status[s]));
        }
    json_object_set_new(root, "http_status", status);
    json_t *errors = json_object();
    for (int e = 0; e < LOAD_ERR_COUNT; e++)
        json_object_set_new(errors, load_error_name((load_error)e), json_integer((json_int_t)m->errors[e]));
    json_object_set_new(root, "transport_errors", errors);

    json_t *tp = json_object();
    json_object_set_new(tp, "req_per_s", json_real((double)m->ok / r->elapsed_s));
    json_object_set_new(tp, "img_per_s", json_real((double)m->images_ok / r->elapsed_s));
    json_object_set_new(root, "throughput", tp);
    json_object_set_new(root, "latency_ms", hist_json(&m->latency));
    json_object_set_new(root, "service_ms", hist_json(&m->service));

    if (r->server->have) {
        server_summary s;
        server_summarize(r->server, &s);
        json_t *sv = json_object();
        json_object_set_new(sv, "mean_batch_size", num(s.mean_batch));
        json_object_set_new(sv, "batches", num(s.batches));
        json_object_set_new(sv, "images", num(s.images));
        json_object_set_new(sv, "mean_request_ms", num(s.request_ms));
        json_object_set_new(sv, "mean_decode_ms", num(s.decode_ms));
        json_object_set_new(sv, "mean_queue_ms", num(s.queue_ms));
        json_object_set_new(sv, "mean_inference_ms", num(s.infer_ms));
        json_object_set_new(sv, "cpu_cores", num(s.cpu_cores));
        json_t *rej = json_object();
        for (int i = 0; i < s.nreasons; i++)
            json_object_set_new(rej, s.reason[i], json_real(s.rejected[i]));
        json_object_set_new(sv, "rejected", rej);
        json_object_set_new(root, "server", sv);
    }
    json_t *cpu = json_object();
    json_object_set_new(cpu, "cores", json_real((r->cpu_user_s + r->cpu_sys_s) / r->cpu_wall_s));
    json_object_set_new(cpu, "user_s", json_real(r->cpu_user_s));
    json_object_set_new(cpu, "sys_s", json_real(r->cpu_sys_s));
    json_object_set_new(cpu, "wall_s", json_real(r->cpu_wall_s));
    json_object_set_new(root, "client_cpu", cpu);

    int rc = json_dumpf(root, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
    json_decref(root);
    if (rc != 0 || printf("\n") < 0)
        return -1;
    return 0;
}

/* --- the run's timeline -------------------------------------------------- */

static double cpu_seconds(const struct timeval *tv)
{
    return (double)tv->tv_sec + (double)tv->tv_usec / 1e6;
}

static void progress_line(load_run *run, uint64_t now, load_progress *last, uint64_t *last_ns)
{
    load_progress p;
    load_progress_get(run, &p);
    double dt = (double)(now - *last_ns) / 1e9;
    double t = (double)(now - load_start_ns(run)) / 1e9;
    fprintf(stderr, "\r\033[K%6.1f s %s  sent %llu  ok %llu  errors %llu  in flight %llu  %.0f req/s", t,
            now < load_measure_ns(run) ? "warm-up " : "measured", (unsigned long long)p.sent, (unsigned long long)p.ok,
            (unsigned long long)p.errors, (unsigned long long)(p.sent - p.answered),
            dt > 0 ? (double)(p.answered - last->answered) / dt : 0.0);
    *last = p;
    *last_ns = now;
}

/* Reachability, and whether the server's view can be scraped: 1 yes, 0
 * no (said why), -1 unreachable (said why). */
static int probe_server(const load_config *cfg, const options *o)
{
    int status;
    char *body, err[512];
    size_t len;
    if (http_get((const struct sockaddr *)&cfg->addr, cfg->addrlen, cfg->host, o->metrics_path, 5000, &status, &body,
                 &len, err, sizeof err) != 0) {
        fprintf(stderr, "resnetd-load: cannot reach %s: %s\n", cfg->host, err);
        return -1;
    }
    free(body);
    if (!o->no_metrics && status != 200)
        fprintf(stderr, "resnetd-load: warning: %s answered %d: no server view in the report\n", o->metrics_path,
                status);
    return !o->no_metrics && status == 200;
}

static void fill_config(load_config *cfg, const options *o, corpus *images)
{
    cfg->images = images;
    cfg->multipart = o->multipart;
    cfg->images_per_request = o->images_per_request;
    cfg->boundary = BOUNDARY;
    cfg->mode = o->rate > 0 ? LOAD_OPEN_LOOP : LOAD_CLOSED_LOOP;
    cfg->arrival = o->arrival;
    cfg->connections = o->connections;
    cfg->threads = o->threads;
    cfg->rate = o->rate;
    cfg->seed = o->seed;
    cfg->warmup_ns = (uint64_t)(o->warmup * 1e9);
    cfg->duration_ns = o->requests ? 0 : (uint64_t)(o->duration * 1e9);
    cfg->requests = o->requests;
    cfg->timeout_ns = (uint64_t)(o->timeout * 1e9);
    cfg->drain_timeout_ns = (uint64_t)(o->drain_timeout * 1e9);
}

/* The server's metrics into *into, or a warning and *want_metrics = 0. */
static void scrape_or_warn(const load_config *cfg, const options *o, prom_set *into, int *want_metrics)
{
    char err[512];
    if (*want_metrics && scrape(cfg, o->metrics_path, into, err, sizeof err) != 0) {
        fprintf(stderr, "resnetd-load: warning: %s: %s: no server view in the report\n", o->metrics_path, err);
        *want_metrics = 0;
    }
}

/* Waits for the run to end, taking the "before" view and CPU time where
 * the warm-up ends and printing progress once a second on a terminal.
 * Returns whether measuring began (*measure_wall_ns: when). */
static int watch(load_run *run, const load_config *cfg, const options *o, server_view *server, int *want_metrics,
                 struct rusage *ru0, uint64_t *measure_wall_ns)
{
    int tty = isatty(STDERR_FILENO) && !o->quiet;
    int measuring = o->warmup == 0;
    uint64_t last_ns = load_start_ns(run), next_tick = last_ns + 1000000000u;
    load_progress last = { 0 };
    while (!load_finished(run)) {
        struct timespec nap = { 0, 20000000 }; /* 20 ms: a prompt end, a cheap loop */
        nanosleep(&nap, NULL);
        uint64_t now = clock_now_ns();
        if (interrupted)
            load_stop(run);
        if (!measuring && now >= load_measure_ns(run)) {
            measuring = 1;
            *measure_wall_ns = now;
            if (getrusage(RUSAGE_SELF, ru0) != 0)
                *ru0 = (struct rusage){ 0 };
            server->before_ns = clock_now_ns();
            scrape_or_warn(cfg, o, &server->before, want_metrics);
        }
        if (tty && now >= next_tick) {
            progress_line(run, now, &last, &last_ns);
            next_tick += 1000000000u;
        }
    }
    if (tty)
        fprintf(stderr, "\r\033[K");
    return measuring;
}

int main(int argc, char **argv)
{
    options o;
    corpus images = { 0 };
    load_config cfg = { 0 };
    server_view server = { 0 };
    load_stats *warm = NULL, *meas = NULL;
    char err[512];
    int rc = parse_options(argc, argv, &o);
    if (rc == 0 && parse_url(o.url, &cfg) != 0)
        rc = -1;
    if (rc != 0) {
        free(o.lists);
        return rc > 0 ? 0 : 2;
    }
    rc = 1;
    if (load_corpus(argc, argv, &o, &images) != 0)
        goto out;
    if (o.multipart && corpus_prepare_multipart(&images, BOUNDARY, err, sizeof err) != 0) {
        fprintf(stderr, "resnetd-load: %s\n", err);
        goto out;
    }
    int want_metrics = probe_server(&cfg, &o);
    if (want_metrics < 0)
        goto out;
    fill_config(&cfg, &o, &images);

    struct sigaction sa = { .sa_handler = on_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    server.before_ns = clock_now_ns();
    if (o.warmup == 0)
        scrape_or_warn(&cfg, &o, &server.before, &want_metrics);
    struct rusage ru0, ru1;
    if (getrusage(RUSAGE_SELF, &ru0) != 0) {
        fprintf(stderr, "resnetd-load: getrusage: %s\n", strerror(errno));
        goto out;
    }
    warm = malloc(sizeof *warm);
    meas = malloc(sizeof *meas);
    if (!warm || !meas) {
        fprintf(stderr, "resnetd-load: out of memory\n");
        goto out;
    }
    load_run *run = load_start(&cfg, err, sizeof err);
    if (!run) {
        fprintf(stderr, "resnetd-load: %s\n", err);
        goto out;
    }
    uint64_t measure_ns = load_measure_ns(run), measure_wall_ns = measure_ns;
    int measured = watch(run, &cfg, &o, &server, &want_metrics, &ru0, &measure_wall_ns);
    uint64_t end_ns = clock_now_ns();
    if (getrusage(RUSAGE_SELF, &ru1) != 0)
        ru1 = ru0;
    load_finish(run, warm, meas);
    if (want_metrics) {
        server.after_ns = clock_now_ns();
        if (scrape(&cfg, o.metrics_path, &server.after, err, sizeof err) == 0)
            server.have = 1;
        else
            fprintf(stderr, "resnetd-load: warning: %s after the run: %s\n", o.metrics_path, err);
    }
    if (!measured) /* stopped during the warm-up */
        measure_wall_ns = end_ns;
    report r = { .o = &o, .cfg = &cfg, .images = &images, .m = meas, .warm = warm, .server = &server };
    uint64_t last_answer = meas->last_answer_ns > measure_ns ? meas->last_answer_ns : end_ns;
    r.elapsed_s = last_answer > measure_ns ? (double)(last_answer - measure_ns) / 1e9 : 1e-9;
    r.cpu_user_s = cpu_seconds(&ru1.ru_utime) - cpu_seconds(&ru0.ru_utime);
    r.cpu_sys_s = cpu_seconds(&ru1.ru_stime) - cpu_seconds(&ru0.ru_stime);
    r.cpu_wall_s = (double)(end_ns - measure_wall_ns) / 1e9;
    rc = o.json ? print_json(&r) : (print_text(&r), 0);
    if (rc == 0 && fflush(stdout) != 0)
        rc = 1;
out:
    free(warm);
    free(meas);
    prom_free(&server.before);
    prom_free(&server.after);
    corpus_free(&images);
    free(o.lists);
    return rc;
}
