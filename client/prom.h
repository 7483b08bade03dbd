/* Reading the server's own view from its Prometheus text exposition
 * (format 0.0.4): the samples are parsed into a flat list, and the report
 * takes sums and differences of the few it needs (batch size, queue time,
 * rejections) between a scrape before and one after the run. */
#ifndef RESNETD_PROM_H
#define RESNETD_PROM_H

#include <stddef.h>

typedef struct {
    char *name; /* e.g. resnetd_rejected_total */
    char *labels; /* the text between the braces, "" if none */
    double value;
} prom_sample;

typedef struct {
    prom_sample *v;
    size_t n, cap;
} prom_set;

/* Parses text into out (which must be zeroed or freed). Comment and blank
 * lines are skipped; 0, or -1 with the offending line number in err. */
int prom_parse(const char *text, prom_set *out, char *err, size_t errlen);

/* Sum of the samples called name over all their label sets; *found says
 * whether there was any. */
double prom_sum(const prom_set *s, const char *name, int *found);

/* The value of label key in a label string into buf; 0, or -1 if absent. */
int prom_label(const char *labels, const char *key, char *buf, size_t n);

void prom_free(prom_set *s);

#endif
