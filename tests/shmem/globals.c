/* Symmetric static data: global and static variables, initialized and not, are reachable
 * by every PE (puts, gets, atomics, waits), keep their initial values, and stay usable after
 * shmem_finalize. */
#include "check.h"
#include <sys/wait.h>
#include <unistd.h>

long counter;                           /* .bss */
int table[1024];                        /* .bss */
double initialized[4] = {1.5, 2.5, 3.5, 4.5}; /* .data */
static long flag;                       /* static, .bss */
static char big[3 << 20];               /* several MiB of .bss */

int main(void) {
  shmem_init();
  int me = shmem_my_pe(), n = shmem_n_pes();
  int right = (me + 1) % n, left = (me + n - 1) % n;
  CHECK(initialized[2] == 3.5, "initial value lost: %f", initialized[2]);
  /* Where they are not symmetric, a put to one ends the job saying why. */
  if (!shmem_addr_accessible(&counter, right)) shmem_long_p(&counter, 1, right);
  CHECK(shmem_addr_accessible(&counter, right) && shmem_addr_accessible(big, right), "globals not accessible");
  int src[1024];
  for (int i = 0; i < 1024; i++) src[i] = me * 10000 + i;
  shmem_int_put(table, src, 1024, right);
  shmem_char_p(&big[(3 << 20) - 1], (char)(me + 1), right);
  shmem_long_atomic_add(&counter, me + 1, 0);
  shmem_barrier_all();
  for (int i = 0; i < 1024; i++) CHECK(table[i] == left * 10000 + i, "table[%d] = %d", i, table[i]);
  CHECK(big[(3 << 20) - 1] == (char)(left + 1), "big's last byte %d", big[(3 << 20) - 1]);
  if (me == 0) CHECK(counter == (long)n * (n + 1) / 2, "counter %ld", counter);
  CHECK(shmem_double_g(&initialized[3], right) == 4.5, "get of an initialized global");
  /* A flag in static data, waited on. */
  shmem_barrier_all();
  if (me == 0) {
    for (int pe = 1; pe < n; pe++) shmem_long_p(&flag, 42, pe);
  } else {
    shmem_long_wait_until(&flag, SHMEM_CMP_EQ, 42);
  }
  shmem_barrier_all();
  /* A child of fork gets its own copy of the globals: its writes do not reach the parent. */
  long before = counter;
  pid_t child = fork();
  if (child == 0) {
    counter = -12345;
    initialized[0] = -1;
    _exit(counter == -12345 ? 0 : 3);
  }
  int st = -1;
  CHECK(child > 0 && waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child");
  CHECK(counter == before && initialized[0] == 1.5, "a child's write reached the parent: %ld", counter);
  shmem_barrier_all();
  if (me == 0) printf("globals: %d PEs ok\n", n);
  shmem_finalize();
  /* The variables are still the program's own. */
  counter += 1;
  table[0] = 7;
  CHECK(table[0] == 7 && initialized[0] == 1.5, "globals after finalize");
  return 0;
}
