#include "alloc_hook.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <new>

#if defined(__SANITIZE_ADDRESS__)
#define KILN_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer) || __has_feature(thread_sanitizer)
#define KILN_UNDER_SANITIZER 1
#endif
#endif
// Sanitizers own malloc; then only operator new is counted.
#if defined(__GLIBC__) && !defined(KILN_UNDER_SANITIZER)
#define KILN_COUNT_MALLOC 1
#endif

#if defined(__GNUC__) && !defined(__clang__)
// GCC sees the malloc-backed new inlined next to free and warns; the pair is consistent.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace {

std::atomic<bool> g_counting{false};
std::atomic<long> g_count{0};
constexpr int kKept = 8;
std::atomic<size_t> g_sizes[kKept];  // the first sizes seen, for the failure message

std::atomic<size_t> g_largest{0};

void note(size_t n) noexcept {
  if (!g_counting.load(std::memory_order_relaxed)) return;
  const long i = g_count.fetch_add(1, std::memory_order_relaxed);
  if (i < kKept) g_sizes[i].store(n, std::memory_order_relaxed);
  size_t seen = g_largest.load(std::memory_order_relaxed);
  while (n > seen && !g_largest.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
  }
}

}  // namespace

#ifdef KILN_COUNT_MALLOC
// glibc documents replacing malloc; these forward to its implementation.
extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);

void* malloc(size_t n) noexcept {
  note(n);
  return __libc_malloc(n);
}
void* calloc(size_t n, size_t size) noexcept {
  note(n * size);
  return __libc_calloc(n, size);
}
void* realloc(void* p, size_t n) noexcept {
  note(n);
  return __libc_realloc(p, n);
}
void* aligned_alloc(size_t align, size_t n) noexcept {
  note(n);
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, size_t align, size_t n) noexcept {
  note(n);
  void* p = __libc_memalign(align, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
void free(void* p) noexcept { __libc_free(p); }
}
#endif

namespace {
// With malloc replaced it counts for operator new too; otherwise count here.
void* raw_alloc(size_t n) noexcept {
#ifndef KILN_COUNT_MALLOC
  note(n);
#endif
  return std::malloc(n ? n : 1);
}
void* raw_aligned(size_t n, std::align_val_t a) noexcept {
#ifndef KILN_COUNT_MALLOC
  note(n);
#endif
  const size_t align = std::max(size_t(a), sizeof(void*));
  return std::aligned_alloc(align, (std::max<size_t>(n, 1) + align - 1) / align * align);
}
}  // namespace

void* operator new(size_t n) {
  if (void* p = raw_alloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return raw_alloc(n); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return raw_alloc(n); }
void* operator new(size_t n, std::align_val_t a) {
  if (void* p = raw_aligned(n, a)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n, std::align_val_t a) { return operator new(n, a); }
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return raw_aligned(n, a); }
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return raw_aligned(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }

namespace kiln::test {

AllocationWindow::AllocationWindow() {
  g_count.store(0);
  g_largest.store(0);
  g_counting.store(true);
}
AllocationWindow::~AllocationWindow() { g_counting.store(false); }
long AllocationWindow::stop() {
  g_counting.store(false);
  return g_count.load();
}
size_t AllocationWindow::largest() { return g_largest.load(); }
std::string AllocationWindow::sizes() {
  std::string s;
  for (long i = 0; i < std::min<long>(g_count.load(), kKept); ++i) s += std::to_string(g_sizes[i].load()) + " ";
  return s;
}
bool AllocationWindow::counts_malloc() {
#ifdef KILN_COUNT_MALLOC
  return true;
#else
  return false;
#endif
}

}  // namespace kiln::test
