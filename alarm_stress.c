#include <shmem.h>
#include <stdio.h>
#include <signal.h>
#include <sys/time.h>
#include <string.h>
#include <stdlib.h>

#define BIG (8 << 20)               /* 64 MiB of .bss to make the move take a while */
long big[BIG];
long handler_hits;                  /* symmetric, written only by the handler */
long handler_last_slot[1024];       /* symmetric array the handler writes */
static volatile sig_atomic_t ticks;

static void on_alarm(int sig) {
    (void)sig;
    ticks++;
    handler_hits++;
    handler_last_slot[ticks % 1024] = ticks;
}

int main(void) {
    for (long i = 0; i < BIG; i += 512) big[i] = i;    /* touch it before init */
    struct sigaction sa; memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm; sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = { {0, 100}, {0, 100} };   /* every 100 us */
    setitimer(ITIMER_REAL, &it, NULL);
    shmem_init();
    struct itimerval off = {0};
    setitimer(ITIMER_REAL, &off, NULL);
    int me = shmem_my_pe(), n = shmem_n_pes();
    long bad = 0;
    for (long i = 0; i < BIG; i += 512) if (big[i] != i) bad++;
    long t = ticks;
    int ok = handler_hits == t && handler_last_slot[t % 1024] == t && bad == 0;
    shmem_barrier_all();
    long remote_hits = shmem_long_g(&handler_hits, (me + 1) % n);
    printf("PE %d: ticks=%ld handler_hits=%ld slot=%ld big-bad=%ld remote_hits=%ld %s\n", me, t, handler_hits, handler_last_slot[t % 1024], bad, remote_hits, ok ? "OK" : "WRONG");
    shmem_finalize();
    return 0;
}
