/* A small daemon that owns its data directory for its whole life.
 *
 *   cc daemon.c $(pkg-config --cflags --libs sidelease) -o daemon
 *   ./daemon /srv/app/data
 *
 * A second instance exits 75 with a message naming the first. SIGTERM or
 * SIGINT release the lease and end the daemon with status 0. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <sidelease.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DATA_DIR\n", argv[0]);
        return 64;
    }
    sidelease_options *opts = NULL;
    sidelease_lease *lease = NULL;
    char msg[1024];
    if (sidelease_options_new(&opts) != SIDELEASE_OK ||
        sidelease_options_set_metadata_json(opts, "{\"app\":\"c-daemon\"}") != SIDELEASE_OK) {
        sidelease_last_error(msg, sizeof msg, NULL);
        fprintf(stderr, "daemon: %s\n", msg);
        return 70;
    }
    sidelease_status st = sidelease_acquire(argv[1], opts, NULL, &lease);
    sidelease_options_free(opts);
    if (st != SIDELEASE_OK) {
        sidelease_last_error(msg, sizeof msg, NULL);
        fprintf(stderr, "daemon: another instance owns %s: %s\n", argv[1], msg);
        return st == SIDELEASE_ERR_IN_USE ? 75 : 71;
    }
    /* Recover unless a record says the last owner released cleanly: an
     * unknown answer (a first lease, a deleted lease file) recovers too. */
    bool clean = false;
    if (sidelease_lease_previous_released_cleanly(lease, &clean) != SIDELEASE_OK || !clean)
        printf("daemon: no record says the previous owner released cleanly; recovering\n");
    printf("daemon: pid %d owns %s\n", (int)getpid(), argv[1]);
    fflush(stdout);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    while (!stop) pause();

    sidelease_lease_release(lease);
    sidelease_lease_free(lease);
    printf("daemon: released %s\n", argv[1]);
    return 0;
}
