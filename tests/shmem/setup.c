/* Setup, queries and exit (also built as C++). */
#include "check.h"
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
  shmem_free(x);
  shmem_barrier_all();
  if (me == 0) printf("setup: %d PEs ok\n", n);
  shmem_finalize();
  return 0;
}
