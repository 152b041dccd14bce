#include <shmem.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
int main(void) {
  shmem_init();
  int me = shmem_my_pe();
  char *b = shmem_malloc(1 << 20);
  shmem_barrier_all();
  if (me == 0) {
    double t[8]; t[0] = now();
    shmem_putmem(b, b, 1, 1); t[1] = now();
    shmem_putmem(b + 1, b, 1, 1); t[2] = now();
    shmem_quiet(); t[3] = now();
    shmem_quiet(); t[4] = now();
    for (int i = 0; i < 100; i++) shmem_putmem(b + 64 * i, b, 1, 1);
    t[5] = now();
    for (int i = 0; i < 100; i++) shmem_putmem(b + 8192 + 64 * i, b, 1, 1);
    t[6] = now();
    printf("put1 %.0f put2 %.0f quiet1 %.0f quiet2 %.0f ns; 100 puts to new lines %.0f, again %.0f ns\n", t[1]-t[0], t[2]-t[1], t[3]-t[2], t[4]-t[3], t[5]-t[4], t[6]-t[5]);
  }
  shmem_barrier_all();
  shmem_finalize();
}
