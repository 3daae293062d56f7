/*
 * geco_log.h - message lines built on the stack, for the preload's messages.
 *
 * A line_t is a caller's buffer; put*() append to it and silently stop at the
 * end. No malloc, no stdio, no locks: safe in sge_execd's child between
 * fork() and exec() (see geco_client.h).
 */
#ifndef GECO_LOG_H
#define GECO_LOG_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *buf;
    size_t cap, len; /* always leaves room for a final '\n' */
} line_t;

void put(line_t *l, const char *s);
void put_u64(line_t *l, uint64_t v);
void put_errno(line_t *l, int err);

#endif /* GECO_LOG_H */
