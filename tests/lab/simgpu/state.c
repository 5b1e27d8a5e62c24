#define _GNU_SOURCE
#include "state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Claims above this are rejected as garbage; it keeps byte counts far from overflow. */
#define SIM_MAX_CLAIM_MIB (1ULL << 32)

static const char *state_dir(void)
{
    const char *dir = getenv("SIMGPU_STATE_DIR");
    return (dir && *dir) ? dir : SIM_DEFAULT_STATE_DIR;
}

/* Whole-string decimal number; no sign, no spaces. */
static int parse_ull(const char *text, unsigned long long max, unsigned long long *out)
{
    unsigned long long value = 0;
    if (*text == '\0')
        return 0;
    for (const char *p = text; *p; p++) {
        if (*p < '0' || *p > '9')
            return 0;
        unsigned digit = (unsigned)(*p - '0');
        if (value > (max - digit) / 10)
            return 0;
        value = value * 10 + digit;
    }
    *out = value;
    return 1;
}

static void strip_trailing_space(char *text)
{
    size_t len = strlen(text);
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' ' || text[len - 1] == '\t'))
        text[--len] = '\0';
}

static int copy_field(char *dst, size_t size, const char *src)
{
    size_t len = strlen(src);
    if (len == 0 || len >= size)
        return 0;
    memcpy(dst, src, len + 1);
    return 1;
}

/* Returns NULL on success, else what is wrong with the line. */
static const char *parse_gpu_line(char *line, struct sim_gpu_list *list, unsigned char *seen)
{
    char *fields[4];
    char *cursor = line;
    for (int i = 0; i < 3; i++) {
        fields[i] = cursor;
        cursor = strchr(cursor, '\t');
        if (!cursor)
            return "expected 4 tab-separated fields: index, uuid, total_mib, name";
        *cursor++ = '\0';
    }
    fields[3] = cursor;
    if (strchr(fields[3], '\t'))
        return "expected 4 tab-separated fields: index, uuid, total_mib, name";

    unsigned long long index, total_mib;
    if (!parse_ull(fields[0], SIM_MAX_GPUS - 1, &index))
        return "index must be a number from 0 to 63";
    if (seen[index])
        return "duplicate index";
    if (!parse_ull(fields[2], SIM_MAX_CLAIM_MIB, &total_mib) || total_mib == 0)
        return "total_mib must be a positive number of MiB";

    struct sim_gpu *gpu = &list->gpus[index];
    if (!copy_field(gpu->uuid, sizeof(gpu->uuid), fields[1]))
        return "uuid must be 1 to 95 characters";
    if (!copy_field(gpu->name, sizeof(gpu->name), fields[3]))
        return "name must be 1 to 95 characters";
    gpu->total_mib = total_mib;
    seen[index] = 1;
    list->count++;
    return NULL;
}

nvmlReturn_t sim_read_gpus(struct sim_gpu_list *list)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%s/gpus", state_dir()) >= (int)sizeof(path))
        return NVML_ERROR_INVALID_ARGUMENT;
    FILE *file = fopen(path, "re");
    if (!file)
        return errno == EACCES ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_DRIVER_NOT_LOADED;

    unsigned char seen[SIM_MAX_GPUS] = {0};
    char *line = NULL;
    size_t capacity = 0;
    unsigned line_no = 0;
    const char *problem = NULL;
    list->count = 0;
    while (!problem && getline(&line, &capacity, file) >= 0) {
        line_no++;
        strip_trailing_space(line);
        const char *start = line + strspn(line, " \t");
        if (*start == '\0' || *start == '#')
            continue;
        problem = parse_gpu_line(line, list, seen);
    }
    free(line);
    fclose(file);

    for (unsigned i = 0; !problem && i < list->count; i++) {
        if (!seen[i]) {
            problem = "indices must be 0 to count-1 without gaps";
            line_no = 0;
        }
    }
    if (problem) {
        if (line_no)
            fprintf(stderr, "simgpu: %s line %u: %s\n", path, line_no, problem);
        else
            fprintf(stderr, "simgpu: %s: %s\n", path, problem);
        return NVML_ERROR_UNKNOWN;
    }
    return NVML_SUCCESS;
}

/* "gpu<INDEX>.pid<PID>" exactly; anything else in claims/ (temp files, locks) is not a claim. */
static int parse_claim_name(const char *name, unsigned *gpu, unsigned *pid)
{
    char digits[24];
    unsigned long long gpu_value, pid_value;
    if (strncmp(name, "gpu", 3) != 0)
        return 0;
    const char *dot = strstr(name, ".pid");
    if (!dot || (size_t)(dot - name - 3) >= sizeof(digits))
        return 0;
    memcpy(digits, name + 3, (size_t)(dot - name - 3));
    digits[dot - name - 3] = '\0';
    if (!parse_ull(digits, SIM_MAX_GPUS - 1, &gpu_value))
        return 0;
    if (!parse_ull(dot + 4, INT_MAX, &pid_value) || pid_value == 0)
        return 0;
    *gpu = (unsigned)gpu_value;
    *pid = (unsigned)pid_value;
    return 1;
}

static int read_claim_mib(int dir_fd, const char *name, unsigned long long *mib)
{
    char text[32];
    int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t len = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (len <= 0)
        return 0;
    text[len] = '\0';
    strip_trailing_space(text);
    return parse_ull(text, SIM_MAX_CLAIM_MIB, mib);
}

static int by_pid(const void *a, const void *b)
{
    unsigned pa = ((const struct sim_claim *)a)->pid, pb = ((const struct sim_claim *)b)->pid;
    return (pa > pb) - (pa < pb);
}

static int append_claim(struct sim_claims *claims, unsigned *capacity, unsigned pid, unsigned long long mib)
{
    if (claims->count == *capacity) {
        unsigned grown = *capacity ? *capacity * 2 : 16;
        struct sim_claim *items = realloc(claims->items, grown * sizeof(*items));
        if (!items)
            return 0;
        claims->items = items;
        *capacity = grown;
    }
    claims->items[claims->count].pid = pid;
    claims->items[claims->count].mib = mib;
    claims->count++;
    claims->total_mib += mib;
    return 1;
}

nvmlReturn_t sim_read_claims(unsigned int gpu_index, struct sim_claims *claims)
{
    char path[PATH_MAX];
    claims->count = 0;
    claims->total_mib = 0;
    claims->items = NULL;
    if (snprintf(path, sizeof(path), "%s/claims", state_dir()) >= (int)sizeof(path))
        return NVML_ERROR_INVALID_ARGUMENT;
    DIR *dir = opendir(path);
    if (!dir) {
        if (errno == ENOENT)
            return NVML_SUCCESS;
        return errno == EACCES ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_UNKNOWN;
    }

    unsigned capacity = 0;
    nvmlReturn_t result = NVML_SUCCESS;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        unsigned gpu, pid;
        unsigned long long mib;
        if (!parse_claim_name(entry->d_name, &gpu, &pid) || gpu != gpu_index)
            continue;
        if (!read_claim_mib(dirfd(dir), entry->d_name, &mib) || !sim_pid_alive(pid))
            continue;
        if (!append_claim(claims, &capacity, pid, mib)) {
            result = NVML_ERROR_MEMORY;
            break;
        }
    }
    closedir(dir);
    if (result != NVML_SUCCESS) {
        sim_free_claims(claims);
        return result;
    }
    if (claims->count > 1)
        qsort(claims->items, claims->count, sizeof(*claims->items), by_pid);
    return NVML_SUCCESS;
}

void sim_free_claims(struct sim_claims *claims)
{
    free(claims->items);
    claims->items = NULL;
    claims->count = 0;
    claims->total_mib = 0;
}
