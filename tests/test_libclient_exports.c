/* SPDX-License-Identifier: MIT */
/*
 * libringlm.so: a program linking it sees the ringlm_* API and nothing else (the version
 * script libclient/libringlm.map), each symbol at the version node that added it, and
 * ringlm_version() of the library agrees with the header's RINGLM_VERSION_* macros.
 */
#include <criterion/criterion.h>

#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "libclient/ringlm.h"

static const char *so_path(void)
{
    static char p[4096];
    const char *b = getenv("RINGLM_BUILD");
    snprintf(p, sizeof p, "%s/lib/libringlm.so", b && *b ? b : "build");
    if (access(p, R_OK) != 0) cr_skip_test("%s not built (set RINGLM_BUILD)", p);
    return p;
}

/* The functions ringlm.h declares ("name(" after a type at the start of a line). */
static int header_functions(char names[][64], int max)
{
    FILE *f = fopen("libclient/ringlm.h", "r");
    if (!f) cr_skip_test("libclient/ringlm.h not found (run from the repository root)");
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f) && n < max) {
        if (line[0] == ' ' || line[0] == '*' || line[0] == '/' || line[0] == '#') continue;
        char *p = strstr(line, "ringlm_");
        if (!p) continue;
        size_t k = strspn(p, "abcdefghijklmnopqrstuvwxyz_");
        if (p[k] != '(' || k >= 64) continue;
        memcpy(names[n], p, k);
        names[n++][k] = 0;
    }
    fclose(f);
    return n;
}

Test(libclient_exports, only_the_ringlm_api)
{
    char declared[64][64];
    int n_declared = header_functions(declared, 64);
    cr_assert_gt(n_declared, 10);
    bool seen[64] = {false};
    const char *so = so_path();
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "nm -D --defined-only '%s' 2>&1", so);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    char line[512];
    int n = 0, api = 0, versioned = 0;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, "command not found")) {
            pclose(f);
            cr_skip_test("nm (binutils) is not installed");
        }
        char addr[64], type[8], name[400];
        if (sscanf(line, "%63s %7s %399s", addr, type, name) != 3) continue;
        if (!strcmp(type, "A")) continue; /* a version node of the map (RINGLM_0.2) */
        /* name@@RINGLM_x.y: every symbol carries the version node that added it */
        char *at = strchr(name, '@');
        cr_expect(at && !strncmp(at, "@@RINGLM_", 9), "%s has no version of the map", name);
        if (at) {
            if (!strcmp(name, "ringlm_submit@@RINGLM_0.2") ||
                !strcmp(name, "ringlm_tokenize@@RINGLM_0.3"))
                versioned++;
            *at = '\0';
        }
        n++;
        cr_expect(strncmp(name, "ringlm_", 7) == 0, "libringlm.so exports %s (not ringlm_*)", name);
        bool in_header = false;
        for (int i = 0; i < n_declared; i++)
            if (!strcmp(name, declared[i])) in_header = seen[i] = true;
        cr_expect(in_header, "libringlm.so exports %s, which ringlm.h does not declare", name);
        if (!strcmp(name, "ringlm_submit") || !strcmp(name, "ringlm_version")) api++;
    }
    for (int i = 0; i < n_declared; i++)
        cr_expect(seen[i],
                  "ringlm.h declares %s but libringlm.so does not export it "
                  "(add it to libclient/libringlm.map)",
                  declared[i]);
    cr_assert_eq(pclose(f), 0, "%s failed", cmd);
    cr_assert_gt(n, 10, "nm listed %d symbols", n);
    cr_assert_eq(api, 2, "ringlm_submit or ringlm_version is missing");
    cr_assert_eq(versioned, 2, "ringlm_submit is not at RINGLM_0.2 or ringlm_tokenize at 0.3");
}

Test(libclient_exports, version_matches_the_header)
{
    void *h = dlopen(so_path(), RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(h, "%s", dlerror());
    const char *(*version)(int *) = (const char *(*)(int *))dlsym(h, "ringlm_version");
    cr_assert_not_null(version, "%s", dlerror());
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", RINGLM_VERSION_MAJOR, RINGLM_VERSION_MINOR,
             RINGLM_VERSION_PATCH);
    int num = -1;
    cr_assert_str_eq(version(&num), want);
    cr_assert_eq(num, RINGLM_VERSION_NUMBER);
    cr_assert_eq(dlsym(h, "ring_copy_in"), NULL, "an internal symbol is reachable with dlsym");
    dlclose(h);
}
