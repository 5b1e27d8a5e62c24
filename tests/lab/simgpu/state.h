/*
 * Reading the simgpu state directory (see README.md, "State"): the GPU list
 * and the per-(GPU, PID) claim files. Nothing is cached; every call reads the
 * files again so a process that dies drops out at once.
 */
#ifndef SIMGPU_STATE_H
#define SIMGPU_STATE_H

#include "nvml_subset.h"

#define SIM_MAX_GPUS 64
#define SIM_DEFAULT_STATE_DIR "/var/lib/simgpu"
#define SIM_DRIVER_RESERVED_MIB 1ULL
#define SIM_MIB 1048576ULL

struct sim_gpu {
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    unsigned long long total_mib;
};

/* gpus[i] is the GPU whose index is i; the file must list 0..count-1. */
struct sim_gpu_list {
    unsigned int count;
    struct sim_gpu gpus[SIM_MAX_GPUS];
};

struct sim_claim {
    unsigned int pid;
    unsigned long long mib;
};

/* Live claims on one GPU, sorted by PID. Free with sim_free_claims. */
struct sim_claims {
    unsigned int count;
    unsigned long long total_mib;
    struct sim_claim *items;
};

/* NVML_ERROR_DRIVER_NOT_LOADED when the list is missing, NVML_ERROR_UNKNOWN when malformed. */
nvmlReturn_t sim_read_gpus(struct sim_gpu_list *list);

nvmlReturn_t sim_read_claims(unsigned int gpu_index, struct sim_claims *claims);
void sim_free_claims(struct sim_claims *claims);

/* Alive: /proc/PID exists and its state is neither zombie (Z) nor dead (X). */
int sim_pid_alive(unsigned int pid);

/* argv[0] from /proc/PID/cmdline, else /proc/PID/comm; 0 when the process is gone. */
int sim_process_name(unsigned int pid, char *out, unsigned int size);

#endif
