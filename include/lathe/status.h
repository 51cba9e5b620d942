/* status.h: how lathe reports what a caller, a file or the machine caused.
 *
 * Every fallible function returns an lt_status. The human-readable reason for the most
 * recent failure on this thread is kept in a thread-local buffer (lt_last_error), set by
 * lt_fail(). assert() is reserved for programmer invariants; nothing a caller can cause
 * aborts the process. */
#ifndef LATHE_STATUS_H
#define LATHE_STATUS_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lt_status {
    LT_OK = 0,
    LT_ERR_INVALID,     /* a bad argument or request */
    LT_ERR_IO,          /* open/read/write/rename failed */
    LT_ERR_FORMAT,      /* a malformed file (GGUF, safetensors, JSON) */
    LT_ERR_NOMEM,       /* host or device allocation failed */
    LT_ERR_UNSUPPORTED, /* no backend / kernel for this op or layout */
    LT_ERR_BACKEND,     /* a backend (e.g. CUDA) call failed */
    LT_ERR_REFUSED,     /* training admission refused the job */
    LT_ERR_CANCELLED,   /* a job was cancelled */
    LT_STATUS_COUNT
} lt_status;

const char *lt_status_name(lt_status s);

/* Records a reason for the current thread and returns `s`, so callers can write
 * `return lt_fail(LT_ERR_FORMAT, "tensor '%s': ...", name);`. */
lt_status lt_fail(lt_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
lt_status lt_failv(lt_status s, const char *fmt, va_list ap);

/* The reason recorded by the last lt_fail on this thread ("" if none). */
const char *lt_last_error(void);
void lt_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
