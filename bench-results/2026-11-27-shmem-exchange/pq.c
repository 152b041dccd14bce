#include <shmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static char buf[1 << 16];
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 2000000;
  shmem_init();
  int me = shmem_my_pe(), n = shmem_n_pes();
  char *r = shmem_malloc(1 << 16);
  char s[64] = {1};
  shmem_barrier_all();
  if (me == 0) {
    double t = now();
    for (int i = 0; i < iters; i++) { shmem_putmem(r, s, 8, n - 1); shmem_quiet(); }
    double a = (now() - t) / iters * 1e9;
    t = now();
    for (int i = 0; i < iters; i++) { shmem_getmem(s, r, 8, n - 1); }
    double b = (now() - t) / iters * 1e9;
    t = now();
    for (int i = 0; i < iters; i++) { shmem_putmem_nbi(r + (i & 63) * 8, s, 8, n - 1); }
    shmem_quiet();
    double c = (now() - t) / iters * 1e9;
    printf("put+quiet %.1f ns, get %.1f ns, put_nbi %.1f ns\n", a, b, c);
  }
  shmem_barrier_all();
  shmem_finalize();
  return 0;
}
