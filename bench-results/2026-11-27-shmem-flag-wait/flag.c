/* A PE waits long on a flag; the other sets it with a plain put after a delay: the time
 * from the put to the wait's return (measured with a clock both see). */
#include <shmem.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
static long flag, stamp;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(void) {
  shmem_init();
  int me = shmem_my_pe();
  double worst = 0, sum = 0;
  for (int r = 1; r <= 20; r++) {
    shmem_barrier_all();
    if (me == 1) {
      usleep(5000);
      double t = now();
      long bits; __builtin_memcpy(&bits, &t, 8);
      shmem_long_p(&stamp, bits, 0);
      shmem_long_p(&flag, r, 0);
      usleep(10000);
    } else {
      shmem_long_wait_until(&flag, SHMEM_CMP_EQ, r);
      double t; long bits = stamp; __builtin_memcpy(&t, &bits, 8);
      double d = now() - t;
      sum += d; if (d > worst) worst = d;
    }
  }
  if (me == 0) printf("flag seen after put: mean %.1f us, worst %.1f us\n", sum / 20 * 1e6, worst * 1e6);
  shmem_finalize();
  return 0;
}
