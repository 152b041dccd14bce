/* Setup, queries and exit (also built as C++). */
#include "check.h"
#include <stdlib.h>
#include <string.h>

int main(void) {
  int provided = -1;
  CHECK(shmem_init_thread(SHMEM_THREAD_MULTIPLE, &provided) == 0, "init_thread failed");
  CHECK(provided == SHMEM_THREAD_MULTIPLE, "provided %d", provided);
  shmem_init(); /* a second initialization is allowed and does nothing */
  int me = shmem_my_pe(), n = shmem_n_pes();
  CHECK(n >= 1 && me >= 0 && me < n, "pe %d of %d", me, n);
  CHECK(_my_pe() == me && _num_pes() == n, "deprecated queries disagree");
  int q = -1;
  shmem_query_thread(&q);
  CHECK(q == SHMEM_THREAD_MULTIPLE, "query_thread %d", q);
  int major = 0, minor = 0;
  shmem_info_get_version(&major, &minor);
  CHECK(major == SHMEM_MAJOR_VERSION && minor == SHMEM_MINOR_VERSION, "version %d.%d", major, minor);
  char name[SHMEM_MAX_NAME_LEN];
  shmem_info_get_name(name);
  CHECK(strcmp(name, SHMEM_VENDOR_STRING) == 0, "name %s", name);
  for (int pe = 0; pe < n; pe++) CHECK(shmem_pe_accessible(pe), "pe %d not accessible", pe);
  CHECK(!shmem_pe_accessible(n) && !shmem_pe_accessible(-1), "a PE outside the job is accessible");
  long *x = (long *)shmem_malloc(sizeof(long));
  long local = 0;
  CHECK(shmem_addr_accessible(x, (me + 1) % n), "heap object not accessible");
  CHECK(!shmem_addr_accessible(&local, (me + 1) % n), "a stack variable is accessible");
  CHECK(shmem_ptr(x, me) == x, "shmem_ptr to my own object");
  /* Where the fabric maps peers' memory (shared memory), shmem_ptr gives a real load/store
   * address of their copy, for exactly the PEs of SHMEM_TEAM_SHARED. */
  *x = 1000 + me;
  shmem_barrier_all();
  int shared = 0;
  for (int pe = 0; pe < n; pe++) {
    long *p = (long *)shmem_ptr(x, pe);
    if (p != NULL) {
      shared++;
      CHECK(*p == 1000 + pe, "shmem_ptr(x, %d) reads %ld", pe, *p);
      CHECK(shmem_team_translate_pe(SHMEM_TEAM_WORLD, pe, SHMEM_TEAM_SHARED) >= 0, "PE %d mapped, not shared", pe);
    }
  }
  CHECK(shared == shmem_team_n_pes(SHMEM_TEAM_SHARED), "%d PEs mapped, team shared has %d", shared,
        shmem_team_n_pes(SHMEM_TEAM_SHARED));
  const char *fabric = getenv("WEFT_FABRIC");
  if (fabric == NULL || strcmp(fabric, "shm") == 0) CHECK(shared == n, "shared memory maps %d of %d PEs", shared, n);
  static long global_counter;
  long *g = (long *)shmem_ptr(&global_counter, (me + 1) % n);
  if (g != NULL) __atomic_fetch_add(g, 1, __ATOMIC_SEQ_CST); /* a store into a peer's global */
  shmem_barrier_all();
  if (g != NULL) CHECK(global_counter == 1, "store through shmem_ptr to a global: %ld", global_counter);
  shmem_barrier_all();
  shmem_free(x);
  shmem_barrier_all();
  if (me == 0) printf("setup: %d PEs ok\n", n);
  shmem_finalize();
  return 0;
}
