/* Point-to-point synchronization: a ring of flags with wait_until and test, a ping-pong, and
 * put with signal (set and add). */
#include "check.h"
#include <stdint.h>

#define ROUNDS 100

int main(void) {
  shmem_init();
  int me = shmem_my_pe(), n = shmem_n_pes();
  int right = (me + 1) % n, left = (me + n - 1) % n;
  long *flag = shmem_calloc(1, sizeof(long));
  int *data = shmem_calloc(64, sizeof(int));
  uint64_t *sig = shmem_calloc(2, sizeof(uint64_t));
  /* A token goes round the ring ROUNDS times. */
  for (long r = 1; r <= ROUNDS; r++) {
    if (me == 0) {
      shmem_long_p(flag, r, right);
      shmem_long_wait_until(flag, SHMEM_CMP_EQ, r);
    } else {
      shmem_long_wait_until(flag, SHMEM_CMP_GE, r);
      shmem_long_p(flag, r, right);
    }
  }
  CHECK(*flag == ROUNDS, "flag %ld", *flag);
  shmem_barrier_all();
  CHECK(shmem_long_test(flag, SHMEM_CMP_EQ, ROUNDS) == 1, "test true");
  CHECK(shmem_long_test(flag, SHMEM_CMP_GT, ROUNDS) == 0, "test false");
  /* Put with signal: the data is there when the signal is. */
  int src[64];
  for (int round = 1; round <= ROUNDS; round++) {
    for (int i = 0; i < 64; i++) src[i] = round * 1000 + me * 64 + i;
    shmem_putmem_signal(data, src, sizeof src, &sig[0], (uint64_t)round, SHMEM_SIGNAL_SET, right);
    uint64_t s = shmem_signal_wait_until(&sig[0], SHMEM_CMP_GE, (uint64_t)round);
    CHECK(s >= (uint64_t)round, "signal %llu", (unsigned long long)s);
    for (int i = 0; i < 64; i++) CHECK(data[i] >= round * 1000 + left * 64 + i, "data before signal, round %d", round);
    shmem_barrier_all();
  }
  /* The typed form. */
  shmem_int_put_signal(data, src, 64, &sig[0], 1000, SHMEM_SIGNAL_SET, right);
  shmem_signal_wait_until(&sig[0], SHMEM_CMP_EQ, 1000);
  CHECK(data[63] == src[63] - me * 64 + left * 64, "typed put_signal data %d", data[63]);
  shmem_barrier_all();
  /* Signal add: every PE adds 1 to PE 0's counter. */
  shmem_putmem_signal(data, src, 4, &sig[1], 1, SHMEM_SIGNAL_ADD, 0);
  if (me == 0) {
    shmem_signal_wait_until(&sig[1], SHMEM_CMP_EQ, (uint64_t)n);
    CHECK(shmem_signal_fetch(&sig[1]) == (uint64_t)n, "signal add");
  }
  shmem_barrier_all();
  /* Arrays of flags: every PE sets its own flag on every PE; wait for all, any, some. */
  int *flags = shmem_calloc(n + 1, sizeof(int));
  int status[64] = {0};
  status[n] = 1; /* the extra flag nobody sets is left out */
  shmem_barrier_all();
  for (int pe = 0; pe < n; pe++) shmem_int_p(&flags[me], 1, pe);
  shmem_int_wait_until_all(flags, n + 1, status, SHMEM_CMP_EQ, 1);
  CHECK(shmem_int_test_all(flags, n + 1, status, SHMEM_CMP_EQ, 1) == 1, "test_all");
  CHECK(shmem_int_test_all(flags, n + 1, NULL, SHMEM_CMP_EQ, 1) == 0, "test_all without status");
  size_t idx[64];
  CHECK(shmem_int_wait_until_some(flags, n + 1, idx, NULL, SHMEM_CMP_EQ, 1) == (size_t)n, "some");
  CHECK(shmem_int_wait_until_any(flags, n + 1, NULL, SHMEM_CMP_EQ, 0) == (size_t)n, "any: the unset one");
  int want[64];
  for (int i = 0; i <= n; i++) want[i] = i < n;
  shmem_int_wait_until_all_vector(flags, n + 1, NULL, SHMEM_CMP_EQ, want);
  CHECK(shmem_int_test_any(flags, n + 1, status, SHMEM_CMP_EQ, 5) == SIZE_MAX, "test_any none");
  shmem_barrier_all();
  if (me == 0) printf("sync: %d PEs ok\n", n);
  shmem_finalize();
  return 0;
}
