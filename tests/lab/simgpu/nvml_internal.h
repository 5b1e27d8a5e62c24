/* Helpers shared by the NVML entry points; hidden from the library's exported symbols. */
#ifndef SIMGPU_NVML_INTERNAL_H
#define SIMGPU_NVML_INTERNAL_H

#include "nvml_subset.h"
#include "state.h"

int sim_initialized(void);

/* NVML's string contract: INSUFFICIENT_SIZE unless value and its NUL fit in length. */
nvmlReturn_t sim_copy_string(const char *value, char *out, unsigned int length);

#endif
