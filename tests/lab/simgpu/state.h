/*
 * Reading the simgpu state directory (see README.md, "State"): the GPU list,
 * the MIG devices and the per-(device, PID) claim files. Nothing is cached;
 * every call reads the files again, as simgpu_state.py (the Python reading of
 * the same contract) does.
 */
#ifndef SIMGPU_STATE_H
#define SIMGPU_STATE_H

#include "nvml_subset.h"

#define SIM_MAX_GPUS 64
#define SIM_MAX_MIG 7
#define SIM_PROFILE_SIZE 32
#define SIM_DEFAULT_STATE_DIR "/var/lib/simgpu"
/* What an idle device's NVML v2 `used` reads (nvidia-smi's "1MiB / 81559MiB"). */
#define SIM_IDLE_USED_MIB 1ULL
/* The driver's reservation on each GPU when the state has no reserved_mib file: an idle H100 80GB HBM3 (README). */
#define SIM_DEFAULT_RESERVED_MIB 454ULL
#define SIM_MIB 1048576ULL
#define SIM_DEFAULT_RELEASE_LAG_MS 400

/* Which claims a query covers. */
#define SIM_CLAIMS_GPU_ONLY (-1) /* claims on the GPU itself (not on a MIG device) */
#define SIM_CLAIMS_ALL (-2)      /* every claim on the GPU and its MIG devices (MIG aggregate) */

struct sim_mig {
    int present;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char profile[SIM_PROFILE_SIZE];
    unsigned long long total_mib;
    unsigned int gpu_instance;
    unsigned int compute_instance;
};

struct sim_gpu {
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    unsigned long long total_mib;
    unsigned int mig_count;
    struct sim_mig mig[SIM_MAX_MIG]; /* mig[k] is MIG device index k when present */
};

/* gpus[i] is the GPU whose index is i; the file must list 0..count-1. */
struct sim_gpu_list {
    unsigned int count;
    struct sim_gpu gpus[SIM_MAX_GPUS];
};

struct sim_claim {
    unsigned int pid;
    unsigned long long mib;
    int mig; /* MIG device index, or -1 for the GPU itself */
};

/* Claims of one query: the listed processes (sorted by PID) and the MiB that count as used. */
struct sim_claims {
    unsigned int count;
    unsigned long long total_mib;
    struct sim_claim *items;
};

/* NVML_ERROR_DRIVER_NOT_LOADED when the list is missing, NVML_ERROR_UNKNOWN when malformed. */
nvmlReturn_t sim_read_gpus(struct sim_gpu_list *list);

/* which: a MIG device index, SIM_CLAIMS_GPU_ONLY or SIM_CLAIMS_ALL. */
nvmlReturn_t sim_read_claims(unsigned int gpu_index, int which, struct sim_claims *claims);
void sim_free_claims(struct sim_claims *claims);

/* The driver's reservation per GPU in MiB: <state>/reserved_mib, else SIM_DEFAULT_RESERVED_MIB. */
unsigned long long sim_reserved_mib(void);

/* What a listed PID reads as in the host's PID namespace: the claim's PID plus <state>/host_pid_offset (0 when the
 * file is missing or malformed: the caller shares the driver's PID namespace). */
#define SIM_MAX_HOST_PID_OFFSET 3000000ULL
unsigned long long sim_host_pid_offset(void);

/* The state letter of /proc/PID/stat ('R', 'S', 'Z', ...), or 0 when the PID does not exist. */
char sim_pid_state(unsigned int pid);

/* argv[0] from /proc/PID/cmdline, else /proc/PID/comm; 0 when the process is gone. */
int sim_process_name(unsigned int pid, char *out, unsigned int size);

#endif
