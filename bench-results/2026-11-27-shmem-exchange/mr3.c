#include <shmem.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/time.h>
static double tod(void) { struct timeval t; gettimeofday(&t, 0); return t.tv_sec * 1e6 + t.tv_usec; }
static double pwrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE];
static long psync[SHMEM_REDUCE_SYNC_SIZE];
static double mr, mr_sum;
int main(int argc, char **argv) {
  int warm = argc > 1 ? atoi(argv[1]) : 1, big = argc > 2 ? atoi(argv[2]) : 1;
  shmem_init();
  int me = shmem_my_pe();
  for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; i++) psync[i] = SHMEM_SYNC_VALUE;
  size_t len = (size_t)(4 << 20) * 50;
  char *b = shmem_malloc(len);
  memset(b, 0, len);
  if (warm && me == 0) for (size_t i = 0; i < len; i += 4 << 20) shmem_putmem(b + i, b + i, 4 << 20, 1);
  shmem_barrier_all();
  if (argc > 3) { shmem_quiet(); }
  if (argc > 4) { shmem_putmem(b, b, 1, 1 - me); }
  for (int size = 1; size <= 8; size *= 2) {
    memset(b, size, big ? len : 1 << 20);
    shmem_barrier_all();
    mr = 0;
    if (me == 0) {
      double t = tod();
      for (int i = 0, off = 0; i < 500; i++, off += size) shmem_putmem(b + off, b + off, size, 1);
      shmem_quiet();
      double d = tod() - t;
      mr = 500 / d;
    }
    shmem_double_sum_to_all(&mr_sum, &mr, 1, 0, 0, 2, pwrk, psync);
    if (me == 0) printf("%d:%.1f ", size, mr_sum);
  }
  if (me == 0) printf("\n");
  shmem_finalize();
}
