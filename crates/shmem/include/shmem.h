/*
 * shmem.h: OpenSHMEM 1.5 for C and C++ on weft (libweft_shmem).
 *
 * Written from the OpenSHMEM 1.5 specification. Build programs with `weft cc` (or
 * `weft c++`) and start them with `weft run -n N ./prog`, `mpirun` or `srun`.
 */
#ifndef WEFT_SHMEM_H
#define WEFT_SHMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Library constants. */
#define SHMEM_MAJOR_VERSION 1
#define SHMEM_MINOR_VERSION 5
#define _SHMEM_MAJOR_VERSION SHMEM_MAJOR_VERSION
#define _SHMEM_MINOR_VERSION SHMEM_MINOR_VERSION
#define SHMEM_MAX_NAME_LEN 256
#define _SHMEM_MAX_NAME_LEN SHMEM_MAX_NAME_LEN
#define SHMEM_VENDOR_STRING "weft"
#define _SHMEM_VENDOR_STRING SHMEM_VENDOR_STRING

#define SHMEM_THREAD_SINGLE 0
#define SHMEM_THREAD_FUNNELED 1
#define SHMEM_THREAD_SERIALIZED 2
#define SHMEM_THREAD_MULTIPLE 3

#define SHMEM_CMP_EQ 0
#define SHMEM_CMP_NE 1
#define SHMEM_CMP_GT 2
#define SHMEM_CMP_GE 3
#define SHMEM_CMP_LT 4
#define SHMEM_CMP_LE 5
#define _SHMEM_CMP_EQ SHMEM_CMP_EQ
#define _SHMEM_CMP_NE SHMEM_CMP_NE
#define _SHMEM_CMP_GT SHMEM_CMP_GT
#define _SHMEM_CMP_GE SHMEM_CMP_GE
#define _SHMEM_CMP_LT SHMEM_CMP_LT
#define _SHMEM_CMP_LE SHMEM_CMP_LE

#define SHMEM_SIGNAL_SET 0
#define SHMEM_SIGNAL_ADD 1

#define SHMEM_MALLOC_ATOMICS_REMOTE 1L
#define SHMEM_MALLOC_SIGNAL_REMOTE 2L

/* Work arrays of the deprecated active-set collectives (sizes in longs). */
#define SHMEM_SYNC_VALUE 0L
#define SHMEM_SYNC_SIZE 64
#define SHMEM_BARRIER_SYNC_SIZE SHMEM_SYNC_SIZE
#define SHMEM_BCAST_SYNC_SIZE SHMEM_SYNC_SIZE
#define SHMEM_COLLECT_SYNC_SIZE SHMEM_SYNC_SIZE
#define SHMEM_REDUCE_SYNC_SIZE SHMEM_SYNC_SIZE
#define SHMEM_ALLTOALL_SYNC_SIZE SHMEM_SYNC_SIZE
#define SHMEM_ALLTOALLS_SYNC_SIZE SHMEM_SYNC_SIZE
#define SHMEM_REDUCE_MIN_WRKDATA_SIZE 1
#define _SHMEM_SYNC_VALUE SHMEM_SYNC_VALUE
#define _SHMEM_SYNC_SIZE SHMEM_SYNC_SIZE
#define _SHMEM_BARRIER_SYNC_SIZE SHMEM_BARRIER_SYNC_SIZE
#define _SHMEM_BCAST_SYNC_SIZE SHMEM_BCAST_SYNC_SIZE
#define _SHMEM_COLLECT_SYNC_SIZE SHMEM_COLLECT_SYNC_SIZE
#define _SHMEM_REDUCE_SYNC_SIZE SHMEM_REDUCE_SYNC_SIZE
#define _SHMEM_REDUCE_MIN_WRKDATA_SIZE SHMEM_REDUCE_MIN_WRKDATA_SIZE

/* Teams and communication contexts. A handle is an opaque value weft checks (never a pointer
 * it follows). */
typedef struct weft_shmem_team *shmem_team_t;
typedef struct weft_shmem_ctx *shmem_ctx_t;
/* The handle constants (C++ spells the casts its own way, for -Wold-style-cast). */
#ifdef __cplusplus
#define WEFT_SHMEM_HANDLE(T, V) (reinterpret_cast<T>(static_cast<uintptr_t>(V)))
#else
#define WEFT_SHMEM_HANDLE(T, V) ((T)(V))
#endif
#define SHMEM_TEAM_INVALID WEFT_SHMEM_HANDLE(shmem_team_t, 0)
#define SHMEM_TEAM_WORLD WEFT_SHMEM_HANDLE(shmem_team_t, 1)
#define SHMEM_TEAM_SHARED WEFT_SHMEM_HANDLE(shmem_team_t, 2)
#define SHMEM_CTX_INVALID WEFT_SHMEM_HANDLE(shmem_ctx_t, 0)
#define SHMEM_CTX_DEFAULT WEFT_SHMEM_HANDLE(shmem_ctx_t, 1)
#define SHMEM_CTX_SERIALIZED 1L
#define SHMEM_CTX_PRIVATE 2L
#define SHMEM_CTX_NOSTORE 4L

/* The parameter lists of a routine's two forms: `shmem_NAME(...)` and
 * `shmem_ctx_NAME(shmem_ctx_t ctx, ...)`. */
#define WEFT_SHMEM_NOCTX()
#define WEFT_SHMEM_CTX() shmem_ctx_t ctx,

/* Setup, exit and query. */
void shmem_init(void);
int shmem_init_thread(int requested, int *provided);
void shmem_query_thread(int *provided);
void shmem_finalize(void);
void shmem_global_exit(int status);
int shmem_my_pe(void);
int shmem_n_pes(void);
int shmem_pe_accessible(int pe);
int shmem_addr_accessible(const void *addr, int pe);
void *shmem_ptr(const void *dest, int pe);
void shmem_info_get_version(int *major, int *minor);
void shmem_info_get_name(char *name);
void start_pes(int npes);
int _my_pe(void);
int _num_pes(void);

/* The symmetric heap. */
void *shmem_malloc(size_t size);
void *shmem_malloc_with_hints(size_t size, long hints);
void *shmem_calloc(size_t count, size_t size);
void *shmem_realloc(void *ptr, size_t size);
void *shmem_align(size_t alignment, size_t size);
void shmem_free(void *ptr);
/* OpenSHMEM 1.0's names (deprecated). */
void *shmalloc(size_t size);
void shfree(void *ptr);
void *shmemalign(size_t alignment, size_t size);
void *shrealloc(void *ptr, size_t size);

/* RMA: the standard types (Table 5; long double below). */
#define WEFT_SHMEM_RMA_TYPES(X) \
  X(float, float) X(double, double) X(char, char) X(schar, signed char) X(short, short) \
  X(int, int) X(long, long) X(longlong, long long) X(uchar, unsigned char) \
  X(ushort, unsigned short) X(uint, unsigned int) X(ulong, unsigned long) \
  X(ulonglong, unsigned long long) X(int8, int8_t) X(int16, int16_t) X(int32, int32_t) \
  X(int64, int64_t) X(uint8, uint8_t) X(uint16, uint16_t) X(uint32, uint32_t) \
  X(uint64, uint64_t) X(size, size_t) X(ptrdiff, ptrdiff_t)

#define WEFT_SHMEM_DECL_RMA_(P, C, N, T) \
  void P##N##_put(C() T *dest, const T *source, size_t nelems, int pe); \
  void P##N##_get(C() T *dest, const T *source, size_t nelems, int pe); \
  void P##N##_put_nbi(C() T *dest, const T *source, size_t nelems, int pe); \
  void P##N##_get_nbi(C() T *dest, const T *source, size_t nelems, int pe); \
  void P##N##_p(C() T *dest, T value, int pe); \
  T P##N##_g(C() const T *source, int pe); \
  void P##N##_iput(C() T *dest, const T *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, int pe); \
  void P##N##_iget(C() T *dest, const T *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, int pe);
#define WEFT_SHMEM_DECL_RMA(N, T) \
  WEFT_SHMEM_DECL_RMA_(shmem_, WEFT_SHMEM_NOCTX, N, T) WEFT_SHMEM_DECL_RMA_(shmem_ctx_, WEFT_SHMEM_CTX, N, T)
WEFT_SHMEM_RMA_TYPES(WEFT_SHMEM_DECL_RMA)

#define WEFT_SHMEM_DECL_SIZED_(P, C, S) \
  void P##put##S(C() void *dest, const void *source, size_t nelems, int pe); \
  void P##get##S(C() void *dest, const void *source, size_t nelems, int pe); \
  void P##put##S##_nbi(C() void *dest, const void *source, size_t nelems, int pe); \
  void P##get##S##_nbi(C() void *dest, const void *source, size_t nelems, int pe); \
  void P##iput##S(C() void *dest, const void *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, int pe); \
  void P##iget##S(C() void *dest, const void *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, int pe);
#define WEFT_SHMEM_DECL_SIZED(S) WEFT_SHMEM_DECL_SIZED_(shmem_, WEFT_SHMEM_NOCTX, S) WEFT_SHMEM_DECL_SIZED_(shmem_ctx_, WEFT_SHMEM_CTX, S)
WEFT_SHMEM_DECL_SIZED(8)
WEFT_SHMEM_DECL_SIZED(16)
WEFT_SHMEM_DECL_SIZED(32)
WEFT_SHMEM_DECL_SIZED(64)
WEFT_SHMEM_DECL_SIZED(128)

#define WEFT_SHMEM_DECL_MEM(P, C) \
  void P##putmem(C() void *dest, const void *source, size_t nelems, int pe); \
  void P##getmem(C() void *dest, const void *source, size_t nelems, int pe); \
  void P##putmem_nbi(C() void *dest, const void *source, size_t nelems, int pe); \
  void P##getmem_nbi(C() void *dest, const void *source, size_t nelems, int pe);
WEFT_SHMEM_DECL_MEM(shmem_, WEFT_SHMEM_NOCTX)
WEFT_SHMEM_DECL_MEM(shmem_ctx_, WEFT_SHMEM_CTX)

/* long double: over the sized routines of its size (16 bytes on LP64 targets; 8 with
 * -mlong-double-64). The library's own long double routines (put_signal, team collectives,
 * reductions) take 16 bytes, and reductions the x87 format: declared only where they match. */
#if __SIZEOF_LONG_DOUBLE__ == 16
#define WEFT_SHMEM_LD_BITS 128
#define WEFT_SHMEM_GL_LD16(X, P, OP) X(P, OP, longdouble, long double)
#elif __SIZEOF_LONG_DOUBLE__ == 8
#define WEFT_SHMEM_LD_BITS 64
#define WEFT_SHMEM_GL_LD16(X, P, OP)
#else
#error "weft's shmem.h supports long double of 8 or 16 bytes"
#endif
#define WEFT_SHMEM_CAT_(a, b, c, d) a##b##c##d
#define WEFT_SHMEM_CAT(a, b, c, d) WEFT_SHMEM_CAT_(a, b, c, d)
#define WEFT_SHMEM_LD(P, OP, NBI) WEFT_SHMEM_CAT(P, OP, WEFT_SHMEM_LD_BITS, NBI)
#define WEFT_SHMEM_LONGDOUBLE_RMA(P, C, X) \
  static inline void P##longdouble_put(C() long double *d, const long double *s, size_t n, int pe) { WEFT_SHMEM_LD(P, put, )(X d, s, n, pe); } \
  static inline void P##longdouble_get(C() long double *d, const long double *s, size_t n, int pe) { WEFT_SHMEM_LD(P, get, )(X d, s, n, pe); } \
  static inline void P##longdouble_put_nbi(C() long double *d, const long double *s, size_t n, int pe) { WEFT_SHMEM_LD(P, put, _nbi)(X d, s, n, pe); } \
  static inline void P##longdouble_get_nbi(C() long double *d, const long double *s, size_t n, int pe) { WEFT_SHMEM_LD(P, get, _nbi)(X d, s, n, pe); } \
  static inline void P##longdouble_p(C() long double *d, long double v, int pe) { WEFT_SHMEM_LD(P, put, )(X d, &v, 1, pe); } \
  static inline long double P##longdouble_g(C() const long double *s, int pe) { long double v; WEFT_SHMEM_LD(P, get, )(X &v, s, 1, pe); return v; } \
  static inline void P##longdouble_iput(C() long double *d, const long double *s, ptrdiff_t dst, ptrdiff_t sst, size_t n, int pe) { WEFT_SHMEM_LD(P, iput, )(X d, s, dst, sst, n, pe); } \
  static inline void P##longdouble_iget(C() long double *d, const long double *s, ptrdiff_t dst, ptrdiff_t sst, size_t n, int pe) { WEFT_SHMEM_LD(P, iget, )(X d, s, dst, sst, n, pe); }
#define WEFT_SHMEM_CTX_ARG ctx,
WEFT_SHMEM_LONGDOUBLE_RMA(shmem_, WEFT_SHMEM_NOCTX, )
WEFT_SHMEM_LONGDOUBLE_RMA(shmem_ctx_, WEFT_SHMEM_CTX, WEFT_SHMEM_CTX_ARG)

/* Atomic memory operations (Tables 6 and 7). */
#define WEFT_SHMEM_EXT_AMO_TYPES(X) X(float, float) X(double, double)
#define WEFT_SHMEM_STD_AMO_TYPES(X) \
  X(int, int) X(long, long) X(longlong, long long) X(size, size_t) X(ptrdiff, ptrdiff_t)
#define WEFT_SHMEM_BIT_AMO_TYPES(X) \
  X(uint, unsigned int) X(ulong, unsigned long) X(ulonglong, unsigned long long) \
  X(int32, int32_t) X(int64, int64_t) X(uint32, uint32_t) X(uint64, uint64_t)

#define WEFT_SHMEM_DECL_EXT_AMO_(P, C, N, T) \
  T P##N##_atomic_fetch(C() const T *source, int pe); \
  void P##N##_atomic_set(C() T *dest, T value, int pe); \
  T P##N##_atomic_swap(C() T *dest, T value, int pe); \
  void P##N##_atomic_fetch_nbi(C() T *fetch, const T *source, int pe); \
  void P##N##_atomic_swap_nbi(C() T *fetch, T *dest, T value, int pe);
#define WEFT_SHMEM_DECL_STD_AMO_(P, C, N, T) \
  WEFT_SHMEM_DECL_EXT_AMO_(P, C, N, T) \
  T P##N##_atomic_compare_swap(C() T *dest, T cond, T value, int pe); \
  T P##N##_atomic_fetch_inc(C() T *dest, int pe); \
  void P##N##_atomic_inc(C() T *dest, int pe); \
  T P##N##_atomic_fetch_add(C() T *dest, T value, int pe); \
  void P##N##_atomic_add(C() T *dest, T value, int pe); \
  void P##N##_atomic_compare_swap_nbi(C() T *fetch, T *dest, T cond, T value, int pe); \
  void P##N##_atomic_fetch_inc_nbi(C() T *fetch, T *dest, int pe); \
  void P##N##_atomic_fetch_add_nbi(C() T *fetch, T *dest, T value, int pe);
#define WEFT_SHMEM_DECL_BIT_AMO_(P, C, N, T) \
  WEFT_SHMEM_DECL_STD_AMO_(P, C, N, T) \
  T P##N##_atomic_fetch_and(C() T *dest, T value, int pe); \
  void P##N##_atomic_and(C() T *dest, T value, int pe); \
  void P##N##_atomic_fetch_and_nbi(C() T *fetch, T *dest, T value, int pe); \
  T P##N##_atomic_fetch_or(C() T *dest, T value, int pe); \
  void P##N##_atomic_or(C() T *dest, T value, int pe); \
  void P##N##_atomic_fetch_or_nbi(C() T *fetch, T *dest, T value, int pe); \
  T P##N##_atomic_fetch_xor(C() T *dest, T value, int pe); \
  void P##N##_atomic_xor(C() T *dest, T value, int pe); \
  void P##N##_atomic_fetch_xor_nbi(C() T *fetch, T *dest, T value, int pe);
/* The deprecated names (no context forms). */
#define WEFT_SHMEM_DECL_OLD_EXT_AMO(N, T) \
  T shmem_##N##_fetch(const T *source, int pe); \
  void shmem_##N##_set(T *dest, T value, int pe); \
  T shmem_##N##_swap(T *dest, T value, int pe);
#define WEFT_SHMEM_DECL_OLD_STD_AMO(N, T) \
  WEFT_SHMEM_DECL_OLD_EXT_AMO(N, T) \
  T shmem_##N##_cswap(T *dest, T cond, T value, int pe); \
  T shmem_##N##_finc(T *dest, int pe); \
  void shmem_##N##_inc(T *dest, int pe); \
  T shmem_##N##_fadd(T *dest, T value, int pe); \
  void shmem_##N##_add(T *dest, T value, int pe);
#define WEFT_SHMEM_DECL_EXT_AMO(N, T) WEFT_SHMEM_DECL_EXT_AMO_(shmem_, WEFT_SHMEM_NOCTX, N, T) \
  WEFT_SHMEM_DECL_EXT_AMO_(shmem_ctx_, WEFT_SHMEM_CTX, N, T) WEFT_SHMEM_DECL_OLD_EXT_AMO(N, T)
#define WEFT_SHMEM_DECL_STD_AMO(N, T) WEFT_SHMEM_DECL_STD_AMO_(shmem_, WEFT_SHMEM_NOCTX, N, T) \
  WEFT_SHMEM_DECL_STD_AMO_(shmem_ctx_, WEFT_SHMEM_CTX, N, T) WEFT_SHMEM_DECL_OLD_STD_AMO(N, T)
#define WEFT_SHMEM_DECL_BIT_AMO(N, T) WEFT_SHMEM_DECL_BIT_AMO_(shmem_, WEFT_SHMEM_NOCTX, N, T) \
  WEFT_SHMEM_DECL_BIT_AMO_(shmem_ctx_, WEFT_SHMEM_CTX, N, T) WEFT_SHMEM_DECL_OLD_STD_AMO(N, T)
WEFT_SHMEM_EXT_AMO_TYPES(WEFT_SHMEM_DECL_EXT_AMO)
WEFT_SHMEM_STD_AMO_TYPES(WEFT_SHMEM_DECL_STD_AMO)
WEFT_SHMEM_BIT_AMO_TYPES(WEFT_SHMEM_DECL_BIT_AMO)

/* Signals. */
#define WEFT_SHMEM_DECL_PUT_SIGNAL_(P, C, NAME, T) \
  void P##NAME##_signal(C() T *dest, const T *source, size_t nelems, uint64_t *sig_addr, uint64_t signal, \
                        int sig_op, int pe); \
  void P##NAME##_signal_nbi(C() T *dest, const T *source, size_t nelems, uint64_t *sig_addr, uint64_t signal, \
                            int sig_op, int pe);
#define WEFT_SHMEM_DECL_PUT_SIGNAL(N, T) WEFT_SHMEM_DECL_PUT_SIGNAL_(shmem_, WEFT_SHMEM_NOCTX, N##_put, T) \
  WEFT_SHMEM_DECL_PUT_SIGNAL_(shmem_ctx_, WEFT_SHMEM_CTX, N##_put, T)
WEFT_SHMEM_RMA_TYPES(WEFT_SHMEM_DECL_PUT_SIGNAL)
#if __SIZEOF_LONG_DOUBLE__ == 16
WEFT_SHMEM_DECL_PUT_SIGNAL(longdouble, long double)
#endif
#define WEFT_SHMEM_DECL_PUT_SIGNAL_SIZED(S) WEFT_SHMEM_DECL_PUT_SIGNAL_(shmem_, WEFT_SHMEM_NOCTX, put##S, void) \
  WEFT_SHMEM_DECL_PUT_SIGNAL_(shmem_ctx_, WEFT_SHMEM_CTX, put##S, void)
WEFT_SHMEM_DECL_PUT_SIGNAL_SIZED(mem)
WEFT_SHMEM_DECL_PUT_SIGNAL_SIZED(8)
WEFT_SHMEM_DECL_PUT_SIGNAL_SIZED(16)
WEFT_SHMEM_DECL_PUT_SIGNAL_SIZED(32)
WEFT_SHMEM_DECL_PUT_SIGNAL_SIZED(64)
WEFT_SHMEM_DECL_PUT_SIGNAL_SIZED(128)
uint64_t shmem_signal_fetch(const uint64_t *sig_addr);
uint64_t shmem_signal_wait_until(uint64_t *sig_addr, int cmp, uint64_t cmp_value);

/* Ordering, barriers and point-to-point synchronization (Table 11). */
void shmem_quiet(void);
void shmem_fence(void);
void shmem_barrier_all(void);
void shmem_sync_all(void);

#define WEFT_SHMEM_P2P_TYPES(X) \
  X(int, int) X(long, long) X(longlong, long long) X(uint, unsigned int) X(ulong, unsigned long) \
  X(ulonglong, unsigned long long) X(int32, int32_t) X(int64, int64_t) X(uint32, uint32_t) \
  X(uint64, uint64_t) X(size, size_t) X(ptrdiff, ptrdiff_t)
#define WEFT_SHMEM_DECL_P2P(N, T) \
  void shmem_##N##_wait_until(T *ivar, int cmp, T cmp_value); \
  void shmem_##N##_wait(T *ivar, T cmp_value); \
  int shmem_##N##_test(T *ivar, int cmp, T cmp_value);
WEFT_SHMEM_P2P_TYPES(WEFT_SHMEM_DECL_P2P)
#define WEFT_SHMEM_DECL_P2P_ARRAYS(N, T) \
  void shmem_##N##_wait_until_all(T *ivars, size_t nelems, const int *status, int cmp, T cmp_value); \
  size_t shmem_##N##_wait_until_any(T *ivars, size_t nelems, const int *status, int cmp, T cmp_value); \
  size_t shmem_##N##_wait_until_some(T *ivars, size_t nelems, size_t *indices, const int *status, int cmp, \
                                     T cmp_value); \
  void shmem_##N##_wait_until_all_vector(T *ivars, size_t nelems, const int *status, int cmp, \
                                         T *cmp_values); \
  size_t shmem_##N##_wait_until_any_vector(T *ivars, size_t nelems, const int *status, int cmp, \
                                           T *cmp_values); \
  size_t shmem_##N##_wait_until_some_vector(T *ivars, size_t nelems, size_t *indices, const int *status, \
                                            int cmp, T *cmp_values); \
  int shmem_##N##_test_all(T *ivars, size_t nelems, const int *status, int cmp, T cmp_value); \
  size_t shmem_##N##_test_any(T *ivars, size_t nelems, const int *status, int cmp, T cmp_value); \
  size_t shmem_##N##_test_some(T *ivars, size_t nelems, size_t *indices, const int *status, int cmp, \
                               T cmp_value); \
  int shmem_##N##_test_all_vector(T *ivars, size_t nelems, const int *status, int cmp, T *cmp_values); \
  size_t shmem_##N##_test_any_vector(T *ivars, size_t nelems, const int *status, int cmp, T *cmp_values); \
  size_t shmem_##N##_test_some_vector(T *ivars, size_t nelems, size_t *indices, const int *status, int cmp, \
                                      T *cmp_values);
WEFT_SHMEM_P2P_TYPES(WEFT_SHMEM_DECL_P2P_ARRAYS)

/* Distributed locks (a symmetric long, 0 before first use). */
void shmem_set_lock(long *lock);
void shmem_clear_lock(long *lock);
int shmem_test_lock(long *lock);

/* Teams. */
typedef struct {
  int num_contexts;
} shmem_team_config_t;
#define SHMEM_TEAM_NUM_CONTEXTS 1L

int shmem_team_my_pe(shmem_team_t team);
int shmem_team_n_pes(shmem_team_t team);
int shmem_team_get_config(shmem_team_t team, long config_mask, shmem_team_config_t *config);
int shmem_team_translate_pe(shmem_team_t src_team, int src_pe, shmem_team_t dest_team);
int shmem_team_split_strided(shmem_team_t parent_team, int start, int stride, int size,
                             const shmem_team_config_t *config, long config_mask, shmem_team_t *new_team);
int shmem_team_split_2d(shmem_team_t parent_team, int xrange, const shmem_team_config_t *xaxis_config,
                        long xaxis_mask, shmem_team_t *xaxis_team, const shmem_team_config_t *yaxis_config,
                        long yaxis_mask, shmem_team_t *yaxis_team);
void shmem_team_destroy(shmem_team_t team);
int shmem_team_sync(shmem_team_t team);

/* Communication contexts: a context's puts and gets are completed by its own quiet. */
int shmem_ctx_create(long options, shmem_ctx_t *ctx);
int shmem_team_create_ctx(shmem_team_t team, long options, shmem_ctx_t *ctx);
void shmem_ctx_destroy(shmem_ctx_t ctx);
int shmem_ctx_get_team(shmem_ctx_t ctx, shmem_team_t *team);
void shmem_ctx_quiet(shmem_ctx_t ctx);
void shmem_ctx_fence(shmem_ctx_t ctx);

/* Collectives on teams. */
int shmem_broadcastmem(shmem_team_t team, void *dest, const void *source, size_t nelems, int PE_root);
int shmem_collectmem(shmem_team_t team, void *dest, const void *source, size_t nelems);
int shmem_fcollectmem(shmem_team_t team, void *dest, const void *source, size_t nelems);
int shmem_alltoallmem(shmem_team_t team, void *dest, const void *source, size_t nelems);
int shmem_alltoallsmem(shmem_team_t team, void *dest, const void *source, ptrdiff_t dst, ptrdiff_t sst,
                       size_t nelems);
#define WEFT_SHMEM_DECL_TEAM_COLL(N, T) \
  int shmem_##N##_broadcast(shmem_team_t team, T *dest, const T *source, size_t nelems, int PE_root); \
  int shmem_##N##_collect(shmem_team_t team, T *dest, const T *source, size_t nelems); \
  int shmem_##N##_fcollect(shmem_team_t team, T *dest, const T *source, size_t nelems); \
  int shmem_##N##_alltoall(shmem_team_t team, T *dest, const T *source, size_t nelems); \
  int shmem_##N##_alltoalls(shmem_team_t team, T *dest, const T *source, ptrdiff_t dst, ptrdiff_t sst, \
                            size_t nelems);
WEFT_SHMEM_RMA_TYPES(WEFT_SHMEM_DECL_TEAM_COLL)
#if __SIZEOF_LONG_DOUBLE__ == 16
WEFT_SHMEM_DECL_TEAM_COLL(longdouble, long double)
#endif

/* Reductions (Table 10; long double on x86-64; complex types in C): on teams, and the deprecated
 * forms on active sets. */
#define WEFT_SHMEM_BITWISE_RED_TYPES(X) \
  X(uchar, unsigned char) X(ushort, unsigned short) X(uint, unsigned int) X(ulong, unsigned long) \
  X(ulonglong, unsigned long long) X(int8, int8_t) X(int16, int16_t) X(int32, int32_t) \
  X(int64, int64_t) X(uint8, uint8_t) X(uint16, uint16_t) X(uint32, uint32_t) X(uint64, uint64_t) \
  X(size, size_t) X(short, short) X(int, int) X(long, long) X(longlong, long long)
#define WEFT_SHMEM_ARITH_RED_TYPES(X) \
  WEFT_SHMEM_BITWISE_RED_TYPES(X) X(char, char) X(schar, signed char) X(ptrdiff, ptrdiff_t) \
  X(float, float) X(double, double)
#define WEFT_SHMEM_DECL_RED(N, T, OP) \
  int shmem_##N##_##OP##_reduce(shmem_team_t team, T *dest, const T *source, size_t nreduce); \
  void shmem_##N##_##OP##_to_all(T *dest, const T *source, int nreduce, int PE_start, int logPE_stride, \
                                 int PE_size, T *pWrk, long *pSync);
#define WEFT_SHMEM_DECL_RED_BIT(N, T) WEFT_SHMEM_DECL_RED(N, T, and) WEFT_SHMEM_DECL_RED(N, T, or) WEFT_SHMEM_DECL_RED(N, T, xor)
#define WEFT_SHMEM_DECL_RED_ARITH(N, T) \
  WEFT_SHMEM_DECL_RED(N, T, max) WEFT_SHMEM_DECL_RED(N, T, min) WEFT_SHMEM_DECL_RED(N, T, sum) \
  WEFT_SHMEM_DECL_RED(N, T, prod)
WEFT_SHMEM_BITWISE_RED_TYPES(WEFT_SHMEM_DECL_RED_BIT)
WEFT_SHMEM_ARITH_RED_TYPES(WEFT_SHMEM_DECL_RED_ARITH)
#if defined(__x86_64__) && __SIZEOF_LONG_DOUBLE__ == 16 && __LDBL_MANT_DIG__ == 64
/* long double (x87 on x86-64) */
WEFT_SHMEM_DECL_RED_ARITH(longdouble, long double)
#define WEFT_SHMEM_GL_RED_LD(X, P, OP) X(P, OP, longdouble, long double)
#else
#define WEFT_SHMEM_GL_RED_LD(X, P, OP)
#endif
#if !defined(__cplusplus) && !defined(__STDC_NO_COMPLEX__)
WEFT_SHMEM_DECL_RED(complexf, float _Complex, sum)
WEFT_SHMEM_DECL_RED(complexf, float _Complex, prod)
WEFT_SHMEM_DECL_RED(complexd, double _Complex, sum)
WEFT_SHMEM_DECL_RED(complexd, double _Complex, prod)
#define WEFT_SHMEM_GL_RED_CPLX(X, P, OP) X(P, OP, complexf, float _Complex) X(P, OP, complexd, double _Complex)
#else
#define WEFT_SHMEM_GL_RED_CPLX(X, P, OP)
#endif

/* Deprecated collectives on active sets (PE_start, logPE_stride, PE_size) with a pSync. */
void shmem_barrier(int PE_start, int logPE_stride, int PE_size, long *pSync);
void shmem_sync(int PE_start, int logPE_stride, int PE_size, long *pSync);
void shmem_broadcast32(void *dest, const void *source, size_t nelems, int PE_root, int PE_start,
                       int logPE_stride, int PE_size, long *pSync);
void shmem_broadcast64(void *dest, const void *source, size_t nelems, int PE_root, int PE_start,
                       int logPE_stride, int PE_size, long *pSync);
#define WEFT_SHMEM_DECL_ACTIVE(NAME) \
  void shmem_##NAME(void *dest, const void *source, size_t nelems, int PE_start, int logPE_stride, \
                    int PE_size, long *pSync);
WEFT_SHMEM_DECL_ACTIVE(collect32)
WEFT_SHMEM_DECL_ACTIVE(collect64)
WEFT_SHMEM_DECL_ACTIVE(fcollect32)
WEFT_SHMEM_DECL_ACTIVE(fcollect64)
WEFT_SHMEM_DECL_ACTIVE(alltoall32)
WEFT_SHMEM_DECL_ACTIVE(alltoall64)
void shmem_alltoalls32(void *dest, const void *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems,
                       int PE_start, int logPE_stride, int PE_size, long *pSync);
void shmem_alltoalls64(void *dest, const void *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems,
                       int PE_start, int logPE_stride, int PE_size, long *pSync);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* C11 generic interfaces, over the types that are not typedefs of others. A routine with a
 * context form takes the context first or not at all: the first argument's type tells. */
#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && !defined(__cplusplus)
#define WEFT_SHMEM_GL_BIT(X, P, OP) \
  X(P, OP, uint, unsigned int) X(P, OP, ulong, unsigned long) X(P, OP, ulonglong, unsigned long long)
#define WEFT_SHMEM_GL_STD(X, P, OP) \
  X(P, OP, int, int) X(P, OP, long, long) X(P, OP, longlong, long long) WEFT_SHMEM_GL_BIT(X, P, OP)
#define WEFT_SHMEM_GL_EXT(X, P, OP) X(P, OP, float, float) X(P, OP, double, double) WEFT_SHMEM_GL_STD(X, P, OP)
#define WEFT_SHMEM_GL_INT(X, P, OP) \
  X(P, OP, char, char) X(P, OP, schar, signed char) X(P, OP, short, short) X(P, OP, uchar, unsigned char) \
  X(P, OP, ushort, unsigned short) WEFT_SHMEM_GL_STD(X, P, OP)
#define WEFT_SHMEM_GL_RMA(X, P, OP) \
  X(P, OP, float, float) X(P, OP, double, double) X(P, OP, longdouble, long double) WEFT_SHMEM_GL_INT(X, P, OP)
/* The routines whose long double form the library itself provides (16-byte long double). */
#define WEFT_SHMEM_GL_RMA16(X, P, OP) \
  X(P, OP, float, float) X(P, OP, double, double) WEFT_SHMEM_GL_LD16(X, P, OP) WEFT_SHMEM_GL_INT(X, P, OP)
/* One association of a _Generic: `T *` (and `const T *`) chooses routine P N OP. */
#define WEFT_SHMEM_AS(P, OP, N, T) , T *: P##N##OP
#define WEFT_SHMEM_AS_CONST(P, OP, N, T) , T *: P##N##OP, const T *: P##N##OP
#define WEFT_SHMEM_A0(a, ...) a
#define WEFT_SHMEM_A1(a, b, ...) b
/* Never defined: a call with arguments of no listed type fails to compile naming it. */
void weft_shmem_generic_bad_arguments(void);
#define WEFT_SHMEM_GEN(TYPES, AS, OP, ...) \
  _Generic(WEFT_SHMEM_A0(__VA_ARGS__, 0), \
           shmem_ctx_t: _Generic(WEFT_SHMEM_A1(__VA_ARGS__, 0, 0) TYPES(AS, shmem_ctx_, OP), \
                                 default: weft_shmem_generic_bad_arguments), \
           default: _Generic(WEFT_SHMEM_A0(__VA_ARGS__, 0) TYPES(AS, shmem_, OP), \
                             default: weft_shmem_generic_bad_arguments))(__VA_ARGS__)
/* Routines without a context form, chosen by argument X's type. */
#define WEFT_SHMEM_GEN_NOCTX(TYPES, AS, OP, X) \
  _Generic((X) TYPES(AS, shmem_, OP), default: weft_shmem_generic_bad_arguments)

#define shmem_put(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_RMA, WEFT_SHMEM_AS, _put, __VA_ARGS__)
#define shmem_get(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_RMA, WEFT_SHMEM_AS, _get, __VA_ARGS__)
#define shmem_put_nbi(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_RMA, WEFT_SHMEM_AS, _put_nbi, __VA_ARGS__)
#define shmem_get_nbi(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_RMA, WEFT_SHMEM_AS, _get_nbi, __VA_ARGS__)
#define shmem_p(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_RMA, WEFT_SHMEM_AS, _p, __VA_ARGS__)
#define shmem_g(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_RMA, WEFT_SHMEM_AS_CONST, _g, __VA_ARGS__)
#define shmem_iput(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_RMA, WEFT_SHMEM_AS, _iput, __VA_ARGS__)
#define shmem_iget(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_RMA, WEFT_SHMEM_AS, _iget, __VA_ARGS__)
#define shmem_put_signal(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_RMA16, WEFT_SHMEM_AS, _put_signal, __VA_ARGS__)
#define shmem_put_signal_nbi(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_RMA16, WEFT_SHMEM_AS, _put_signal_nbi, __VA_ARGS__)

#define shmem_atomic_fetch(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_EXT, WEFT_SHMEM_AS_CONST, _atomic_fetch, __VA_ARGS__)
#define shmem_atomic_set(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_EXT, WEFT_SHMEM_AS, _atomic_set, __VA_ARGS__)
#define shmem_atomic_swap(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_EXT, WEFT_SHMEM_AS, _atomic_swap, __VA_ARGS__)
#define shmem_atomic_fetch_nbi(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_EXT, WEFT_SHMEM_AS, _atomic_fetch_nbi, __VA_ARGS__)
#define shmem_atomic_swap_nbi(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_EXT, WEFT_SHMEM_AS, _atomic_swap_nbi, __VA_ARGS__)
#define shmem_atomic_compare_swap(...) \
  WEFT_SHMEM_GEN(WEFT_SHMEM_GL_STD, WEFT_SHMEM_AS, _atomic_compare_swap, __VA_ARGS__)
#define shmem_atomic_compare_swap_nbi(...) \
  WEFT_SHMEM_GEN(WEFT_SHMEM_GL_STD, WEFT_SHMEM_AS, _atomic_compare_swap_nbi, __VA_ARGS__)
#define shmem_atomic_fetch_inc(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_STD, WEFT_SHMEM_AS, _atomic_fetch_inc, __VA_ARGS__)
#define shmem_atomic_fetch_inc_nbi(...) \
  WEFT_SHMEM_GEN(WEFT_SHMEM_GL_STD, WEFT_SHMEM_AS, _atomic_fetch_inc_nbi, __VA_ARGS__)
#define shmem_atomic_inc(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_STD, WEFT_SHMEM_AS, _atomic_inc, __VA_ARGS__)
#define shmem_atomic_fetch_add(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_STD, WEFT_SHMEM_AS, _atomic_fetch_add, __VA_ARGS__)
#define shmem_atomic_fetch_add_nbi(...) \
  WEFT_SHMEM_GEN(WEFT_SHMEM_GL_STD, WEFT_SHMEM_AS, _atomic_fetch_add_nbi, __VA_ARGS__)
#define shmem_atomic_add(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_STD, WEFT_SHMEM_AS, _atomic_add, __VA_ARGS__)
#define shmem_atomic_fetch_and(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_BIT, WEFT_SHMEM_AS, _atomic_fetch_and, __VA_ARGS__)
#define shmem_atomic_fetch_or(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_BIT, WEFT_SHMEM_AS, _atomic_fetch_or, __VA_ARGS__)
#define shmem_atomic_fetch_xor(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_BIT, WEFT_SHMEM_AS, _atomic_fetch_xor, __VA_ARGS__)
#define shmem_atomic_fetch_and_nbi(...) \
  WEFT_SHMEM_GEN(WEFT_SHMEM_GL_BIT, WEFT_SHMEM_AS, _atomic_fetch_and_nbi, __VA_ARGS__)
#define shmem_atomic_fetch_or_nbi(...) \
  WEFT_SHMEM_GEN(WEFT_SHMEM_GL_BIT, WEFT_SHMEM_AS, _atomic_fetch_or_nbi, __VA_ARGS__)
#define shmem_atomic_fetch_xor_nbi(...) \
  WEFT_SHMEM_GEN(WEFT_SHMEM_GL_BIT, WEFT_SHMEM_AS, _atomic_fetch_xor_nbi, __VA_ARGS__)
#define shmem_atomic_and(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_BIT, WEFT_SHMEM_AS, _atomic_and, __VA_ARGS__)
#define shmem_atomic_or(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_BIT, WEFT_SHMEM_AS, _atomic_or, __VA_ARGS__)
#define shmem_atomic_xor(...) WEFT_SHMEM_GEN(WEFT_SHMEM_GL_BIT, WEFT_SHMEM_AS, _atomic_xor, __VA_ARGS__)

#define shmem_wait_until(ivar, cmp, value) \
  WEFT_SHMEM_GEN_NOCTX(WEFT_SHMEM_GL_STD, WEFT_SHMEM_AS, _wait_until, ivar)(ivar, cmp, value)
#define shmem_test(ivar, cmp, value) WEFT_SHMEM_GEN_NOCTX(WEFT_SHMEM_GL_STD, WEFT_SHMEM_AS, _test, ivar)(ivar, cmp, value)

#define shmem_broadcast(team, dest, source, nelems, root) \
  WEFT_SHMEM_GEN_NOCTX(WEFT_SHMEM_GL_RMA16, WEFT_SHMEM_AS, _broadcast, dest)(team, dest, source, nelems, root)
#define shmem_collect(team, dest, source, nelems) \
  WEFT_SHMEM_GEN_NOCTX(WEFT_SHMEM_GL_RMA16, WEFT_SHMEM_AS, _collect, dest)(team, dest, source, nelems)
#define shmem_fcollect(team, dest, source, nelems) \
  WEFT_SHMEM_GEN_NOCTX(WEFT_SHMEM_GL_RMA16, WEFT_SHMEM_AS, _fcollect, dest)(team, dest, source, nelems)
#define shmem_alltoall(team, dest, source, nelems) \
  WEFT_SHMEM_GEN_NOCTX(WEFT_SHMEM_GL_RMA16, WEFT_SHMEM_AS, _alltoall, dest)(team, dest, source, nelems)
#define shmem_alltoalls(team, dest, source, dst, sst, nelems) \
  WEFT_SHMEM_GEN_NOCTX(WEFT_SHMEM_GL_RMA16, WEFT_SHMEM_AS, _alltoalls, dest)(team, dest, source, dst, sst, nelems)
#define WEFT_SHMEM_GL_RED_BIT(X, P, OP) \
  X(P, OP, uchar, unsigned char) X(P, OP, ushort, unsigned short) X(P, OP, short, short) WEFT_SHMEM_GL_STD(X, P, OP)
#define WEFT_SHMEM_GL_RED_ARITH(X, P, OP) \
  X(P, OP, char, char) X(P, OP, schar, signed char) X(P, OP, float, float) X(P, OP, double, double) \
  WEFT_SHMEM_GL_RED_LD(X, P, OP) WEFT_SHMEM_GL_RED_BIT(X, P, OP)
/* Sums and products take the complex types too (Table 10). */
#define WEFT_SHMEM_GL_RED_SUM(X, P, OP) WEFT_SHMEM_GL_RED_ARITH(X, P, OP) WEFT_SHMEM_GL_RED_CPLX(X, P, OP)
#define shmem_and_reduce(team, dest, source, n) \
  WEFT_SHMEM_GEN_NOCTX(WEFT_SHMEM_GL_RED_BIT, WEFT_SHMEM_AS, _and_reduce, dest)(team, dest, source, n)
#define shmem_or_reduce(team, dest, source, n) \
  WEFT_SHMEM_GEN_NOCTX(WEFT_SHMEM_GL_RED_BIT, WEFT_SHMEM_AS, _or_reduce, dest)(team, dest, source, n)
#define shmem_xor_reduce(team, dest, source, n) \
  WEFT_SHMEM_GEN_NOCTX(WEFT_SHMEM_GL_RED_BIT, WEFT_SHMEM_AS, _xor_reduce, dest)(team, dest, source, n)
#define shmem_max_reduce(team, dest, source, n) \
  WEFT_SHMEM_GEN_NOCTX(WEFT_SHMEM_GL_RED_ARITH, WEFT_SHMEM_AS, _max_reduce, dest)(team, dest, source, n)
#define shmem_min_reduce(team, dest, source, n) \
  WEFT_SHMEM_GEN_NOCTX(WEFT_SHMEM_GL_RED_ARITH, WEFT_SHMEM_AS, _min_reduce, dest)(team, dest, source, n)
#define shmem_sum_reduce(team, dest, source, n) \
  WEFT_SHMEM_GEN_NOCTX(WEFT_SHMEM_GL_RED_SUM, WEFT_SHMEM_AS, _sum_reduce, dest)(team, dest, source, n)
#define shmem_prod_reduce(team, dest, source, n) \
  WEFT_SHMEM_GEN_NOCTX(WEFT_SHMEM_GL_RED_SUM, WEFT_SHMEM_AS, _prod_reduce, dest)(team, dest, source, n)
#endif /* C11 */

#endif /* WEFT_SHMEM_H */
