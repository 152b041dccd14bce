/* Atomics: every PE updates counters on every PE; 32-bit objects side by side in one word
 * are updated at once by different PEs (a 32-bit operation must not disturb its neighbour);
 * compare-and-swap, swap, set/fetch, bitwise and the deprecated names. */
#include "check.h"

#define ROUNDS 200

int main(void) {
  shmem_init();
  int me = shmem_my_pe(), n = shmem_n_pes();
  int *i32 = shmem_calloc(2 * n, sizeof(int));
  long *i64 = shmem_calloc(n, sizeof(long));
  unsigned int *bits = shmem_calloc(1, sizeof(unsigned int));
  long long *ll = shmem_calloc(1, sizeof(long long));
  double *dbl = shmem_calloc(1, sizeof(double));
  shmem_barrier_all();
  for (int r = 0; r < ROUNDS; r++)
    for (int pe = 0; pe < n; pe++) {
      shmem_int_atomic_add(&i32[me], 1, pe);        /* my slot on every PE */
      shmem_int_atomic_fetch_inc(&i32[n + (r % n)], pe);
      shmem_long_atomic_fetch_add(&i64[0], 2, pe);
      shmem_longlong_fadd(ll, 1, pe);              /* deprecated name */
    }
  shmem_uint_atomic_or(bits, 1u << me, 0);
  shmem_barrier_all();
  for (int pe = 0; pe < n; pe++) CHECK(i32[pe] == ROUNDS, "int slot %d = %d", pe, i32[pe]);
  int sum = 0;
  for (int k = 0; k < n; k++) sum += i32[n + k];
  CHECK(sum == ROUNDS * n, "fetch_inc total %d", sum);
  CHECK(i64[0] == 2L * ROUNDS * n, "long fetch_add total %ld", i64[0]);
  CHECK(*ll == (long long)ROUNDS * n, "longlong fadd total %lld", *ll);
  if (me == 0) CHECK(*bits == (1u << n) - 1, "or: %#x", *bits);
  shmem_barrier_all();
  /* One winner of a compare-and-swap on PE 0. */
  long *cas = shmem_calloc(1, sizeof(long));
  long *won = shmem_calloc(1, sizeof(long));
  long old = shmem_long_atomic_compare_swap(cas, 0, 100 + me, 0);
  long winners = (old == 0);
  shmem_long_atomic_add(won, winners, 0);
  shmem_barrier_all();
  if (me == 0) CHECK(*won == 1, "%ld PEs won one compare-and-swap", *won);
  /* swap, set, fetch (also doubles), xor and and. */
  shmem_barrier_all();
  if (me == 0) {
    CHECK(shmem_int_atomic_swap(&i32[0], 7, n - 1) == ROUNDS, "swap returned the old value");
    shmem_double_atomic_set(dbl, 3.25, n - 1);
    CHECK(shmem_double_atomic_fetch(dbl, n - 1) == 3.25, "double set/fetch");
    CHECK(shmem_int_atomic_fetch(&i32[0], n - 1) == 7, "int fetch after swap");
    shmem_uint_atomic_set(bits, 0xF0F0u, n - 1);
    CHECK(shmem_uint_atomic_fetch_xor(bits, 0xFF00u, n - 1) == 0xF0F0u, "fetch_xor old");
    CHECK(shmem_uint_atomic_fetch_and(bits, 0x0FF0u, n - 1) == 0x0FF0u, "fetch_and old");
    CHECK(shmem_uint_atomic_fetch(bits, n - 1) == 0x0FF0u, "and result");
    int f = 0;
    shmem_int_atomic_fetch_add_nbi(&f, &i32[0], 5, n - 1);
    shmem_quiet();
    CHECK(f == 7, "fetch_add_nbi fetched %d", f);
    CHECK(shmem_int_atomic_fetch(&i32[0], n - 1) == 12, "after fetch_add_nbi");
    /* C11 generic forms. */
    CHECK(shmem_atomic_fetch_add(&i64[0], 1L, n - 1) == shmem_atomic_fetch(&i64[0], n - 1) - 1, "generic");
  }
  shmem_barrier_all();
  if (me == 0) printf("amo: %d PEs ok\n", n);
  shmem_finalize();
  return 0;
}
