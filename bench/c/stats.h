/* Timing helpers shared by the C benchmark programs. */
#ifndef SIDELEASE_BENCH_STATS_H
#define SIDELEASE_BENCH_STATS_H
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* Sort the samples and print {"n","median_ns","p99_ns"} (named if `name`). */
static void print_stats(const char *name, long long *ns, int n) {
    qsort(ns, n, sizeof *ns, cmp_ll);
    if (name) printf("\"%s\":", name);
    printf("{\"n\":%d,\"median_ns\":%lld,\"p99_ns\":%lld}", n, ns[n / 2], ns[(long long)((n - 1) * 0.99)]);
}
#endif
