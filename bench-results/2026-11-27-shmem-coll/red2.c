#include <shmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static long psync[2][SHMEM_REDUCE_SYNC_SIZE];
static float pwrk[2][1024];
static float src[1024], dst[1024];
static long bsync[2][SHMEM_BCAST_SYNC_SIZE];
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static double med(double *v, int n) { qsort(v, n, sizeof *v, cmp); return v[n / 2] * 1e6; }
int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 20000; int cnt = argc > 2 ? atoi(argv[2]) : 1;
  shmem_init();
  int me = shmem_my_pe(), n = shmem_n_pes();
  for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; i++) psync[0][i] = psync[1][i] = SHMEM_SYNC_VALUE;
  for (int i = 0; i < SHMEM_BCAST_SYNC_SIZE; i++) bsync[0][i] = bsync[1][i] = SHMEM_SYNC_VALUE;
  double *tr = malloc(iters * sizeof(double)), *tb = malloc(iters * sizeof(double)), *tbar = malloc(iters * sizeof(double));
  shmem_barrier_all();
  for (int i = 0; i < iters; i++) {
    double t = now();
    shmem_float_sum_to_all(dst, src, cnt, 0, 0, n, pwrk[i & 1], psync[i & 1]);
    tr[i] = now() - t;
    shmem_barrier_all();
    t = now();
    shmem_broadcast32(dst, src, cnt, 0, 0, 0, n, bsync[i & 1]);
    tb[i] = now() - t;
    shmem_barrier_all();
    t = now();
    shmem_barrier_all();
    tbar[i] = now() - t;
  }
  printf("PE %d: median reduce %.3f us, broadcast %.3f us, barrier %.3f us\n", me, med(tr, iters), med(tb, iters), med(tbar, iters));
  shmem_finalize();
  return 0;
}
