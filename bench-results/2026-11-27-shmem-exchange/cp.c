#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
__attribute__((target("avx2"))) static void avx(char *d, const char *s, size_t n) {
  for (size_t i = 0; i < n; i += 128) {
    __m256i a = _mm256_loadu_si256((const __m256i *)(s + i)), b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
    __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64)), e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
    _mm256_storeu_si256((__m256i *)(d + i), a); _mm256_storeu_si256((__m256i *)(d + i + 32), b);
    _mm256_storeu_si256((__m256i *)(d + i + 64), c); _mm256_storeu_si256((__m256i *)(d + i + 96), e);
  }
}
static void movsb(char *d, const char *s, size_t n) { __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory"); }
int main(void) {
  char *a = aligned_alloc(4096, 8 << 20), *b = aligned_alloc(4096, 8 << 20);
  memset(a, 1, 8 << 20); memset(b, 2, 8 << 20);
  for (size_t s = 4096; s <= (4 << 20); s *= 2) {
    int it = (int)((256 << 20) / s); if (it > 20000) it = 20000;
    double best[3] = {1e9, 1e9, 1e9};
    for (int rep = 0; rep < 5; rep++) {
      double t = now(); for (int i = 0; i < it; i++) { memcpy(b, a, s); __asm__ volatile("" ::: "memory"); } double x = (now() - t) / it; if (x < best[0]) best[0] = x;
      t = now(); for (int i = 0; i < it; i++) { avx(b, a, s); __asm__ volatile("" ::: "memory"); } x = (now() - t) / it; if (x < best[1]) best[1] = x;
      t = now(); for (int i = 0; i < it; i++) { movsb(b, a, s); } x = (now() - t) / it; if (x < best[2]) best[2] = x;
    }
    printf("%8zu memcpy %.3f avx2 %.3f movsb %.3f us  (avx2/memcpy %.2f)\n", s, best[0]*1e6, best[1]*1e6, best[2]*1e6, best[1]/best[0]);
  }
}
