/* Collectives: the deprecated active-set forms with pSync arrays (globals, as programs keep
 * them) and the team forms; teams: split_strided, split_2d, queries, translate, destroy. */
#include "check.h"
#include <complex.h>

long psync[SHMEM_REDUCE_SYNC_SIZE];
long psync2[SHMEM_REDUCE_SYNC_SIZE];
int pwrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE];
double dwrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE];
int ibuf[64], iout[64 * 8];
long lbuf[64], lout[64 * 8];
double dbuf[4], dout[4];

int main(void) {
  shmem_init();
  int me = shmem_my_pe(), n = shmem_n_pes();
  for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; i++) psync[i] = psync2[i] = SHMEM_SYNC_VALUE;
  shmem_barrier_all();
  /* Barriers on the whole job, then on odd PEs only. */
  for (int r = 0; r < 20; r++) shmem_barrier(0, 0, n, psync);
  if (n >= 2 && me % 2 == 1) shmem_barrier(1, 1, n / 2, psync2);
  shmem_barrier_all();
  for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; i++) CHECK(psync[i] == SHMEM_SYNC_VALUE, "pSync[%d] = %ld after use", i, psync[i]);
  shmem_barrier_all(); /* before anyone uses psync again */
  /* broadcast32 from member 1 (or 0): the root's dest is left alone. */
  int root = n > 1 ? 1 : 0;
  for (int i = 0; i < 64; i++) { ibuf[i] = me * 100 + i; iout[i] = -1; }
  shmem_barrier_all(); /* destinations are written from the moment the root calls */
  shmem_broadcast32(iout, ibuf, 64, root, 0, 0, n, psync);
  for (int i = 0; i < 64; i++) CHECK(me == root ? iout[i] == -1 : iout[i] == root * 100 + i, "broadcast32 [%d] = %d", i, iout[i]);
  /* collect32: PE i gives i + 1 ints. */
  for (int i = 0; i < 64; i++) ibuf[i] = me;
  shmem_collect32(iout, ibuf, me + 1, 0, 0, n, psync2);
  int k = 0;
  for (int pe = 0; pe < n; pe++)
    for (int i = 0; i <= pe; i++, k++) CHECK(iout[k] == pe, "collect32 element %d = %d", k, iout[k]);
  /* fcollect64 and alltoall32. */
  for (int i = 0; i < 64; i++) lbuf[i] = me * 1000 + i;
  shmem_fcollect64(lout, lbuf, 8, 0, 0, n, psync);
  for (int pe = 0; pe < n; pe++)
    for (int i = 0; i < 8; i++) CHECK(lout[pe * 8 + i] == pe * 1000 + i, "fcollect64 [%d][%d]", pe, i);
  for (int j = 0; j < n; j++) ibuf[j] = me * 10 + j;
  shmem_alltoall32(iout, ibuf, 1, 0, 0, n, psync2);
  for (int j = 0; j < n; j++) CHECK(iout[j] == j * 10 + me, "alltoall32 [%d] = %d", j, iout[j]);
  /* Strided all-to-all: element k for member j at source (j*2+k)*3, lands at (me*2+k)*2. */
  long *sa = shmem_calloc(3 * 2 * 8, sizeof(long)), *da = shmem_calloc(2 * 2 * 8, sizeof(long));
  for (int j = 0; j < n; j++)
    for (int k = 0; k < 2; k++) sa[(j * 2 + k) * 3] = me * 100 + j * 10 + k;
  shmem_barrier_all();
  shmem_long_alltoalls(SHMEM_TEAM_WORLD, da, sa, 2, 3, 2);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < 2; k++)
      CHECK(da[(i * 2 + k) * 2] == i * 100 + me * 10 + k, "alltoalls from %d element %d: %ld", i, k, da[(i * 2 + k) * 2]);
  shmem_barrier_all();
  shmem_free(sa);
  shmem_free(da);
  /* Reductions, one in place. */
  for (int i = 0; i < 4; i++) ibuf[i] = me + i;
  shmem_int_sum_to_all(iout, ibuf, 4, 0, 0, n, pwrk, psync);
  for (int i = 0; i < 4; i++) CHECK(iout[i] == n * (n - 1) / 2 + n * i, "int_sum_to_all [%d] = %d", i, iout[i]);
  dbuf[0] = me * 1.5;
  shmem_double_max_to_all(dout, dbuf, 1, 0, 0, n, dwrk, psync2);
  CHECK(dout[0] == (n - 1) * 1.5, "double_max_to_all %f", dout[0]);
  lbuf[0] = ~(1L << me);
  shmem_long_and_to_all(lbuf, lbuf, 1, 0, 0, n, (long *)pwrk, psync);
  CHECK(lbuf[0] == ~((1L << n) - 1), "long_and_to_all in place %lx", lbuf[0]);
  /* Complex: the product of (1 + i·pe) over all PEs, computed here too. */
  double _Complex *cz = shmem_malloc(2 * sizeof(double _Complex));
  cz[0] = 1.0 + 1.0 * me * I;
  double _Complex want_c = 1.0;
  for (int pe = 0; pe < n; pe++) want_c *= 1.0 + 1.0 * pe * I;
  shmem_complexd_prod_reduce(SHMEM_TEAM_WORLD, &cz[1], &cz[0], 1);
  CHECK(cabs(cz[1] - want_c) < 1e-9, "complexd prod (%f, %f)", creal(cz[1]), cimag(cz[1]));
  shmem_barrier_all();
  shmem_sum_reduce(SHMEM_TEAM_WORLD, &cz[1], &cz[0], 1); /* the C11 generic form */
  CHECK(cabs(cz[1] - (n + 1.0 * n * (n - 1) / 2 * I)) < 1e-9, "generic complexd sum (%f, %f)", creal(cz[1]), cimag(cz[1]));
  shmem_barrier_all();
  shmem_free(cz);
#if defined(__x86_64__)
  /* long double: sums that need its 64-bit mantissa (1 + pe·2^-60 loses the small part in a
   * double), in member order as computed here; products, max and min (generic form too). */
  long double *ld = shmem_malloc(8 * sizeof(long double));
  ld[0] = 1.0L + (me + 1) * 0x1p-60L;
  ld[1] = -1.0L - me;
  long double sum = 0, prod = 1;
  for (int pe = 0; pe < n; pe++) {
    long double v = 1.0L + (pe + 1) * 0x1p-60L;
    sum = pe == 0 ? v : sum + v;
    prod = pe == 0 ? v : prod * v;
  }
  shmem_longdouble_sum_reduce(SHMEM_TEAM_WORLD, &ld[2], &ld[0], 1);
  CHECK(ld[2] == sum && ld[2] != (long double)(double)sum, "longdouble sum %La, want %La", ld[2], sum);
  shmem_longdouble_prod_reduce(SHMEM_TEAM_WORLD, &ld[3], &ld[0], 1);
  CHECK(ld[3] == prod, "longdouble prod %La, want %La", ld[3], prod);
  shmem_sum_reduce(SHMEM_TEAM_WORLD, &ld[4], &ld[0], 2);
  CHECK(ld[4] == sum && ld[5] == -(long double)n * (n + 1) / 2, "generic longdouble sum %La %La", ld[4], ld[5]);
  shmem_longdouble_max_reduce(SHMEM_TEAM_WORLD, &ld[6], &ld[0], 2);
  CHECK(ld[6] == 1.0L + n * 0x1p-60L && ld[7] == -1.0L, "longdouble max %La %La", ld[6], ld[7]);
  shmem_longdouble_min_reduce(SHMEM_TEAM_WORLD, &ld[6], &ld[0], 2);
  CHECK(ld[6] == 1.0L + 0x1p-60L && ld[7] == -(long double)n, "longdouble min %La %La", ld[6], ld[7]);
  shmem_barrier_all();
  shmem_free(ld);
#endif
  /* Teams. */
  CHECK(shmem_team_n_pes(SHMEM_TEAM_WORLD) == n && shmem_team_my_pe(SHMEM_TEAM_WORLD) == me, "world");
  CHECK(shmem_team_n_pes(SHMEM_TEAM_SHARED) >= 1, "shared");
  shmem_team_t even = SHMEM_TEAM_INVALID, xt, yt;
  int evens = (n + 1) / 2;
  CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 2, evens, NULL, 0, &even) == 0, "split_strided");
  /* A team of one PE, named with stride 0 and with a negative stride. */
  shmem_team_t last, last2;
  CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, n - 1, 0, 1, NULL, 0, &last) == 0, "split stride 0");
  CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, n - 1, -1, 1, NULL, 0, &last2) == 0, "split stride -1");
  CHECK((me == n - 1) == (last != SHMEM_TEAM_INVALID && last2 != SHMEM_TEAM_INVALID), "one-PE teams");
  /* Sets that make no team: non-zero and SHMEM_TEAM_INVALID on every PE, the job goes on. */
  shmem_team_t none = SHMEM_TEAM_WORLD;
  CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 1, 2, 0, NULL, 0, &none) != 0 && none == SHMEM_TEAM_INVALID, "size 0");
  none = SHMEM_TEAM_WORLD;
  CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, n + 1, NULL, 0, &none) != 0 && none == SHMEM_TEAM_INVALID, "past the parent");
  if (me == n - 1) CHECK(shmem_team_n_pes(last) == 1 && shmem_team_my_pe(last2) == 0, "one-PE team queries");
  if (me == n - 1) {
    shmem_team_destroy(last);
    shmem_team_destroy(last2);
  }
  if (me % 2 == 0) {
    CHECK(even != SHMEM_TEAM_INVALID && shmem_team_n_pes(even) == evens && shmem_team_my_pe(even) == me / 2, "even team");
    CHECK(shmem_team_translate_pe(even, evens - 1, SHMEM_TEAM_WORLD) == 2 * (evens - 1), "translate");
    int *tb = shmem_malloc(8 * sizeof(int)); /* every PE allocates, as the heap requires */
    (void)tb;
    for (int i = 0; i < 8; i++) ibuf[i] = me == 0 ? 77 + i : -1;
    for (int i = 0; i < 8; i++) iout[i] = 0;
    shmem_team_sync(even);
    shmem_int_broadcast(even, iout, ibuf, 8, 0);
    for (int i = 0; i < 8; i++) CHECK(iout[i] == 77 + i, "team broadcast [%d] = %d", i, iout[i]);
    shmem_team_sync(even); /* iout is the next destination */
    ibuf[0] = me;
    shmem_int_fcollect(even, iout, ibuf, 1);
    for (int i = 0; i < evens; i++) CHECK(iout[i] == 2 * i, "team fcollect [%d] = %d", i, iout[i]);
    shmem_int_sum_reduce(even, iout, ibuf, 1);
    CHECK(iout[0] == evens * (evens - 1), "team sum_reduce %d", iout[0]);
    shmem_team_sync(even);
    shmem_free(tb);
    shmem_team_destroy(even);
  } else {
    CHECK(even == SHMEM_TEAM_INVALID, "an odd PE got a team");
    CHECK(shmem_team_translate_pe(SHMEM_TEAM_WORLD, me, SHMEM_TEAM_WORLD) == me, "translate to world");
    int *tb = shmem_malloc(8 * sizeof(int));
    shmem_free(tb);
  }
  shmem_barrier_all();
  CHECK(shmem_team_split_2d(SHMEM_TEAM_WORLD, 2, NULL, 0, &xt, NULL, 0, &yt) == 0, "split_2d");
  CHECK(shmem_team_n_pes(xt) == (me / 2 * 2 + 2 <= n ? 2 : 1), "x team of %d", shmem_team_n_pes(xt));
  CHECK(shmem_team_my_pe(yt) == me / 2 && shmem_team_my_pe(xt) == me % 2, "2d positions");
  lbuf[0] = me;
  shmem_long_sum_reduce(yt, lout, lbuf, 1);
  long want = 0;
  for (int pe = me % 2; pe < n; pe += 2) want += pe;
  CHECK(lout[0] == want, "y-team sum %ld, want %ld", lout[0], want);
  shmem_team_destroy(xt);
  shmem_team_destroy(yt);
  shmem_barrier_all();
  /* Back-to-back team reductions with no synchronization between them, of sizes on both
   * sides of the small-reduction limit, some in place; then back-to-back broadcasts from
   * every root into separate parts of one array. */
  long *rb = shmem_malloc(2 * 256 * sizeof(long));
  static const int counts[] = {1, 3, 7, 14, 29, 60, 200, 2, 1, 256};
  for (int r = 0; r < 40; r++) {
    int c = counts[r % 10];
    for (int i = 0; i < c; i++) rb[i] = (long)me * 1000 + r + i;
    long *out = r % 3 == 0 ? rb : rb + 256;
    shmem_long_sum_reduce(SHMEM_TEAM_WORLD, out, rb, c);
    for (int i = 0; i < c; i++) {
      long want = 1000L * n * (n - 1) / 2 + (long)n * (r + i);
      CHECK(out[i] == want, "round %d: sum[%d] of %d is %ld, want %ld", r, i, c, out[i], want);
    }
  }
  for (int r = 0; r < 4 * n; r++) {
    int root = r % n;
    for (int i = 0; i < 4; i++) rb[i] = me * 100 + r;
    shmem_long_broadcast(SHMEM_TEAM_WORLD, rb + 256 + 4 * (r % 64), rb, 4, root);
  }
  for (int r = 0; r < 4 * n && r < 64; r++)
    CHECK(rb[256 + 4 * r] == (r % n) * 100 + r, "broadcast %d got %ld", r, rb[256 + 4 * r]);
  shmem_barrier_all();
  /* Back-to-back team collects and fcollects, mixed with reductions, with no synchronization
   * between them: lengths that fit a slot of the one-exchange path, and collects where one
   * member's does not (every member then takes the put path). Each routine has its own
   * destination: a member may write another's as soon as it calls. */
  long *cb = shmem_calloc(64 * n + 64, sizeof(long)), *fb = shmem_calloc(20 * n, sizeof(long));
  static long mx;
  for (int r = 0; r < 30; r++) {
    int mine = r % 3 == 0 ? 1 + me : r % 3 == 1 ? (me == n - 1 ? 40 : 2) : 3;
    for (int i = 0; i < 40; i++) rb[i] = me * 1000 + r * 50 + i;
    shmem_long_collect(SHMEM_TEAM_WORLD, cb, rb, mine);
    long at = 0;
    for (int pe = 0; pe < n; pe++) {
      int theirs = r % 3 == 0 ? 1 + pe : r % 3 == 1 ? (pe == n - 1 ? 40 : 2) : 3;
      for (int i = 0; i < theirs; i++, at++)
        CHECK(cb[at] == pe * 1000 + r * 50 + i, "round %d: collect [%ld] = %ld", r, at, cb[at]);
    }
    shmem_long_fcollect(SHMEM_TEAM_WORLD, fb, rb, r % 2 ? 2 : 20);
    for (int pe = 0; pe < n; pe++)
      for (int i = 0; i < (r % 2 ? 2 : 20); i++)
        CHECK(fb[pe * (r % 2 ? 2 : 20) + i] == pe * 1000 + r * 50 + i, "round %d: fcollect [%d][%d]", r, pe, i);
    shmem_long_max_reduce(SHMEM_TEAM_WORLD, &mx, rb, 1);
    CHECK(mx == (n - 1) * 1000 + r * 50, "round %d: max %ld", r, mx);
  }
  /* Large reductions (each member reduces a share of the elements, then reads the others'):
   * an uneven split, in place and not, on a team and with a pSync. */
  {
    enum { CNT = 20011 };
    static long bwrk[CNT / 2 + 1 + SHMEM_REDUCE_MIN_WRKDATA_SIZE];
    long *big = shmem_malloc(2 * CNT * sizeof(long)), *bout = big + CNT;
    for (int r = 0; r < 4; r++) {
      for (int i = 0; i < CNT; i++) big[i] = (long)me * 7 + (long)i * (r + 1);
      long *out = r % 2 ? big : bout;
      shmem_barrier_all(); /* the sources are written before anyone reads them */
      if (r < 2) shmem_long_sum_reduce(SHMEM_TEAM_WORLD, out, big, CNT);
      else shmem_long_sum_to_all(out, big, CNT, 0, 0, n, bwrk, psync);
      for (int i = 0; i < CNT; i++) {
        long want = 7L * n * (n - 1) / 2 + (long)n * i * (r + 1);
        CHECK(out[i] == want, "large reduction %d: [%d] = %ld, want %ld", r, i, out[i], want);
      }
    }
    shmem_barrier_all();
    shmem_free(big);
  }
  /* pSync broadcasts of every small length, alternating two pSync arrays; every pSync word
   * is back at SHMEM_SYNC_VALUE after them. */
  for (int len = 1; len <= 64; len++) {
    for (int i = 0; i < 64; i++) { ibuf[i] = me * 100 + len + i; iout[i] = -1; }
    shmem_barrier_all();
    shmem_broadcast32(iout, ibuf, len, 0, 0, 0, n, len % 2 ? psync : psync2);
    for (int i = 0; i < 64; i++)
      CHECK(me == 0 || i >= len ? iout[i] == -1 : iout[i] == len + i, "broadcast of %d: [%d] = %d", len, i, iout[i]);
    shmem_fcollect32(iout, ibuf, len % 5 + 1, 0, 0, n, len % 2 ? psync2 : psync);
    shmem_int_max_to_all(iout, ibuf, len % 7 + 1, 0, 0, n, pwrk, len % 2 ? psync : psync2);
  }
  shmem_barrier_all();
  for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; i++)
    CHECK(psync[i] == SHMEM_SYNC_VALUE && psync2[i] == SHMEM_SYNC_VALUE, "pSync[%d] = %ld, %ld after use", i, psync[i], psync2[i]);
  /* Team broadcasts back to back with different roots: a member must not take the next
   * root's signal for this one's (it would return before this root's data is all there). */
  {
    const long big = 1 << 20; /* 8 MiB */
    long *bs = shmem_malloc(big * 8), *bd = shmem_malloc(big * 8);
    long *ss = shmem_calloc(8, 8), *sd = shmem_calloc(8, 8);
    for (int it = 0; it < 6; it++) {
      for (long i = 0; i < big; i++) { bs[i] = it * 10000000L + me * 1000000L + i; bd[i] = -1; }
      shmem_barrier_all();
      shmem_long_broadcast(SHMEM_TEAM_WORLD, bd, bs, big, 0);
      for (long i = 0; i < big; i += 4099)
        CHECK(bd[i] == it * 10000000L + i, "broadcast %d from PE 0, right after it returned: [%ld] = %ld", it, i, bd[i]);
      CHECK(bd[big - 1] == it * 10000000L + big - 1, "broadcast %d: last element %ld", it, bd[big - 1]);
      shmem_long_broadcast(SHMEM_TEAM_WORLD, sd, ss, 8, n > 1 ? 1 : 0); /* served first by PE 0 */
      shmem_barrier_all();
    }
    shmem_free(bs);
    shmem_free(bd);
    shmem_free(ss);
    shmem_free(sd);
  }
  shmem_barrier_all();
  shmem_free(cb);
  shmem_free(fb);
  shmem_free(rb);
  if (me == 0) printf("coll: %d PEs ok\n", n);
  shmem_finalize();
  return 0;
}
