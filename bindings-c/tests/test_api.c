/* Every function of the C ABI and every error path, against the checked-in
 * header and the built library. Real processes (fork) for contention; pipes
 * for handshakes; every wait bounded. Ends with "N passed, N failed". */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sidelease.h"

static int passed, failed;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (cond) {                                                              \
            passed++;                                                            \
        } else {                                                                 \
            failed++;                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                        \
    } while (0)

#define EXPECT(call, code)                                                       \
    do {                                                                         \
        sidelease_status st_ = (call);                                           \
        if (st_ == (code)) {                                                     \
            passed++;                                                            \
        } else {                                                                 \
            char m_[512];                                                        \
            sidelease_last_error(m_, sizeof m_, NULL);                           \
            failed++;                                                            \
            fprintf(stderr, "%s:%d: %s returned %d, expected %s (%d); last error: %s\n", \
                    __FILE__, __LINE__, #call, (int)st_, #code, (int)(code), m_); \
        }                                                                        \
    } while (0)

static char dir[256];

static void path(char *buf, const char *name) { snprintf(buf, 512, "%s/%s", dir, name); }

static int last_error_contains(const char *needle) {
    char m[1024];
    sidelease_last_error(m, sizeof m, NULL);
    if (strstr(m, needle)) return 1;
    fprintf(stderr, "  last error %s lacks %s\n", m, needle);
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Read one byte from a pipe within 10 s, or fail loudly. */
static int read_bounded(int fd) {
    fd_set set;
    struct timeval tv = {10, 0};
    FD_ZERO(&set);
    FD_SET(fd, &set);
    if (select(fd + 1, &set, NULL, NULL, &tv) != 1) {
        fprintf(stderr, "handshake timed out\n");
        exit(2);
    }
    char c;
    return read(fd, &c, 1) == 1 ? c : -1;
}

/* A child process that holds the lease of `target` until told to go. */
struct holder {
    pid_t pid;
    int to_child, from_child;
};

static struct holder start_holder(const char *target) {
    int up[2], down[2];
    if (pipe(up) || pipe(down)) exit(2);
    pid_t pid = fork();
    if (pid == 0) {
        close(up[0]);
        close(down[1]);
        sidelease_lease *l = NULL;
        char ok = sidelease_acquire(target, NULL, NULL, &l) == SIDELEASE_OK ? 'R' : 'E';
        if (write(up[1], &ok, 1) != 1) _exit(3);
        read_bounded(down[0]);
        sidelease_lease_release(l);
        sidelease_lease_free(l);
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    struct holder h = {pid, down[1], up[0]};
    CHECK(read_bounded(h.from_child) == 'R');
    return h;
}

static void stop_holder(struct holder *h) {
    char c = 'G';
    int status = -1;
    CHECK(write(h->to_child, &c, 1) == 1);
    CHECK(waitpid(h->pid, &status, 0) == h->pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(h->to_child);
    close(h->from_child);
}

static void test_version_and_strerror(void) {
    CHECK(strcmp(sidelease_version(), SIDELEASE_VERSION) == 0);
    char buf[64];
    size_t n = 0;
    EXPECT(sidelease_strerror(SIDELEASE_ERR_IN_USE, buf, sizeof buf, &n), SIDELEASE_OK);
    CHECK(strcmp(buf, "the lease is held by another process") == 0 && n == strlen(buf));
    EXPECT(sidelease_strerror(9999, buf, sizeof buf, NULL), SIDELEASE_OK);
    CHECK(strcmp(buf, "unknown status") == 0);
    EXPECT(sidelease_strerror(SIDELEASE_ERR_IN_USE, buf, 5, &n), SIDELEASE_ERR_BUFFER_TOO_SMALL);
    CHECK(strcmp(buf, "the ") == 0 && n > 5);
    EXPECT(sidelease_strerror(SIDELEASE_OK, NULL, 0, &n), SIDELEASE_ERR_BUFFER_TOO_SMALL);
    CHECK(n == strlen("success"));
    EXPECT(sidelease_strerror(SIDELEASE_OK, NULL, 4, &n), SIDELEASE_ERR_NULL_ARGUMENT);
}

static void test_options(void) {
    sidelease_options *o = NULL;
    EXPECT(sidelease_options_new(NULL), SIDELEASE_ERR_NULL_ARGUMENT);
    CHECK(last_error_contains("`out` is NULL"));
    EXPECT(sidelease_options_new(&o), SIDELEASE_OK);
    EXPECT(sidelease_options_set_timeout_ms(NULL, 5), SIDELEASE_ERR_NULL_ARGUMENT);
    CHECK(last_error_contains("`opts`"));
    EXPECT(sidelease_options_set_timeout_ms(o, 5), SIDELEASE_OK);
    EXPECT(sidelease_options_set_suffix(o, NULL), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_options_set_suffix(o, "a/b"), SIDELEASE_ERR_INVALID_ARGUMENT);
    CHECK(last_error_contains("`suffix`"));
    EXPECT(sidelease_options_set_suffix(o, ""), SIDELEASE_ERR_INVALID_ARGUMENT);
    EXPECT(sidelease_options_set_suffix(o, "\xff\xfe"), SIDELEASE_ERR_INVALID_ARGUMENT);
    CHECK(last_error_contains("not valid UTF-8"));
    EXPECT(sidelease_options_set_suffix(o, ".lock"), SIDELEASE_OK);
    EXPECT(sidelease_options_set_metadata_json(o, "[1]"), SIDELEASE_ERR_INVALID_ARGUMENT);
    CHECK(last_error_contains("`metadata`: must be a JSON object"));
    EXPECT(sidelease_options_set_metadata_json(o, "{nope"), SIDELEASE_ERR_INVALID_ARGUMENT);
    EXPECT(sidelease_options_set_metadata_json(o, "{\"s\":\"\xff\"}"), SIDELEASE_ERR_INVALID_ARGUMENT);
    EXPECT(sidelease_options_set_metadata_json(o, "{\"app\":\"c-test\"}"), SIDELEASE_OK);
    EXPECT(sidelease_options_set_metadata_json(o, NULL), SIDELEASE_OK);
    EXPECT(sidelease_options_set_allow_unsupported_fs(o, false), SIDELEASE_OK);
    EXPECT(sidelease_options_set_allow_unsupported_fs(NULL, false), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_options_set_split_guard(o, true), SIDELEASE_OK);
    EXPECT(sidelease_options_set_split_guard(NULL, true), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_options_set_runtime(o, "c-test"), SIDELEASE_OK);
    EXPECT(sidelease_options_set_runtime(o, "\xc3"), SIDELEASE_ERR_INVALID_ARGUMENT);
    sidelease_options_free(o);
    sidelease_options_free(NULL);
}

static void test_lease_lifecycle(void) {
    char db[512];
    path(db, "app.db");
    sidelease_lease *a = NULL, *b = NULL;
    EXPECT(sidelease_acquire(NULL, NULL, NULL, &a), SIDELEASE_ERR_NULL_ARGUMENT);
    CHECK(last_error_contains("`target` is NULL"));
    EXPECT(sidelease_acquire(db, NULL, NULL, NULL), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_acquire("", NULL, NULL, &a), SIDELEASE_ERR_INVALID_ARGUMENT);
    CHECK(last_error_contains("`target`"));
    {
        /* A lease file named as the target: refused, naming its database. */
        char lease[600], meant[600];
        snprintf(lease, sizeof lease, "%s.backend-lease", db);
        snprintf(meant, sizeof meant, "did you mean %s?", db);
        EXPECT(sidelease_acquire(lease, NULL, NULL, &a), SIDELEASE_ERR_INVALID_ARGUMENT);
        CHECK(last_error_contains("is a lease file") && last_error_contains(meant));
        char *j = NULL;
        EXPECT(sidelease_inspect_json(lease, NULL, &j), SIDELEASE_ERR_INVALID_ARGUMENT);
        CHECK(j == NULL && last_error_contains(meant));
    }

    sidelease_options *o = NULL;
    sidelease_options_new(&o);
    sidelease_options_set_metadata_json(o, "{\"app\":\"c-test\",\"port\":8000}");
    EXPECT(sidelease_acquire(db, o, NULL, &a), SIDELEASE_OK);
    sidelease_options_free(o);

    char *s = NULL;
    EXPECT(sidelease_lease_path(a, &s), SIDELEASE_OK);
    CHECK(s && strstr(s, "app.db.backend-lease"));
    sidelease_string_free(s);
    EXPECT(sidelease_lease_path(NULL, &s), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_lease_path(a, NULL), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_lease_record_json(a, &s), SIDELEASE_OK);
    CHECK(s && strstr(s, "\"runtime\":\"c\"") && strstr(s, "\"port\":8000"));
    char pidtext[32];
    snprintf(pidtext, sizeof pidtext, "\"pid\":%d,", (int)getpid());
    CHECK(s && strstr(s, pidtext));
    sidelease_string_free(s);
    EXPECT(sidelease_lease_record_json(NULL, &s), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_lease_previous_json(a, &s), SIDELEASE_OK);
    CHECK(s && strcmp(s, "null") == 0);
    sidelease_string_free(s);
    EXPECT(sidelease_lease_previous_json(a, NULL), SIDELEASE_ERR_NULL_ARGUMENT);
    bool clean = false, written = false;
    /* A first lease file: no record says how the last holder ended. */
    EXPECT(sidelease_lease_previous_released_cleanly(a, &clean), SIDELEASE_ERR_UNKNOWN);
    EXPECT(sidelease_lease_previous_released_cleanly(a, NULL), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_lease_record_written(a, &written), SIDELEASE_OK);
    CHECK(written);
    EXPECT(sidelease_lease_record_written(NULL, &written), SIDELEASE_ERR_NULL_ARGUMENT);
    uint64_t gen = 0;
    EXPECT(sidelease_lease_generation(a, &gen), SIDELEASE_OK);
    /* ... and the generation starts at the clock (microseconds since 1970),
     * above every one handed out before (issue 35). */
    const uint64_t first = gen;
    CHECK(first > 1600000000000000ULL);
    EXPECT(sidelease_lease_generation(a, NULL), SIDELEASE_ERR_NULL_ARGUMENT);
    sidelease_check c = SIDELEASE_CHECK_REPLACED;
    EXPECT(sidelease_lease_check(a, &c), SIDELEASE_OK);
    CHECK(c == SIDELEASE_CHECK_HELD);
    EXPECT(sidelease_lease_check(NULL, &c), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_lease_check(a, NULL), SIDELEASE_ERR_NULL_ARGUMENT);

    /* Same process: the second acquisition shares the lease. */
    EXPECT(sidelease_acquire(db, NULL, NULL, &b), SIDELEASE_OK);
    EXPECT(sidelease_lease_generation(b, &gen), SIDELEASE_OK);
    CHECK(gen == first);
    EXPECT(sidelease_lease_release(a), SIDELEASE_OK);
    EXPECT(sidelease_lease_release(a), SIDELEASE_OK); /* no-op */
    EXPECT(sidelease_lease_release(NULL), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_lease_check(a, &c), SIDELEASE_ERR_INVALID_ARGUMENT);
    CHECK(last_error_contains("released"));
    EXPECT(sidelease_lease_check(b, &c), SIDELEASE_OK);
    CHECK(c == SIDELEASE_CHECK_HELD);
    sidelease_lease_free(a);
    sidelease_lease_free(b); /* releases the last handle */
    sidelease_lease_free(NULL);

    /* Without the holder's watch, so that check() reports what an
     * operator did instead of the watch undoing it. */
    sidelease_options *nw = NULL;
    EXPECT(sidelease_options_new(&nw), SIDELEASE_OK);
    EXPECT(sidelease_options_set_watch(nw, false), SIDELEASE_OK);
    EXPECT(sidelease_options_set_watch(NULL, false), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_acquire(db, nw, NULL, &a), SIDELEASE_OK);
    sidelease_options_free(nw);
    EXPECT(sidelease_lease_generation(a, &gen), SIDELEASE_OK);
    CHECK(gen == first + 1);
    EXPECT(sidelease_lease_previous_json(a, &s), SIDELEASE_OK);
    CHECK(s && strstr(s, "\"released_at\""));
    sidelease_string_free(s);

    /* check() sees the file replaced (in this test's own directory). */
    char lp[600], tmp[600];
    snprintf(lp, sizeof lp, "%s.backend-lease", db);
    path(tmp, "replacement");
    FILE *f = fopen(tmp, "w");
    fclose(f);
    CHECK(rename(tmp, lp) == 0);
    EXPECT(sidelease_lease_check(a, &c), SIDELEASE_OK);
    CHECK(c == SIDELEASE_CHECK_REPLACED);
    CHECK(unlink(lp) == 0);
    EXPECT(sidelease_lease_check(a, &c), SIDELEASE_OK);
    CHECK(c == SIDELEASE_CHECK_UNLINKED);
    sidelease_lease_free(a);
}

static void test_inspect(void) {
    char db[512], *s = NULL;
    path(db, "inspect.db");
    EXPECT(sidelease_inspect_json(db, NULL, &s), SIDELEASE_OK);
    CHECK(s && strstr(s, "\"state\":\"free\"") && strstr(s, "\"record_status\":\"empty\""));
    sidelease_string_free(s);
    sidelease_lease *l = NULL;
    EXPECT(sidelease_acquire(db, NULL, NULL, &l), SIDELEASE_OK);
    EXPECT(sidelease_inspect_json(db, ".backend-lease", &s), SIDELEASE_OK);
    CHECK(s && strstr(s, "\"state\":\"held\"") && strstr(s, "\"record_status\":\"self\""));
    sidelease_string_free(s);
    EXPECT(sidelease_inspect_json(db, ".other", &s), SIDELEASE_OK);
    CHECK(s && strstr(s, "\"state\":\"free\""));
    sidelease_string_free(s);
    EXPECT(sidelease_inspect_json(NULL, NULL, &s), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_inspect_json(db, NULL, NULL), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_inspect_json(db, "a/b", &s), SIDELEASE_ERR_INVALID_ARGUMENT);
    EXPECT(sidelease_inspect_json(db, "\xff", &s), SIDELEASE_ERR_INVALID_ARGUMENT);
    sidelease_lease_free(l);
}

static void test_io_and_filesystem_errors(void) {
    char db[512];
    sidelease_lease *l = NULL;
    path(db, "no-such-dir/app.db");
    EXPECT(sidelease_acquire(db, NULL, NULL, &l), SIDELEASE_ERR_IO);
    CHECK(sidelease_last_errno() == ENOENT);
    CHECK(last_error_contains("no-such-dir"));
    CHECK(l == NULL);
    EXPECT(sidelease_acquire("/proc/sidelease-c-test.db", NULL, NULL, &l), SIDELEASE_ERR_UNSUPPORTED_FS);
    CHECK(last_error_contains("allow_unsupported_fs"));
    CHECK(sidelease_last_errno() == 0);
    size_t n = 0;
    EXPECT(sidelease_last_error(NULL, 0, &n), SIDELEASE_ERR_BUFFER_TOO_SMALL);
    CHECK(n > 20);
}

struct waiter_args {
    const char *target;
    int64_t timeout_ms;
    sidelease_cancel *cancel;
    sidelease_status status;
    double took;
};

static void *waiter(void *p) {
    struct waiter_args *w = p;
    sidelease_options *o = NULL;
    sidelease_options_new(&o);
    sidelease_options_set_timeout_ms(o, w->timeout_ms);
    sidelease_lease *l = NULL;
    double t = now_s();
    w->status = sidelease_acquire(w->target, o, w->cancel, &l);
    w->took = now_s() - t;
    sidelease_lease_free(l);
    sidelease_options_free(o);
    return NULL;
}

static void test_contention(void) {
    char db[512];
    path(db, "contended.db");
    struct holder h = start_holder(db);
    sidelease_lease *l = NULL;

    EXPECT(sidelease_acquire(db, NULL, NULL, &l), SIDELEASE_ERR_IN_USE);
    char want[64], holder[2048];
    snprintf(want, sizeof want, "is leased by pid %d (c)", (int)h.pid);
    CHECK(last_error_contains(want));
    EXPECT(sidelease_last_holder_json(holder, sizeof holder, NULL), SIDELEASE_OK);
    snprintf(want, sizeof want, "\"pid\":%d,", (int)h.pid);
    CHECK(strstr(holder, want) != NULL);
    uint32_t pids[4] = {0};
    size_t count = 0;
    EXPECT(sidelease_last_holder_pids(pids, 4, &count), SIDELEASE_OK);
    CHECK(count == 1 && pids[0] == (uint32_t)h.pid);
    EXPECT(sidelease_last_holder_pids(NULL, 0, &count), SIDELEASE_ERR_BUFFER_TOO_SMALL);
    EXPECT(sidelease_last_holder_pids(pids, 4, NULL), SIDELEASE_ERR_NULL_ARGUMENT);

    /* A timeout expires while held. */
    sidelease_options *o = NULL;
    sidelease_options_new(&o);
    sidelease_options_set_timeout_ms(o, 200);
    double t = now_s();
    EXPECT(sidelease_acquire(db, o, NULL, &l), SIDELEASE_ERR_TIMEOUT);
    CHECK(now_s() - t >= 0.2 && now_s() - t < 3);
    CHECK(last_error_contains("timed out after 0.2"));
    EXPECT(sidelease_last_holder_pids(pids, 4, &count), SIDELEASE_OK);
    CHECK(count == 1 && pids[0] == (uint32_t)h.pid);
    sidelease_options_free(o);

    /* A wait forever is cancelled from this thread. */
    sidelease_cancel *cancel = NULL;
    EXPECT(sidelease_cancel_new(NULL), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_cancel_new(&cancel), SIDELEASE_OK);
    struct waiter_args w = {db, -1, cancel, SIDELEASE_OK, 0};
    pthread_t th;
    pthread_create(&th, NULL, waiter, &w);
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL);
    EXPECT(sidelease_cancel_cancel(cancel), SIDELEASE_OK);
    EXPECT(sidelease_cancel_cancel(NULL), SIDELEASE_ERR_NULL_ARGUMENT);
    pthread_join(th, NULL);
    CHECK(w.status == SIDELEASE_ERR_CANCELLED);
    CHECK(w.took < 2.0);
    sidelease_cancel_free(cancel);
    sidelease_cancel_free(NULL);

    /* A waiter with a timeout wakes when the other process releases. */
    struct waiter_args w2 = {db, 10000, NULL, SIDELEASE_ERR_PANIC, 0};
    pthread_create(&th, NULL, waiter, &w2);
    nanosleep(&pause, NULL);
    stop_holder(&h);
    pthread_join(th, NULL);
    CHECK(w2.status == SIDELEASE_OK);
    CHECK(w2.took < 2.0);
}

static void test_fork_child_does_not_keep_the_lease(void) {
    char db[512];
    path(db, "forked.db");
    sidelease_lease *l = NULL;
    EXPECT(sidelease_acquire(db, NULL, NULL, &l), SIDELEASE_OK);
    int down[2], up[2];
    if (pipe(down) || pipe(up)) exit(2);
    pid_t child = fork();
    if (child == 0) {
        /* The handle belongs to the parent: it holds nothing here. */
        sidelease_check c;
        char ok = sidelease_lease_check(l, &c) == SIDELEASE_ERR_INVALID_ARGUMENT &&
                          sidelease_lease_release(l) == SIDELEASE_OK
                      ? 'K'
                      : 'X';
        if (write(up[1], &ok, 1) != 1) _exit(3);
        read_bounded(down[0]);
        _exit(0);
    }
    CHECK(read_bounded(up[0]) == 'K');
    /* The child's release did not release the parent's lease... */
    sidelease_lease *other = NULL;
    pid_t probe = fork();
    if (probe == 0) _exit(sidelease_acquire(db, NULL, NULL, &other) == SIDELEASE_ERR_IN_USE ? 0 : 1);
    int status = -1;
    waitpid(probe, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* ...and after the parent releases, the live child does not hold it. */
    EXPECT(sidelease_lease_release(l), SIDELEASE_OK);
    probe = fork();
    if (probe == 0) _exit(sidelease_acquire(db, NULL, NULL, &other) == SIDELEASE_OK ? 0 : 1);
    waitpid(probe, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char c = 'G';
    CHECK(write(down[1], &c, 1) == 1);
    waitpid(child, &status, 0);
    sidelease_lease_free(l);
    close(down[0]);
    close(down[1]);
    close(up[0]);
    close(up[1]);
}

/* The holder's watch: a lease file replaced under a held lease is put
 * back (state stays HELD); one taken by another process makes the lease
 * LOST, signalled on the descriptor, through the callback and by
 * ensure_held(). */
struct lost_seen {
    pthread_mutex_t mu;
    int calls;
    char reason[256];
};

static void on_lost_cb(const char *reason, void *user_data) {
    struct lost_seen *seen = user_data;
    pthread_mutex_lock(&seen->mu);
    seen->calls++;
    snprintf(seen->reason, sizeof seen->reason, "%s", reason ? reason : "(null)");
    pthread_mutex_unlock(&seen->mu);
}

static int poll_readable(int fd, int ms) {
    fd_set set;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    FD_ZERO(&set);
    FD_SET(fd, &set);
    return select(fd + 1, &set, NULL, NULL, &tv) == 1;
}

static void test_watch_reanchors_and_signals_loss(void) {
    char db[512], lp[600], tmp[600];
    path(db, "watched.db");
    snprintf(lp, sizeof lp, "%s.backend-lease", db);
    path(tmp, "watched-rival");
    sidelease_lease *l = NULL;
    sidelease_state st = SIDELEASE_STATE_RELEASED;
    sidelease_check c;
    int lfd = -1;
    EXPECT(sidelease_acquire(db, NULL, NULL, &l), SIDELEASE_OK);
    EXPECT(sidelease_lease_state(l, &st), SIDELEASE_OK);
    CHECK(st == SIDELEASE_STATE_HELD);
    EXPECT(sidelease_lease_state(NULL, &st), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_lease_state(l, NULL), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_lease_ensure_held(l), SIDELEASE_OK);
    EXPECT(sidelease_lease_ensure_held(NULL), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_lease_ensure_held_now(l), SIDELEASE_OK);
    EXPECT(sidelease_lease_ensure_held_now(NULL), SIDELEASE_ERR_NULL_ARGUMENT);
    CHECK(last_error_contains("lease"));
    EXPECT(sidelease_lease_lost_fd(l, &lfd), SIDELEASE_OK);
    CHECK(lfd >= 0 && !poll_readable(lfd, 0));
    EXPECT(sidelease_lease_lost_fd(l, NULL), SIDELEASE_ERR_NULL_ARGUMENT);
    struct lost_seen seen = {PTHREAD_MUTEX_INITIALIZER, 0, ""};
    EXPECT(sidelease_lease_on_lost(l, NULL, &seen), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_lease_on_lost(l, on_lost_cb, &seen), SIDELEASE_OK);

    /* Deleted: the holder puts the file back and locks it again. */
    CHECK(unlink(lp) == 0);
    struct stat sb;
    int back = 0;
    for (int i = 0; i < 200 && !back; i++) {
        back = stat(lp, &sb) == 0;
        if (!back) usleep(5000);
    }
    CHECK(back);
    EXPECT(sidelease_lease_state(l, &st), SIDELEASE_OK);
    CHECK(st == SIDELEASE_STATE_HELD);
    EXPECT(sidelease_lease_ensure_held(l), SIDELEASE_OK);
    EXPECT(sidelease_lease_check(l, &c), SIDELEASE_OK);
    CHECK(c == SIDELEASE_CHECK_HELD);
    /* Another process cannot take the re-anchored file. */
    pid_t probe = fork();
    if (probe == 0) {
        sidelease_lease *o = NULL;
        _exit(sidelease_acquire(db, NULL, NULL, &o) == SIDELEASE_ERR_IN_USE ? 0 : 1);
    }
    int status = -1;
    waitpid(probe, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    /* Replaced by a file another process holds: the lease is lost. */
    int up[2], down[2];
    if (pipe(up) || pipe(down)) exit(2);
    pid_t rival = fork();
    if (rival == 0) {
        FILE *f = fopen(tmp, "w");
        char ok = f && flock(fileno(f), LOCK_EX | LOCK_NB) == 0 && rename(tmp, lp) == 0 ? 'R' : 'E';
        if (write(up[1], &ok, 1) != 1) _exit(3);
        read_bounded(down[0]);
        _exit(0);
    }
    CHECK(read_bounded(up[0]) == 'R');
    CHECK(poll_readable(lfd, 5000));
    EXPECT(sidelease_lease_state(l, &st), SIDELEASE_OK);
    CHECK(st == SIDELEASE_STATE_LOST);
    EXPECT(sidelease_lease_ensure_held(l), SIDELEASE_ERR_LOST);
    EXPECT(sidelease_lease_ensure_held_now(l), SIDELEASE_ERR_LOST);
    char pid_text[32];
    snprintf(pid_text, sizeof pid_text, "%d", (int)rival);
    CHECK(last_error_contains(pid_text));
    pthread_mutex_lock(&seen.mu);
    CHECK(seen.calls == 1 && strstr(seen.reason, pid_text));
    pthread_mutex_unlock(&seen.mu);
    /* A callback registered after the loss runs at once, here. */
    struct lost_seen late = {PTHREAD_MUTEX_INITIALIZER, 0, ""};
    EXPECT(sidelease_lease_on_lost(l, on_lost_cb, &late), SIDELEASE_OK);
    CHECK(late.calls == 1);
    char go = 'G';
    CHECK(write(down[1], &go, 1) == 1);
    waitpid(rival, &status, 0);
    EXPECT(sidelease_lease_release(l), SIDELEASE_OK);
    EXPECT(sidelease_lease_state(l, &st), SIDELEASE_OK);
    CHECK(st == SIDELEASE_STATE_RELEASED);
    EXPECT(sidelease_lease_lost_fd(l, &lfd), SIDELEASE_ERR_INVALID_ARGUMENT);
    sidelease_lease_free(l);
    close(up[0]);
    close(up[1]);
    close(down[0]);
    close(down[1]);
}

/* ---- the elector ---- */

struct events_seen {
    pthread_mutex_t mu;
    int count[6];
    char waiting[512];
};

static void on_event_cb(sidelease_elector_event ev, const char *detail, void *user_data) {
    struct events_seen *seen = user_data;
    pthread_mutex_lock(&seen->mu);
    if ((int)ev >= 0 && (int)ev < 6) seen->count[ev]++;
    if (ev == SIDELEASE_ELECTOR_WAITING) snprintf(seen->waiting, sizeof seen->waiting, "%s", detail);
    pthread_mutex_unlock(&seen->mu);
}

static void test_elector_in_process(void) {
    char db[512];
    path(db, "elect.db");
    sidelease_elector *e = NULL;
    EXPECT(sidelease_elector_new(NULL, NULL, &e), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_elector_new("postgres:/nohost", NULL, &e), SIDELEASE_ERR_INVALID_ARGUMENT);
    CHECK(last_error_contains("postgresql://"));
    EXPECT(sidelease_elector_new(db, NULL, &e), SIDELEASE_OK);
    struct events_seen seen = {PTHREAD_MUTEX_INITIALIZER, {0}, ""};
    EXPECT(sidelease_elector_on_event(e, NULL, &seen), SIDELEASE_ERR_NULL_ARGUMENT);
    EXPECT(sidelease_elector_on_event(e, on_event_cb, &seen), SIDELEASE_OK);
    sidelease_term *t = NULL;
    EXPECT(sidelease_elector_campaign(e, &t), SIDELEASE_OK);
    CHECK(t != NULL);
    uint64_t gen = 0;
    EXPECT(sidelease_lease_generation(sidelease_term_lease(t), &gen), SIDELEASE_OK);
    CHECK(gen > 1600000000000000ULL); /* a first lease file: the clock */
    sidelease_term_state st = SIDELEASE_TERM_FAILED;
    EXPECT(sidelease_term_check(t, &st), SIDELEASE_OK);
    CHECK(st == SIDELEASE_TERM_LEADING);
    int fd = -1;
    EXPECT(sidelease_term_cancel_fd(t, &fd), SIDELEASE_OK);
    CHECK(fd >= 0 && !poll_readable(fd, 0));
    sidelease_term *again = NULL;
    EXPECT(sidelease_elector_campaign(e, &again), SIDELEASE_ERR_INVALID_ARGUMENT);
    CHECK(last_error_contains("one term at a time"));
    char *snap = NULL;
    EXPECT(sidelease_elector_snapshot_json(e, &snap), SIDELEASE_OK);
    CHECK(snap && strstr(snap, "\"leading\":true") && strstr(snap, "\"elections\":1"));
    sidelease_string_free(snap);
    EXPECT(sidelease_elector_stop(e), SIDELEASE_OK);
    CHECK(poll_readable(fd, 1000));
    EXPECT(sidelease_term_check(t, &st), SIDELEASE_OK);
    CHECK(st == SIDELEASE_TERM_STOPPED);
    EXPECT(sidelease_term_step_down(t, "late failure", &st), SIDELEASE_OK);
    CHECK(st == SIDELEASE_TERM_STOPPED);
    EXPECT(sidelease_term_cancel_fd(t, &fd), SIDELEASE_ERR_INVALID_ARGUMENT);
    char *info = NULL;
    EXPECT(sidelease_inspect_json(db, NULL, &info), SIDELEASE_OK);
    CHECK(info && strstr(info, "\"state\":\"free\""));
    sidelease_string_free(info);
    EXPECT(sidelease_elector_campaign(e, &again), SIDELEASE_OK);
    CHECK(again == NULL);
    pthread_mutex_lock(&seen.mu);
    CHECK(seen.count[SIDELEASE_ELECTOR_ELECTED] == 1);
    CHECK(seen.count[SIDELEASE_ELECTOR_STEPPED_DOWN] == 1);
    CHECK(seen.count[SIDELEASE_ELECTOR_STOPPED] == 1);
    pthread_mutex_unlock(&seen.mu);
    sidelease_term_free(t);
    sidelease_elector_free(e);
    sidelease_term_free(NULL);
    sidelease_elector_free(NULL);
}

/* A loss while leading: the LOST callback is told (from the watcher
 * thread), the cancel descriptor fires, the term says LOST, and stepping
 * down says why. The rival is a child that renames its locked file over the
 * lease file and holds it until told. */
static void test_elector_tells_a_loss(void) {
    char db[512], lp[600], tmp[600];
    path(db, "elect-lost.db");
    snprintf(lp, sizeof lp, "%s.backend-lease", db);
    path(tmp, "elect-lost.rival");
    sidelease_elector *e = NULL;
    EXPECT(sidelease_elector_new(db, NULL, &e), SIDELEASE_OK);
    struct events_seen seen = {PTHREAD_MUTEX_INITIALIZER, {0}, ""};
    EXPECT(sidelease_elector_on_event(e, on_event_cb, &seen), SIDELEASE_OK);
    sidelease_term *t = NULL;
    EXPECT(sidelease_elector_campaign(e, &t), SIDELEASE_OK);
    CHECK(t != NULL);
    int fd = -1;
    EXPECT(sidelease_term_cancel_fd(t, &fd), SIDELEASE_OK);
    int ready[2], done[2];
    CHECK(pipe(ready) == 0 && pipe(done) == 0);
    pid_t rival = fork();
    if (rival == 0) {
        int r = open(tmp, O_RDWR | O_CREAT, 0600);
        if (r < 0 || flock(r, LOCK_EX) != 0 || rename(tmp, lp) != 0) _exit(3);
        char c = 1;
        if (write(ready[1], &c, 1) != 1) _exit(4);
        if (read(done[0], &c, 1) < 0) _exit(5);
        _exit(0);
    }
    char c = 0;
    CHECK(read(ready[0], &c, 1) == 1);
    CHECK(poll_readable(fd, 5000));
    sidelease_term_state st = SIDELEASE_TERM_LEADING;
    EXPECT(sidelease_term_check(t, &st), SIDELEASE_OK);
    CHECK(st == SIDELEASE_TERM_LOST);
    /* Told from the watcher thread, after the cancellation fired. */
    int told = 0;
    for (double until = now_s() + 5; !told && now_s() < until; usleep(1000)) {
        pthread_mutex_lock(&seen.mu);
        told = seen.count[SIDELEASE_ELECTOR_LOST];
        pthread_mutex_unlock(&seen.mu);
    }
    CHECK(told == 1);
    EXPECT(sidelease_term_step_down(t, NULL, &st), SIDELEASE_OK);
    CHECK(st == SIDELEASE_TERM_LOST);
    sidelease_term_free(t);
    char *snap = NULL;
    EXPECT(sidelease_elector_snapshot_json(e, &snap), SIDELEASE_OK);
    CHECK(snap && strstr(snap, "\"losses\":1") && strstr(snap, "\"leading\":false"));
    sidelease_string_free(snap);
    CHECK(write(done[1], &c, 1) == 1);
    int status = 0;
    CHECK(waitpid(rival, &status, 0) == rival && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(ready[0]);
    close(ready[1]);
    close(done[0]);
    close(done[1]);
    EXPECT(sidelease_elector_stop(e), SIDELEASE_OK);
    sidelease_elector_free(e);
}

/* A campaigner process: leads `db` again and again and, while leading,
 * holds an exclusive flock on `detector` (a second leader at the same
 * moment fails to take it and logs "overlap"). One line per event is
 * appended to `log`. */
static void note(const char *log, const char *what) {
    int fd = open(log, O_WRONLY | O_APPEND | O_CREAT, 0600);
    if (fd < 0) _exit(3);
    dprintf(fd, "%d %s\n", (int)getpid(), what);
    close(fd);
}

static pid_t start_campaigner(const char *db, const char *detector, const char *log) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    sidelease_elector *e = NULL;
    if (sidelease_elector_new(db, NULL, &e) != SIDELEASE_OK) _exit(4);
    for (;;) {
        sidelease_term *t = NULL;
        if (sidelease_elector_campaign(e, &t) != SIDELEASE_OK) _exit(5);
        if (!t) break;
        int det = open(detector, O_RDWR | O_CREAT, 0600);
        if (det < 0) _exit(6);
        if (flock(det, LOCK_EX | LOCK_NB) != 0) note(log, "overlap");
        note(log, "leading");
        int fd = -1;
        if (sidelease_term_cancel_fd(t, &fd) != SIDELEASE_OK) _exit(7);
        while (!poll_readable(fd, 60000)) {
        }
        sidelease_term_state st = SIDELEASE_TERM_LEADING;
        sidelease_term_check(t, &st);
        close(det); /* unlocks the detector before the lease is released */
        note(log, st == SIDELEASE_TERM_LOST ? "cancelled lost" : "cancelled");
        sidelease_term_step_down(t, NULL, NULL);
        sidelease_term_free(t);
    }
    sidelease_elector_free(e);
    _exit(0);
}

/* The first line of `log` past `*offset` saying `what` (from `not`, if it
 * is not 0, only if another pid says it): its pid, or 0 after 10 s. */
static pid_t next_line(const char *log, long *offset, const char *what, pid_t only) {
    double until = now_s() + 10;
    while (now_s() < until) {
        FILE *f = fopen(log, "r");
        if (f) {
            char line[128];
            fseek(f, *offset, SEEK_SET);
            while (fgets(line, sizeof line, f)) {
                if (!strchr(line, '\n')) break; /* a line still being written */
                *offset = ftell(f);
                int pid = 0;
                char said[64] = "";
                if (sscanf(line, "%d %63[^\n]", &pid, said) == 2 && !strcmp(said, what) && (!only || pid == only)) {
                    fclose(f);
                    return pid;
                }
            }
            fclose(f);
        }
        usleep(1000);
    }
    fprintf(stderr, "no \"%s\" line in %s within 10 s\n", what, log);
    return 0;
}

static int overlaps_in(const char *log) {
    FILE *f = fopen(log, "r");
    if (!f) return 0;
    char line[128];
    int n = 0;
    while (fgets(line, sizeof line, f)) n += strstr(line, " overlap") != NULL;
    fclose(f);
    return n;
}

static void kill_child(pid_t pid) {
    int status = 0;
    kill(pid, SIGKILL);
    CHECK(waitpid(pid, &status, 0) == pid && WIFSIGNALED(status));
}

#define CAMPAIGNERS 4
#define KILLS 100

static void test_elector_killed_leaders_and_a_loss(void) {
    char db[512], detector[512], log[512], lp[600], tmp[600];
    path(db, "elected.db");
    path(detector, "elected.detector");
    path(log, "elected.log");
    snprintf(lp, sizeof lp, "%s.backend-lease", db);
    path(tmp, "elected.rival");
    pid_t procs[CAMPAIGNERS + KILLS];
    int n = 0, alive = 0;
    for (int i = 0; i < CAMPAIGNERS; i++) procs[n++] = start_campaigner(db, detector, log);
    long off = 0;
    pid_t leader = next_line(log, &off, "leading", 0);
    CHECK(leader > 0);
    int fresh = 1;
    double worst = 0;
    for (int k = 0; k < KILLS && leader > 0; k++) {
        double t0 = now_s();
        kill_child(leader);
        for (int i = 0; i < n; i++)
            if (procs[i] == leader) procs[i] = 0;
        procs[n++] = start_campaigner(db, detector, log);
        pid_t next = next_line(log, &off, "leading", 0);
        if (now_s() - t0 > worst) worst = now_s() - t0;
        for (int i = 0; i < n; i++)
            if (procs[i] == 0 && next == leader) fresh = 0;
        if (next == leader || next == 0) fresh = 0;
        leader = next;
    }
    CHECK(fresh);
    CHECK(overlaps_in(log) == 0);
    printf("elector: %d SIGKILLed leaders succeeded, worst failover %.1f ms\n", KILLS, worst * 1000);
    /* A rival renames its locked file over the lease file: the leader's term
     * is cancelled as lost, nobody leads while the rival holds it, and one
     * does once it lets go. */
    int rival = open(tmp, O_RDWR | O_CREAT, 0600);
    CHECK(rival >= 0 && flock(rival, LOCK_EX) == 0);
    CHECK(rename(tmp, lp) == 0);
    CHECK(next_line(log, &off, "cancelled lost", leader) == leader);
    usleep(300000);
    long peek = off;
    FILE *f = fopen(log, "r");
    int led_meanwhile = 0;
    if (f) {
        char line[128];
        fseek(f, peek, SEEK_SET);
        while (fgets(line, sizeof line, f)) led_meanwhile += strstr(line, " leading") != NULL;
        fclose(f);
    }
    CHECK(led_meanwhile == 0);
    close(rival);
    CHECK(next_line(log, &off, "leading", 0) > 0);
    CHECK(overlaps_in(log) == 0);
    for (int i = 0; i < n; i++) {
        if (procs[i] > 0) {
            alive += waitpid(procs[i], NULL, WNOHANG) == 0;
            kill_child(procs[i]);
        }
    }
    CHECK(alive == CAMPAIGNERS);
}

/* One statement as the PostgreSQL superuser of the test cluster
 * (tests/pg/cluster's environment): its single integer answer, or -1. */
static long psql_number(const char *sql) {
    const char *bin = getenv("SIDELEASE_TEST_PG_BIN"), *dirp = getenv("SIDELEASE_TEST_PG_DIR");
    const char *port = getenv("SIDELEASE_TEST_PG_PORT");
    if (!bin || !dirp || !port) return -1;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s'%s/psql' -X -q -t -A -v ON_ERROR_STOP=1 -h '%s' -p '%s' -U postgres -d app -c \"%s\"",
             geteuid() == 0 ? "runuser -u postgres -- " : "", bin, dirp, port, sql);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    long n = -1;
    if (fscanf(p, "%ld", &n) != 1) n = -1;
    pclose(p);
    return n;
}

/* PostgreSQL: the server frees the lock the moment the leader's session is
 * terminated and grants a waiting campaigner at once; the new term waits
 * out the bound (confirm_within) before it starts, so the old leader's work
 * has ended first. 3 campaigners, the leader's session terminated 3 times
 * in a row: each old leader's term cancelled as lost, a new term each time,
 * no overlap. */
static void test_elector_postgres_terminated(void) {
    const char *base = getenv("SIDELEASE_TEST_PG");
    if (!base) {
        printf("skipped: the PostgreSQL elector test needs SIDELEASE_TEST_PG (tests/run sets it)\n");
        return;
    }
    char url[1024], name[64], detector[512], log[512];
    snprintf(name, sizeof name, "c-elect-%d", (int)getpid());
    snprintf(url, sizeof url, "%s?lease=%s", base, name);
    path(detector, "pg-elected.detector");
    path(log, "pg-elected.log");
    pid_t procs[3];
    for (int i = 0; i < 3; i++) procs[i] = start_campaigner(url, detector, log);
    long off = 0;
    pid_t leader = next_line(log, &off, "leading", 0);
    CHECK(leader > 0);
    for (int round = 0; round < 3 && leader > 0; round++) {
        /* The session holding the lease's advisory lock, whichever one
           carries it (the leader's shared session or its own): the key as
           the library computes it, from the name. */
        char key[256], sql[1024];
        snprintf(key, sizeof key,
                 "('x' || left(encode(sha256('\\x736964656c65617365206c6561736500'::bytea || "
                 "convert_to('%s', 'UTF8')), 'hex'), 16))::bit(64)::bigint",
                 name);
        snprintf(sql, sizeof sql,
                 "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' "
                 "AND granted AND objsubid = 1 AND classid = ((%s >> 32) & 4294967295)::oid "
                 "AND objid = (%s & 4294967295)::oid",
                 key, key);
        CHECK(psql_number(sql) == 1);
        long at = off;
        CHECK(next_line(log, &at, "cancelled lost", leader) == leader);
        leader = next_line(log, &off, "leading", 0);
        CHECK(leader > 0);
        if (at > off) off = at;
    }
    CHECK(overlaps_in(log) == 0);
    for (int i = 0; i < 3; i++) {
        CHECK(waitpid(procs[i], NULL, WNOHANG) == 0); /* each still campaigning */
        kill_child(procs[i]);
    }
}

int main(void) {
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(dir, sizeof dir, "%s/sidelease-c-test-XXXXXX", base);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_version_and_strerror();
    test_options();
    test_lease_lifecycle();
    test_inspect();
    test_io_and_filesystem_errors();
    test_contention();
    test_fork_child_does_not_keep_the_lease();
    test_watch_reanchors_and_signals_loss();
    test_elector_in_process();
    test_elector_tells_a_loss();
    test_elector_killed_leaders_and_a_loss();
    test_elector_postgres_terminated();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
