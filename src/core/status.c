/* Status names and error-message formatting. */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *g3_status_name(g3_status s) {
    switch (s) {
    case G3_OK: return "ok";
    case G3_ERR_IO: return "I/O error";
    case G3_ERR_FORMAT: return "format error";
    case G3_ERR_UNSUPPORTED: return "unsupported";
    case G3_ERR_NOMEM: return "out of memory";
    case G3_ERR_ARG: return "invalid argument";
    case G3_ERR_DEVICE: return "device error";
    case G3_ERR_FULL: return "no room";
    case G3_ERR_CANCELLED: return "cancelled";
    }
    return "unknown status";
}

g3_status g3_fail(g3_error *err, g3_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

g3_status g3_fail_prefix(g3_error *err, const char *fmt, ...) {
    if (!err) return G3_ERR_ARG;
    char prefix[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t np = strlen(prefix);
    if (np >= sizeof err->msg) np = sizeof err->msg - 1;
    memcpy(err->msg, prefix, np);
    size_t rest = sizeof err->msg - 1 - np, no = strnlen(old, sizeof old);
    if (no > rest) no = rest;
    memcpy(err->msg + np, old, no);
    err->msg[np + no] = 0;
    return err->code;
}
