#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){ long N=100000000; long x=3; double t0=now();
 for(long i=0;i<N;i++){ __asm__ volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(x)); }
 double t1=now(); printf("imul chain (3-cycle latency): %.2f GHz\n", 4.0*3*N/(t1-t0)/1e9); return 0;}
