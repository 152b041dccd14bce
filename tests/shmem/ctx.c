/* Communication contexts: private, serialized, shared and NOSTORE contexts on the world and
 * on a team (team-relative PE numbers), one per thread of a multithreaded PE, more than the
 * endpoint pool holds, their quiet, atomics and put-with-signal, the C11 generic forms with a
 * context, and the default context's queries. */
#include "check.h"
#include <pthread.h>

#define THREADS 4
#define PER 64
long data[THREADS * PER]; /* written by the left neighbour's threads */
long total;               /* on PE 0: fetch-adds of every thread of every PE */
uint64_t sig;
long flag[2];

static int me, n;

static void *worker(void *arg) {
  long t = (long)arg;
  shmem_ctx_t ctx;
  long opts = t % 2 ? SHMEM_CTX_PRIVATE : SHMEM_CTX_SERIALIZED;
  CHECK(shmem_ctx_create(opts, &ctx) == 0, "thread %ld: shmem_ctx_create", t);
  int right = (me + 1) % n;
  long src[PER];
  for (int i = 0; i < PER; i++) src[i] = me * 100000L + t * 1000 + i;
  /* Half element by element (shmem_ctx_long_p), half in one put. */
  for (int i = 0; i < PER / 2; i++) shmem_ctx_long_p(ctx, &data[t * PER + i], src[i], right);
  shmem_ctx_long_put_nbi(ctx, &data[t * PER + PER / 2], &src[PER / 2], PER / 2, right);
  shmem_ctx_long_atomic_add(ctx, &total, 1, 0);
  CHECK(shmem_ctx_long_atomic_fetch(ctx, &total, 0) >= 1, "thread %ld: fetch", t);
  shmem_ctx_quiet(ctx);
  /* Read back what this thread wrote, through the same context. */
  long back[PER];
  shmem_ctx_long_get(ctx, back, &data[t * PER], PER, right);
  for (int i = 0; i < PER; i++) CHECK(back[i] == src[i], "thread %ld: element %d is %ld", t, i, back[i]);
  shmem_ctx_destroy(ctx);
  return NULL;
}

int main(void) {
  int provided;
  shmem_init_thread(SHMEM_THREAD_MULTIPLE, &provided);
  CHECK(provided == SHMEM_THREAD_MULTIPLE, "thread level %d", provided);
  me = shmem_my_pe();
  n = shmem_n_pes();
  int left = (me + n - 1) % n;

  /* One context per thread. */
  pthread_t th[THREADS];
  for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void *)t);
  for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
  shmem_barrier_all();
  for (int t = 0; t < THREADS; t++)
    for (int i = 0; i < PER; i++)
      CHECK(data[t * PER + i] == left * 100000L + t * 1000 + i, "data[%d] is %ld", t * PER + i, data[t * PER + i]);
  if (me == 0) CHECK(total == (long)THREADS * n, "total %ld, want %d", total, THREADS * n);

  /* More contexts than the pool has endpoints, with every option; shared ones used by all. */
  shmem_ctx_t many[20];
  long options[4] = {0, SHMEM_CTX_SERIALIZED, SHMEM_CTX_PRIVATE, SHMEM_CTX_NOSTORE};
  for (int i = 0; i < 20; i++) CHECK(shmem_ctx_create(options[i % 4], &many[i]) == 0, "context %d", i);
  for (int i = 0; i < 20; i++) {
    CHECK(many[i] != SHMEM_CTX_INVALID && many[i] != SHMEM_CTX_DEFAULT, "context %d handle", i);
    for (int j = 0; j < i; j++) CHECK(many[i] != many[j], "contexts %d and %d share a handle", i, j);
    shmem_team_t team;
    CHECK(shmem_ctx_get_team(many[i], &team) == 0 && team == SHMEM_TEAM_WORLD, "context %d's team", i);
  }
  long *heap = shmem_calloc(20, sizeof(long));
  shmem_barrier_all();
  for (int i = 0; i < 20; i++) shmem_ctx_long_p(many[i], &heap[i], me + i, (me + 1) % n);
  for (int i = 0; i < 20; i++) shmem_ctx_quiet(many[i]);
  shmem_barrier_all();
  for (int i = 0; i < 20; i++) CHECK(heap[i] == left + i, "heap[%d] is %ld", i, heap[i]);
  for (int i = 0; i < 20; i++) shmem_ctx_destroy(many[i]);
  shmem_ctx_destroy(SHMEM_CTX_INVALID); /* no effect */
  shmem_ctx_t bad = SHMEM_CTX_DEFAULT;
  CHECK(shmem_ctx_create(64, &bad) != 0 && bad == SHMEM_CTX_INVALID, "unknown option bits accepted");

  /* The default context. */
  shmem_team_t team;
  CHECK(shmem_ctx_get_team(SHMEM_CTX_DEFAULT, &team) == 0 && team == SHMEM_TEAM_WORLD, "default's team");
  CHECK(shmem_ctx_get_team(SHMEM_CTX_INVALID, &team) != 0 && team == SHMEM_TEAM_INVALID, "invalid's team");
  shmem_ctx_long_p(SHMEM_CTX_DEFAULT, &flag[0], 7, me);
  shmem_ctx_quiet(SHMEM_CTX_DEFAULT);
  CHECK(flag[0] == 7, "default context put");

  /* A team's context: PE numbers are the team's. Team of the even PEs. */
  shmem_team_t evens;
  shmem_team_config_t cfg = {.num_contexts = 3};
  shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 2, (n + 1) / 2, &cfg, SHMEM_TEAM_NUM_CONTEXTS, &evens);
  if (evens != SHMEM_TEAM_INVALID) {
    shmem_team_config_t got_cfg = {.num_contexts = -1};
    CHECK(shmem_team_get_config(evens, SHMEM_TEAM_NUM_CONTEXTS, &got_cfg) == 0 && got_cfg.num_contexts == 3,
          "num_contexts %d", got_cfg.num_contexts);
    shmem_ctx_t tc;
    CHECK(shmem_team_create_ctx(evens, SHMEM_CTX_PRIVATE, &tc) == 0, "team context");
    shmem_team_t got;
    CHECK(shmem_ctx_get_team(tc, &got) == 0 && got == evens, "team context's team");
    int tme = shmem_team_my_pe(evens), tn = shmem_team_n_pes(evens);
    /* Team PE (tme + 1) % tn is world PE 2 * that. */
    shmem_ctx_long_p(tc, &flag[1], 1000 + me, (tme + 1) % tn);
    shmem_ctx_quiet(tc);
    shmem_team_sync(evens);
    int from = 2 * ((tme + tn - 1) % tn);
    CHECK(flag[1] == 1000 + from, "team context put: flag %ld, want %d", flag[1], 1000 + from);
    /* Put with signal on the team's context, generic forms with a context. */
    long word = 5 + me;
    shmem_put_signal(tc, &flag[0], &word, 1, &sig, 1, SHMEM_SIGNAL_ADD, (tme + 1) % tn);
    shmem_signal_wait_until(&sig, SHMEM_CMP_GE, 1);
    CHECK(flag[0] == 5 + from, "put with signal: %ld, want %d", flag[0], 5 + from);
    long old = shmem_atomic_fetch_add(tc, &total, 0L, 0);
    CHECK(me != 0 || old == total, "generic fetch_add on a context");
    shmem_ctx_destroy(tc);
    /* Team contexts left are destroyed with the team: their slots are free again. */
    for (int r = 0; r < 300; r++) {
      shmem_ctx_t shared;
      CHECK(shmem_team_create_ctx(evens, 0, &shared) == 0, "team context %d", r);
      if (r == 299) break;
      if (r % 100 == 99) {
        shmem_team_t again;
        shmem_team_split_strided(evens, 0, 1, tn, NULL, 0, &again);
        CHECK(again != SHMEM_TEAM_INVALID, "split %d", r);
        shmem_team_destroy(evens);
        evens = again;
      }
    }
    shmem_team_destroy(evens);
  }
  shmem_barrier_all();
  if (me == 0) printf("ctx: %d PEs ok\n", n);
  shmem_finalize();
  return 0;
}
