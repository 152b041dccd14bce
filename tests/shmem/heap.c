/* The symmetric heap: alignment, calloc, realloc, align, free and reuse, symmetry. */
#include "check.h"
#include <stdint.h>
#include <string.h>

int main(void) {
  shmem_init();
  int me = shmem_my_pe(), n = shmem_n_pes();
  CHECK(shmem_malloc(0) == NULL, "malloc(0) gives NULL");
  char *a = shmem_malloc(1);
  double *b = shmem_malloc(100 * sizeof(double));
  CHECK(((uintptr_t)a % 16) == 0 && ((uintptr_t)b % 16) == 0, "malloc alignment");
  void *c = shmem_align(4096, 10);
  CHECK(((uintptr_t)c % 4096) == 0, "align(4096) gave %p", c);
  /* Alignments above a page hold on every PE (each PE's heap starts where its mapping is
   * aligned to 2 MiB), up to 2 MiB; above, NULL on every PE. */
  for (size_t a = 8192; a <= ((size_t)2 << 20); a *= 4) {
    void *p = shmem_align(a, 100);
    CHECK(p != NULL && ((uintptr_t)p % a) == 0, "align(%zu) gave %p", a, p);
    shmem_free(p);
  }
  CHECK(shmem_align((size_t)64 << 20, 100) == NULL, "align(64 MiB) is above what the heap gives");
  int *z = shmem_calloc(1000, sizeof(int));
  for (int i = 0; i < 1000; i++) CHECK(z[i] == 0, "calloc element %d = %d", i, z[i]);
  for (int i = 0; i < 100; i++) b[i] = me * 1000 + i;
  b = shmem_realloc(b, 100000 * sizeof(double));
  CHECK(b != NULL, "realloc grew to NULL");
  for (int i = 0; i < 100; i++) CHECK(b[i] == me * 1000 + i, "realloc lost element %d", i);
  /* Symmetric: a peer's copy is written at the same address. */
  shmem_double_p(&b[99999], (double)me, (me + 1) % n);
  shmem_barrier_all();
  CHECK(b[99999] == (double)((me + n - 1) % n), "realloc'd object not symmetric: %f", b[99999]);
  /* Free and reallocate in a loop: memory is reused (the heap does not run out). */
  for (int i = 0; i < 1000; i++) {
    void *p = shmem_malloc(1 << 20);
    CHECK(p != NULL, "round %d: the heap ran out", i);
    shmem_free(p);
  }
  void *big = shmem_malloc((size_t)1 << 40);
  CHECK(big == NULL, "a 1 TiB allocation succeeded");
  shmem_free(NULL);
  shmem_free(a);
  shmem_free(b);
  shmem_free(c);
  shmem_free(z);
  if (me == 0) printf("heap: %d PEs ok\n", n);
  shmem_finalize();
  return 0;
}
