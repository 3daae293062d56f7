/*
 * dump_args - the program the exec tests start: it reports exactly what it got.
 *
 * stdout: "pid=<pid>\n", "argc=<n>\n", each argv string followed by a NUL byte,
 * "envc=<n>\n", each environment string followed by a NUL byte. Exit 0.
 * Raw bytes, so an empty string, a string without '=' or a newline inside
 * one survive the trip unchanged.
 */
#include <string.h>
#include <unistd.h>
#include <stdio.h>

extern char **environ;

static void out(const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(1, s, n);
        if (w <= 0)
            _exit(3);
        s += w;
        n -= (size_t)w;
    }
}

static void count(const char *label, long n)
{
    char line[64];
    int len = snprintf(line, sizeof line, "%s=%ld\n", label, n);
    out(line, (size_t)len);
}

int main(int argc, char **argv)
{
    long envc = 0;
    count("pid", (long)getpid());
    count("argc", argc);
    for (int i = 0; i < argc; i++)
        out(argv[i], strlen(argv[i]) + 1);
    while (environ[envc] != NULL)
        envc++;
    count("envc", envc);
    for (long i = 0; i < envc; i++)
        out(environ[i], strlen(environ[i]) + 1);
    return 0;
}
