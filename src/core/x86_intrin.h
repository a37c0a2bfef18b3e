// <immintrin.h> for the kernels that use AVX-512 intrinsics.
//
// GCC 12's AVX-512 intrinsics start many results from _mm512_undefined_*() (a self-initialised
// variable), which -Wmaybe-uninitialized reports wherever they are inlined (GCC bug 105593,
// fixed in GCC 13). The reports point into the header: silenced for its lines only, so this
// must be a translation unit's first include of <immintrin.h> (a build error otherwise).
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
