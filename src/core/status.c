/* status.c: the thread-local reason behind the last failed call. */
#include <stdio.h>
#include <string.h>

#include "lathe/status.h"

static _Thread_local char last_error[1024];

const char *lt_status_name(lt_status s)
{
    static const char *const names[] = {
        [LT_OK] = "ok",
        [LT_ERR_INVALID] = "invalid argument",
        [LT_ERR_IO] = "I/O error",
        [LT_ERR_FORMAT] = "malformed input",
        [LT_ERR_NOMEM] = "out of memory",
        [LT_ERR_UNSUPPORTED] = "unsupported",
        [LT_ERR_BACKEND] = "backend error",
        [LT_ERR_REFUSED] = "refused",
        [LT_ERR_CANCELLED] = "cancelled",
    };
    _Static_assert(sizeof(names) / sizeof(names[0]) == LT_STATUS_COUNT, "status names");
    if ((int)s < 0 || s >= LT_STATUS_COUNT)
        return "unknown status";
    return names[s];
}

lt_status lt_failv(lt_status s, const char *fmt, va_list ap)
{
    /* format first: callers may pass lt_last_error() itself as an argument */
    char msg[sizeof(last_error)];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    memcpy(last_error, msg, sizeof(msg));
    return s;
}

lt_status lt_fail(lt_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    lt_failv(s, fmt, ap);
    va_end(ap);
    return s;
}

const char *lt_last_error(void) { return last_error; }

void lt_clear_error(void) { last_error[0] = '\0'; }
