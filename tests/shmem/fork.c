/* A child of fork that calls exit() (running the exit handlers it inherited) changes nothing
 * of the job: the job's directory in /dev/shm stays, and the PEs go on. A child's OpenSHMEM
 * call ends the child (status 1) and nothing else. */
#include <shmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The job's directory, from a mapped file of the job (shared memory only); "" if none. */
static void job_dir(char *out, size_t len) {
  out[0] = 0;
  FILE *maps = fopen("/proc/self/maps", "r");
  char line[4096];
  while (maps && fgets(line, sizeof line, maps)) {
    char *p = strstr(line, "/dev/shm/weft-");
    if (!p) continue;
    char *slash = strchr(p + strlen("/dev/shm/"), '/');
    if (!slash || (size_t)(slash - p) >= len) continue;
    memcpy(out, p, (size_t)(slash - p));
    out[slash - p] = 0;
    break;
  }
  if (maps) fclose(maps);
}

int main(void) {
  shmem_init();
  int me = shmem_my_pe(), n = shmem_n_pes();
  int *x = shmem_malloc(sizeof(int));
  *x = -1;
  char dir[512];
  job_dir(dir, sizeof dir);
  shmem_barrier_all();
  pid_t child = fork();
  if (child == 0) exit(0); /* runs the inherited exit handlers */
  int status;
  if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status)) {
    printf("fork: PE %d: the child failed\n", me);
    return 1;
  }
  /* A child that calls OpenSHMEM is refused (its parent's connections are not its own), and
   * the job goes on. */
  child = fork();
  if (child == 0) {
    shmem_int_p(x, 7, (me + 1) % n);
    shmem_quiet();
    _exit(0);
  }
  if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 1) {
    printf("fork: PE %d: a child's OpenSHMEM call was not refused\n", me);
    return 1;
  }
  struct stat st;
  if (dir[0] && stat(dir, &st) != 0) {
    printf("fork: PE %d: the child's exit removed the job's directory %s\n", me, dir);
    return 1;
  }
  shmem_barrier_all();
  shmem_int_p(x, me, (me + 1) % n);
  shmem_barrier_all();
  if (*x != (me + n - 1) % n) {
    printf("fork: PE %d read %d\n", me, *x);
    return 1;
  }
  shmem_barrier_all();
  if (me == 0) printf("fork: %d PEs ok\n", n);
  shmem_finalize();
  return 0;
}
