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

#define WEFT_SHMEM_DECL_RMA(N, T) \
  void shmem_##N##_put(T *dest, const T *source, size_t nelems, int pe); \
  void shmem_##N##_get(T *dest, const T *source, size_t nelems, int pe); \
  void shmem_##N##_put_nbi(T *dest, const T *source, size_t nelems, int pe); \
  void shmem_##N##_get_nbi(T *dest, const T *source, size_t nelems, int pe); \
  void shmem_##N##_p(T *dest, T value, int pe); \
  T shmem_##N##_g(const T *source, int pe); \
  void shmem_##N##_iput(T *dest, const T *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, int pe); \
  void shmem_##N##_iget(T *dest, const T *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, int pe);
WEFT_SHMEM_RMA_TYPES(WEFT_SHMEM_DECL_RMA)

#define WEFT_SHMEM_DECL_SIZED(S) \
  void shmem_put##S(void *dest, const void *source, size_t nelems, int pe); \
  void shmem_get##S(void *dest, const void *source, size_t nelems, int pe); \
  void shmem_put##S##_nbi(void *dest, const void *source, size_t nelems, int pe); \
  void shmem_get##S##_nbi(void *dest, const void *source, size_t nelems, int pe); \
  void shmem_iput##S(void *dest, const void *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, int pe); \
  void shmem_iget##S(void *dest, const void *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, int pe);
WEFT_SHMEM_DECL_SIZED(8)
WEFT_SHMEM_DECL_SIZED(16)
WEFT_SHMEM_DECL_SIZED(32)
WEFT_SHMEM_DECL_SIZED(64)
WEFT_SHMEM_DECL_SIZED(128)

void shmem_putmem(void *dest, const void *source, size_t nelems, int pe);
void shmem_getmem(void *dest, const void *source, size_t nelems, int pe);
void shmem_putmem_nbi(void *dest, const void *source, size_t nelems, int pe);
void shmem_getmem_nbi(void *dest, const void *source, size_t nelems, int pe);

/* long double: over the 128-bit routines (its size on LP64 targets). */
typedef char weft_shmem_longdouble_is_16_bytes[sizeof(long double) == 16 ? 1 : -1];
static inline void shmem_longdouble_put(long double *d, const long double *s, size_t n, int pe) { shmem_put128(d, s, n, pe); }
static inline void shmem_longdouble_get(long double *d, const long double *s, size_t n, int pe) { shmem_get128(d, s, n, pe); }
static inline void shmem_longdouble_put_nbi(long double *d, const long double *s, size_t n, int pe) { shmem_put128_nbi(d, s, n, pe); }
static inline void shmem_longdouble_get_nbi(long double *d, const long double *s, size_t n, int pe) { shmem_get128_nbi(d, s, n, pe); }
static inline void shmem_longdouble_p(long double *d, long double v, int pe) { shmem_put128(d, &v, 1, pe); }
static inline long double shmem_longdouble_g(const long double *s, int pe) { long double v; shmem_get128(&v, s, 1, pe); return v; }
static inline void shmem_longdouble_iput(long double *d, const long double *s, ptrdiff_t dst, ptrdiff_t sst, size_t n, int pe) { shmem_iput128(d, s, dst, sst, n, pe); }
static inline void shmem_longdouble_iget(long double *d, const long double *s, ptrdiff_t dst, ptrdiff_t sst, size_t n, int pe) { shmem_iget128(d, s, dst, sst, n, pe); }

/* Atomic memory operations (Tables 6 and 7). */
#define WEFT_SHMEM_EXT_AMO_TYPES(X) X(float, float) X(double, double)
#define WEFT_SHMEM_STD_AMO_TYPES(X) \
  X(int, int) X(long, long) X(longlong, long long) X(size, size_t) X(ptrdiff, ptrdiff_t)
#define WEFT_SHMEM_BIT_AMO_TYPES(X) \
  X(uint, unsigned int) X(ulong, unsigned long) X(ulonglong, unsigned long long) \
  X(int32, int32_t) X(int64, int64_t) X(uint32, uint32_t) X(uint64, uint64_t)

#define WEFT_SHMEM_DECL_EXT_AMO(N, T) \
  T shmem_##N##_atomic_fetch(const T *source, int pe); \
  void shmem_##N##_atomic_set(T *dest, T value, int pe); \
  T shmem_##N##_atomic_swap(T *dest, T value, int pe); \
  void shmem_##N##_atomic_fetch_nbi(T *fetch, const T *source, int pe); \
  void shmem_##N##_atomic_swap_nbi(T *fetch, T *dest, T value, int pe); \
  T shmem_##N##_fetch(const T *source, int pe); \
  void shmem_##N##_set(T *dest, T value, int pe); \
  T shmem_##N##_swap(T *dest, T value, int pe);
#define WEFT_SHMEM_DECL_STD_AMO(N, T) \
  WEFT_SHMEM_DECL_EXT_AMO(N, T) \
  T shmem_##N##_atomic_compare_swap(T *dest, T cond, T value, int pe); \
  T shmem_##N##_atomic_fetch_inc(T *dest, int pe); \
  void shmem_##N##_atomic_inc(T *dest, int pe); \
  T shmem_##N##_atomic_fetch_add(T *dest, T value, int pe); \
  void shmem_##N##_atomic_add(T *dest, T value, int pe); \
  void shmem_##N##_atomic_compare_swap_nbi(T *fetch, T *dest, T cond, T value, int pe); \
  void shmem_##N##_atomic_fetch_inc_nbi(T *fetch, T *dest, int pe); \
  void shmem_##N##_atomic_fetch_add_nbi(T *fetch, T *dest, T value, int pe); \
  T shmem_##N##_cswap(T *dest, T cond, T value, int pe); \
  T shmem_##N##_finc(T *dest, int pe); \
  void shmem_##N##_inc(T *dest, int pe); \
  T shmem_##N##_fadd(T *dest, T value, int pe); \
  void shmem_##N##_add(T *dest, T value, int pe);
#define WEFT_SHMEM_DECL_BIT_AMO(N, T) \
  WEFT_SHMEM_DECL_STD_AMO(N, T) \
  T shmem_##N##_atomic_fetch_and(T *dest, T value, int pe); \
  void shmem_##N##_atomic_and(T *dest, T value, int pe); \
  void shmem_##N##_atomic_fetch_and_nbi(T *fetch, T *dest, T value, int pe); \
  T shmem_##N##_atomic_fetch_or(T *dest, T value, int pe); \
  void shmem_##N##_atomic_or(T *dest, T value, int pe); \
  void shmem_##N##_atomic_fetch_or_nbi(T *fetch, T *dest, T value, int pe); \
  T shmem_##N##_atomic_fetch_xor(T *dest, T value, int pe); \
  void shmem_##N##_atomic_xor(T *dest, T value, int pe); \
  void shmem_##N##_atomic_fetch_xor_nbi(T *fetch, T *dest, T value, int pe);
WEFT_SHMEM_EXT_AMO_TYPES(WEFT_SHMEM_DECL_EXT_AMO)
WEFT_SHMEM_STD_AMO_TYPES(WEFT_SHMEM_DECL_STD_AMO)
WEFT_SHMEM_BIT_AMO_TYPES(WEFT_SHMEM_DECL_BIT_AMO)

/* Signals. */
void shmem_putmem_signal(void *dest, const void *source, size_t nelems, uint64_t *sig_addr,
                         uint64_t signal, int sig_op, int pe);
void shmem_putmem_signal_nbi(void *dest, const void *source, size_t nelems, uint64_t *sig_addr,
                             uint64_t signal, int sig_op, int pe);
#define WEFT_SHMEM_DECL_PUT_SIGNAL(N, T) \
  void shmem_##N##_put_signal(T *dest, const T *source, size_t nelems, uint64_t *sig_addr, uint64_t signal, \
                              int sig_op, int pe); \
  void shmem_##N##_put_signal_nbi(T *dest, const T *source, size_t nelems, uint64_t *sig_addr, \
                                  uint64_t signal, int sig_op, int pe);
WEFT_SHMEM_RMA_TYPES(WEFT_SHMEM_DECL_PUT_SIGNAL)
WEFT_SHMEM_DECL_PUT_SIGNAL(longdouble, long double)
#define WEFT_SHMEM_DECL_PUT_SIGNAL_SIZED(S) \
  void shmem_put##S##_signal(void *dest, const void *source, size_t nelems, uint64_t *sig_addr, \
                             uint64_t signal, int sig_op, int pe); \
  void shmem_put##S##_signal_nbi(void *dest, const void *source, size_t nelems, uint64_t *sig_addr, \
                                 uint64_t signal, int sig_op, int pe);
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

/* Teams. A handle is an opaque value weft checks (never a pointer it follows). */
typedef struct weft_shmem_team *shmem_team_t;
#define SHMEM_TEAM_INVALID ((shmem_team_t)0)
#define SHMEM_TEAM_WORLD ((shmem_team_t)1)
#define SHMEM_TEAM_SHARED ((shmem_team_t)2)
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
WEFT_SHMEM_DECL_TEAM_COLL(longdouble, long double)

/* Reductions (Table 10; long double not yet; complex types in C): on teams, and the deprecated
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
#if !defined(__cplusplus) && !defined(__STDC_NO_COMPLEX__)
WEFT_SHMEM_DECL_RED(complexf, float _Complex, sum)
WEFT_SHMEM_DECL_RED(complexf, float _Complex, prod)
WEFT_SHMEM_DECL_RED(complexd, double _Complex, sum)
WEFT_SHMEM_DECL_RED(complexd, double _Complex, prod)
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

/* C11 generic interfaces, over the types that are not typedefs of others. */
#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && !defined(__cplusplus)
#define WEFT_SHMEM_GEN_TYPES(X) \
  X(float, float) X(double, double) X(char, char) X(schar, signed char) X(short, short) \
  X(int, int) X(long, long) X(longlong, long long) X(uchar, unsigned char) \
  X(ushort, unsigned short) X(uint, unsigned int) X(ulong, unsigned long) \
  X(ulonglong, unsigned long long)
#define WEFT_SHMEM_GEN_BIT(X) X(uint, unsigned int) X(ulong, unsigned long) X(ulonglong, unsigned long long)
#define WEFT_SHMEM_GEN_STD(X) X(int, int) X(long, long) X(longlong, long long) WEFT_SHMEM_GEN_BIT(X)
#define WEFT_SHMEM_GEN_EXT(X) X(float, float) X(double, double) WEFT_SHMEM_GEN_STD(X)

#define WEFT_SHMEM_G_PUT(N, T) , T *: shmem_##N##_put
#define shmem_put(dest, source, nelems, pe) \
  _Generic((dest) WEFT_SHMEM_GEN_TYPES(WEFT_SHMEM_G_PUT), long double *: shmem_longdouble_put)(dest, source, nelems, pe)
#define WEFT_SHMEM_G_GET(N, T) , T *: shmem_##N##_get
#define shmem_get(dest, source, nelems, pe) \
  _Generic((dest) WEFT_SHMEM_GEN_TYPES(WEFT_SHMEM_G_GET), long double *: shmem_longdouble_get)(dest, source, nelems, pe)
#define WEFT_SHMEM_G_PUT_NBI(N, T) , T *: shmem_##N##_put_nbi
#define shmem_put_nbi(dest, source, nelems, pe) \
  _Generic((dest) WEFT_SHMEM_GEN_TYPES(WEFT_SHMEM_G_PUT_NBI), long double *: shmem_longdouble_put_nbi)(dest, source, nelems, pe)
#define WEFT_SHMEM_G_GET_NBI(N, T) , T *: shmem_##N##_get_nbi
#define shmem_get_nbi(dest, source, nelems, pe) \
  _Generic((dest) WEFT_SHMEM_GEN_TYPES(WEFT_SHMEM_G_GET_NBI), long double *: shmem_longdouble_get_nbi)(dest, source, nelems, pe)
#define WEFT_SHMEM_G_P(N, T) , T *: shmem_##N##_p
#define shmem_p(dest, value, pe) \
  _Generic((dest) WEFT_SHMEM_GEN_TYPES(WEFT_SHMEM_G_P), long double *: shmem_longdouble_p)(dest, value, pe)
#define WEFT_SHMEM_G_G(N, T) , T *: shmem_##N##_g , const T *: shmem_##N##_g
#define shmem_g(source, pe) \
  _Generic((source) WEFT_SHMEM_GEN_TYPES(WEFT_SHMEM_G_G), long double *: shmem_longdouble_g, \
           const long double *: shmem_longdouble_g)(source, pe)
#define WEFT_SHMEM_G_IPUT(N, T) , T *: shmem_##N##_iput
#define shmem_iput(dest, source, dst, sst, nelems, pe) \
  _Generic((dest) WEFT_SHMEM_GEN_TYPES(WEFT_SHMEM_G_IPUT), long double *: shmem_longdouble_iput)(dest, source, dst, sst, nelems, pe)
#define WEFT_SHMEM_G_IGET(N, T) , T *: shmem_##N##_iget
#define shmem_iget(dest, source, dst, sst, nelems, pe) \
  _Generic((dest) WEFT_SHMEM_GEN_TYPES(WEFT_SHMEM_G_IGET), long double *: shmem_longdouble_iget)(dest, source, dst, sst, nelems, pe)

#define WEFT_SHMEM_G_FETCH(N, T) , T *: shmem_##N##_atomic_fetch , const T *: shmem_##N##_atomic_fetch
#define shmem_atomic_fetch(source, pe) _Generic((source) WEFT_SHMEM_GEN_EXT(WEFT_SHMEM_G_FETCH))(source, pe)
#define WEFT_SHMEM_G_SET(N, T) , T *: shmem_##N##_atomic_set
#define shmem_atomic_set(dest, value, pe) _Generic((dest) WEFT_SHMEM_GEN_EXT(WEFT_SHMEM_G_SET))(dest, value, pe)
#define WEFT_SHMEM_G_SWAP(N, T) , T *: shmem_##N##_atomic_swap
#define shmem_atomic_swap(dest, value, pe) _Generic((dest) WEFT_SHMEM_GEN_EXT(WEFT_SHMEM_G_SWAP))(dest, value, pe)
#define WEFT_SHMEM_G_CSWAP(N, T) , T *: shmem_##N##_atomic_compare_swap
#define shmem_atomic_compare_swap(dest, cond, value, pe) \
  _Generic((dest) WEFT_SHMEM_GEN_STD(WEFT_SHMEM_G_CSWAP))(dest, cond, value, pe)
#define WEFT_SHMEM_G_FINC(N, T) , T *: shmem_##N##_atomic_fetch_inc
#define shmem_atomic_fetch_inc(dest, pe) _Generic((dest) WEFT_SHMEM_GEN_STD(WEFT_SHMEM_G_FINC))(dest, pe)
#define WEFT_SHMEM_G_INC(N, T) , T *: shmem_##N##_atomic_inc
#define shmem_atomic_inc(dest, pe) _Generic((dest) WEFT_SHMEM_GEN_STD(WEFT_SHMEM_G_INC))(dest, pe)
#define WEFT_SHMEM_G_FADD(N, T) , T *: shmem_##N##_atomic_fetch_add
#define shmem_atomic_fetch_add(dest, value, pe) _Generic((dest) WEFT_SHMEM_GEN_STD(WEFT_SHMEM_G_FADD))(dest, value, pe)
#define WEFT_SHMEM_G_ADD(N, T) , T *: shmem_##N##_atomic_add
#define shmem_atomic_add(dest, value, pe) _Generic((dest) WEFT_SHMEM_GEN_STD(WEFT_SHMEM_G_ADD))(dest, value, pe)
#define WEFT_SHMEM_G_FAND(N, T) , T *: shmem_##N##_atomic_fetch_and
#define shmem_atomic_fetch_and(dest, value, pe) _Generic((dest) WEFT_SHMEM_GEN_BIT(WEFT_SHMEM_G_FAND))(dest, value, pe)
#define WEFT_SHMEM_G_FOR(N, T) , T *: shmem_##N##_atomic_fetch_or
#define shmem_atomic_fetch_or(dest, value, pe) _Generic((dest) WEFT_SHMEM_GEN_BIT(WEFT_SHMEM_G_FOR))(dest, value, pe)
#define WEFT_SHMEM_G_FXOR(N, T) , T *: shmem_##N##_atomic_fetch_xor
#define shmem_atomic_fetch_xor(dest, value, pe) _Generic((dest) WEFT_SHMEM_GEN_BIT(WEFT_SHMEM_G_FXOR))(dest, value, pe)
#define WEFT_SHMEM_G_AND(N, T) , T *: shmem_##N##_atomic_and
#define shmem_atomic_and(dest, value, pe) _Generic((dest) WEFT_SHMEM_GEN_BIT(WEFT_SHMEM_G_AND))(dest, value, pe)
#define WEFT_SHMEM_G_OR(N, T) , T *: shmem_##N##_atomic_or
#define shmem_atomic_or(dest, value, pe) _Generic((dest) WEFT_SHMEM_GEN_BIT(WEFT_SHMEM_G_OR))(dest, value, pe)
#define WEFT_SHMEM_G_XOR(N, T) , T *: shmem_##N##_atomic_xor
#define shmem_atomic_xor(dest, value, pe) _Generic((dest) WEFT_SHMEM_GEN_BIT(WEFT_SHMEM_G_XOR))(dest, value, pe)

#define WEFT_SHMEM_G_WAIT(N, T) , T *: shmem_##N##_wait_until
#define shmem_wait_until(ivar, cmp, value) _Generic((ivar) WEFT_SHMEM_GEN_STD(WEFT_SHMEM_G_WAIT))(ivar, cmp, value)
#define WEFT_SHMEM_G_TEST(N, T) , T *: shmem_##N##_test
#define shmem_test(ivar, cmp, value) _Generic((ivar) WEFT_SHMEM_GEN_STD(WEFT_SHMEM_G_TEST))(ivar, cmp, value)
#endif /* C11 */

#endif /* WEFT_SHMEM_H */
