#include <shmem.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
int main(void){
  shmem_init(); int me=shmem_my_pe();
  int *x=shmem_malloc(64*sizeof(int));
  int N=200000;
  for(int rep=0;rep<3;rep++){
    shmem_barrier_all();
    double t0=now(); for(int i=0;i<N;i++) shmem_team_sync(SHMEM_TEAM_WORLD);
    double t1=now(); for(int i=0;i<N;i++) shmem_int_sum_reduce(SHMEM_TEAM_WORLD, x+8, x, 1);
    double t2=now(); for(int i=0;i<N;i++) shmem_barrier_all();
    double t3=now();
    if(me==0) printf("sync %.1f reduce %.1f barrier_all %.1f\n",(t1-t0)/N,(t2-t1)/N,(t3-t2)/N);
  }
  shmem_finalize(); return 0;
}
