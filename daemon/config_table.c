/* The option table and everything driven by it: defaults, the key = value
 * file parser, the command-line parser and --help. Adding an option means
 * adding one row here, one field in struct config, and its paragraph in
 * etc/resnetd.conf (tests/daemon/test_config checks that last part). */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/config_table.h"
#include "image/devjpeg.h"
#include "engine/engine.h"
#include "util/textfile.h"

static int check_listen(const char *v, char *err, size_t errlen)
{
    char host[256];
    int port;
    return config_parse_listen(v, host, sizeof host, &port, err, errlen);
}

static int check_device(const char *v, char *err, size_t errlen)
{
    engine_device d;
    int index[ENGINE_MAX_DEVICES], n;
    if (engine_parse_devices(v, &d, index, ENGINE_MAX_DEVICES, &n) != 0) {
        snprintf(err, errlen,
                 "'%s' is not a device (cpu, cuda, cuda:N, cuda:N,M,... (up to %d, no repeats), "
                 "cuda:all or auto)",
                 v, ENGINE_MAX_DEVICES);
        return -1;
    }
    return 0;
}

static int check_precision(const char *v, char *err, size_t errlen)
{
    engine_precision p;
    if (engine_parse_precision(v, &p) != 0) {
        snprintf(err, errlen, "'%s' is not a precision (fp32, fp16, int8 or default)", v);
        return -1;
    }
    return 0;
}

static int check_decode(const char *v, char *err, size_t errlen)
{
    devjpeg_mode m;
    if (devjpeg_parse_mode(v, &m) != 0) {
        snprintf(err, errlen, "'%s' is not a decode mode (auto, gpu, gpu-exact or cpu)", v);
        return -1;
    }
    return 0;
}

static int check_bool(const char *v, char *err, size_t errlen)
{
    if (strcmp(v, "true") != 0 && strcmp(v, "false") != 0) {
        snprintf(err, errlen, "'%s' is not true or false", v);
        return -1;
    }
    return 0;
}

int config_bool(const char *v)
{
    return strcmp(v, "true") == 0;
}

static int check_tuning(const char *v, char *err, size_t errlen)
{
    engine_tuning tu;
    return engine_tuning_parse(v, &tu, err, errlen);
}

static int check_preferred(const char *v, char *err, size_t errlen)
{
    int sizes[CONFIG_MAX_PREFERRED];
    return config_preferred_sizes(v, sizes, CONFIG_MAX_PREFERRED, err, errlen) < 0 ? -1 : 0;
}

#define STR(field) CONFIG_STRING, offsetof(config, field), sizeof(((config *)0)->field), 0, 0, 0
#define INT(field, lo, hi) CONFIG_INT, offsetof(config, field), 0, lo, hi, 0
#define INT_AUTO(field, lo, hi) CONFIG_INT, offsetof(config, field), 0, lo, hi, 1
#define BYTES(field, lo, hi) CONFIG_BYTES, offsetof(config, field), 0, lo, hi, 0
#define BYTES_AUTO(field, lo, hi) CONFIG_BYTES, offsetof(config, field), 0, lo, hi, 1

static const config_option options[] = {
    { "listen", STR(listen), "127.0.0.1:8080",
      "address and port to listen on: ADDR:PORT or [ADDR6]:PORT (port 0 picks a free one)", check_listen },
    { "weights", STR(weights), "",
      "ResNet18 weights (safetensors, torchvision names), or 'synthetic' for load tests; required", NULL },
    { "labels", STR(labels), "",
      "class names, one per line, one line per class of the weights; empty means the installed "
      "imagenet-classes.txt (1000)",
      NULL },
    { "device", STR(device), "auto",
      "cpu, cuda, cuda:N, cuda:N,M,... or cuda:all (an engine per GPU), or auto (CUDA when present)", check_device },
    { "precision", STR(precision), "default", "fp32, fp16, int8 (needs calibration), or default (the device's best)",
      check_precision },
    { "calibration", STR(calibration), "",
      "INT8 calibration table made by resnetd-calibrate for the weights; required with precision int8, "
      "unused otherwise",
      NULL },
    { "deterministic", STR(deterministic), "false",
      "true: an image's scores are the same bits whatever batch it is in and wherever it sits in it, on every "
      "engine (CUDA FP16/FP32 then plan without split-K: slower at small batches); false: the CPU engines and "
      "CUDA INT8 are so anyway, CUDA FP16/FP32 may differ in the last bits",
      check_bool },
    { "gpu_tuning", STR(gpu_tuning), "",
      "CUDA engine overrides, to compare its ways of running the network (serve with none): comma-separated "
      "autotune=off|log, stem=separate (FP16; INT8 always fuses its stem), pool=separate, "
      "downsample=inside|separate, pdl=on|off; empty: the engine's own choices",
      check_tuning },
    { "max_batch_size", INT_AUTO(max_batch_size, 1, 1024), "auto",
      "most images per inference batch; auto: 8 on CPU, 128 on CUDA", NULL },
    { "max_queue_delay_us", INT_AUTO(max_queue_delay_us, 0, 10000000), "auto",
      "longest the oldest queued image waits for a fuller batch; auto: 4000 on CPU, 2000 on CUDA", NULL },
    { "preferred_batch_sizes", STR(preferred_batch_sizes), "",
      "comma-separated batch sizes sent as soon as they can be formed, e.g. 32,64; empty: none", check_preferred },
    { "queue_capacity", INT_AUTO(queue_capacity, 1, 65536), "auto",
      "images that may wait for a batch; more get 503; auto: 8 x max_batch_size, at least 64", NULL },
    { "threads", INT_AUTO(threads, 1, 256), "auto",
      "HTTP worker threads (parsing and answering only); auto: a quarter of the CPUs, 2 to 8", NULL },
    { "decode_threads", INT_AUTO(decode_threads, 1, 1024), "auto",
      "JPEG decode threads, shared by all connections; auto: the number of CPUs", NULL },
    { "decode", STR(decode), "auto",
      "where JPEGs are decoded: gpu (nvJPEG hardware decoder), gpu-exact (the same, pixels bit-exact with cpu, "
      "slower), cpu (libjpeg-turbo, bit-exact with torchvision), or auto (gpu when the CUDA engine's device has "
      "a hardware decoder)",
      check_decode },
    { "gpu_decode_memory", BYTES_AUTO(gpu_decode_memory, 16L << 20, 64L << 30), "auto",
      "GPU memory for decoded pixels, split between the engine slots (suffixes K, M, G); larger images decode on the "
      "CPU; auto: 8G, at most an eighth of the device's memory",
      NULL },
    { "cpu_decode_assist", INT_AUTO(cpu_decode_assist, 0, 1000000), "auto",
      "with GPU decoding, when the decode threads decode JPEGs the GPU could take: auto: each one the CPU finishes "
      "in under half the time the GPU's measured backlog (queued and being decoded) would take; N: all while at least "
      "N images wait in the queue; 0: never",
      NULL },
    { "engine_threads", INT(engine_threads, 0, 256), "0", "CPU engine threads; 0: all CPUs", NULL },
    { "max_body_bytes", BYTES(max_body_bytes, 1024, 1L << 30), "16M",
      "largest request body (suffixes K, M, G); larger ones get 413 unread", NULL },
    { "body_memory_bytes", BYTES_AUTO(body_memory_bytes, 1024, 1L << 40), "auto",
      "memory for all request bodies being received, and the CPU decodes running, together; past it requests "
      "get 503; auto: an eighth of the memory this process may use (physical, or its cgroup's limit), "
      "1G to 16G (under 4G of memory, a quarter)",
      NULL },
    { "max_pixels", BYTES(max_pixels, 1, 1L << 30), "64M",
      "largest decoded image, width x height (suffixes K, M, G); larger ones get 413", NULL },
    { "request_timeout_ms", INT(request_timeout_ms, 1, 3600000), "10000",
      "a request not answered this long after it arrived gets 504 (waiting, decoding or queued)", NULL },
    { "drain_timeout_ms", INT(drain_timeout_ms, 0, 3600000), "30000",
      "on SIGTERM, longest wait for accepted requests before exiting", NULL },
    { "connection_limit", INT(connection_limit, 1, 1000000), "1024",
      "most client connections served at once; connections that have sent nothing yet wait outside it", NULL },
    { "client_connection_limit", INT_AUTO(client_connection_limit, 0, 1000000), "auto",
      "most connections from one client address, open or waiting for their first bytes; more get 503; "
      "0: no limit (behind a proxy); auto: half of connection_limit",
      NULL },
    { "connection_timeout_s", INT(connection_timeout_s, 1, 3600), "30",
      "an idle or stalled connection is closed after this long", NULL },
    { "header_timeout_s", INT(header_timeout_s, 1, 3600), "10",
      "a request's headers must arrive complete within this long, however steadily they trickle in", NULL },
    { "min_body_rate", BYTES(min_body_rate, 0, 1L << 30), "1K",
      "bytes/s a request body must average once header_timeout_s has passed; 0: no minimum", NULL },
    { "connection_memory_bytes", BYTES(connection_memory_bytes, 8192, 16L << 20), "64K",
      "per-connection memory for headers and read buffers (suffixes K, M)", NULL },
    { "listen_backlog", INT(listen_backlog, 1, 65535), "1024", "kernel listen queue length", NULL },
    { "access_log", STR(access_log), "",
      "a file to append one JSON line per request to (time, peer, method, path, status, bytes, images, latency, "
      "id); empty: none",
      NULL },
    { "tls_certificate", STR(tls_certificate), "",
      "a PEM certificate (chain) file: the listener serves HTTPS instead of HTTP; needs tls_key", NULL },
    { "tls_key", STR(tls_key), "", "the certificate's PEM private key file (unencrypted)", NULL },
};

#define NOPTIONS ((int)(sizeof options / sizeof options[0]))
_Static_assert(NOPTIONS <= CONFIG_MAX_OPTIONS, "config.line has a slot per option");

const config_option *config_options(int *count)
{
    *count = NOPTIONS;
    return options;
}

const config_option *config_find(const char *name)
{
    for (int i = 0; i < NOPTIONS; i++)
        if (strcmp(options[i].name, name) == 0)
            return &options[i];
    return NULL;
}

static int parse_long(const char *v, int bytes, long *out)
{
    if (!isdigit((unsigned char)v[0]))
        return -1;
    errno = 0;
    char *end;
    long n = strtol(v, &end, 10);
    if (errno != 0)
        return -1;
    if (bytes && *end) {
        long mult;
        switch (*end) {
        case 'k':
        case 'K': mult = 1L << 10; break;
        case 'm':
        case 'M': mult = 1L << 20; break;
        case 'g':
        case 'G': mult = 1L << 30; break;
        default: return -1;
        }
        end++;
        if (n > LONG_MAX / mult)
            return -1;
        n *= mult;
    }
    if (*end)
        return -1;
    *out = n;
    return 0;
}

static int option_set(config *c, const config_option *o, const char *value, char *err, size_t errlen)
{
    char *field = (char *)c + o->offset;
    if (o->type == CONFIG_STRING) {
        size_t n = strlen(value);
        if (n >= o->size) {
            snprintf(err, errlen, "%s: value longer than %zu characters", o->name, o->size - 1);
            return -1;
        }
        if (o->check && o->check(value, err, errlen) != 0)
            return -1;
        memcpy(field, value, n + 1);
        return 0;
    }
    long v;
    if (o->allow_auto && strcmp(value, "auto") == 0) {
        v = CONFIG_AUTO;
    } else if (parse_long(value, o->type == CONFIG_BYTES, &v) != 0) {
        snprintf(err, errlen, "%s: '%s' is not %s", o->name, value,
                 o->type == CONFIG_BYTES
                     ? (o->allow_auto ? "a size (digits, optional K/M/G) or 'auto'" : "a size (digits, optional K/M/G)")
                 : o->allow_auto ? "a whole number or 'auto'"
                                 : "a whole number");
        return -1;
    } else if (v < o->min || v > o->max) {
        snprintf(err, errlen, "%s: %ld is outside %ld..%ld", o->name, v, o->min, o->max);
        return -1;
    }
    memcpy(field, &v, sizeof v);
    return 0;
}

void config_defaults(config *c)
{
    char err[256];
    memset(c, 0, sizeof *c);
    for (int i = 0; i < NOPTIONS; i++)
        if (option_set(c, &options[i], options[i].def, err, sizeof err) != 0) {
            /* A bad default is a programming error that tests/daemon/test_config catches. */
            fprintf(stderr, "resnetd: bad built-in default: %s\n", err);
            abort();
        }
}

int config_set(config *c, const char *name, const char *value, char *err, size_t errlen)
{
    const config_option *o = config_find(name);
    if (!o) {
        snprintf(err, errlen, "unknown option '%s'", name);
        return -1;
    }
    return option_set(c, o, value, err, errlen);
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

int config_parse_text(config *c, const char *name, const char *text, size_t len, char *err, size_t errlen)
{
    const char *nul = memchr(text, '\0', len);
    if (nul) {
        snprintf(err, errlen, "%s: contains a NUL byte at offset %zu (a binary file, not a config?)", name,
                 (size_t)(nul - text));
        return -1;
    }
    char line[8192], why[512];
    int lineno = 0;
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)((eol ? eol : end) - p);
        lineno++;
        if (n >= sizeof line) {
            snprintf(err, errlen, "%s:%d: line longer than %zu characters", name, lineno, sizeof line - 1);
            return -1;
        }
        memcpy(line, p, n);
        line[n] = '\0';
        p = eol ? eol + 1 : end;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *s = trim(line);
        if (!*s)
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            snprintf(err, errlen, "%s:%d: expected 'key = value'", name, lineno);
            return -1;
        }
        *eq = '\0';
        char *key = trim(s), *value = trim(eq + 1);
        if (config_set(c, key, value, why, sizeof why) != 0) {
            snprintf(err, errlen, "%s:%d: %s", name, lineno, why);
            return -1;
        }
        c->line[config_find(key) - options] = lineno;
    }
    return 0;
}

int config_load_file(config *c, const char *path, char *err, size_t errlen)
{
    char *text;
    size_t len;
    if (textfile_read(path, (size_t)CONFIG_FILE_MAX, &text, &len, err, errlen) != 0)
        return -1;
    int rc = config_parse_text(c, path, text, len, err, errlen);
    free(text);
    return rc;
}

/* "max_batch_size" -> "max-batch-size" (without the dashes) in buf. */
static void name_to_flag(const char *name, char *buf, size_t len)
{
    size_t i = 0;
    for (const char *p = name; *p && i + 1 < len; p++)
        buf[i++] = *p == '_' ? '-' : *p;
    buf[i] = '\0';
}

/* "--max-batch-size" -> "max_batch_size" in buf; NULL if not a long flag. */
static const char *flag_to_name(const char *arg, char *buf, size_t len)
{
    if (strncmp(arg, "--", 2) != 0)
        return NULL;
    size_t i = 0;
    for (const char *p = arg + 2; *p && *p != '=' && i + 1 < len; p++)
        buf[i++] = *p == '-' ? '_' : *p;
    buf[i] = '\0';
    return buf;
}

int config_load(config *c, config_cli *cli, int argc, char **argv, char *err, size_t errlen)
{
    char name[128], why[512];
    memset(cli, 0, sizeof *cli);
    config_defaults(c);

    /* First pass: the switches and --config, so the file loads before flags. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            cli->help = 1;
            continue;
        }
        if (strcmp(a, "--version") == 0) {
            cli->version = 1;
            continue;
        }
        if (strcmp(a, "--check-config") == 0) {
            cli->check_config = 1;
            continue;
        }
        if (!flag_to_name(a, name, sizeof name)) {
            snprintf(err, errlen, "unexpected argument '%s' (options start with --)", a);
            return -1;
        }
        const char *eq = strchr(a, '=');
        const char *value = eq ? eq + 1 : (i + 1 < argc ? argv[i + 1] : NULL);
        /* An unknown option is named as such, also as the last argument. */
        if (strcmp(name, "config") != 0 && !config_find(name)) {
            snprintf(err, errlen, "unknown option '--%.*s' (see --help)", (int)strcspn(a + 2, "="), a + 2);
            return -1;
        }
        if (!value) {
            snprintf(err, errlen, "%s needs a value", a);
            return -1;
        }
        if (!eq)
            i++;
        if (strcmp(name, "config") == 0)
            cli->config_path = value;
    }
    if (cli->help || cli->version)
        return 0;
    if (cli->config_path && config_load_file(c, cli->config_path, err, errlen) != 0)
        return -1;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--check-config") == 0)
            continue;
        flag_to_name(a, name, sizeof name);
        const char *eq = strchr(a, '=');
        const char *value = eq ? eq + 1 : argv[++i];
        if (strcmp(name, "config") == 0)
            continue;
        if (config_set(c, name, value, why, sizeof why) != 0) {
            snprintf(err, errlen, "--%.*s: %s", (int)strcspn(a + 2, "="), a + 2, why);
            return -1;
        }
        c->line[config_find(name) - options] = CONFIG_FROM_FLAG;
    }
    return 0;
}

void config_where(const config *c, const char *file, const char *name, char *buf, size_t len)
{
    const config_option *o = config_find(name);
    const int line = o ? c->line[o - options] : 0;
    if (line == CONFIG_FROM_FLAG) {
        char flag[128];
        name_to_flag(name, flag, sizeof flag);
        snprintf(buf, len, "--%s", flag);
    } else if (line > 0 && file) {
        snprintf(buf, len, "%s:%d: %s", file, line, name);
    } else {
        snprintf(buf, len, "%s", name);
    }
}

int config_validate(const config *c, char *err, size_t errlen)
{
    if (!c->weights[0]) {
        snprintf(err, errlen, "weights: required (a safetensors file, or 'synthetic' for load tests)");
        return -1;
    }
    if (strcmp(c->precision, "int8") == 0 && !c->calibration[0]) {
        snprintf(err, errlen,
                 "precision int8 needs calibration = FILE (a table made by resnetd-calibrate "
                 "for these weights)");
        return -1;
    }
    int sizes[CONFIG_MAX_PREFERRED];
    int n = config_preferred_sizes(c->preferred_batch_sizes, sizes, CONFIG_MAX_PREFERRED, err, errlen);
    if (n < 0)
        return -1;
    for (int i = 0; i < n; i++)
        if (c->max_batch_size != CONFIG_AUTO && sizes[i] > c->max_batch_size) {
            snprintf(err, errlen, "preferred_batch_sizes: %d is larger than max_batch_size %ld", sizes[i],
                     c->max_batch_size);
            return -1;
        }
    if (!c->tls_certificate[0] != !c->tls_key[0]) {
        snprintf(err, errlen, "%s: HTTPS needs both tls_certificate and tls_key",
                 c->tls_key[0] ? "tls_key without tls_certificate" : "tls_certificate without tls_key");
        return -1;
    }
    if (c->body_memory_bytes != CONFIG_AUTO && c->body_memory_bytes < c->max_body_bytes) {
        snprintf(err, errlen,
                 "body_memory_bytes %ld is smaller than max_body_bytes %ld: "
                 "a body of the largest size could never be received",
                 c->body_memory_bytes, c->max_body_bytes);
        return -1;
    }
    if (c->queue_capacity != CONFIG_AUTO && c->max_batch_size != CONFIG_AUTO && c->queue_capacity < c->max_batch_size) {
        snprintf(err, errlen, "queue_capacity %ld is smaller than max_batch_size %ld", c->queue_capacity,
                 c->max_batch_size);
        return -1;
    }
    return 0;
}

/* body_memory_bytes = auto: 512 uploads of 12 MP photos (2-5 MB each)
 * overflowed the old fixed 1G; an eighth of memory leaves the rest to the
 * model, the queue and the system. At least 1G (the old default; large
 * progressive JPEGs need ~600 MB to decode) unless memory is under 4G,
 * then a quarter of it; at most 16G; never under max_body_bytes. */
#define BODY_MEMORY_MIN (1LL << 30)
#define BODY_MEMORY_MAX (16LL << 30)

void config_resolve(config *c, int cuda, long ncpus, long long memory)
{
    if (c->body_memory_bytes == CONFIG_AUTO) {
        long long lo = memory > 0 && memory / 4 < BODY_MEMORY_MIN ? memory / 4 : BODY_MEMORY_MIN, b = memory / 8;
        b = b < lo ? lo : b > BODY_MEMORY_MAX ? BODY_MEMORY_MAX : b;
        c->body_memory_bytes = (long)(b < c->max_body_bytes ? c->max_body_bytes : b);
    }
    if (c->max_batch_size == CONFIG_AUTO)
        c->max_batch_size = cuda ? 128 : 8;
    if (c->max_queue_delay_us == CONFIG_AUTO)
        c->max_queue_delay_us = cuda ? 2000 : 4000;
    if (c->queue_capacity == CONFIG_AUTO)
        c->queue_capacity = c->max_batch_size * 8 < 64 ? 64 : c->max_batch_size * 8;
    if (c->threads == CONFIG_AUTO)
        c->threads = ncpus / 4 < 2 ? 2 : ncpus / 4 > 8 ? 8 : ncpus / 4;
    if (c->decode_threads == CONFIG_AUTO)
        c->decode_threads = ncpus < 1 ? 1 : ncpus;
    if (c->client_connection_limit == CONFIG_AUTO)
        c->client_connection_limit = c->connection_limit / 2 < 1 ? 1 : c->connection_limit / 2;
}

int config_preferred_sizes(const char *s, int *sizes, int max, char *err, size_t errlen)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        if (!isdigit((unsigned char)*p)) {
            snprintf(err, errlen, "preferred_batch_sizes: '%s' is not a comma-separated list of sizes", s);
            return -1;
        }
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || v < 1 || v > 1024) {
            snprintf(err, errlen, "preferred_batch_sizes: sizes must be within 1..1024");
            return -1;
        }
        if (n == max) {
            snprintf(err, errlen, "preferred_batch_sizes: at most %d sizes", max);
            return -1;
        }
        sizes[n++] = (int)v;
        p = end;
        if (*p == ',')
            p++;
        else if (*p) {
            snprintf(err, errlen, "preferred_batch_sizes: '%s' is not a comma-separated list of sizes", s);
            return -1;
        }
    }
    return n;
}

int config_parse_listen(const char *s, char *host, size_t hostlen, int *port, char *err, size_t errlen)
{
    const char *colon, *h = s;
    size_t hl;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':') {
            snprintf(err, errlen, "listen: '%s' is not [ADDR6]:PORT", s);
            return -1;
        }
        h = s + 1;
        hl = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || strchr(s, ':') != colon) {
            snprintf(err, errlen, "listen: '%s' is not ADDR:PORT", s);
            return -1;
        }
        hl = (size_t)(colon - s);
    }
    if (hl == 0 || hl >= hostlen) {
        snprintf(err, errlen, "listen: '%s' has %s address", s, hl ? "too long an" : "no");
        return -1;
    }
    long p;
    if (parse_long(colon + 1, 0, &p) != 0 || p > 65535) {
        snprintf(err, errlen, "listen: '%s' has no valid port (0..65535)", s);
        return -1;
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    return 0;
}

void config_print_help(FILE *f, const char *prog)
{
    fprintf(f,
            "Usage: %s --weights FILE|synthetic [OPTION]...\n"
            "Serves ResNet18 image classification over HTTP with dynamic batching.\n\n"
            "  --config FILE         read key = value options from FILE first\n"
            "  --check-config        validate the configuration and exit\n"
            "  --help                show this help and exit\n"
            "  --version             show the version and exit\n\n"
            "Options (also valid as 'name = value' in the config file):\n",
            prog);
    for (int i = 0; i < NOPTIONS; i++) {
        char flag[128];
        name_to_flag(options[i].name, flag, sizeof flag);
        fprintf(f, "  --%s=VALUE\n      %s (default: %s)\n", flag, options[i].doc,
                options[i].def[0] ? options[i].def : "none");
    }
}
