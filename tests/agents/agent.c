/* The C agent (see tests/PROTOCOL.md), against libsidelease.so. Commands
 * are flat JSON objects; the few fields needed are picked out by key. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sidelease.h"

#define MAX_HANDLES 1024
static sidelease_lease *handles[MAX_HANDLES];
/* Set by each lease's lost callback (run on the library's watcher thread). */
static atomic_int lost_called[MAX_HANDLES];
static void on_lost(const char *reason, void *user_data);
static int nhandles;
static int execs;
static char **saved_argv;

/* Find `"key":` and return a pointer just past it (spaces skipped). */
static const char *field(const char *json, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    if (!p) return NULL;
    p += strlen(pat);
    while (*p == ' ') p++;
    return p;
}

static int str_field(const char *json, const char *key, char *out, size_t len) {
    const char *p = field(json, key);
    if (!p || *p != '"') return 0;
    size_t n = 0;
    for (p++; *p && *p != '"' && n + 1 < len; p++) {
        if (*p == '\\' && p[1]) {
            p++;
            if (*p == 'u' && strncmp(p, "u0000", 5) == 0) { out[n++] = '\0'; p += 4; continue; }
        }
        out[n++] = *p;
    }
    out[n] = 0;
    return 1;
}

/* 1 and the number; 2 for null; 0 when absent. */
static int num_field(const char *json, const char *key, double *out) {
    const char *p = field(json, key);
    if (!p) return 0;
    if (strncmp(p, "null", 4) == 0) return 2;
    *out = strtod(p, NULL);
    return 1;
}

static int bool_field(const char *json, const char *key, int *out) {
    const char *p = field(json, key);
    if (!p) return 0;
    *out = strncmp(p, "true", 4) == 0;
    return 1;
}

/* Copy a balanced JSON object value. */
static int object_field(const char *json, const char *key, char *out, size_t len) {
    const char *p = field(json, key);
    if (!p || *p != '{') return 0;
    int depth = 0, in_str = 0;
    size_t n = 0;
    for (; *p && n + 1 < len; p++) {
        out[n++] = *p;
        if (in_str) {
            if (*p == '\\' && p[1]) out[n++] = *++p;
            else if (*p == '"') in_str = 0;
        } else if (*p == '"') in_str = 1;
        else if (*p == '{') depth++;
        else if (*p == '}' && --depth == 0) break;
    }
    out[n] = 0;
    return 1;
}

static void put_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') putchar('\\');
        if ((unsigned char)*s < 0x20) printf("\\u%04x", *s);
        else putchar(*s);
    }
    putchar('"');
}

static void done(void) {
    putchar('\n');
    fflush(stdout);
}

static const char *kind(sidelease_status st) {
    switch (st) {
    case SIDELEASE_ERR_IN_USE: return "in_use";
    case SIDELEASE_ERR_TIMEOUT: return "timeout";
    case SIDELEASE_ERR_UNSUPPORTED_FS: return "unsupported_fs";
    case SIDELEASE_ERR_INVALID_ARGUMENT: return "invalid_argument";
    case SIDELEASE_ERR_IO: return "io";
    case SIDELEASE_ERR_CANCELLED: return "cancelled";
    case SIDELEASE_ERR_NULL_ARGUMENT: return "null_argument";
    case SIDELEASE_ERR_LOST: return "lost";
    default: return "other";
    }
}

static void error(sidelease_status st) {
    static char msg[4096], holder[65536];
    sidelease_last_error(msg, sizeof msg, NULL);
    printf("{\"ok\":false,\"error\":{\"kind\":\"%s\",\"message\":", kind(st));
    put_string(msg);
    if (st == SIDELEASE_ERR_IN_USE || st == SIDELEASE_ERR_TIMEOUT) {
        uint32_t pids[64];
        size_t count = 0;
        sidelease_last_holder_json(holder, sizeof holder, NULL);
        sidelease_last_holder_pids(pids, 64, &count);
        printf(",\"holder\":%s,\"holders\":[", holder[0] ? holder : "null");
        for (size_t i = 0; i < count && i < 64; i++) printf("%s%u", i ? "," : "", pids[i]);
        putchar(']');
    }
    if (st == SIDELEASE_ERR_IO) printf(",\"errno\":%d", sidelease_last_errno());
    printf("}}");
    done();
}

static sidelease_options *options(const char *cmd) {
    sidelease_options *o = NULL;
    double t;
    int b;
    static char buf[32768];
    sidelease_options_new(&o);
    switch (num_field(cmd, "timeout", &t)) {
    case 1: sidelease_options_set_timeout_ms(o, (int64_t)(t * 1000)); break;
    case 2: sidelease_options_set_timeout_ms(o, -1); break;
    default: break;
    }
    if (str_field(cmd, "suffix", buf, sizeof buf)) sidelease_options_set_suffix(o, buf);
    if (object_field(cmd, "metadata", buf, sizeof buf)) sidelease_options_set_metadata_json(o, buf);
    if (bool_field(cmd, "split_guard", &b)) sidelease_options_set_split_guard(o, b);
    if (bool_field(cmd, "watch", &b)) sidelease_options_set_watch(o, b);
    return o;
}

static void acquire(const char *cmd) {
    static char target[4096];
    str_field(cmd, "target", target, sizeof target);
    sidelease_options *o = options(cmd);
    sidelease_lease *l = NULL;
    sidelease_status st = sidelease_acquire(target, o, NULL, &l);
    sidelease_options_free(o);
    if (st != SIDELEASE_OK) return error(st);
    if (nhandles == MAX_HANDLES) {
        sidelease_lease_free(l);
        printf("{\"ok\":false,\"error\":{\"kind\":\"protocol\",\"message\":\"too many handles\"}}");
        return done();
    }
    handles[nhandles] = l;
    sidelease_lease_on_lost(l, on_lost, &lost_called[nhandles]);
    nhandles++;
    char *path = NULL, *record = NULL, *previous = NULL;
    bool clean = false, written = false;
    uint64_t gen = 0;
    char gen_text[32] = "null";
    sidelease_lease_path(l, &path);
    sidelease_lease_record_json(l, &record);
    sidelease_lease_previous_json(l, &previous);
    /* Read-only leases answer SIDELEASE_ERR_UNKNOWN: null in JSON. */
    sidelease_status clean_st = sidelease_lease_previous_released_cleanly(l, &clean);
    sidelease_lease_record_written(l, &written);
    if (sidelease_lease_generation(l, &gen) == SIDELEASE_OK)
        snprintf(gen_text, sizeof gen_text, "%llu", (unsigned long long)gen);
    printf("{\"ok\":true,\"handle\":%d,\"lease_path\":", nhandles);
    put_string(path);
    printf(",\"generation\":%s,\"record\":%s,\"previous\":%s,\"previous_released_cleanly\":%s,\"record_written\":%s}",
           gen_text, record, previous,
           clean_st != SIDELEASE_OK ? "null" : clean ? "true" : "false", written ? "true" : "false");
    sidelease_string_free(path);
    sidelease_string_free(record);
    sidelease_string_free(previous);
    done();
}

static sidelease_lease *handle(const char *cmd) {
    double h = 0;
    num_field(cmd, "handle", &h);
    return h >= 1 && h <= nhandles ? handles[(int)h - 1] : NULL;
}

static void on_lost(const char *reason, void *user_data) {
    (void)reason;
    atomic_store((atomic_int *)user_data, 1);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* {"ok":true,"state":...,"reason":...} from sidelease_lease_state and
 * sidelease_lease_ensure_held, plus what the wait saw. */
static void state(sidelease_lease *l, int index, int waited, int lost, double elapsed) {
    sidelease_state s;
    sidelease_status st = sidelease_lease_state(l, &s);
    if (st != SIDELEASE_OK) return error(st);
    printf("{\"ok\":true,\"state\":\"%s\",\"reason\":",
           s == SIDELEASE_STATE_HELD ? "held" : s == SIDELEASE_STATE_LOST ? "lost" : "released");
    if (s == SIDELEASE_STATE_LOST && sidelease_lease_ensure_held(l) == SIDELEASE_ERR_LOST) {
        static char msg[4096];
        sidelease_last_error(msg, sizeof msg, NULL);
        put_string(msg);
    } else {
        printf("null");
    }
    printf(",\"callback\":%s", atomic_load(&lost_called[index]) ? "true" : "false");
    if (waited) printf(",\"lost\":%s,\"elapsed_ms\":%.3f", lost ? "true" : "false", elapsed);
    putchar('}');
    done();
}

static void wait_lost(const char *cmd, sidelease_lease *l, int index) {
    double timeout = 5;
    int fd = -1;
    num_field(cmd, "timeout", &timeout);
    double start = now_ms();
    sidelease_status st = sidelease_lease_lost_fd(l, &fd);
    if (st != SIDELEASE_OK) return error(st);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n = poll(&p, 1, (int)(timeout * 1000));
    state(l, index, 1, n > 0, now_ms() - start);
}

static int read_file(const char *path, char *buf, size_t len) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = 0;
    fclose(f);
    return (int)n;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void stress(const char *cmd) {
    static char target[4096], counter[4096], owner[4096];
    char buf[64], me[32];
    double iterations = 0, timeout = 5;
    str_field(cmd, "target", target, sizeof target);
    str_field(cmd, "counter", counter, sizeof counter);
    str_field(cmd, "owner", owner, sizeof owner);
    num_field(cmd, "iterations", &iterations);
    num_field(cmd, "timeout", &timeout);
    snprintf(me, sizeof me, "%d", (int)getpid());
    sidelease_options *o = NULL;
    sidelease_options_new(&o);
    sidelease_options_set_timeout_ms(o, (int64_t)(timeout * 1000));
    int guard_on;
    if (bool_field(cmd, "split_guard", &guard_on)) sidelease_options_set_split_guard(o, guard_on);
    long done_n = 0, overlaps = 0, timeouts = 0, lost = 0;
    for (long i = 0; i < (long)iterations; i++) {
        sidelease_lease *l = NULL;
        sidelease_status st = sidelease_acquire(target, o, NULL, &l);
        if (st == SIDELEASE_ERR_TIMEOUT) { timeouts++; continue; }
        if (st != SIDELEASE_OK) { sidelease_options_free(o); return error(st); }
        read_file(owner, buf, sizeof buf);
        if (strncmp(buf, "-", 1) != 0) overlaps++;
        write_file(owner, me);
        read_file(counter, buf, sizeof buf);
        snprintf(buf, sizeof buf, "%ld", atol(buf) + 1);
        write_file(counter, buf);
        read_file(owner, buf, sizeof buf);
        if (strcmp(buf, me) != 0) overlaps++;
        write_file(owner, "-");
        if (sidelease_lease_ensure_held(l) == SIDELEASE_ERR_LOST) lost++;
        sidelease_lease_free(l);
        done_n++;
    }
    sidelease_options_free(o);
    printf("{\"ok\":true,\"done\":%ld,\"overlaps\":%ld,\"timeouts\":%ld,\"lost\":%ld}", done_n, overlaps, timeouts, lost);
    done();
}

/* `threads` threads acquire one new lease at the same moment, `rounds`
 * times; none may be refused by its own process. */
static pthread_barrier_t barrier;
static char threads_dir[4096];
static long rounds_n;
static atomic_long acquired_n, self_refused_n, other_n;

static void *threads_worker(void *arg) {
    (void)arg;
    char target[4200];
    for (long r = 0; r < rounds_n; r++) {
        snprintf(target, sizeof target, "%s/round-%ld.db", threads_dir, r);
        pthread_barrier_wait(&barrier);
        sidelease_lease *l = NULL;
        sidelease_status st = sidelease_acquire(target, NULL, NULL, &l);
        pthread_barrier_wait(&barrier);
        if (st == SIDELEASE_OK) {
            atomic_fetch_add(&acquired_n, 1);
            sidelease_lease_free(l);
        } else if (st == SIDELEASE_ERR_IN_USE) {
            uint32_t pids[16];
            size_t count = 0;
            sidelease_last_holder_pids(pids, 16, &count);
            int self = count == 0;
            for (size_t i = 0; i < count && i < 16; i++) self |= pids[i] == (uint32_t)getpid();
            atomic_fetch_add(self ? &self_refused_n : &other_n, 1);
        } else {
            atomic_fetch_add(&other_n, 1);
        }
    }
    return NULL;
}

static void threads_cmd(const char *cmd) {
    double n = 8, rounds = 1000;
    str_field(cmd, "dir", threads_dir, sizeof threads_dir);
    num_field(cmd, "threads", &n);
    num_field(cmd, "rounds", &rounds);
    rounds_n = (long)rounds;
    atomic_store(&acquired_n, 0);
    atomic_store(&self_refused_n, 0);
    atomic_store(&other_n, 0);
    pthread_t t[64];
    int k = n > 64 ? 64 : (int)n;
    pthread_barrier_init(&barrier, NULL, (unsigned)k);
    for (int i = 0; i < k; i++) pthread_create(&t[i], NULL, threads_worker, NULL);
    for (int i = 0; i < k; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&barrier);
    printf("{\"ok\":true,\"acquired\":%ld,\"refused_by_self\":%ld,\"other_errors\":%ld}",
           atomic_load(&acquired_n), atomic_load(&self_refused_n), atomic_load(&other_n));
    done();
}

/* Fork while another thread acquires and releases; no child may keep a
 * descriptor of the lease file. */
static atomic_int storm_stop;
static atomic_long storm_cycles;
static char storm_target[4096];

static void *storm_worker(void *arg) {
    (void)arg;
    while (!atomic_load(&storm_stop)) {
        sidelease_lease *l = NULL;
        if (sidelease_acquire(storm_target, NULL, NULL, &l) == SIDELEASE_OK) sidelease_lease_free(l);
        atomic_fetch_add(&storm_cycles, 1);
    }
    return NULL;
}

static int child_has_fd_of(pid_t child, dev_t dev, ino_t ino) {
    char dir[64], path[400];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)child);
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    struct stat st;
    while ((e = readdir(d))) {
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (e->d_name[0] != '.' && stat(path, &st) == 0 && st.st_dev == dev && st.st_ino == ino) found = 1;
    }
    closedir(d);
    return found;
}

static void fork_storm(const char *cmd) {
    double forks = 5000;
    str_field(cmd, "target", storm_target, sizeof storm_target);
    num_field(cmd, "forks", &forks);
    sidelease_lease *first = NULL;
    sidelease_status st = sidelease_acquire(storm_target, NULL, NULL, &first);
    if (st != SIDELEASE_OK) return error(st);
    char *lp = NULL;
    sidelease_lease_path(first, &lp);
    struct stat key;
    stat(lp, &key);
    sidelease_string_free(lp);
    sidelease_lease_free(first);
    atomic_store(&storm_stop, 0);
    atomic_store(&storm_cycles, 0);
    pthread_t w;
    pthread_create(&w, NULL, storm_worker, NULL);
    long bad = 0;
    for (long i = 0; i < (long)forks; i++) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) != 0) break;
        pid_t child = fork();
        if (child == 0) {
            char x = 'x';
            (void)!write(p[1], &x, 1);
            for (;;) pause();
        }
        char b;
        (void)!read(p[0], &b, 1);
        close(p[0]);
        close(p[1]);
        bad += child_has_fd_of(child, key.st_dev, key.st_ino);
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    }
    atomic_store(&storm_stop, 1);
    pthread_join(w, NULL);
    sidelease_lease *last = NULL;
    st = sidelease_acquire(storm_target, NULL, NULL, &last);
    sidelease_lease_free(last);
    printf("{\"ok\":true,\"forks\":%ld,\"children_with_lease_fd\":%ld,\"cycles\":%ld,\"final_acquire\":\"%s\"}",
           (long)forks, bad, atomic_load(&storm_cycles), st == SIDELEASE_OK ? "ok" : "refused");
    done();
}

int main(int argc, char **argv) {
    (void)argc;
    saved_argv = argv;
    const char *e = getenv("SIDELEASE_AGENT_EXECS");
    execs = e ? atoi(e) : 0;
    printf("{\"event\":\"ready\",\"pid\":%d,\"runtime\":\"c\",\"execs\":%d}", (int)getpid(), execs);
    done();
    static char line[1 << 16];
    while (fgets(line, sizeof line, stdin)) {
        char name[64] = "";
        str_field(line, "cmd", name, sizeof name);
        if (!strcmp(name, "ping")) {
            printf("{\"ok\":true,\"pid\":%d}", (int)getpid());
            done();
        } else if (!strcmp(name, "acquire")) {
            acquire(line);
        } else if (!strcmp(name, "release") || !strcmp(name, "check") || !strcmp(name, "ensure") ||
                   !strcmp(name, "ensure_now")) {
            sidelease_lease *l = handle(line);
            if (!l) {
                printf("{\"ok\":false,\"error\":{\"kind\":\"protocol\",\"message\":\"no such handle\"}}");
                done();
                continue;
            }
            if (!strcmp(name, "release")) {
                sidelease_status st = sidelease_lease_release(l);
                if (st != SIDELEASE_OK) { error(st); continue; }
                printf("{\"ok\":true}");
            } else if (!strcmp(name, "ensure") || !strcmp(name, "ensure_now")) {
                sidelease_status st = !strcmp(name, "ensure") ? sidelease_lease_ensure_held(l)
                                                              : sidelease_lease_ensure_held_now(l);
                if (st != SIDELEASE_OK) { error(st); continue; }
                printf("{\"ok\":true}");
            } else {
                sidelease_check c;
                sidelease_status st = sidelease_lease_check(l, &c);
                if (st != SIDELEASE_OK) { error(st); continue; }
                printf("{\"ok\":true,\"check\":\"%s\"}",
                       c == SIDELEASE_CHECK_HELD ? "held" : c == SIDELEASE_CHECK_UNLINKED ? "unlinked" : "replaced");
            }
            done();
        } else if (!strcmp(name, "state") || !strcmp(name, "wait_lost")) {
            sidelease_lease *l = handle(line);
            if (!l) {
                printf("{\"ok\":false,\"error\":{\"kind\":\"protocol\",\"message\":\"no such handle\"}}");
                done();
                continue;
            }
            double h = 0;
            num_field(line, "handle", &h);
            if (!strcmp(name, "state")) state(l, (int)h - 1, 0, 0, 0);
            else wait_lost(line, l, (int)h - 1);
        } else if (!strcmp(name, "inspect")) {
            static char target[4096], suffix[256];
            char *out = NULL;
            str_field(line, "target", target, sizeof target);
            int has_suffix = str_field(line, "suffix", suffix, sizeof suffix);
            sidelease_status st = sidelease_inspect_json(target, has_suffix ? suffix : NULL, &out);
            if (st != SIDELEASE_OK) { error(st); continue; }
            printf("{\"ok\":true,\"inspect\":%s}", out);
            sidelease_string_free(out);
            done();
        } else if (!strcmp(name, "exec_self")) {
            char n[16];
            snprintf(n, sizeof n, "%d", execs + 1);
            setenv("SIDELEASE_AGENT_EXECS", n, 1);
            execv("/proc/self/exe", saved_argv);
            printf("{\"ok\":false,\"error\":{\"kind\":\"io\",\"message\":\"execv failed\"}}");
            done();
        } else if (!strcmp(name, "fork_child")) {
            pid_t pid = fork();
            if (pid == 0)
                for (;;) pause();
            printf("{\"ok\":true,\"child\":%d}", (int)pid);
            done();
        } else if (!strcmp(name, "crash")) {
            kill(getpid(), SIGKILL);
        } else if (!strcmp(name, "exit")) {
            double code = 0;
            num_field(line, "code", &code);
            fflush(stdout);
            _exit((int)code);
        } else if (!strcmp(name, "stress")) {
            stress(line);
        } else if (!strcmp(name, "threads")) {
            threads_cmd(line);
        } else if (!strcmp(name, "fork_storm")) {
            fork_storm(line);
        } else {
            printf("{\"ok\":false,\"error\":{\"kind\":\"protocol\",\"message\":\"unknown command\"}}");
            done();
        }
    }
    return 0;
}
