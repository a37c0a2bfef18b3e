// Software prefetch that the optimiser keeps.
//
// GCC models __builtin_prefetch / _mm_prefetch as free of side effects, so a helper whose body
// is only prefetches (a look-ahead member function, a lambda) can be judged `const` by its
// interprocedural analysis and every call to it deleted. It happened here: the quantized
// attention kernel's next-block look-ahead and a lambda around the fused kernel's row prefetch
// both compiled to no prefetch instruction at all (found by counting them in the assembly).
// The empty volatile asm is a side effect the compiler must keep, so the prefetch stays
// wherever the call is written; it emits no instruction of its own.
#pragma once

namespace kvcache {

// Prefetch the cache line holding p into all levels (read, high temporal locality: T0).
inline void prefetch_l1(const void* p) {
  __builtin_prefetch(p, 0, 3);
  asm volatile("" : : "r"(p));
}

// Prefetch into L2 and the levels below it, not L1 (T1).
inline void prefetch_l2(const void* p) {
  __builtin_prefetch(p, 0, 2);
  asm volatile("" : : "r"(p));
}

}  // namespace kvcache
