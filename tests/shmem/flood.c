/* Run while a process outside the job holds thousands of idle connections to every rank's
 * libfabric port (see outsider.c): each PE says its port, waits for the flag file named by
 * argv[1] (created once the connections are open), then makes new connections to every PE
 * through atomics and puts, and checks the totals. */
#define _DEFAULT_SOURCE
#include <netinet/in.h>
#include <shmem.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

/* The port of this process's listening TCP socket (the provider's), or -1. */
static int listening_port(void) {
  for (int fd = 0; fd < 4096; fd++) {
    int on = 0;
    socklen_t len = sizeof on;
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) == 0 && on &&
        getsockname(fd, (struct sockaddr *)&a, &alen) == 0 && a.sin_family == AF_INET)
      return ntohs(a.sin_port);
  }
  return -1;
}

static long counter;
static long cells[64];

int main(int argc, char **argv) {
  shmem_init();
  int me = shmem_my_pe(), n = shmem_n_pes();
  printf("flood: PE %d listens on %d\n", me, listening_port());
  fflush(stdout);
  if (argc > 1)
    while (access(argv[1], F_OK) != 0) usleep(10000);
  const int rounds = 20;
  for (int r = 0; r < rounds; r++) {
    for (int pe = 0; pe < n; pe++) {
      shmem_long_atomic_add(&counter, 1, pe);
      shmem_long_p(&cells[me], r + 1, pe);
    }
    shmem_barrier_all();
  }
  if (counter != (long)rounds * n) {
    printf("flood: PE %d counted %ld, not %ld\n", me, counter, (long)rounds * n);
    return 1;
  }
  for (int pe = 0; pe < n; pe++)
    if (cells[pe] != rounds) {
      printf("flood: PE %d read %ld from PE %d\n", me, cells[pe], pe);
      return 1;
    }
  shmem_barrier_all();
  if (me == 0) printf("flood: %d PEs ok\n", n);
  shmem_finalize();
  return 0;
}
