#include <shmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define _GNU_SOURCE
#include <sched.h>
extern int sched_getcpu(void);
static long bsync[2][SHMEM_BCAST_SYNC_SIZE];
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
  int iters = 20000;
  shmem_init();
  int me = shmem_my_pe(), n = shmem_n_pes();
  for (int i = 0; i < SHMEM_BCAST_SYNC_SIZE; i++) bsync[0][i] = bsync[1][i] = SHMEM_SYNC_VALUE;
  int *buf = shmem_malloc(4096);
  double *v = malloc(iters * sizeof *v), *w = malloc(iters * sizeof *w);
  shmem_barrier_all();
  for (int i = 0; i < iters; i++) {
    double t = now();
    shmem_broadcast32(buf, buf, 1, 0, 0, 0, n, bsync[i & 1]);
    double u = now();
    shmem_barrier_all();
    v[i] = u - t; w[i] = now() - u;
  }
  double s = 0, sw = 0; for (int i = 0; i < iters; i++) s += v[i], sw += w[i];
  qsort(v, iters, sizeof *v, cmp); qsort(w, iters, sizeof *w, cmp);
  double big = 0; for (int i = 0; i < iters; i++) if (v[i] > 2e-6) big += v[i];
  printf("cpu %d PE %d bcast mean %.3f p10 %.3f p50 %.3f p90 %.3f p99 %.3f (>2us part %.3f) | barrier mean %.3f p50 %.3f\n", sched_getcpu(), me, s / iters * 1e6, v[iters/10]*1e6, v[iters/2]*1e6, v[iters*9/10]*1e6, v[iters*99/100]*1e6, big/iters*1e6, sw/iters*1e6, w[iters/2]*1e6);
  shmem_finalize();
  return 0;
}
