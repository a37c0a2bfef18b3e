# Runs SimdDigest.FusedAndQuantized in the native kernel tests (AVX-512 branches) and in
# test_kernels_avx2 (AVX2 only) and fails unless both print the same digest of the kernels'
# outputs: the 512-bit branches must keep the AVX2 arithmetic bit for bit.
#   cmake -DNATIVE=<test_kernels> -DAVX2=<test_kernels_avx2> -P simd_digest.cmake
foreach(which NATIVE AVX2)
  execute_process(COMMAND ${${which}} --gtest_filter=SimdDigest.FusedAndQuantized
                  OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${${which}}: SimdDigest.FusedAndQuantized failed (exit ${rc}):\n${out}")
  endif()
  string(REGEX MATCH "simd digest: ([0-9a-f]+)" _ "${out}")
  if(NOT CMAKE_MATCH_1)
    message(FATAL_ERROR "${${which}}: no 'simd digest:' line in its output:\n${out}")
  endif()
  set(digest_${which} ${CMAKE_MATCH_1})
endforeach()
if(NOT digest_NATIVE STREQUAL digest_AVX2)
  message(FATAL_ERROR "AVX-512 and AVX2 kernels disagree: digest ${digest_NATIVE} (native) vs "
                      "${digest_AVX2} (x86-64-v3)")
endif()
message(STATUS "AVX-512 and AVX2 kernels agree bit for bit (digest ${digest_NATIVE})")
