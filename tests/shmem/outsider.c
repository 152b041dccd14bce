/* A process outside the job: opens COUNT idle TCP connections to each port named on the
 * command line (127.0.0.1), says how many it holds, and keeps them until its standard input
 * closes. Usage: outsider COUNT PORT... */
#define _DEFAULT_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  struct rlimit lim;
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  int count = atoi(argv[1]), held = 0;
  for (int p = 2; p < argc; p++) {
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)atoi(argv[p]));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < count; i++) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("outsider");
        return 1;
      }
      held++;
    }
  }
  printf("outsider: holding %d connections\n", held);
  fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  return 0;
}
