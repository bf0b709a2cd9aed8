/* Status codes and error messages: every fallible function returns a g3_status and, on failure, writes a
 * message saying what was wrong and where (file, tensor, byte offset, JSON field) into a caller-owned g3_error. */
#ifndef G3_CORE_STATUS_H
#define G3_CORE_STATUS_H

#include "gemma3.h"

/* Formats a message into err (if err is non-NULL) and returns code. Usage: return g3_fail(err, G3_ERR_FORMAT, "...", ...) */
g3_status g3_fail(g3_error *err, g3_status code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Prepends context ("loading X: ") to an existing message. Returns err->code. */
g3_status g3_fail_prefix(g3_error *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#define G3_TRY(expr)                                                                                                   \
    do {                                                                                                               \
        g3_status g3_try_rc_ = (expr);                                                                                 \
        if (g3_try_rc_ != G3_OK) return g3_try_rc_;                                                                    \
    } while (0)

#endif
