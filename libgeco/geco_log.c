/*
 * geco_log.c - message lines built on the stack (see geco_log.h).
 */
#define _GNU_SOURCE

#include <string.h>

#include "geco_log.h"

void put(line_t *l, const char *s)
{
    while (s != NULL && *s != '\0' && l->len + 2 < l->cap)
        l->buf[l->len++] = *s++;
}

void put_u64(line_t *l, uint64_t v)
{
    char digits[21];
    int n = 0;
    do
        digits[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n > 0 && l->len + 2 < l->cap)
        l->buf[l->len++] = digits[--n];
}

void put_errno(line_t *l, int err)
{
    /* strerrorname_np: a static string, no locale lookup, no allocation */
    const char *name = strerrorname_np(err);
    if (name != NULL) {
        put(l, name);
    } else {
        put(l, "errno ");
        put_u64(l, (uint64_t)err);
    }
}
