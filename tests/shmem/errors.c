/* Erroneous calls: each must end the job with a message that names the routine (run by the
 * test with the case as argument; every one of them is a failure of the job). */
#include <shmem.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>

/* threads_not_judged: PE 1's thread A and PE 0's thread B come 2 s late. */
static shmem_team_t twin;
static int my_pe;
static int reduced[2];
static void *thread_a(void *x) {
  if (my_pe == 1) sleep(2);
  shmem_int_sum_reduce(SHMEM_TEAM_WORLD, reduced + 1, reduced, 1);
  return x;
}
static void *thread_b(void *x) {
  if (my_pe == 0) sleep(2);
  shmem_team_sync(twin);
  return x;
}

int main(int argc, char **argv) {
  const char *c = argc > 1 ? argv[1] : "";
  if (strcmp(c, "before_init") == 0) {
    shmem_int_p(NULL, 1, 0);
    return 0;
  }
  int level;
  if (strcmp(c, "threads_not_judged") == 0) shmem_init_thread(SHMEM_THREAD_MULTIPLE, &level);
  else shmem_init();
  int me = shmem_my_pe(), n = shmem_n_pes();
  int *x = shmem_malloc(16 * sizeof(int));
  int local[16] = {0};
  shmem_barrier_all();
  if (strcmp(c, "bad_pe") == 0) shmem_int_p(x, 1, n);
  if (strcmp(c, "negative_pe") == 0) shmem_int_get(local, x, 1, -1);
  if (strcmp(c, "not_symmetric") == 0) shmem_int_put(local, x, 16, (me + 1) % n);
  if (strcmp(c, "past_the_heap") == 0) shmem_putmem((char *)x + 8, local, (size_t)1 << 40, 0);
  if (strcmp(c, "overflow") == 0) shmem_int_put(x, local, SIZE_MAX / 2, 0);
  if (strcmp(c, "misaligned_atomic") == 0) shmem_long_atomic_add((long *)((char *)x + 4), 1, 0);
  if (strcmp(c, "double_free") == 0) { shmem_free(x); shmem_free(x); }
  if (strcmp(c, "mismatched_malloc") == 0) shmem_malloc(me == 0 ? 64 : 128);
  if (strcmp(c, "bad_cmp") == 0) shmem_int_wait_until(x, 42, 0);
  if (strcmp(c, "bad_stride") == 0) shmem_int_iput(x, local, 0, 1, 4, 0);
  if (strcmp(c, "null_source") == 0) shmem_putmem(x, NULL, 8, 0);
  if (strcmp(c, "global_exit_zero") == 0) {
    shmem_putmem(x, NULL, 0, 0); /* nothing to move: fine with NULL */
    if (me == 0) shmem_global_exit(0); /* PE 1 waits in the barrier below */
  }
  if (strcmp(c, "global_exit_seven") == 0 && me == 0) shmem_global_exit(7);
  if (strcmp(c, "last_exits_three") == 0 && me == n - 1) { /* the others: barrier */
    sleep(2);
    exit(3);
  }
  if (strcmp(c, "bad_team") == 0) shmem_team_sync((shmem_team_t)99);
  if (strcmp(c, "negative_strides") == 0) shmem_int_alltoalls(SHMEM_TEAM_WORLD, x, x + 8, -2, -3, 1);
  if (strcmp(c, "clear_unheld") == 0) {
    static long lock;
    shmem_clear_lock(&lock);
  }
  if (strcmp(c, "held_lock") == 0 || strcmp(c, "holder_gone") == 0) {
    static long lock;
    if (me == 0) shmem_set_lock(&lock);
    shmem_barrier_all();
    if (me == 0 && c[0] == 'h' && c[1] == 'o') _exit(0);
    if (me == 0) for (;;) sleep(1);
    shmem_set_lock(&lock);
  }
  if (strcmp(c, "set_twice") == 0) {
    static long lock;
    if (me == 0) {
      shmem_set_lock(&lock);
      shmem_set_lock(&lock);
    }
  }
  if (strcmp(c, "clear_twice") == 0) {
    static long lock;
    if (me == 0) {
      shmem_set_lock(&lock);
      shmem_clear_lock(&lock);
      shmem_clear_lock(&lock);
    }
  }
  static long psync[SHMEM_SYNC_SIZE];
  if (strcmp(c, "bad_active_set") == 0) shmem_barrier(0, 0, n + 1, psync);
  if (strcmp(c, "bad_root") == 0) shmem_broadcast64(x, x, 1, 5, 0, 0, n, psync);
  /* Members whose collective calls differ: in length, in kind, in a pSync broadcast. */
  if (strcmp(c, "mismatched_reduce") == 0) shmem_int_sum_reduce(SHMEM_TEAM_WORLD, x, x + 8, me + 1);
  if (strcmp(c, "mismatched_kind") == 0) {
    if (me == 0) shmem_int_fcollect(SHMEM_TEAM_WORLD, x, x + 8, 1);
    else shmem_int_collect(SHMEM_TEAM_WORLD, x, x + 8, 1);
  }
  if (strcmp(c, "mismatched_type") == 0) {
    if (me == 0) shmem_int_sum_reduce(SHMEM_TEAM_WORLD, x, x + 8, 2);
    else shmem_float_sum_reduce(SHMEM_TEAM_WORLD, (float *)x, (float *)x + 8, 2);
  }
  if (strcmp(c, "uninitialized_psync") == 0) {
    static int pwrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE];
    static long junk[SHMEM_REDUCE_SYNC_SIZE];
    for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; i++) junk[i] = 12345;
    shmem_barrier_all();
    if (me != 0) sleep(1); /* PE 0 reads its slot before anyone writes a head over the junk */
    shmem_int_sum_to_all(x, x + 8, 2, 0, 0, n, pwrk, junk);
  }
  if (strcmp(c, "mismatched_broadcast") == 0) shmem_broadcast32(x, x + 8, me == 0 ? 2 : 4, 0, 0, 0, n, psync);
  /* Calls that take different paths, and so wait on different words: named, not hung. */
  if (strcmp(c, "mismatched_path") == 0) {
    int *big = shmem_calloc(8192, sizeof(int));
    shmem_int_sum_reduce(SHMEM_TEAM_WORLD, big, big + 4096, me == 0 ? 2 : 4000);
  }
  if (strcmp(c, "skipped_collective") == 0) {
    if (me == 0) shmem_int_sum_reduce(SHMEM_TEAM_WORLD, x, x + 8, 2);
    shmem_team_sync(SHMEM_TEAM_WORLD);
  }
  if (strcmp(c, "barrier_all_meets_reduce") == 0) {
    if (me == 0) shmem_barrier_all();
    else shmem_int_sum_reduce(SHMEM_TEAM_WORLD, x, x + 8, 2);
  }
  if (strcmp(c, "team_meets_psync") == 0) {
    static int pwrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE];
    static long rsync[SHMEM_REDUCE_SYNC_SIZE];
    if (me == 0) shmem_int_sum_reduce(SHMEM_TEAM_WORLD, x, x + 8, 2);
    else shmem_int_sum_to_all(x, x + 8, 2, 0, 0, n, pwrk, rsync);
  }
  if (strcmp(c, "skipped_into_finalize") == 0 && me == 0) shmem_int_sum_reduce(SHMEM_TEAM_WORLD, x, x + 8, 2);
  if (strcmp(c, "skipped_barrier_all") == 0 && me == 0) shmem_barrier_all();
  if (strcmp(c, "skipped_into_finalize") == 0 || strcmp(c, "skipped_barrier_all") == 0) {
    shmem_finalize(); /* PE 1 goes straight here */
    return 0;
  }
  if (strcmp(c, "threads_not_judged") == 0) { /* not an error: threads in different teams */
    my_pe = me;
    shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, n, NULL, 0, &twin);
    shmem_barrier_all();
    pthread_t a, b;
    pthread_create(&a, NULL, thread_a, NULL);
    pthread_create(&b, NULL, thread_b, NULL);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    shmem_barrier_all();
    if (me == 0) printf("threads ok\n");
    shmem_finalize();
    return 0;
  }
  if (strcmp(c, "late_member") == 0) { /* not an error: a member that is slow to come */
    if (me == 1) sleep(3);
    x[0] = me + 1;
    shmem_int_sum_reduce(SHMEM_TEAM_WORLD, x + 8, x, 1);
    if (me == 0) sleep(2); /* now PE 1 waits, in the barrier below */
    shmem_barrier_all();
    if (x[8] != 3) shmem_global_exit(2);
    if (me == 0) printf("late member ok\n");
    shmem_finalize();
    return 0;
  }
  if (strcmp(c, "destroyed_ctx") == 0) {
    shmem_ctx_t ctx;
    shmem_ctx_create(SHMEM_CTX_PRIVATE, &ctx);
    shmem_ctx_destroy(ctx);
    shmem_ctx_int_p(ctx, x, 1, 0);
  }
  if (strcmp(c, "forged_ctx") == 0) shmem_ctx_putmem((shmem_ctx_t)0x12345, x, local, 4, 0);
  if (strcmp(c, "ctx_after_team_destroy") == 0) {
    shmem_team_t t;
    shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, n, NULL, 0, &t);
    shmem_ctx_t ctx;
    shmem_team_create_ctx(t, 0, &ctx);
    shmem_team_destroy(t); /* destroys the team's contexts */
    shmem_ctx_putmem(ctx, x, local, 4, 0);
  }
  if (strcmp(c, "pe_outside_ctx_team") == 0) {
    shmem_team_t alone;
    shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, 1, NULL, 0, &alone);
    shmem_ctx_t ctx;
    if (me == 0 && shmem_team_create_ctx(alone, 0, &ctx) == 0) shmem_ctx_int_p(ctx, x, 1, 1);
  }
  if (strcmp(c, "dead_pe_ctx_get") == 0) {
    shmem_ctx_t ctx;
    shmem_ctx_create(SHMEM_CTX_PRIVATE, &ctx);
    shmem_barrier_all();
    if (me == 1) _exit(0);
    sleep(1);
    for (int r = 0; r < 1000; r++) shmem_ctx_int_get(ctx, local, x, 16, 1);
  }
  if (strcmp(c, "dead_pe_ctx_put") == 0) {
    shmem_ctx_t ctx;
    shmem_ctx_create(SHMEM_CTX_PRIVATE, &ctx);
    shmem_barrier_all();
    if (me == 1) _exit(0);
    sleep(1);
    for (int r = 0; r < 1000; r++) shmem_ctx_int_put(ctx, x, local, 16, 1);
    shmem_ctx_quiet(ctx);
  }
  if (strcmp(c, "gone_at_finalize") == 0) { /* PE 1 exits without shmem_finalize */
    shmem_barrier_all();
    if (me == 1) _exit(0);
    shmem_finalize();
    return 0;
  }
  shmem_barrier_all();
  printf("errors: case %s did not fail\n", c);
  shmem_finalize();
  return 0;
}
