/* Signal handlers that store to program variables while shmem_init moves the program's data
 * into shared memory lose nothing: a timer fires every 50 us during init, and its handler
 * counts in a global (moved) and in malloc'd memory (not moved); the two must agree. The
 * large array makes the copy take milliseconds, so many signals come while it runs. */
#define _DEFAULT_SOURCE
#include <shmem.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

static char big[32 << 20];
static volatile long hits;
static volatile long *shadow;

static void on_alarm(int sig) {
  (void)sig;
  hits++;
  (*shadow)++;
}

int main(void) {
  shadow = malloc(sizeof *shadow);
  *shadow = 0;
  memset(big, 1, 4096);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGALRM, &sa, NULL);
  struct itimerval every = {{0, 50}, {0, 50}}, off;
  memset(&off, 0, sizeof off);
  setitimer(ITIMER_REAL, &every, NULL);
  shmem_init();
  setitimer(ITIMER_REAL, &off, NULL);
  int me = shmem_my_pe(), n = shmem_n_pes();
  long counted = hits, seen = *shadow;
  if (counted != seen || big[0] != 1) {
    printf("signals: PE %d lost %ld of %ld stores (big[0] = %d)\n", me, seen - counted, seen, big[0]);
    return 1;
  }
  /* The variable is symmetric now: PE 0 reads every PE's count. */
  shmem_barrier_all();
  if (me == 0) {
    for (int pe = 0; pe < n; pe++) {
      long c = shmem_long_g((long *)&hits, pe);
      if (c <= 0) {
        printf("signals: PE %d's count reads %ld\n", pe, c);
        return 1;
      }
    }
    printf("signals: %d PEs ok (%ld signals on PE 0)\n", n, counted);
  }
  shmem_finalize();
  return 0;
}
