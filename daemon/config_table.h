/* resnetd's configuration: one table declares every option (name, type,
 * bounds, default, doc line); the config-file parser, the command-line
 * parser, --help and the sample-config test all walk that table.
 *
 * Precedence: built-in defaults < the config file < command-line flags.
 * Options that default to "auto" hold -1 until config_resolve() fills them
 * in for the device the engine actually runs on. */
#ifndef RESNETD_CONFIG_H
#define RESNETD_CONFIG_H

#include <stddef.h>
#include <stdio.h>

#define CONFIG_AUTO (-1L)
#define CONFIG_MAX_PREFERRED 16
#define CONFIG_PATH_MAX 4096
#define CONFIG_FILE_MAX (1L << 20) /* largest config file read */
#define CONFIG_MAX_OPTIONS 64
#define CONFIG_FROM_FLAG (-1) /* config.line: set by a command-line flag */

typedef struct config {
    char listen[256]; /* ADDR:PORT, [ADDR6]:PORT; port 0 = ephemeral */
    char weights[CONFIG_PATH_MAX]; /* safetensors file, or "synthetic" */
    char labels[CONFIG_PATH_MAX]; /* "" = the installed default */
    char device[32]; /* cpu, cuda, cuda:N, auto */
    char precision[16]; /* fp32, fp16, int8, default */
    char calibration[CONFIG_PATH_MAX]; /* INT8 calibration table; "" = none */
    char deterministic[8]; /* "true", "false": engine_config.deterministic */
    char gpu_tuning[128]; /* engine_tuning_parse's text: engine_config.tuning */
    long max_batch_size; /* images per engine batch; auto per device */
    long max_queue_delay_us; /* oldest image's longest wait for a fuller batch */
    char preferred_batch_sizes[256]; /* "4,8": comma list, "" = none */
    long queue_capacity; /* preallocated image slots */
    long threads; /* HTTP worker threads (parsing, answering) */
    long decode_threads; /* the JPEG decode pool, shared by all connections */
    char decode[16]; /* auto, gpu, cpu */
    long gpu_decode_memory; /* device arena for decoded pixels */
    long cpu_decode_assist; /* GPU decoding: CONFIG_AUTO by cost, N past a queue depth of N, 0 never */
    long engine_threads; /* CPU engine threads, 0 = all cores */
    long max_body_bytes;
    long body_memory_bytes; /* all buffered request bodies together (503 past it) */
    long max_pixels; /* decoded width x height per image */
    long request_timeout_ms; /* our per-request deadline (504) */
    long drain_timeout_ms; /* SIGTERM: longest wait for in-flight requests */
    long connection_limit;
    long client_connection_limit; /* per client address; 0: none */
    long connection_timeout_s; /* idle connections are closed */
    long header_timeout_s; /* a request's headers must arrive within this (slowloris) */
    long min_body_rate; /* bytes/s a body must average after header_timeout_s; 0: none */
    long connection_memory_bytes; /* a connection's read buffer at most: the largest head */
    long listen_backlog;
    char access_log[CONFIG_PATH_MAX]; /* one JSON line per request; "" = none */
    char tls_certificate[CONFIG_PATH_MAX]; /* PEM chain: HTTPS on the listener; "" = plain HTTP */
    char tls_key[CONFIG_PATH_MAX]; /* its private key (PEM) */
    /* Where each option (in config_options' order) was set: its line in
     * --config's file, CONFIG_FROM_FLAG, or 0 (the default). */
    int line[CONFIG_MAX_OPTIONS];
} config;

typedef enum { CONFIG_STRING, CONFIG_INT, CONFIG_BYTES } config_type;

/* "true" or "false" (config_check_bool has accepted it): 1 or 0. */
int config_bool(const char *v);

typedef struct config_option {
    const char *name; /* file key; the flag is --name with '_' -> '-' */
    config_type type;
    size_t offset; /* into struct config */
    size_t size; /* CONFIG_STRING: buffer size */
    long min, max; /* CONFIG_INT/BYTES bounds */
    int allow_auto; /* accepts "auto" (stored as CONFIG_AUTO) */
    const char *def; /* default, written as in the file */
    const char *doc; /* one line for --help and the sample config */
    /* Optional extra validation of a string value. */
    int (*check)(const char *value, char *err, size_t errlen);
} config_option;

/* What the command line asked for besides options. */
typedef struct config_cli {
    const char *config_path; /* --config FILE, or NULL */
    int check_config; /* --check-config */
    int help; /* --help */
    int version; /* --version */
} config_cli;

const config_option *config_options(int *count);
const config_option *config_find(const char *name);

/* Fills c with every option's default. */
void config_defaults(config *c);

/* Sets one option from its text form; err gets the reason. */
int config_set(config *c, const char *name, const char *value, char *err, size_t errlen);

/* Reads key = value lines (# comments, blank lines) from a regular file of
 * at most CONFIG_FILE_MAX bytes with no NUL byte. Errors read
 * "FILE:LINE: reason" or "FILE: reason". */
int config_load_file(config *c, const char *path, char *err, size_t errlen);

/* The same parser on text[0..len) (need not be NUL-terminated); name is
 * what errors call it. */
int config_parse_text(config *c, const char *name, const char *text, size_t len, char *err, size_t errlen);

/* Defaults, then --config's file, then the other flags. Errors name the
 * flag. argv is not modified. */
int config_load(config *c, config_cli *cli, int argc, char **argv, char *err, size_t errlen);

/* Where option `name` of c came from, for an error message: "FILE:LINE:
 * name" (file: --config's), "--flag-name", or "name" (its default). */
void config_where(const config *c, const char *file, const char *name, char *buf, size_t len);

/* Cross-option checks (weights given, preferred sizes within max batch...). */
int config_validate(const config *c, char *err, size_t errlen);

/* Fills the "auto" options for the device the engine resolved to
 * (cuda != 0: a CUDA device), the CPUs and the bytes of memory this
 * process may use (0: unknown). */
void config_resolve(config *c, int cuda, long ncpus, long long memory);

/* Parses preferred_batch_sizes into sizes[]; returns the count or -1. */
int config_preferred_sizes(const char *s, int *sizes, int max, char *err, size_t errlen);

/* Splits listen into host and port. */
int config_parse_listen(const char *s, char *host, size_t hostlen, int *port, char *err, size_t errlen);

void config_print_help(FILE *f, const char *prog);

#endif
