/* Per-device queries. Every call re-reads the state directory; handles only carry the index. */
#define _GNU_SOURCE
#include "nvml_internal.h"

#include <stddef.h>
#include <string.h>

/* Utilization is not modelled beyond "busy or idle": fixed percentages while any claim is live. */
#define SIM_BUSY_GPU_UTIL 37
#define SIM_BUSY_MEMORY_UTIL 21

/* The ABI nvidia-ml-py's ctypes structures expect (checked against nvml.h). */
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t layout");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40 && nvmlMemory_v2 == 0x02000028, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo_v1_t layout");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t layout");

struct nvmlDevice_st {
    unsigned char unused;
};

static struct nvmlDevice_st handles[SIM_MAX_GPUS];

static nvmlReturn_t handle_index(nvmlDevice_t device, unsigned *index)
{
    if (!device)
        return NVML_ERROR_INVALID_ARGUMENT;
    ptrdiff_t offset = device - handles;
    if (offset < 0 || offset >= SIM_MAX_GPUS)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)offset;
    return NVML_SUCCESS;
}

/* The GPU behind a handle as the state directory describes it now. */
static nvmlReturn_t lookup(nvmlDevice_t device, struct sim_gpu_list *list, unsigned *index)
{
    if (!sim_initialized())
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t result = handle_index(device, index);
    if (result != NVML_SUCCESS)
        return result;
    result = sim_read_gpus(list);
    if (result != NVML_SUCCESS)
        return result;
    return *index < list->count ? NVML_SUCCESS : NVML_ERROR_GPU_IS_LOST;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (!sim_initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct sim_gpu_list list;
    nvmlReturn_t result = sim_read_gpus(&list);
    if (result == NVML_SUCCESS)
        *deviceCount = list.count;
    return result;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!sim_initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!device)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct sim_gpu_list list;
    nvmlReturn_t result = sim_read_gpus(&list);
    if (result != NVML_SUCCESS)
        return result;
    if (index >= list.count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &handles[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!sim_initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct sim_gpu_list list;
    nvmlReturn_t result = sim_read_gpus(&list);
    if (result != NVML_SUCCESS)
        return result;
    for (unsigned i = 0; i < list.count; i++) {
        if (strcmp(list.gpus[i].uuid, uuid) == 0) {
            *device = &handles[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    struct sim_gpu_list list;
    unsigned index;
    nvmlReturn_t result = lookup(device, &list, &index);
    return result != NVML_SUCCESS ? result : sim_copy_string(list.gpus[index].name, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    struct sim_gpu_list list;
    unsigned index;
    nvmlReturn_t result = lookup(device, &list, &index);
    return result != NVML_SUCCESS ? result : sim_copy_string(list.gpus[index].uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    struct sim_gpu_list list;
    unsigned found;
    if (!index)
        return sim_initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t result = lookup(device, &list, &found);
    if (result == NVML_SUCCESS)
        *index = found;
    return result;
}

/* Bytes used (live claims plus the driver reservation) and total for one GPU. */
static nvmlReturn_t memory_bytes(nvmlDevice_t device, unsigned long long *total, unsigned long long *used)
{
    struct sim_gpu_list list;
    struct sim_claims claims;
    unsigned index;
    nvmlReturn_t result = lookup(device, &list, &index);
    if (result == NVML_SUCCESS)
        result = sim_read_claims(index, &claims);
    if (result != NVML_SUCCESS)
        return result;
    *total = list.gpus[index].total_mib * SIM_MIB;
    *used = (claims.total_mib + SIM_DRIVER_RESERVED_MIB) * SIM_MIB;
    sim_free_claims(&claims);
    return NVML_SUCCESS;
}

/* A forced over-commit can make used exceed total; free then reads 0, never wraps. */
static unsigned long long free_bytes(unsigned long long total, unsigned long long used)
{
    return used < total ? total - used : 0;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    unsigned long long total, used;
    if (!memory)
        return sim_initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t result = memory_bytes(device, &total, &used);
    if (result != NVML_SUCCESS)
        return result;
    memory->total = total;
    memory->used = used;
    memory->free = free_bytes(total, used);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    unsigned long long total, used;
    if (!memory)
        return sim_initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t result = memory_bytes(device, &total, &used);
    if (result != NVML_SUCCESS)
        return result;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = total;
    memory->reserved = 0;
    memory->used = used;
    memory->free = free_bytes(total, used);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    struct sim_gpu_list list;
    struct sim_claims claims;
    unsigned index;
    if (!utilization)
        return sim_initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t result = lookup(device, &list, &index);
    if (result == NVML_SUCCESS)
        result = sim_read_claims(index, &claims);
    if (result != NVML_SUCCESS)
        return result;
    int busy = claims.count > 0;
    sim_free_claims(&claims);
    utilization->gpu = busy ? SIM_BUSY_GPU_UTIL : 0;
    utilization->memory = busy ? SIM_BUSY_MEMORY_UTIL : 0;
    return NVML_SUCCESS;
}

/*
 * NVML's sizing protocol: with *infoCount too small, report the needed count and
 * INSUFFICIENT_SIZE (pynvml asks with 0 first); with no processes, SUCCESS and 0.
 */
static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *infoCount, void *infos, int v1_layout,
                                      int graphics)
{
    struct sim_gpu_list list;
    struct sim_claims claims;
    unsigned index;
    if (!infoCount)
        return sim_initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t result = lookup(device, &list, &index);
    if (result != NVML_SUCCESS)
        return result;
    if (graphics) {
        *infoCount = 0;
        return NVML_SUCCESS;
    }
    result = sim_read_claims(index, &claims);
    if (result != NVML_SUCCESS)
        return result;
    if (*infoCount < claims.count) {
        *infoCount = claims.count;
        sim_free_claims(&claims);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (claims.count > 0 && !infos) {
        sim_free_claims(&claims);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (unsigned i = 0; i < claims.count; i++) {
        unsigned long long bytes = claims.items[i].mib * SIM_MIB;
        if (v1_layout) {
            nvmlProcessInfo_v1_t *info = (nvmlProcessInfo_v1_t *)infos + i;
            info->pid = claims.items[i].pid;
            info->usedGpuMemory = bytes;
        } else {
            nvmlProcessInfo_t *info = (nvmlProcessInfo_t *)infos + i;
            info->pid = claims.items[i].pid;
            info->usedGpuMemory = bytes;
            info->gpuInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT; /* not a MIG device */
            info->computeInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
        }
    }
    *infoCount = claims.count;
    sim_free_claims(&claims);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos)
{
    return running_processes(device, infoCount, infos, 1, 0);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return running_processes(device, infoCount, infos, 0, 0);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return running_processes(device, infoCount, infos, 0, 0);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                   nvmlProcessInfo_v1_t *infos)
{
    return running_processes(device, infoCount, infos, 1, 1);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos)
{
    return running_processes(device, infoCount, infos, 0, 1);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos)
{
    return running_processes(device, infoCount, infos, 0, 1);
}
