#include <shmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static long psync[2][SHMEM_REDUCE_SYNC_SIZE];
static long csync[2][SHMEM_COLLECT_SYNC_SIZE];
static float pwrk[2][1024];
static int src[1024], dst[4096];
static long bsync[2][SHMEM_BCAST_SYNC_SIZE];
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static void rep(int me, const char *what, double *v, int n) {
  double s = 0; for (int i = 0; i < n; i++) s += v[i];
  qsort(v, n, sizeof *v, cmp);
  double slow = 0; int ns = 0; for (int i = 0; i < n; i++) if (v[i] > 5e-6) { slow += v[i]; ns++; }
  printf("PE %d %-10s mean %.3f p50 %.3f p90 %.3f p99 %.3f p999 %.2f max %.1f  >5us: %d (%.3f of mean)\n", me, what, s / n * 1e6, v[n/2]*1e6, v[n*9/10]*1e6, v[n*99/100]*1e6, v[n*999/1000]*1e6, v[n-1]*1e6, ns, slow / n * 1e6);
}
int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 20000; int cnt = argc > 2 ? atoi(argv[2]) : 1;
  shmem_init();
  int me = shmem_my_pe(), n = shmem_n_pes();
  for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; i++) psync[0][i] = psync[1][i] = SHMEM_SYNC_VALUE;
  for (int i = 0; i < SHMEM_BCAST_SYNC_SIZE; i++) bsync[0][i] = bsync[1][i] = SHMEM_SYNC_VALUE;
  for (int i = 0; i < SHMEM_COLLECT_SYNC_SIZE; i++) csync[0][i] = csync[1][i] = SHMEM_SYNC_VALUE;
  double *tr = malloc(iters * sizeof(double)), *tb = malloc(iters * sizeof(double)), *tc = malloc(iters * sizeof(double)), *tf = malloc(iters * sizeof(double));
  shmem_barrier_all();
  for (int i = 0; i < iters; i++) {
    double t = now();
    shmem_float_sum_to_all((float*)dst, (float*)src, cnt, 0, 0, n, pwrk[i & 1], psync[i & 1]);
    tr[i] = now() - t;
    shmem_barrier_all();
    t = now();
    shmem_broadcast32(dst, src, cnt, 0, 0, 0, n, bsync[i & 1]);
    tb[i] = now() - t;
    shmem_barrier_all();
    t = now();
    shmem_collect32(dst, src, cnt, 0, 0, n, csync[i & 1]);
    tc[i] = now() - t;
    shmem_barrier_all();
    t = now();
    shmem_fcollect32(dst, src, cnt, 0, 0, n, csync[i & 1]);
    tf[i] = now() - t;
    shmem_barrier_all();
  }
  rep(me, "reduce", tr, iters); rep(me, "broadcast", tb, iters); rep(me, "collect", tc, iters); rep(me, "fcollect", tf, iters);
  shmem_finalize();
  return 0;
}
