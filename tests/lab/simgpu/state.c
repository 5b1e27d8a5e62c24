#define _GNU_SOURCE
#include "state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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
    memset(gpu, 0, sizeof(*gpu));
    if (!copy_field(gpu->uuid, sizeof(gpu->uuid), fields[1]))
        return "uuid must be 1 to 95 characters";
    if (!copy_field(gpu->name, sizeof(gpu->name), fields[3]))
        return "name must be 1 to 95 characters";
    gpu->total_mib = total_mib;
    seen[index] = 1;
    list->count++;
    return NULL;
}

/* Splits a tab-separated line into exactly `count` fields; 0 when the count differs. */
static int split_fields(char *line, char **fields, int count)
{
    char *cursor = line;
    for (int i = 0; i < count - 1; i++) {
        fields[i] = cursor;
        cursor = strchr(cursor, '\t');
        if (!cursor)
            return 0;
        *cursor++ = '\0';
    }
    fields[count - 1] = cursor;
    return strchr(cursor, '\t') == NULL;
}

/* "gpu<TAB>mig_index<TAB>uuid<TAB>total_mib<TAB>profile<TAB>gpu_instance<TAB>compute_instance" */
static const char *parse_mig_line(char *line, struct sim_gpu_list *list)
{
    char *f[7];
    unsigned long long gpu_index, mig_index, total_mib, gi, ci;
    if (!split_fields(line, f, 7))
        return "expected 7 tab-separated fields: gpu, mig_index, uuid, total_mib, profile, gpu_instance, "
               "compute_instance";
    if (!parse_ull(f[0], SIM_MAX_GPUS - 1, &gpu_index) || gpu_index >= list->count)
        return "gpu must be the index of a GPU in the gpus file";
    if (!parse_ull(f[1], SIM_MAX_MIG - 1, &mig_index))
        return "mig_index must be a number from 0 to 6";
    struct sim_gpu *gpu = &list->gpus[gpu_index];
    struct sim_mig *mig = &gpu->mig[mig_index];
    if (mig->present)
        return "duplicate mig_index for this GPU";
    if (!parse_ull(f[3], SIM_MAX_CLAIM_MIB, &total_mib) || total_mib == 0)
        return "total_mib must be a positive number of MiB";
    if (!parse_ull(f[5], 0xFFFFFFFEULL, &gi) || !parse_ull(f[6], 0xFFFFFFFEULL, &ci))
        return "gpu_instance and compute_instance must be numbers";
    if (!copy_field(mig->uuid, sizeof(mig->uuid), f[2]))
        return "uuid must be 1 to 95 characters";
    if (!copy_field(mig->profile, sizeof(mig->profile), f[4]))
        return "profile must be 1 to 31 characters";
    mig->total_mib = total_mib;
    mig->gpu_instance = (unsigned)gi;
    mig->compute_instance = (unsigned)ci;
    mig->present = 1;
    gpu->mig_count++;
    return NULL;
}

typedef const char *(*line_parser)(char *line, struct sim_gpu_list *list, unsigned char *seen);

static const char *gpu_line(char *line, struct sim_gpu_list *list, unsigned char *seen)
{
    return parse_gpu_line(line, list, seen);
}

static const char *mig_line(char *line, struct sim_gpu_list *list, unsigned char *seen)
{
    (void)seen;
    return parse_mig_line(line, list);
}

/* Reads one list file; 0 on success, -1 when it cannot be opened (errno set), 1 after printing a problem. */
static int read_list(const char *path, struct sim_gpu_list *list, unsigned char *seen, line_parser parse)
{
    FILE *file = fopen(path, "re");
    if (!file)
        return -1;
    char *line = NULL;
    size_t capacity = 0;
    unsigned line_no = 0;
    const char *problem = NULL;
    while (!problem && getline(&line, &capacity, file) >= 0) {
        line_no++;
        strip_trailing_space(line);
        const char *start = line + strspn(line, " \t");
        if (*start == '\0' || *start == '#')
            continue;
        problem = parse(line, list, seen);
    }
    free(line);
    fclose(file);
    if (problem) {
        fprintf(stderr, "simgpu: %s line %u: %s\n", path, line_no, problem);
        return 1;
    }
    return 0;
}

nvmlReturn_t sim_read_gpus(struct sim_gpu_list *list)
{
    char path[PATH_MAX];
    unsigned char seen[SIM_MAX_GPUS] = {0};
    if (snprintf(path, sizeof(path), "%s/gpus", state_dir()) >= (int)sizeof(path))
        return NVML_ERROR_INVALID_ARGUMENT;
    list->count = 0;
    int rc = read_list(path, list, seen, gpu_line);
    if (rc < 0)
        return errno == EACCES ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_DRIVER_NOT_LOADED;
    if (rc > 0)
        return NVML_ERROR_UNKNOWN;
    for (unsigned i = 0; i < list->count; i++) {
        if (!seen[i]) {
            fprintf(stderr, "simgpu: %s: indices must be 0 to count-1 without gaps\n", path);
            return NVML_ERROR_UNKNOWN;
        }
    }
    if (snprintf(path, sizeof(path), "%s/mig", state_dir()) >= (int)sizeof(path))
        return NVML_ERROR_INVALID_ARGUMENT;
    rc = read_list(path, list, seen, mig_line);
    if (rc > 0 || (rc < 0 && errno != ENOENT))
        return NVML_ERROR_UNKNOWN;
    return NVML_SUCCESS;
}

/* "gpu<I>.pid<P>" or "gpu<I>.mig<K>.pid<P>" exactly; temp files, locks and ".exit" markers are not claims. */
static int parse_claim_name(const char *name, unsigned *gpu, int *mig, unsigned *pid)
{
    unsigned long long gpu_value, mig_value = 0, pid_value;
    char digits[24];
    const char *cursor = name;
    if (strncmp(cursor, "gpu", 3) != 0)
        return 0;
    cursor += 3;
    size_t len = strspn(cursor, "0123456789");
    if (len == 0 || len >= sizeof(digits))
        return 0;
    memcpy(digits, cursor, len);
    digits[len] = '\0';
    if (!parse_ull(digits, SIM_MAX_GPUS - 1, &gpu_value))
        return 0;
    cursor += len;
    *mig = -1;
    if (strncmp(cursor, ".mig", 4) == 0) {
        cursor += 4;
        len = strspn(cursor, "0123456789");
        if (len == 0 || len >= sizeof(digits))
            return 0;
        memcpy(digits, cursor, len);
        digits[len] = '\0';
        if (!parse_ull(digits, SIM_MAX_MIG - 1, &mig_value))
            return 0;
        cursor += len;
        *mig = (int)mig_value;
    }
    if (strncmp(cursor, ".pid", 4) != 0)
        return 0;
    if (!parse_ull(cursor + 4, INT_MAX, &pid_value) || pid_value == 0)
        return 0;
    *gpu = (unsigned)gpu_value;
    *pid = (unsigned)pid_value;
    return 1;
}

#define SIM_FLAG_ZOMBIE 1
#define SIM_FLAG_STUCK 2

/* Content "MIB[ FLAG...]" with flags zombie, stuck; 0 when malformed. */
static int read_claim(int dir_fd, const char *name, unsigned long long *mib, int *flags)
{
    char text[128];
    int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t len = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (len <= 0)
        return 0;
    text[len] = '\0';
    char *save = NULL;
    char *word = strtok_r(text, " \t\r\n", &save);
    if (!word || !parse_ull(word, SIM_MAX_CLAIM_MIB, mib))
        return 0;
    *flags = 0;
    while ((word = strtok_r(NULL, " \t\r\n", &save)) != NULL) {
        if (strcmp(word, "zombie") == 0)
            *flags |= SIM_FLAG_ZOMBIE;
        else if (strcmp(word, "stuck") == 0)
            *flags |= SIM_FLAG_STUCK;
        else
            return 0;
    }
    return 1;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A whole number from a small state file; 0 when the file is missing or malformed. */
static int read_number_file(const char *leaf, unsigned long long max, unsigned long long *out)
{
    char path[PATH_MAX], text[32] = "";
    snprintf(path, sizeof(path), "%s/%s", state_dir(), leaf);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t len = read(fd, text, sizeof(text) - 1);
    close(fd);
    text[len > 0 ? len : 0] = '\0';
    strip_trailing_space(text);
    return *text && parse_ull(text, max, out);
}

unsigned long long sim_host_pid_offset(void)
{
    unsigned long long offset;
    return read_number_file("host_pid_offset", SIM_MAX_HOST_PID_OFFSET, &offset) ? offset : 0;
}

unsigned long long sim_reserved_mib(void)
{
    unsigned long long mib;
    return read_number_file("reserved_mib", SIM_MAX_CLAIM_MIB, &mib) ? mib : SIM_DEFAULT_RESERVED_MIB;
}

/* $SIMGPU_RELEASE_LAG_MS, else <state>/release_lag_ms, else the default; malformed values use the default. */
static double release_lag_seconds(void)
{
    unsigned long long ms = SIM_DEFAULT_RELEASE_LAG_MS;
    char text[32] = "";
    const char *env = getenv("SIMGPU_RELEASE_LAG_MS");
    if (env) {
        snprintf(text, sizeof(text), "%s", env);
    } else {
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s/release_lag_ms", state_dir());
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            ssize_t len = read(fd, text, sizeof(text) - 1);
            close(fd);
            text[len > 0 ? len : 0] = '\0';
        }
    }
    strip_trailing_space(text);
    unsigned long long value;
    if (*text && parse_ull(text, 24ULL * 3600 * 1000, &value))
        ms = value;
    return (double)ms / 1000.0;
}

/* When the claim's holder went away: read its marker, or write it now (first observer wins). -1: unknown. */
static double exit_time(int dir_fd, const char *name, int create)
{
    char marker[NAME_MAX + 1], text[64];
    if (snprintf(marker, sizeof(marker), "%s.exit", name) >= (int)sizeof(marker))
        return -1;
    if (create) {
        int fd = openat(dir_fd, marker, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) {
            /* whole milliseconds, rounded down (truncation: the time is positive), so never in the future */
            double now = (double)(long long)(now_seconds() * 1000.0) / 1000.0;
            int len = snprintf(text, sizeof(text), "%.3f\n", now);
            ssize_t written = write(fd, text, (size_t)len);
            close(fd);
            return written == len ? now : -1;
        }
        if (errno != EEXIST)
            return -1;
    }
    int fd = openat(dir_fd, marker, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t len = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (len <= 0)
        return -1;
    text[len] = '\0';
    char *end;
    double value = strtod(text, &end);
    return end == text ? -1 : value;
}

static int marker_exists(int dir_fd, const char *name)
{
    char marker[NAME_MAX + 1];
    if (snprintf(marker, sizeof(marker), "%s.exit", name) >= (int)sizeof(marker))
        return 0;
    return faccessat(dir_fd, marker, F_OK, 0) == 0;
}

/* simgpu_state.claim_status: does the claim count as used memory, and is its PID listed. */
static void claim_status(int dir_fd, const char *name, unsigned pid, int flags, double lag, int *counted, int *listed)
{
    int exited = marker_exists(dir_fd, name);
    if (!exited) {
        char state = sim_pid_state(pid);
        int alive = state != 0 && state != 'Z' && state != 'X' && state != 'x';
        if (alive || ((flags & SIM_FLAG_ZOMBIE) && state != 0)) {
            *counted = *listed = 1;
            return;
        }
    }
    *listed = 0;
    if (flags & SIM_FLAG_STUCK) {
        *counted = 1;
        return;
    }
    double released = exit_time(dir_fd, name, !exited);
    *counted = released >= 0 && now_seconds() < released + lag;
}

static int by_pid(const void *a, const void *b)
{
    unsigned pa = ((const struct sim_claim *)a)->pid, pb = ((const struct sim_claim *)b)->pid;
    return (pa > pb) - (pa < pb);
}

static int append_claim(struct sim_claims *claims, unsigned *capacity, unsigned pid, unsigned long long mib, int mig)
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
    claims->items[claims->count].mig = mig;
    claims->count++;
    return 1;
}

static int covered(int which, int mig)
{
    return which == SIM_CLAIMS_ALL || (which == SIM_CLAIMS_GPU_ONLY ? mig < 0 : mig == which);
}

nvmlReturn_t sim_read_claims(unsigned int gpu_index, int which, struct sim_claims *claims)
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

    double lag = release_lag_seconds();
    unsigned long long host_offset = sim_host_pid_offset();
    unsigned capacity = 0;
    nvmlReturn_t result = NVML_SUCCESS;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        unsigned gpu, pid;
        int mig, flags, counted, listed;
        unsigned long long mib;
        if (!parse_claim_name(entry->d_name, &gpu, &mig, &pid) || gpu != gpu_index || !covered(which, mig))
            continue;
        if (!read_claim(dirfd(dir), entry->d_name, &mib, &flags))
            continue;
        claim_status(dirfd(dir), entry->d_name, pid, flags, lag, &counted, &listed);
        if (counted)
            claims->total_mib += mib;
        /* The driver names each holder by its PID in the host's namespace (host_pid_offset: a container host). */
        if (listed && !append_claim(claims, &capacity, (unsigned)(pid + host_offset), mib, mig)) {
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
