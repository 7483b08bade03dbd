/* Loading the JPEG corpus into memory (see corpus.h). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include "client/corpus.h"

#define PART_HEAD_FMT                                                             \
    "--%s\r\nContent-Disposition: form-data; name=\"image\"; filename=\"%s\"\r\n" \
    "Content-Type: image/jpeg\r\n\r\n"

static int read_whole(const char *path, uint8_t **data, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        fclose(f);
        return -1;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf || fread(buf, 1, n, f) != n) {
        snprintf(err, errlen, "%s: %s", path, buf ? "short read" : "out of memory");
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    *data = buf;
    *len = n;
    return 0;
}

static int add_file(corpus *c, const char *path, char *err, size_t errlen)
{
    uint8_t *data;
    size_t len;
    if (read_whole(path, &data, &len, err, errlen) != 0)
        return -1;
    if (len < 3 || data[0] != 0xFF || data[1] != 0xD8 || data[2] != 0xFF) {
        snprintf(err, errlen, "%s: not a JPEG file", path);
        free(data);
        return -1;
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 64;
        corpus_image *p = realloc(c->images, cap * sizeof *p);
        if (!p) {
            snprintf(err, errlen, "out of memory");
            free(data);
            return -1;
        }
        c->images = p;
        c->cap = cap;
    }
    char *copy = strdup(path);
    if (!copy) {
        snprintf(err, errlen, "out of memory");
        free(data);
        return -1;
    }
    c->images[c->n++] = (corpus_image){ .path = copy, .data = data, .len = len };
    c->bytes += len;
    return 0;
}

static int is_jpeg_name(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot && (strcasecmp(dot, ".jpg") == 0 || strcasecmp(dot, ".jpeg") == 0);
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int add_dir(corpus *c, const char *dir, char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(err, errlen, "%s: %s", dir, strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || !is_jpeg_name(e->d_name))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **p = realloc(names, cap * sizeof *p);
            if (!p) {
                rc = -1;
                break;
            }
            names = p;
        }
        if ((names[n] = strdup(e->d_name)) == NULL) {
            rc = -1;
            break;
        }
        n++;
    }
    closedir(d);
    if (rc != 0)
        snprintf(err, errlen, "out of memory");
    if (rc == 0 && n > 0)
        qsort(names, n, sizeof *names, cmp_names);
    for (size_t i = 0; i < n; i++) {
        if (rc == 0) {
            size_t len = strlen(dir) + strlen(names[i]) + 2;
            char *path = malloc(len);
            if (!path) {
                snprintf(err, errlen, "out of memory");
                rc = -1;
            } else {
                snprintf(path, len, "%s/%s", dir, names[i]);
                rc = add_file(c, path, err, errlen);
                free(path);
            }
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int corpus_add_path(corpus *c, const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    return S_ISDIR(st.st_mode) ? add_dir(c, path, err, errlen) : add_file(c, path, err, errlen);
}

int corpus_add_list(corpus *c, const char *list, char *err, size_t errlen)
{
    FILE *f = fopen(list, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", list, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    while (rc == 0 && (len = getline(&line, &cap, f)) != -1) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
            line[--len] = '\0';
        if (len == 0 || line[0] == '#')
            continue;
        rc = add_file(c, line, err, errlen);
    }
    if (rc == 0 && ferror(f)) {
        snprintf(err, errlen, "%s: read error", list);
        rc = -1;
    }
    free(line);
    fclose(f);
    return rc;
}

int corpus_prepare_multipart(corpus *c, const char *boundary, char *err, size_t errlen)
{
    for (size_t i = 0; i < c->n; i++) {
        corpus_image *im = &c->images[i];
        const char *base = strrchr(im->path, '/');
        base = base ? base + 1 : im->path;
        /* a filename with quotes or CR/LF would break the header: use a plain one */
        const char *name = strpbrk(base, "\"\r\n\\") ? "image.jpg" : base;
        int n = snprintf(NULL, 0, PART_HEAD_FMT, boundary, name);
        free(im->part_head);
        im->part_head = malloc((size_t)n + 1);
        if (n < 0 || !im->part_head) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        snprintf(im->part_head, (size_t)n + 1, PART_HEAD_FMT, boundary, name);
        im->part_head_len = (size_t)n;
    }
    return 0;
}

void corpus_free(corpus *c)
{
    for (size_t i = 0; i < c->n; i++) {
        free(c->images[i].path);
        free(c->images[i].data);
        free(c->images[i].part_head);
    }
    free(c->images);
    c->images = NULL;
    c->n = c->cap = c->bytes = 0;
}
