/* device.c - the CPU backend's device queries: one device, the host processor. */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "../backend.h"
#include "gemm.h"

const char *be_name(void) { return "cpu"; }
int32_t be_device_count(void) { return 1; }

gyre_status be_device_name(int32_t device, char *buf, size_t cap) {
  (void)device; /* 0, checked by the caller */
  char model[256] = "unknown processor", line[512];
  FILE *f = fopen("/proc/cpuinfo", "r");
  while (f != NULL && fgets(line, sizeof line, f) != NULL) {
    char *colon = strchr(line, ':');
    if (strncmp(line, "model name", 10) == 0 && colon != NULL) {
      snprintf(model, sizeof model, "%s", colon + 2);
      model[strcspn(model, "\n")] = '\0';
      break;
    }
  }
  if (f != NULL) fclose(f);
  snprintf(buf, cap, "%s (%d cores, %d threads)", model, omp_get_num_procs(), cpu_default_threads());
  return GYRE_OK;
}

gyre_status be_set_device(int32_t device) {
  (void)device; /* 0, checked by the caller: nothing to select */
  return GYRE_OK;
}

void be_set_num_threads(int32_t n) { cpu_set_threads(n); }
int32_t be_num_threads(void) { return cpu_default_threads(); }
void be_use_threads(int32_t n) { cpu_use_threads(n); }
int32_t be_threads_for(int32_t n) { return n > 0 ? n : cpu_default_threads(); }
