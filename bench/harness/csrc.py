"""C routines that more than one benchmark's program is built from: each bench pastes the
ones it uses into its source (`IMA_C = r"..." + csrc.NOW + csrc.LINES + r"..."`), so a
routine the programs share is written once. Each piece needs the headers of the program
it goes into: <fcntl.h> <stdio.h> <stdlib.h> <string.h> <sys/stat.h> <time.h> <unistd.h>."""

# Seconds on the monotonic clock.
NOW = r"""
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
"""

# Microseconds on the monotonic clock, and qsort's order for doubles.
NOW_US = r"""
static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
"""

# The lines of file LIST (without their newlines) and their number, or NULL if it does
# not open.
LINES = r"""
static char **lines(const char *list, size_t *count) {
    FILE *f = fopen(list, "r");
    if (!f)
        return NULL;
    size_t cap = 1024, n = 0;
    char line[4096], **paths = malloc(cap * sizeof *paths);
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (n == cap)
            paths = realloc(paths, (cap *= 2) * sizeof *paths);
        paths[n++] = strdup(line);
    }
    fclose(f);
    *count = n;
    return paths;
}
"""

# FS-Mark style creates (needs NOW): makes directories DIR/d00.. (NDIRS of them; one that
# is there is fine), sets *t0 to now(), then creates DIR/dNN/fNNNNNN (NFILES of them,
# round robin over the directories) with open(O_CREAT | O_TRUNC | access, 0644), writes
# SIZE bytes into each and closes it. Returns 0, or the program's exit status for what
# failed: 3 a directory, 4 an open, 5 a write.
CREATE = r"""
static int create_files(const char *dir, int n, int nd, long size, int access_mode,
                        double *t0) {
    char *buf = calloc(1, size > 0 ? size : 1);
    memset(buf, 'x', size);
    char p[4096];
    for (int d = 0; d < nd; d++) {
        snprintf(p, sizeof p, "%s/d%02d", dir, d);
        if (mkdir(p, 0755) && access(p, F_OK))
            return 3;
    }
    *t0 = now();
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/d%02d/f%06d", dir, i % nd, i);
        int fd = open(p, O_CREAT | access_mode | O_TRUNC, 0644);
        if (fd < 0)
            return 4;
        if (size > 0 && write(fd, buf, size) != size)
            return 5;
        close(fd);
    }
    return 0;
}
"""
