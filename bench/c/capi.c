/* The C ABI in the same measurements as the other languages:
 *   capi cycle|shared|refused TARGET ITERS   JSON stats (ns)
 *   capi waiter TARGET                       handoff waiter (stdin protocol)
 *   capi raw-waiter LOCKFILE                 the baseline: a blocking flock(2)
 *   capi inotify-waiter LOCKFILE             the mechanism alone: inotify wake + LOCK_NB */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <time.h>
#include <unistd.h>

#include "stats.h"

#include "sidelease.h"


static void op(const char *mode, const char *target) {
    sidelease_lease *l = NULL;
    sidelease_status st = sidelease_acquire(target, NULL, NULL, &l);
    if (!strcmp(mode, "refused")) {
        if (st != SIDELEASE_ERR_IN_USE) { fprintf(stderr, "expected in-use\n"); exit(1); }
        return;
    }
    if (st != SIDELEASE_OK) { fprintf(stderr, "acquire failed: %d\n", st); exit(1); }
    sidelease_lease_free(l);
}

/* One timed operation, not inlined: bench/instructions.py counts the
 * instructions run inside it (the warm-up calls op() directly). */
__attribute__((noinline)) static void one(const char *mode, const char *target) { op(mode, target); }

/* raw: 0 sidelease, 1 blocking flock, 2 inotify + LOCK_NB retries. */
static int waiter(const char *target, int raw) {
    char line[64];
    sidelease_options *o = NULL;
    sidelease_options_new(&o);
    sidelease_options_set_timeout_ms(o, 30000);
    sidelease_lease *l = NULL;
    int fd = -1;
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "wait", 4)) {
            if (raw == 1) {
                fd = open(target, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
                if (flock(fd, LOCK_EX)) return 1;
            } else if (raw == 2) {
                fd = open(target, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
                int in = inotify_init1(IN_CLOEXEC);
                inotify_add_watch(in, target, IN_CLOSE_WRITE | IN_CLOSE_NOWRITE);
                while (flock(fd, LOCK_EX | LOCK_NB)) {
                    struct pollfd pf = {in, POLLIN, 0};
                    char buf[4096];
                    poll(&pf, 1, 100);
                    if (pf.revents && read(in, buf, sizeof buf) < 0) return 1;
                    /* the event precedes the unlock: retry at once, briefly */
                    for (int i = 0; i < 1000 && flock(fd, LOCK_EX | LOCK_NB); i++) sched_yield();
                    if (!flock(fd, LOCK_EX | LOCK_NB)) break;
                }
                printf("%lld\n", now_ns());
                close(in); /* after the stamp: closing an inotify instance is slow */
                fflush(stdout);
                continue;
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
    if (!strcmp(mode, "inotify-waiter")) return waiter(target, 2);
    int iters = argc > 3 ? atoi(argv[3]) : 10000;
    sidelease_lease *held = NULL;
    if (!strcmp(mode, "shared") && sidelease_acquire(target, NULL, NULL, &held) != SIDELEASE_OK) return 1;
    long long *ns = malloc(sizeof *ns * iters);
    for (int i = 0; i < iters / 10 + 1; i++) op(mode, target);
    for (int i = 0; i < iters; i++) {
        long long t = now_ns();
        one(mode, target);
        ns[i] = now_ns() - t;
    }
    sidelease_lease_free(held);
    print_stats(NULL, ns, iters);
    printf("\n");
    free(ns);
    return 0;
}
