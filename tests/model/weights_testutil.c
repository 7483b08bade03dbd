/* Helpers shared by the weights and SHA-256 test programs
 * (tests/model/weights_testutil.h). */
#include "tests/model/weights_testutil.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "tests/lib/testutil.h"

static char tmpdir[64];

int tmpdir_make(const char *name)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/%s.XXXXXX", name);
    return mkdtemp(tmpdir) ? 0 : -1;
}

void tmpdir_remove(void)
{
    DIR *dir = opendir(tmpdir);
    struct dirent *de;
    while (dir && (de = readdir(dir)) != NULL)
        if (de->d_name[0] != '.')
            unlink(tmp_path(de->d_name));
    if (dir)
        closedir(dir);
    if (rmdir(tmpdir) != 0)
        perror(tmpdir);
}

const char *tmp_dir(void)
{
    return tmpdir;
}

const char *tmp_path(const char *name)
{
    static char buf[4][512];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", tmpdir, name);
    return b;
}

void write_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert(f != NULL);
    ck_assert(fwrite(b, 1, n, f) == n);
    ck_assert(fclose(f) == 0);
}

void sha256sum(const char *path, char hex[65])
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "sha256sum '%s'", path);
    FILE *p = popen(cmd, "r");
    ck_assert(p != NULL);
    ck_assert(fscanf(p, "%64s", hex) == 1);
    ck_assert_int_eq(pclose(p), 0);
}

double half_value(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return h & 0x8000 ? -v : v;
}

int near_ulp(float a, float b)
{
    return a == b || nextafterf(b, a) == a;
}
