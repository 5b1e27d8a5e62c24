/* nvidia-smi stand-in: shared pieces of the CLI (nvidia-smi.c) and its CSV queries (smi_query.c). */
#ifndef SIMGPU_SMI_H
#define SIMGPU_SMI_H

#include "nvml_subset.h"

#define SMI_MAX_GPUS 64
#define SMI_EXIT_INVALID_ARGUMENT 2
#define SMI_EXIT_NOT_FOUND 6

struct smi_format {
    int header; /* print the header line ("noheader" clears it) */
    int units;  /* append units to values ("nounits" clears it) */
};

struct smi_gpus {
    unsigned int count;
    nvmlDevice_t handles[SMI_MAX_GPUS];
};

/* Exits like nvidia-smi: its exit codes follow NVML's error codes where one exists. */
void smi_fail(const char *what, nvmlReturn_t result) __attribute__((noreturn));
void smi_check(const char *what, nvmlReturn_t result);

/* Both return 0, or SMI_EXIT_INVALID_ARGUMENT after naming the bad field on stdout. */
int smi_query_gpus(const struct smi_gpus *gpus, const char *fields, const struct smi_format *format);
int smi_query_compute_apps(const struct smi_gpus *gpus, const char *fields, const struct smi_format *format);

#endif
