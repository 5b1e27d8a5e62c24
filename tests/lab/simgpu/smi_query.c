/* --query-gpu and --query-compute-apps: CSV rows built from NVML calls only. */
#define _GNU_SOURCE
#include "smi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FIELDS 32
#define CELL_SIZE 256
#define BYTES_PER_MIB (1024ULL * 1024ULL)

enum unit { UNIT_NONE, UNIT_MIB, UNIT_PERCENT };

struct app_row {
    nvmlDevice_t device;
    nvmlProcessInfo_t info;
};

struct field {
    const char *name;
    const char *header; /* NULL: the name itself */
    enum unit unit;
    void (*gpu_value)(nvmlDevice_t device, char *cell);
    void (*app_value)(const struct app_row *row, char *cell);
};

static void gpu_index(nvmlDevice_t device, char *cell)
{
    unsigned index;
    smi_check("nvmlDeviceGetIndex", nvmlDeviceGetIndex(device, &index));
    snprintf(cell, CELL_SIZE, "%u", index);
}

static void gpu_uuid(nvmlDevice_t device, char *cell)
{
    smi_check("nvmlDeviceGetUUID", nvmlDeviceGetUUID(device, cell, CELL_SIZE));
}

static void gpu_name(nvmlDevice_t device, char *cell)
{
    smi_check("nvmlDeviceGetName", nvmlDeviceGetName(device, cell, CELL_SIZE));
}

/* nvidia-smi prints a bracketed reason instead of a value it cannot read. */
static int unavailable(nvmlReturn_t result, char *cell)
{
    if (result == NVML_ERROR_NOT_SUPPORTED)
        snprintf(cell, CELL_SIZE, "[N/A]");
    else if (result == NVML_ERROR_NO_PERMISSION)
        snprintf(cell, CELL_SIZE, "[Insufficient Permissions]");
    else
        return 0;
    return 1;
}

enum memory_field { MEMORY_TOTAL, MEMORY_USED, MEMORY_FREE, MEMORY_RESERVED };

/* As nvidia-smi from R510 on: memory.used leaves the driver's reservation out (NVML v2), memory.reserved is it. */
static void memory_value(nvmlDevice_t device, char *cell, enum memory_field which)
{
    nvmlMemory_v2_t memory = {.version = nvmlMemory_v2};
    nvmlReturn_t result = nvmlDeviceGetMemoryInfo_v2(device, &memory);
    if (unavailable(result, cell))
        return;
    smi_check("nvmlDeviceGetMemoryInfo_v2", result);
    unsigned long long bytes = which == MEMORY_TOTAL      ? memory.total
                               : which == MEMORY_USED     ? memory.used
                               : which == MEMORY_RESERVED ? memory.reserved
                                                          : memory.free;
    snprintf(cell, CELL_SIZE, "%llu", bytes / BYTES_PER_MIB);
}

static void memory_reserved(nvmlDevice_t device, char *cell)
{
    memory_value(device, cell, MEMORY_RESERVED);
}

static void memory_total(nvmlDevice_t device, char *cell)
{
    memory_value(device, cell, MEMORY_TOTAL);
}

static void memory_used(nvmlDevice_t device, char *cell)
{
    memory_value(device, cell, MEMORY_USED);
}

static void memory_free(nvmlDevice_t device, char *cell)
{
    memory_value(device, cell, MEMORY_FREE);
}

static void driver_version(nvmlDevice_t device, char *cell)
{
    (void)device;
    smi_check("nvmlSystemGetDriverVersion", nvmlSystemGetDriverVersion(cell, CELL_SIZE));
}

static void gpu_count(nvmlDevice_t device, char *cell)
{
    unsigned count;
    (void)device;
    smi_check("nvmlDeviceGetCount", nvmlDeviceGetCount_v2(&count));
    snprintf(cell, CELL_SIZE, "%u", count);
}

static void utilization_value(nvmlDevice_t device, char *cell, int memory_rate)
{
    nvmlUtilization_t rates;
    nvmlReturn_t result = nvmlDeviceGetUtilizationRates(device, &rates);
    if (unavailable(result, cell))
        return;
    smi_check("nvmlDeviceGetUtilizationRates", result);
    snprintf(cell, CELL_SIZE, "%u", memory_rate ? rates.memory : rates.gpu);
}

static void utilization_gpu(nvmlDevice_t device, char *cell)
{
    utilization_value(device, cell, 0);
}

static void utilization_memory(nvmlDevice_t device, char *cell)
{
    utilization_value(device, cell, 1);
}

static void app_pid(const struct app_row *row, char *cell)
{
    snprintf(cell, CELL_SIZE, "%u", row->info.pid);
}

static void app_process_name(const struct app_row *row, char *cell)
{
    /* The process may exit between listing and naming it; nvidia-smi then shows a placeholder. */
    if (nvmlSystemGetProcessName(row->info.pid, cell, CELL_SIZE) != NVML_SUCCESS)
        snprintf(cell, CELL_SIZE, "[N/A]");
}

static void app_gpu_uuid(const struct app_row *row, char *cell)
{
    gpu_uuid(row->device, cell);
}

static void app_gpu_name(const struct app_row *row, char *cell)
{
    gpu_name(row->device, cell);
}

static void app_used_memory(const struct app_row *row, char *cell)
{
    snprintf(cell, CELL_SIZE, "%llu", row->info.usedGpuMemory / BYTES_PER_MIB);
}

static const struct field gpu_fields[] = {
    {"index", NULL, UNIT_NONE, gpu_index, NULL},
    {"uuid", NULL, UNIT_NONE, gpu_uuid, NULL},
    {"gpu_uuid", NULL, UNIT_NONE, gpu_uuid, NULL},
    {"name", NULL, UNIT_NONE, gpu_name, NULL},
    {"gpu_name", NULL, UNIT_NONE, gpu_name, NULL},
    {"memory.total", NULL, UNIT_MIB, memory_total, NULL},
    {"memory.used", NULL, UNIT_MIB, memory_used, NULL},
    {"memory.free", NULL, UNIT_MIB, memory_free, NULL},
    {"memory.reserved", NULL, UNIT_MIB, memory_reserved, NULL},
    {"driver_version", NULL, UNIT_NONE, driver_version, NULL},
    {"count", NULL, UNIT_NONE, gpu_count, NULL},
    {"utilization.gpu", NULL, UNIT_PERCENT, utilization_gpu, NULL},
    {"utilization.memory", NULL, UNIT_PERCENT, utilization_memory, NULL},
    {NULL, NULL, UNIT_NONE, NULL, NULL},
};

static const struct field app_fields[] = {
    {"pid", NULL, UNIT_NONE, NULL, app_pid},
    {"process_name", NULL, UNIT_NONE, NULL, app_process_name},
    {"name", "process_name", UNIT_NONE, NULL, app_process_name},
    {"gpu_uuid", NULL, UNIT_NONE, NULL, app_gpu_uuid},
    {"gpu_name", NULL, UNIT_NONE, NULL, app_gpu_name},
    {"used_memory", "used_gpu_memory", UNIT_MIB, NULL, app_used_memory},
    {"used_gpu_memory", NULL, UNIT_MIB, NULL, app_used_memory},
    {NULL, NULL, UNIT_NONE, NULL, NULL},
};

static const char *trim(char *text)
{
    while (*text == ' ')
        text++;
    size_t len = strlen(text);
    while (len > 0 && text[len - 1] == ' ')
        text[--len] = '\0';
    return text;
}

/* Resolves every requested field before anything is printed; 0 after reporting the first unknown one. */
static int parse_fields(const char *list, const struct field *known, const struct field **out, unsigned *count)
{
    char *copy = strdup(list);
    char *cursor = copy, *token;
    int ok = copy != NULL;
    *count = 0;
    while (ok && (token = strsep(&cursor, ",")) != NULL) {
        const char *name = trim(token);
        const struct field *match = NULL;
        for (const struct field *f = known; f->name && !match; f++)
            if (strcmp(f->name, name) == 0)
                match = f;
        if (!match || *count == MAX_FIELDS) {
            printf("Field \"%s\" is not a valid field to query.\n\n", name);
            ok = 0;
        } else {
            out[(*count)++] = match;
        }
    }
    free(copy);
    return ok;
}

static const char *unit_text(enum unit unit)
{
    return unit == UNIT_MIB ? "MiB" : unit == UNIT_PERCENT ? "%" : NULL;
}

static void print_header(const struct field **fields, unsigned count)
{
    for (unsigned i = 0; i < count; i++) {
        const char *unit = unit_text(fields[i]->unit);
        printf("%s%s", i ? ", " : "", fields[i]->header ? fields[i]->header : fields[i]->name);
        if (unit)
            printf(" [%s]", unit);
    }
    printf("\n");
}

static void print_cell(unsigned position, const struct field *field, const char *cell, const struct smi_format *format)
{
    const char *unit = unit_text(field->unit);
    printf("%s%s", position ? ", " : "", cell);
    if (unit && format->units && cell[0] != '[')
        printf(" %s", unit);
}

/* One --query-* run: the fields asked for, resolved against one table, and the output format. */
struct query {
    const struct field *fields[MAX_FIELDS];
    unsigned count;
    const struct smi_format *format;
};

/* Resolves the fields and prints the header line when asked; 0 when a field is unknown (reported). */
static int start_query(struct query *query, const char *list, const struct field *known,
                       const struct smi_format *format)
{
    query->format = format;
    if (!parse_fields(list, known, query->fields, &query->count))
        return 0;
    if (format->header)
        print_header(query->fields, query->count);
    return 1;
}

/* One CSV line: a GPU's fields (row NULL) or one of its processes' fields. */
static void print_row(const struct query *query, nvmlDevice_t device, const struct app_row *row)
{
    char cell[CELL_SIZE];
    for (unsigned i = 0; i < query->count; i++) {
        if (row)
            query->fields[i]->app_value(row, cell);
        else
            query->fields[i]->gpu_value(device, cell);
        print_cell(i, query->fields[i], cell, query->format);
    }
    printf("\n");
}

int smi_query_gpus(const struct smi_gpus *gpus, const char *list, const struct smi_format *format)
{
    struct query query;
    if (!start_query(&query, list, gpu_fields, format))
        return SMI_EXIT_INVALID_ARGUMENT;
    for (unsigned g = 0; g < gpus->count; g++)
        print_row(&query, gpus->handles[g], NULL);
    return 0;
}

/* NVML's two-call protocol, repeated if processes appear between the calls. */
static nvmlProcessInfo_t *compute_processes(nvmlDevice_t device, unsigned *count)
{
    nvmlProcessInfo_t *infos = NULL;
    unsigned capacity = 0;
    for (;;) {
        *count = capacity;
        nvmlReturn_t result = nvmlDeviceGetComputeRunningProcesses_v3(device, count, infos);
        if (result == NVML_SUCCESS)
            return infos;
        free(infos);
        if (result == NVML_ERROR_NO_PERMISSION) {
            *count = 0;
            return NULL;
        }
        if (result != NVML_ERROR_INSUFFICIENT_SIZE)
            smi_fail("nvmlDeviceGetComputeRunningProcesses_v3", result);
        capacity = *count + 8;
        infos = calloc(capacity, sizeof(*infos));
        if (!infos)
            smi_fail("allocating the process list", NVML_ERROR_MEMORY);
    }
}

int smi_query_compute_apps(const struct smi_gpus *gpus, const char *list, const struct smi_format *format)
{
    struct query query;
    if (!start_query(&query, list, app_fields, format))
        return SMI_EXIT_INVALID_ARGUMENT;
    for (unsigned g = 0; g < gpus->count; g++) {
        unsigned n;
        nvmlProcessInfo_t *infos = compute_processes(gpus->handles[g], &n);
        for (unsigned p = 0; p < n; p++) {
            struct app_row row = {gpus->handles[g], infos[p]};
            print_row(&query, gpus->handles[g], &row);
        }
        free(infos);
    }
    return 0;
}
