// A model's fingerprint: what must match for stored KV (session files, the prefix cache's disk
// tier, a shared remote tier) to be reused. BLAKE2b-128 over the architecture, every config
// field that changes K/V (layers, heads, head dims, layer types, RoPE, windows, ...), the
// vocabulary size, and every weight tensor's name, dtype and shape plus a sample of its bytes
// (whole when at most 64 KiB; else 64 evenly spaced 1 KiB pieces, which any fine-tune, other
// quantization or other checkpoint changes). Sampling keeps it cheap (microseconds per tensor,
// no full read of a multi-GB file); two files with identical config, shapes and sampled bytes
// but different unsampled weights would collide, which no real checkpoint pair does.
#pragma once

#include "core/digest.h"

namespace kvcache {

class Model;
class Tokenizer;

Digest128 model_fingerprint(const Model& model);

// A tokenizer's fingerprint, for keys of KV shared between processes (the remote tier): two
// servers share blocks only when the same text gives them the same ids. BLAKE2b-128 over its
// kind, size, BOS/EOS ids and every entry (stored text and decoded bytes: the vocabulary and
// its byte mapping), plus the ids it encodes a fixed set of probe texts into (spaces,
// punctuation, digits, contractions, code, non-ASCII), which exercises what the interface does
// not expose: the merges or scores and the pre-tokenizer's splits. nullptr (a model served on
// raw ids) hashes "none".
Digest128 tokenizer_fingerprint(const Tokenizer* tokenizer);

}  // namespace kvcache
