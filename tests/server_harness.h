/* server_harness.h: starting the real server in-process on a test model and cleaning up
 * after it, as test_server_metrics.c, test_server_train.c and test_server_pacing.c do. */
#ifndef LATHE_TESTS_SERVER_HARNESS_H
#define LATHE_TESTS_SERVER_HARNESS_H

#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "lathe/server.h"

/* Starts the server of p and waits until it is ready; *port is its port. LT_OK, or the
 * failure (already reported as a failed check); *s is to be freed either way. */
static lt_status harness_start(const struct lt_server_params *p, struct lt_server **s, int *port)
{
    lt_status st = lt_server_start(p, s);
    CHECK(st == LT_OK, "%s", lt_last_error());
    if (st == LT_OK) {
        *port = lt_server_port(*s);
        st = lt_server_wait_ready(*s);
        CHECK(st == LT_OK, "%s", lt_last_error());
    }
    return st;
}

/* Frees the server, removes the train dir and the model file. */
static void harness_stop(struct lt_server *s, const char *train_dir, const char *model_path)
{
    lt_server_free(s);
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", train_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", train_dir);
    remove(model_path);
}

#endif
