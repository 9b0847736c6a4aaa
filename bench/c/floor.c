/* The physical floor of one lease cycle: the syscalls sidelease's full
 * algorithm needs, in C, with nothing else (realpath, statfs, lstat, open,
 * fstat, flock, lstat, /proc/locks read, pread, pwrite, ftruncate; then the
 * release: pwrite, ftruncate, close). Prints median and p99 in ns as JSON. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "stats.h"


static char buf[65536];
static const char record[] =
    "{\"schema\":1,\"generation\":1,\"pid\":4242,\"host\":\"db-1\",\"started_at\":\"2026-11-30T09:00:00.123Z\","
    "\"target\":\"/srv/app/app.db\",\"lease_path\":\"/srv/app/app.db.backend-lease\",\"nonce\":\"5f0c5f0c5f0c5f0c5f0c5f0c5f0c5f0c\","
    "\"boot_id\":\"5aef75cb-dfbd-4e36-b9fc-cc00793c6c46\",\"pid_ns\":4026531836,\"proc_start\":123456789,"
    "\"runtime\":\"c\",\"library\":\"sidelease 0.1.0\"}\n";

static void cycle(const char *target, const char *dir, int guard) {
    char real[PATH_MAX], lease[PATH_MAX + 32];
    struct statfs sfs;
    struct stat st, st2;
    if (!realpath(target, real)) { /* missing target: resolve the directory */
        if (!realpath(dir, real)) { perror("realpath"); exit(1); }
        strcat(real, "/bench.db");
    }
    snprintf(lease, sizeof lease, "%s.backend-lease", real);
    if (statfs(dir, &sfs)) { perror("statfs"); exit(1); }
    lstat(lease, &st);
    int fd = open(lease, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) { perror("open"); exit(1); }
    fstat(fd, &st);
    if (flock(fd, LOCK_EX | LOCK_NB)) { perror("flock"); exit(1); }
    lstat(lease, &st2);
    if (guard) {
        int p = open("/proc/locks", O_RDONLY | O_CLOEXEC);
        while (read(p, buf, sizeof buf) > 0) {}
        close(p);
    }
    (void)!pread(fd, buf, 4096, 0);
    (void)!pwrite(fd, record, sizeof record - 1, 0);
    (void)!ftruncate(fd, sizeof record - 1);
    (void)!pwrite(fd, record, sizeof record - 1, 0); /* the release record */
    (void)!ftruncate(fd, sizeof record - 1);
    close(fd);
}

static void run(const char *name, const char *target, const char *dir, int guard, int iters) {
    long long *ns = malloc(sizeof *ns * iters);
    for (int i = 0; i < iters / 10 + 1; i++) cycle(target, dir, guard);
    for (int i = 0; i < iters; i++) {
        long long t = now_ns();
        cycle(target, dir, guard);
        ns[i] = now_ns() - t;
    }
    print_stats(name, ns, iters);
    free(ns);
}

static void bare(int iters, const char *dir) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/bare.lock", dir);
    long long *ns = malloc(sizeof *ns * iters);
    for (int i = 0; i < iters; i++) {
        long long t = now_ns();
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        flock(fd, LOCK_EX | LOCK_NB);
        close(fd);
        ns[i] = now_ns() - t;
    }
    print_stats("c_bare_flock", ns, iters);
    free(ns);
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: floor DIR [ITERS]\n"); return 2; }
    int iters = argc > 2 ? atoi(argv[2]) : 20000;
    char target[PATH_MAX];
    snprintf(target, sizeof target, "%s/bench.db", argv[1]);
    printf("{");
    run("c_floor_cycle", target, argv[1], 1, iters);
    printf(",");
    run("c_floor_cycle_no_split_guard", target, argv[1], 0, iters);
    printf(",");
    bare(iters, argv[1]);
    printf("}\n");
    return 0;
}
