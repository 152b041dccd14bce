/* Puts and gets: putmem/getmem, typed, sized, p/g, iput/iget, _nbi with quiet, long double,
 * and C11 generic forms, each to the next PE and checked there. */
#include "check.h"
#include <string.h>

#define N 4096

int main(void) {
  shmem_init();
  int me = shmem_my_pe(), n = shmem_n_pes();
  int right = (me + 1) % n, left = (me + n - 1) % n;
  char *bytes = shmem_malloc(N);
  int *ints = shmem_malloc(N * sizeof(int));
  long *longs = shmem_calloc(N, sizeof(long));
  long double *lds = shmem_malloc(8 * sizeof(long double));
  short *shorts = shmem_calloc(2 * N, sizeof(short));
  char src[N];
  int isrc[N];
  for (int i = 0; i < N; i++) { src[i] = (char)(me * 7 + i); isrc[i] = me * 100000 + i; }
  shmem_putmem(bytes, src, N, right);
  shmem_int_put(ints, isrc, N, right);
  shmem_barrier_all();
  for (int i = 0; i < N; i++) {
    CHECK(bytes[i] == (char)(left * 7 + i), "putmem byte %d", i);
    CHECK(ints[i] == left * 100000 + i, "int_put element %d: %d", i, ints[i]);
  }
  /* Gets read the right PE's copy. */
  int got[N];
  shmem_int_get(got, ints, N, right);
  for (int i = 0; i < N; i++) CHECK(got[i] == me * 100000 + i, "int_get element %d", i);
  char gb[N];
  shmem_getmem(gb, bytes, N, right);
  CHECK(memcmp(gb, src, N) == 0, "getmem");
  /* Single elements. */
  shmem_long_p(&longs[me], (long)me + 1, right);
  shmem_barrier_all();
  CHECK(longs[left] == left + 1, "long_p: %ld", longs[left]);
  CHECK(shmem_long_g(&longs[me], right) == me + 1, "long_g");
  /* Strided: every other short, 3 apart at the target. */
  short ss[N];
  for (int i = 0; i < N; i++) ss[i] = (short)(me + i);
  shmem_short_iput(shorts, ss, 3, 2, N / 2, right);
  shmem_barrier_all();
  for (int i = 0; i < N / 2; i++) CHECK(shorts[3 * i] == (short)(left + 2 * i), "iput element %d", i);
  short sg[N / 2];
  shmem_short_iget(sg, shorts, 1, 3, N / 2, me);
  for (int i = 0; i < N / 2; i++) CHECK(sg[i] == (short)(left + 2 * i), "iget element %d", i);
  shmem_barrier_all();
  /* Non-blocking, completed by quiet, then seen after a barrier. */
  for (int i = 0; i < N; i++) isrc[i] = -i - me;
  for (int i = 0; i < N; i += 64) shmem_int_put_nbi(ints + i, isrc + i, 64, right);
  shmem_quiet();
  shmem_barrier_all();
  for (int i = 0; i < N; i++) CHECK(ints[i] == -i - left, "put_nbi element %d", i);
  shmem_int_get_nbi(got, ints, N, right);
  shmem_quiet();
  for (int i = 0; i < N; i++) CHECK(got[i] == -i - me, "get_nbi element %d", i);
  /* Sized and long double. */
  long double ld[8];
  for (int i = 0; i < 8; i++) ld[i] = (long double)me / 3.0L + i;
  shmem_longdouble_put(lds, ld, 8, right);
  uint64_t w = 0x0123456789abcdefULL ^ (uint64_t)me;
  shmem_put64(&longs[N - 1], &w, 1, right);
  shmem_barrier_all();
  for (int i = 0; i < 8; i++) CHECK(lds[i] == (long double)left / 3.0L + i, "longdouble element %d", i);
  CHECK((uint64_t)longs[N - 1] == (0x0123456789abcdefULL ^ (uint64_t)left), "put64");
  CHECK(shmem_longdouble_g(&lds[3], right) == (long double)me / 3.0L + 3, "longdouble_g");
  /* C11 generic forms. */
  double d = 2.5 * me, dd[2];
  double *ds = shmem_malloc(2 * sizeof(double));
  shmem_p(ds, d, right);
  shmem_barrier_all();
  CHECK(ds[0] == 2.5 * left, "generic p");
  CHECK(shmem_g(ds, right) == 2.5 * me, "generic g");
  shmem_barrier_all();
  dd[0] = 1; dd[1] = me;
  shmem_put(ds, dd, 2, right);
  shmem_barrier_all();
  shmem_get(dd, ds, 2, me);
  CHECK(dd[1] == left, "generic put/get");
  shmem_barrier_all();
  if (me == 0) printf("rma: %d PEs ok\n", n);
  shmem_finalize();
  return 0;
}
