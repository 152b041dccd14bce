/* Memory runs out (run in a private /dev/shm of 256 MiB): an allocation no PE can back gives
 * NULL on every PE and gives back what was backed, so a smaller one fits after it. */
#include "check.h"

int main(void) {
  shmem_init();
  int me = shmem_my_pe(), n = shmem_n_pes();
  void *big = shmem_malloc((size_t)300 << 20);
  CHECK(big == NULL, "300 MiB per PE fit in 256 MiB of /dev/shm");
  char *small = shmem_malloc((size_t)40 << 20);
  CHECK(small != NULL, "40 MiB per PE did not fit after the failed allocation gave its memory back");
  small[((size_t)40 << 20) - 1] = 1;
  shmem_free(small);
  shmem_barrier_all();
  if (me == 0) printf("oom: %d PEs ok\n", n);
  shmem_finalize();
  return 0;
}
