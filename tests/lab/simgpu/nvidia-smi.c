/*
 * nvidia-smi stand-in: the query forms operators and the collection use, answered
 * through libnvidia-ml.so.1 only (it never reads the simgpu state itself).
 */
#define _GNU_SOURCE
#include "smi.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BYTES_PER_MIB (1024ULL * 1024ULL)
#define TABLE_WIDTH 87
#define RULE "+-----------------------------------------------------------------------------------------+"

struct options {
    int list;
    int help;
    const char *query_gpu;
    const char *query_apps;
    const char *format;
    const char *ids;
};

static const char usage[] =
    "NVIDIA System Management Interface (simgpu stand-in)\n"
    "\n"
    "nvidia-smi [-i ID[,ID...]] [-L | --query-gpu=FIELDS | --query-compute-apps=FIELDS] [--format=csv[,noheader][,nounits]]\n"
    "\n"
    "    -h, --help                  Print this help.\n"
    "    -L, --list-gpus             One line per GPU: \"GPU 0: NAME (UUID: GPU-...)\", MIG devices below it.\n"
    "    -i, --id=ID                 Only these GPUs: indices or UUIDs, comma separated.\n"
    "    --query-gpu=FIELDS          index, uuid, gpu_uuid, name, gpu_name, memory.total, memory.used,\n"
    "                                memory.free, memory.reserved, driver_version, count, utilization.gpu,\n"
    "                                utilization.memory\n"
    "    --query-compute-apps=FIELDS pid, process_name, name, gpu_uuid, gpu_name, used_memory, used_gpu_memory\n"
    "    --format=csv[,noheader][,nounits]  Required with --query-*.\n"
    "\n"
    "Without options: a summary table of GPUs and their processes.\n";

static int exit_code_for(nvmlReturn_t result)
{
    switch (result) {
    case NVML_ERROR_INVALID_ARGUMENT:
    case NVML_ERROR_NOT_SUPPORTED:
    case NVML_ERROR_NO_PERMISSION:
    case NVML_ERROR_NOT_FOUND:
    case NVML_ERROR_INSUFFICIENT_POWER:
    case NVML_ERROR_DRIVER_NOT_LOADED:
    case NVML_ERROR_TIMEOUT:
    case NVML_ERROR_LIBRARY_NOT_FOUND:
    case NVML_ERROR_CORRUPTED_INFOROM:
    case NVML_ERROR_GPU_IS_LOST:
        return (int)result;
    default:
        return 255;
    }
}

void smi_fail(const char *what, nvmlReturn_t result)
{
    if (result == NVML_ERROR_DRIVER_NOT_LOADED)
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.\n\n");
    else
        printf("NVIDIA-SMI has failed: %s: %s\n\n", what, nvmlErrorString(result));
    fflush(stdout);
    exit(exit_code_for(result));
}

void smi_check(const char *what, nvmlReturn_t result)
{
    if (result != NVML_SUCCESS)
        smi_fail(what, result);
}

static int invalid_arguments(const char *detail, const char *value)
{
    fprintf(stderr, "nvidia-smi: %s%s\n", detail, value ? value : "");
    printf("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n");
    return SMI_EXIT_INVALID_ARGUMENT;
}

/* "--name=value" or "--name value"; NULL when argv[*i] is not this option. */
static const char *long_value(int argc, char **argv, int *i, const char *name, int *missing)
{
    size_t len = strlen(name);
    if (strncmp(argv[*i], name, len) != 0)
        return NULL;
    if (argv[*i][len] == '=')
        return argv[*i] + len + 1;
    if (argv[*i][len] != '\0')
        return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

static int parse_options(int argc, char **argv, struct options *opts)
{
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *value;
        if (strcmp(argv[i], "-L") == 0 || strcmp(argv[i], "--list-gpus") == 0)
            opts->list = 1;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            opts->help = 1;
        else if (strcmp(argv[i], "-i") == 0 && i + 1 < argc)
            opts->ids = argv[++i];
        else if ((value = long_value(argc, argv, &i, "--id", &missing)))
            opts->ids = value;
        else if ((value = long_value(argc, argv, &i, "--query-gpu", &missing)))
            opts->query_gpu = value;
        else if ((value = long_value(argc, argv, &i, "--query-compute-apps", &missing)))
            opts->query_apps = value;
        else if ((value = long_value(argc, argv, &i, "--format", &missing)))
            opts->format = value;
        else
            return invalid_arguments(missing || strcmp(argv[i], "-i") == 0 ? "missing value for " : "unknown option ",
                                     argv[i]);
    }
    if (opts->list + (opts->query_gpu != NULL) + (opts->query_apps != NULL) > 1)
        return invalid_arguments("use only one of -L, --query-gpu, --query-compute-apps", NULL);
    if ((opts->query_gpu || opts->query_apps) && !opts->format)
        return invalid_arguments("--format=csv[,noheader][,nounits] is required with --query-gpu and --query-compute-apps",
                                 NULL);
    if (opts->format && !opts->query_gpu && !opts->query_apps)
        return invalid_arguments("--format only applies to --query-gpu and --query-compute-apps", NULL);
    return 0;
}

static int parse_format(const char *text, struct smi_format *format)
{
    char *copy = strdup(text), *cursor = copy, *token;
    int csv = 0, ok = copy != NULL;
    format->header = 1;
    format->units = 1;
    while (ok && (token = strsep(&cursor, ",")) != NULL) {
        if (strcmp(token, "csv") == 0)
            csv = 1;
        else if (strcmp(token, "noheader") == 0)
            format->header = 0;
        else if (strcmp(token, "nounits") == 0)
            format->units = 0;
        else
            ok = 0;
    }
    free(copy);
    if (ok && csv)
        return 0;
    return invalid_arguments("--format accepts csv with optional noheader and nounits, got ", text);
}

/* -i selects by index or UUID, like nvidia-smi; an unknown one is "No devices were found". */
static int select_gpus(const char *ids, struct smi_gpus *gpus)
{
    unsigned count;
    gpus->count = 0;
    if (!ids) {
        smi_check("nvmlDeviceGetCount", nvmlDeviceGetCount_v2(&count));
        for (unsigned i = 0; i < count && i < SMI_MAX_GPUS; i++)
            smi_check("nvmlDeviceGetHandleByIndex", nvmlDeviceGetHandleByIndex_v2(i, &gpus->handles[gpus->count++]));
        return 0;
    }
    char *copy = strdup(ids), *cursor = copy, *token;
    int ok = copy != NULL;
    while (ok && (token = strsep(&cursor, ",")) != NULL && gpus->count < SMI_MAX_GPUS) {
        char *end;
        unsigned long index = strtoul(token, &end, 10);
        nvmlDevice_t *slot = &gpus->handles[gpus->count];
        nvmlReturn_t result = (*token && *end == '\0' && token[0] != '-')
                                  ? nvmlDeviceGetHandleByIndex_v2((unsigned)index, slot)
                                  : nvmlDeviceGetHandleByUUID(token, slot);
        if (result == NVML_ERROR_INVALID_ARGUMENT || result == NVML_ERROR_NOT_FOUND)
            ok = 0;
        else
            smi_check("selecting GPUs", result);
        gpus->count += ok;
    }
    free(copy);
    if (ok)
        return 0;
    printf("No devices were found\n");
    return SMI_EXIT_NOT_FOUND;
}

/* The MIG devices of a GPU in index order: nvidia-smi -L lists them under their GPU. */
static void list_mig_devices(nvmlDevice_t gpu, const char *gpu_name)
{
    unsigned max = 0;
    if (nvmlDeviceGetMaxMigDeviceCount(gpu, &max) != NVML_SUCCESS)
        return;
    for (unsigned k = 0; k < max; k++) {
        nvmlDevice_t mig;
        char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE], uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        nvmlReturn_t result = nvmlDeviceGetMigDeviceHandleByIndex(gpu, k, &mig);
        if (result == NVML_ERROR_NOT_FOUND)
            continue;
        smi_check("nvmlDeviceGetMigDeviceHandleByIndex", result);
        smi_check("nvmlDeviceGetName", nvmlDeviceGetName(mig, name, sizeof(name)));
        smi_check("nvmlDeviceGetUUID", nvmlDeviceGetUUID(mig, uuid, sizeof(uuid)));
        /* The device name is "<GPU name> MIG <profile>"; the listing shows the profile. */
        const char *profile = name;
        size_t prefix = strlen(gpu_name);
        if (strncmp(name, gpu_name, prefix) == 0 && strncmp(name + prefix, " MIG ", 5) == 0)
            profile = name + prefix + 5;
        printf("  MIG %-12sDevice %2u: (UUID: %s)\n", profile, k, uuid);
    }
}

static void list_gpus(const struct smi_gpus *gpus)
{
    for (unsigned g = 0; g < gpus->count; g++) {
        char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE], uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        unsigned index;
        smi_check("nvmlDeviceGetIndex", nvmlDeviceGetIndex(gpus->handles[g], &index));
        smi_check("nvmlDeviceGetName", nvmlDeviceGetName(gpus->handles[g], name, sizeof(name)));
        smi_check("nvmlDeviceGetUUID", nvmlDeviceGetUUID(gpus->handles[g], uuid, sizeof(uuid)));
        printf("GPU %u: %s (UUID: %s)\n", index, name, uuid);
        list_mig_devices(gpus->handles[g], name);
    }
}

/* One table line: content padded to the frame, as nvidia-smi's summary does. */
static void table_row(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void table_row(const char *fmt, ...)
{
    char line[TABLE_WIDTH + 1];
    va_list args;
    va_start(args, fmt);
    vsnprintf(line, sizeof(line), fmt, args);
    va_end(args);
    printf("| %-*s |\n", TABLE_WIDTH, line);
}

static void print_gpu_rows(const struct smi_gpus *gpus)
{
    for (unsigned g = 0; g < gpus->count; g++) {
        char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE], memory_text[64] = "N/A", util_text[16] = "N/A";
        unsigned index;
        nvmlMemory_v2_t memory = {.version = nvmlMemory_v2};
        nvmlUtilization_t rates;
        smi_check("nvmlDeviceGetIndex", nvmlDeviceGetIndex(gpus->handles[g], &index));
        smi_check("nvmlDeviceGetName", nvmlDeviceGetName(gpus->handles[g], name, sizeof(name)));
        nvmlReturn_t result = nvmlDeviceGetMemoryInfo_v2(gpus->handles[g], &memory);
        if (result == NVML_SUCCESS)
            snprintf(memory_text, sizeof(memory_text), "%9lluMiB / %9lluMiB", memory.used / BYTES_PER_MIB,
                     memory.total / BYTES_PER_MIB);
        else if (result != NVML_ERROR_NO_PERMISSION)
            smi_fail("nvmlDeviceGetMemoryInfo_v2", result);
        result = nvmlDeviceGetUtilizationRates(gpus->handles[g], &rates);
        if (result == NVML_SUCCESS)
            snprintf(util_text, sizeof(util_text), "%8u%%", rates.gpu);
        else if (result != NVML_ERROR_NOT_SUPPORTED)
            smi_fail("nvmlDeviceGetUtilizationRates", result);
        table_row("%3u  %-40.40s %27s %9s", index, name, memory_text, util_text);
    }
}

static int print_process_rows(const struct smi_gpus *gpus)
{
    int any = 0;
    for (unsigned g = 0; g < gpus->count; g++) {
        nvmlProcessInfo_t infos[256];
        unsigned count = 256, index;
        smi_check("nvmlDeviceGetIndex", nvmlDeviceGetIndex(gpus->handles[g], &index));
        nvmlReturn_t result = nvmlDeviceGetComputeRunningProcesses_v3(gpus->handles[g], &count, infos);
        if (result == NVML_ERROR_INSUFFICIENT_SIZE || result == NVML_ERROR_NO_PERMISSION)
            continue; /* more than the summary shows; the CSV query lists them all */
        smi_check("nvmlDeviceGetComputeRunningProcesses_v3", result);
        for (unsigned p = 0; p < count; p++) {
            char name[48] = "[N/A]";
            nvmlSystemGetProcessName(infos[p].pid, name, sizeof(name));
            table_row("%4u   %8u   %4s   %-46.46s %9lluMiB", index, infos[p].pid, "C", name,
                      infos[p].usedGpuMemory / BYTES_PER_MIB);
            any = 1;
        }
    }
    return any;
}

static void print_table(const struct smi_gpus *gpus)
{
    char driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    int cuda;
    smi_check("nvmlSystemGetDriverVersion", nvmlSystemGetDriverVersion(driver, sizeof(driver)));
    smi_check("nvmlSystemGetCudaDriverVersion", nvmlSystemGetCudaDriverVersion_v2(&cuda));
    printf("%s\n", RULE);
    table_row("NVIDIA-SMI %-18s Driver Version: %-18s CUDA Version: %d.%d", driver, driver, cuda / 1000,
              cuda % 1000 / 10);
    printf("%s\n", RULE);
    table_row("GPU  %-40s %27s %9s", "Name", "Memory-Usage", "GPU-Util");
    print_gpu_rows(gpus);
    printf("%s\n\n%s\n", RULE, RULE);
    table_row("Processes:");
    table_row("%4s   %8s   %s   %-46s %12s", "GPU", "PID", "Type", "Process name", "GPU Memory");
    if (!print_process_rows(gpus))
        table_row(" No running processes found");
    printf("%s\n", RULE);
}

int main(int argc, char **argv)
{
    struct options opts = {0};
    struct smi_format format = {1, 1};
    struct smi_gpus gpus;
    int rc = parse_options(argc, argv, &opts);
    if (rc == 0 && opts.format)
        rc = parse_format(opts.format, &format);
    if (rc != 0)
        return rc;
    if (opts.help) {
        fputs(usage, stdout);
        return 0;
    }
    smi_check("nvmlInit", nvmlInit_v2());
    rc = select_gpus(opts.ids, &gpus);
    if (rc == 0) {
        if (opts.list)
            list_gpus(&gpus);
        else if (opts.query_gpu)
            rc = smi_query_gpus(&gpus, opts.query_gpu, &format);
        else if (opts.query_apps)
            rc = smi_query_compute_apps(&gpus, opts.query_apps, &format);
        else
            print_table(&gpus);
    }
    nvmlShutdown();
    return rc;
}
