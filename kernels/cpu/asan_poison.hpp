// Marking memory that nobody may touch (a free block of the caching allocator, the emulation's shared
// memory beyond what a kernel asked for): under AddressSanitizer an access is reported at once;
// otherwise the marks cost nothing.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define D2L_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define D2L_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define D2L_POISON(p, n) ((void)(p), (void)(n))
#define D2L_UNPOISON(p, n) ((void)(p), (void)(n))
#endif
