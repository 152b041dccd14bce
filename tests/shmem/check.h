/* Shared by the conformance programs: a failed check names the file, line and PE, and ends
 * the job with status 1. */
#include <shmem.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond, ...)                                                            \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      fprintf(stderr, "%s:%d: PE %d: check failed: %s: ", __FILE__, __LINE__,      \
              shmem_my_pe(), #cond);                                                \
      fprintf(stderr, __VA_ARGS__);                                                 \
      fprintf(stderr, "\n");                                                        \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)
