/* Locks: every PE increments a counter on PE 0 with a get and a put (not atomic) under the
 * lock, many times; the total shows mutual exclusion. test_lock fails while held. */
#include "check.h"

#define ROUNDS 200
long lock;       /* a global, as programs keep it */
long counter;

int main(void) {
  shmem_init();
  int me = shmem_my_pe(), n = shmem_n_pes();
  long *heap_lock = shmem_calloc(1, sizeof(long));
  shmem_barrier_all();
  for (int r = 0; r < ROUNDS; r++) {
    shmem_set_lock(&lock);
    long c = shmem_long_g(&counter, 0);
    shmem_long_p(&counter, c + 1, 0);
    shmem_clear_lock(&lock);
  }
  shmem_barrier_all();
  if (me == 0) CHECK(counter == (long)ROUNDS * n, "counter %ld, want %d", counter, ROUNDS * n);
  /* test_lock: PE 0 holds it; the others fail to take it; then they do one by one. */
  if (me == 0) CHECK(shmem_test_lock(heap_lock) == 0, "a free lock was not taken");
  shmem_barrier_all();
  if (me != 0) CHECK(shmem_test_lock(heap_lock) == 1, "a held lock was taken");
  shmem_barrier_all();
  if (me == 0) shmem_clear_lock(heap_lock);
  shmem_barrier_all();
  while (shmem_test_lock(heap_lock) != 0) {
  }
  shmem_clear_lock(heap_lock);
  shmem_barrier_all();
  if (me == 0) printf("lock: %d PEs ok\n", n);
  shmem_finalize();
  return 0;
}
