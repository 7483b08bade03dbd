/* Class names, one per line in index order, loaded at run time: as many
 * lines as the model has classes. */
#ifndef RESNETD_LABELS_H
#define RESNETD_LABELS_H

#include <stddef.h>

typedef struct labels {
    char **names; /* count entries */
    int count;
    char *text; /* backing storage */
} labels;

/* Loads path; exactly `expect` (the model's class count) non-empty UTF-8
 * lines or it is an error naming both counts. */
int labels_load(const char *path, int expect, labels *l, char *err, size_t errlen);
void labels_free(labels *l);

/* The labels file to use when none is given: the installed one
 * ($(pkgdatadir)/imagenet-classes.txt), else the source tree's, so programs
 * run uninstalled from a build directory. */
const char *labels_default_path(void);

#endif
