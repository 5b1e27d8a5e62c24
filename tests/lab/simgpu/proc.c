#define _GNU_SOURCE
#include "state.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static ssize_t read_proc_file(unsigned pid, const char *leaf, char *buf, size_t size)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%u/%s", pid, leaf);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t len = read(fd, buf, size - 1);
    close(fd);
    if (len < 0)
        return -1;
    buf[len] = '\0';
    return len;
}

char sim_pid_state(unsigned int pid)
{
    char stat[1024];
    if (pid == 0 || read_proc_file(pid, "stat", stat, sizeof(stat)) <= 0)
        return 0;
    /* "PID (comm) S ...": comm may hold spaces and ')' itself, so the state follows the last ')'. */
    const char *paren = strrchr(stat, ')');
    if (!paren || paren[1] != ' ' || paren[2] == '\0')
        return 0;
    return paren[2];
}

int sim_process_name(unsigned int pid, char *out, unsigned int size)
{
    char text[4096];
    ssize_t len = read_proc_file(pid, "cmdline", text, sizeof(text));
    if (len < 0)
        return 0;
    /* argv[0] ends at the first NUL; kernel threads and zombies have an empty cmdline. */
    if (len == 0 || text[0] == '\0') {
        len = read_proc_file(pid, "comm", text, sizeof(text));
        if (len <= 0)
            return 0;
        text[strcspn(text, "\n")] = '\0';
    }
    size_t end = strlen(text);
    while (end > 0 && text[end - 1] == ' ')
        text[--end] = '\0';
    if (size > 0)
        snprintf(out, size, "%s", text);
    return 1;
}
