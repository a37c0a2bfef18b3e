// Softmax helpers for samplers and reference code (the attention kernels keep their own
// online softmax). Float throughout, max-subtracted, as llama2.c's softmax.
#pragma once

#include <cstdint>

namespace kvcache {

// x[i] = exp(x[i] - max) / sum, in place. n >= 1.
void softmax_inplace(float* x, int64_t n);
// log(sum(exp(x))) computed stably, summed in double and returned in double (so that x[i] - lse
// keeps float precision even for logits far from 0); n >= 1.
double log_sum_exp(const float* x, int64_t n);
// The largest value that is not NaN (-inf when there is none). n >= 1.
float max_value(const float* x, int64_t n);
// Index of the largest value; the first one on ties (llama2.c's argmax), 0 when x[0] is NaN
// (a NaN elsewhere is passed over). n >= 1.
int64_t argmax(const float* x, int64_t n);

}  // namespace kvcache
