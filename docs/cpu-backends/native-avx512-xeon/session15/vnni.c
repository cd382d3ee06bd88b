#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  long N=200000000;
  // clock estimate: dependent integer adds (1 cycle latency each)
  double t0=now(); long x=0;
  for(long i=0;i<N;i++){ __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x)); }
  double t1=now(); double ghz=4.0*N/(t1-t0)/1e9;
  printf("dependent add chain: %.2f GHz (approx clock)\n", ghz);
  __m512i a=_mm512_set1_epi8(1), b=_mm512_set1_epi8(2);
  __m512i c0=_mm512_setzero_si512(),c1=c0,c2=c0,c3=c0,c4=c0,c5=c0,c6=c0,c7=c0,c8=c0,c9=c0,c10=c0,c11=c0;
  long M=50000000; t0=now();
  for(long i=0;i<M;i++){
    c0=_mm512_dpbusd_epi32(c0,a,b);c1=_mm512_dpbusd_epi32(c1,a,b);c2=_mm512_dpbusd_epi32(c2,a,b);c3=_mm512_dpbusd_epi32(c3,a,b);
    c4=_mm512_dpbusd_epi32(c4,a,b);c5=_mm512_dpbusd_epi32(c5,a,b);c6=_mm512_dpbusd_epi32(c6,a,b);c7=_mm512_dpbusd_epi32(c7,a,b);
    c8=_mm512_dpbusd_epi32(c8,a,b);c9=_mm512_dpbusd_epi32(c9,a,b);c10=_mm512_dpbusd_epi32(c10,a,b);c11=_mm512_dpbusd_epi32(c11,a,b);
    __asm__ volatile("" : "+v"(c0),"+v"(c1),"+v"(c2),"+v"(c3),"+v"(c4),"+v"(c5),"+v"(c6),"+v"(c7),"+v"(c8),"+v"(c9),"+v"(c10),"+v"(c11));
  }
  t1=now(); double r=12.0*M/(t1-t0);
  printf("vpdpbusd zmm: %.2f G/s per core = %.2f per cycle at that clock\n", r/1e9, r/1e9/ghz);
  __m256i a2=_mm256_set1_epi8(1), b2=_mm256_set1_epi8(2);
  __m256i d0=_mm256_setzero_si256(),d1=d0,d2=d0,d3=d0,d4=d0,d5=d0,d6=d0,d7=d0,d8=d0,d9=d0,d10=d0,d11=d0;
  t0=now();
  for(long i=0;i<M;i++){
    d0=_mm256_dpbusd_epi32(d0,a2,b2);d1=_mm256_dpbusd_epi32(d1,a2,b2);d2=_mm256_dpbusd_epi32(d2,a2,b2);d3=_mm256_dpbusd_epi32(d3,a2,b2);
    d4=_mm256_dpbusd_epi32(d4,a2,b2);d5=_mm256_dpbusd_epi32(d5,a2,b2);d6=_mm256_dpbusd_epi32(d6,a2,b2);d7=_mm256_dpbusd_epi32(d7,a2,b2);
    d8=_mm256_dpbusd_epi32(d8,a2,b2);d9=_mm256_dpbusd_epi32(d9,a2,b2);d10=_mm256_dpbusd_epi32(d10,a2,b2);d11=_mm256_dpbusd_epi32(d11,a2,b2);
    __asm__ volatile("" : "+v"(d0),"+v"(d1),"+v"(d2),"+v"(d3),"+v"(d4),"+v"(d5),"+v"(d6),"+v"(d7),"+v"(d8),"+v"(d9),"+v"(d10),"+v"(d11));
  }
  t1=now(); r=12.0*M/(t1-t0);
  printf("vpdpbusd ymm: %.2f G/s per core = %.2f per cycle\n", r/1e9, r/1e9/ghz);
  // FMA fp32 zmm for reference
  __m512 f0=_mm512_setzero_ps(),f1=f0,f2=f0,f3=f0,f4=f0,f5=f0,f6=f0,f7=f0,f8=f0,f9=f0,f10=f0,f11=f0; __m512 fa=_mm512_set1_ps(1.0001f);
  t0=now();
  for(long i=0;i<M;i++){
    f0=_mm512_fmadd_ps(f0,fa,fa);f1=_mm512_fmadd_ps(f1,fa,fa);f2=_mm512_fmadd_ps(f2,fa,fa);f3=_mm512_fmadd_ps(f3,fa,fa);
    f4=_mm512_fmadd_ps(f4,fa,fa);f5=_mm512_fmadd_ps(f5,fa,fa);f6=_mm512_fmadd_ps(f6,fa,fa);f7=_mm512_fmadd_ps(f7,fa,fa);
    f8=_mm512_fmadd_ps(f8,fa,fa);f9=_mm512_fmadd_ps(f9,fa,fa);f10=_mm512_fmadd_ps(f10,fa,fa);f11=_mm512_fmadd_ps(f11,fa,fa);
    __asm__ volatile("" : "+v"(f0),"+v"(f1),"+v"(f2),"+v"(f3),"+v"(f4),"+v"(f5),"+v"(f6),"+v"(f7),"+v"(f8),"+v"(f9),"+v"(f10),"+v"(f11));
  }
  t1=now(); r=12.0*M/(t1-t0);
  printf("fma zmm: %.2f G/s per core = %.2f per cycle\n", r/1e9, r/1e9/ghz);
  return 0;
}
