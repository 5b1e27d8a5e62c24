/* Per-device queries. Every call re-reads the state directory; handles only carry the index. */
#define _GNU_SOURCE
#include "nvml_internal.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

/* A handle is the address of one of these slots: a GPU, or MIG device k of a GPU. */
static struct nvmlDevice_st handles[SIM_MAX_GPUS];
static struct nvmlDevice_st mig_handles[SIM_MAX_GPUS][SIM_MAX_MIG];

struct target {
    unsigned gpu;
    int mig; /* -1: the GPU itself */
};

static nvmlReturn_t decode(nvmlDevice_t device, struct target *t)
{
    if (!device)
        return NVML_ERROR_INVALID_ARGUMENT;
    uintptr_t address = (uintptr_t)device;
    uintptr_t gpus = (uintptr_t)handles, migs = (uintptr_t)mig_handles;
    if (address >= gpus && address < gpus + sizeof(handles)) {
        t->gpu = (unsigned)((address - gpus) / sizeof(handles[0]));
        t->mig = -1;
        return NVML_SUCCESS;
    }
    if (address >= migs && address < migs + sizeof(mig_handles)) {
        size_t slot = (address - migs) / sizeof(mig_handles[0][0]);
        t->gpu = (unsigned)(slot / SIM_MAX_MIG);
        t->mig = (int)(slot % SIM_MAX_MIG);
        return NVML_SUCCESS;
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

/* The device behind a handle as the state directory describes it now. */
static nvmlReturn_t lookup(nvmlDevice_t device, struct sim_gpu_list *list, struct target *t)
{
    if (!sim_initialized())
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t result = decode(device, t);
    if (result != NVML_SUCCESS)
        return result;
    result = sim_read_gpus(list);
    if (result != NVML_SUCCESS)
        return result;
    if (t->gpu >= list->count)
        return NVML_ERROR_GPU_IS_LOST;
    /* A destroyed MIG device leaves its handle invalid (nvml.h, nvmlDeviceGetMigDeviceHandleByIndex). */
    if (t->mig >= 0 && !list->gpus[t->gpu].mig[t->mig].present)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

static int mig_enabled(const struct sim_gpu_list *list, unsigned gpu)
{
    return list->gpus[gpu].mig_count > 0;
}

/* nvml.h: in MIG mode a GPU handle gives aggregate memory and processes "only if the caller has appropriate privileges". */
static int privileged(void)
{
    return geteuid() == 0;
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
    /* nvml.h: "The UUID of the target GPU or MIG instance"; a MIG UUID gives the MIG device handle. */
    for (unsigned i = 0; i < list.count; i++) {
        if (strcmp(list.gpus[i].uuid, uuid) == 0) {
            *device = &handles[i];
            return NVML_SUCCESS;
        }
        for (unsigned k = 0; k < SIM_MAX_MIG; k++) {
            if (list.gpus[i].mig[k].present && strcmp(list.gpus[i].mig[k].uuid, uuid) == 0) {
                *device = &mig_handles[i][k];
                return NVML_SUCCESS;
            }
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    struct sim_gpu_list list;
    struct target t;
    nvmlReturn_t result = lookup(device, &list, &t);
    if (result != NVML_SUCCESS)
        return result;
    const struct sim_gpu *gpu = &list.gpus[t.gpu];
    if (t.mig < 0)
        return sim_copy_string(gpu->name, name, length);
    /* MIG device names carry the profile: "NVIDIA H100 80GB HBM3 MIG 3g.40gb". */
    char full[NVML_DEVICE_NAME_V2_BUFFER_SIZE + SIM_PROFILE_SIZE + 8];
    snprintf(full, sizeof(full), "%s MIG %s", gpu->name, gpu->mig[t.mig].profile);
    return sim_copy_string(full, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    struct sim_gpu_list list;
    struct target t;
    nvmlReturn_t result = lookup(device, &list, &t);
    if (result != NVML_SUCCESS)
        return result;
    const struct sim_gpu *gpu = &list.gpus[t.gpu];
    return sim_copy_string(t.mig < 0 ? gpu->uuid : gpu->mig[t.mig].uuid, uuid, length);
}

/* For a MIG device handle, the index to pass to nvmlDeviceGetMigDeviceHandleByIndex (nvml.h). */
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    struct sim_gpu_list list;
    struct target t;
    if (!index)
        return sim_initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t result = lookup(device, &list, &t);
    if (result == NVML_SUCCESS)
        *index = t.mig < 0 ? t.gpu : (unsigned)t.mig;
    return result;
}

/*
 * Total, used (NVML v1: the driver's reservation included) and reserved bytes of a GPU, a MIG-mode GPU (aggregate)
 * or one MIG device. The reservation belongs to the GPU; a MIG device reports none of its own.
 */
static nvmlReturn_t memory_bytes(nvmlDevice_t device, unsigned long long *total, unsigned long long *used,
                                 unsigned long long *reserved)
{
    struct sim_gpu_list list;
    struct sim_claims claims;
    struct target t;
    nvmlReturn_t result = lookup(device, &list, &t);
    if (result != NVML_SUCCESS)
        return result;
    const struct sim_gpu *gpu = &list.gpus[t.gpu];
    int aggregate = t.mig < 0 && mig_enabled(&list, t.gpu);
    if (aggregate && !privileged())
        return NVML_ERROR_NO_PERMISSION;
    int which = t.mig >= 0 ? t.mig : aggregate ? SIM_CLAIMS_ALL : SIM_CLAIMS_GPU_ONLY;
    result = sim_read_claims(t.gpu, which, &claims);
    if (result != NVML_SUCCESS)
        return result;
    /* Every device (the GPU and each MIG device) shows 1 MiB used when idle. */
    unsigned long long idle = SIM_IDLE_USED_MIB * (1 + (aggregate ? gpu->mig_count : 0));
    unsigned long long reserved_mib = t.mig < 0 ? sim_reserved_mib() : 0;
    *total = (t.mig < 0 ? gpu->total_mib : gpu->mig[t.mig].total_mib) * SIM_MIB;
    *used = (claims.total_mib + idle + reserved_mib) * SIM_MIB;
    *reserved = reserved_mib * SIM_MIB;
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
    unsigned long long total, used, reserved;
    if (!memory)
        return sim_initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t result = memory_bytes(device, &total, &used, &reserved);
    if (result != NVML_SUCCESS)
        return result;
    memory->total = total;
    memory->used = used;
    memory->free = free_bytes(total, used);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    unsigned long long total, used, reserved;
    if (!memory)
        return sim_initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t result = memory_bytes(device, &total, &used, &reserved);
    if (result != NVML_SUCCESS)
        return result;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    /* As a driver from R510 on: total = reserved + used + free (nvidia-smi -q's "FB Memory Usage"). */
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used - reserved;
    memory->free = free_bytes(total, used);
    return NVML_SUCCESS;
}

/* Utilization is not reported in MIG mode (nvidia-smi shows N/A there). */
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    struct sim_gpu_list list;
    struct sim_claims claims;
    struct target t;
    if (!utilization)
        return sim_initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t result = lookup(device, &list, &t);
    if (result != NVML_SUCCESS)
        return result;
    if (t.mig >= 0 || mig_enabled(&list, t.gpu))
        return NVML_ERROR_NOT_SUPPORTED;
    result = sim_read_claims(t.gpu, SIM_CLAIMS_GPU_ONLY, &claims);
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
 * Only listed claims appear: a holder that is gone is not a process, even while its memory is still used.
 */
static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *infoCount, void *infos, int v1_layout,
                                      int graphics)
{
    struct sim_gpu_list list;
    struct sim_claims claims;
    struct target t;
    if (!infoCount)
        return sim_initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t result = lookup(device, &list, &t);
    if (result != NVML_SUCCESS)
        return result;
    if (graphics) {
        *infoCount = 0;
        return NVML_SUCCESS;
    }
    const struct sim_gpu *gpu = &list.gpus[t.gpu];
    int aggregate = t.mig < 0 && mig_enabled(&list, t.gpu);
    if (aggregate && !privileged())
        return NVML_ERROR_NO_PERMISSION;
    result = sim_read_claims(t.gpu, t.mig >= 0 ? t.mig : aggregate ? SIM_CLAIMS_ALL : SIM_CLAIMS_GPU_ONLY, &claims);
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
        int mig = claims.items[i].mig;
        if (v1_layout) {
            nvmlProcessInfo_v1_t *info = (nvmlProcessInfo_v1_t *)infos + i;
            info->pid = claims.items[i].pid;
            info->usedGpuMemory = bytes;
        } else {
            nvmlProcessInfo_t *info = (nvmlProcessInfo_t *)infos + i;
            info->pid = claims.items[i].pid;
            info->usedGpuMemory = bytes;
            info->gpuInstanceId = mig >= 0 ? gpu->mig[mig].gpu_instance : NVML_VALUE_NOT_AVAILABLE_UINT;
            info->computeInstanceId = mig >= 0 ? gpu->mig[mig].compute_instance : NVML_VALUE_NOT_AVAILABLE_UINT;
        }
    }
    *infoCount = claims.count;
    sim_free_claims(&claims);
    return NVML_SUCCESS;
}

/* Every name nvml.h exports the two process lists under: the unversioned one fills the v1 record (no instance
 * ids), _v2 and _v3 fill nvmlProcessInfo_t. */
#define SIM_PROCESS_LIST(name, info_type, v1_layout, graphics)                                                  \
    nvmlReturn_t name(nvmlDevice_t device, unsigned int *infoCount, info_type *infos)                           \
    {                                                                                                           \
        return running_processes(device, infoCount, infos, v1_layout, graphics);                                \
    }

SIM_PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, 1, 0)
SIM_PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t, 0, 0)
SIM_PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t, 0, 0)
SIM_PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t, 1, 1)
SIM_PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_t, 0, 1)
SIM_PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t, 0, 1)

/* -- MIG (nvml.h: Ampere or newer, Linux only; the simulated H100s support it) ----------------------------- */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    struct sim_gpu_list list;
    struct target t;
    if (!currentMode || !pendingMode)
        return sim_initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t result = lookup(device, &list, &t);
    if (result != NVML_SUCCESS)
        return result;
    if (t.mig >= 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = *pendingMode = mig_enabled(&list, t.gpu) ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return NVML_SUCCESS;
}

/* "Returns zero if MIG is not supported or enabled"; an H100 can hold 7 MIG devices. */
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    struct sim_gpu_list list;
    struct target t;
    if (!count)
        return sim_initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t result = lookup(device, &list, &t);
    if (result != NVML_SUCCESS)
        return result;
    if (t.mig >= 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = mig_enabled(&list, t.gpu) ? SIM_MAX_MIG : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice)
{
    struct sim_gpu_list list;
    struct target t;
    if (!migDevice)
        return sim_initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t result = lookup(device, &list, &t);
    if (result != NVML_SUCCESS)
        return result;
    if (t.mig >= 0 || index >= SIM_MAX_MIG)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!list.gpus[t.gpu].mig[index].present)
        return NVML_ERROR_NOT_FOUND;
    *migDevice = &mig_handles[t.gpu][index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    struct sim_gpu_list list;
    struct target t;
    if (!device)
        return sim_initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t result = lookup(migDevice, &list, &t);
    if (result != NVML_SUCCESS)
        return result;
    if (t.mig < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &handles[t.gpu];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    struct sim_gpu_list list;
    struct target t;
    if (!isMigDevice)
        return sim_initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t result = lookup(device, &list, &t);
    if (result == NVML_SUCCESS)
        *isMigDevice = t.mig >= 0;
    return result;
}

static nvmlReturn_t instance_id(nvmlDevice_t device, unsigned int *id, int compute)
{
    struct sim_gpu_list list;
    struct target t;
    if (!id)
        return sim_initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t result = lookup(device, &list, &t);
    if (result != NVML_SUCCESS)
        return result;
    if (t.mig < 0)
        return NVML_ERROR_INVALID_ARGUMENT; /* "Target MIG device handle" */
    const struct sim_mig *mig = &list.gpus[t.gpu].mig[t.mig];
    *id = compute ? mig->compute_instance : mig->gpu_instance;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return instance_id(device, id, 0);
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return instance_id(device, id, 1);
}
