/* The C ABI in the same measurements as the other languages:
 *   capi cycle|shared|refused TARGET ITERS   JSON stats (ns)
 *   capi waiter TARGET                       handoff waiter (stdin protocol)
 *   capi raw-waiter LOCKFILE                 the baseline: a blocking flock(2) */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "sidelease.h"

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static void one(const char *mode, const char *target) {
    sidelease_lease *l = NULL;
    sidelease_status st = sidelease_acquire(target, NULL, NULL, &l);
    if (!strcmp(mode, "refused")) {
        if (st != SIDELEASE_ERR_IN_USE) { fprintf(stderr, "expected in-use\n"); exit(1); }
        return;
    }
    if (st != SIDELEASE_OK) { fprintf(stderr, "acquire failed: %d\n", st); exit(1); }
    sidelease_lease_free(l);
}

static int waiter(const char *target, int raw) {
    char line[64];
    sidelease_options *o = NULL;
    sidelease_options_new(&o);
    sidelease_options_set_timeout_ms(o, 30000);
    sidelease_lease *l = NULL;
    int fd = -1;
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "wait", 4)) {
            if (raw) {
                fd = open(target, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
                if (flock(fd, LOCK_EX)) return 1;
            } else if (sidelease_acquire(target, o, NULL, &l) != SIDELEASE_OK) {
                return 1;
            }
            printf("%lld\n", now_ns());
        } else if (!strncmp(line, "release", 7)) {
            if (raw) close(fd);
            else sidelease_lease_free(l);
            printf("ok\n");
        } else {
            break;
        }
        fflush(stdout);
    }
    sidelease_options_free(o);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: capi MODE TARGET [ITERS]\n"); return 2; }
    const char *mode = argv[1], *target = argv[2];
    if (!strcmp(mode, "waiter")) return waiter(target, 0);
    if (!strcmp(mode, "raw-waiter")) return waiter(target, 1);
    int iters = argc > 3 ? atoi(argv[3]) : 10000;
    sidelease_lease *held = NULL;
    if (!strcmp(mode, "shared") && sidelease_acquire(target, NULL, NULL, &held) != SIDELEASE_OK) return 1;
    long long *ns = malloc(sizeof *ns * iters);
    for (int i = 0; i < iters / 10 + 1; i++) one(mode, target);
    for (int i = 0; i < iters; i++) {
        long long t = now_ns();
        one(mode, target);
        ns[i] = now_ns() - t;
    }
    sidelease_lease_free(held);
    qsort(ns, iters, sizeof *ns, cmp);
    printf("{\"n\":%d,\"median_ns\":%lld,\"p99_ns\":%lld}\n", iters, ns[iters / 2], ns[(long long)((iters - 1) * 0.99)]);
    free(ns);
    return 0;
}
