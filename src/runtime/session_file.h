// Session files: a conversation's KV cache saved and restored without recomputing it, as
// llama.cpp's state files (`--prompt-cache`, llama_state_save_file) and its server's
// `--slot-save-path`.
//
// Format (little-endian), version 1:
//   magic "KVCSESS\0" | u32 version | model fingerprint (16 B, model/fingerprint.h) |
//   str cache implementation | str kv dtype | u32 n_layers, str layer_type[n_layers] |
//   i64 n_tokens, i32 tokens[n_tokens] | payload | checksum: BLAKE2b-128 of everything before
// where payload is what the source wrote: a dense session's Cache::save() (cache/layer_state.h)
// or, from the server's paged store, the sequence's K/V rows per layer (see
// save_paged_session). Loading checks magic, version, fingerprint, layer types and dtype first
// and refuses with a message naming what differs (another model, another dtype, a file of a
// newer version); the checksum covers the whole file, so a damaged or truncated file is refused
// before the cache it would restore into is touched (the payload is read and verified in full
// first).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/digest.h"

namespace kvcache {

class Session;
class PagedKVStore;
class Model;

struct SessionFileInfo {
  uint32_t version = 0;
  Digest128 fingerprint;
  std::string implementation;  // the cache it was saved from ("dynamic", "paged", ...)
  std::string kv_dtype;
  std::vector<std::string> layer_types;
  std::vector<int32_t> tokens;  // every token the cache holds, in order
  uint64_t file_bytes = 0;
};

// Saves `session`'s cache and the tokens it holds (tokens.size() must equal its position).
// Written to path + ".tmp" then renamed: a crash never leaves a half-written file under `path`.
// Returns the bytes written. Error(kIo) when the file cannot be written; Error(kUnsupported)
// when the session's container cannot be saved.
uint64_t save_session(const Session& session, std::span<const int32_t> tokens,
                      const std::string& path);
// Restores into `session` (position 0, its cache fresh or reset); returns the file's header.
// After it, the session's position is tokens.size(). Errors (kFormat, kIo) name the file and
// what differs; the session is unchanged when loading fails before the payload is applied.
SessionFileInfo load_session(Session& session, const std::string& path);
// Reads only the header (and checks the checksum when verify is true).
SessionFileInfo read_session_info(const std::string& path, bool verify);

// The server's paged store (`serve --slot-save-path`), on the engine thread between steps (no
// step open). Payload: u32 block_tokens, then per layer that owns pages: i64 layer, and the
// sequence's blocks in order, K then V, each [H_kv, block_tokens, D] in the pages' dtype.
// Only full blocks found in the prefix cache are saved (tokens: prompt + generated; the saved
// count is a multiple of the block size, the tail is recomputed on reuse). Models whose state
// is not all in full-attention blocks (sliding, linear, compressed layers) are refused
// (kUnsupported).
struct PagedSessionResult {
  int64_t tokens = 0;  // saved / restored
  uint64_t bytes = 0;  // file bytes written / read
};
// Error(kOutOfRange) when none of `tokens`' blocks are cached any more (evicted).
PagedSessionResult save_paged_session(PagedKVStore& store, const Model& model,
                                      std::span<const int32_t> tokens, const std::string& path);
// Puts the file's blocks back into the prefix cache (allocated, written, keyed under the default
// salt): the next request whose prompt starts with those tokens reuses them. Error(kOutOfRange)
// when the pool has too few free blocks.
PagedSessionResult load_paged_session(PagedKVStore& store, const Model& model,
                                      const std::string& path);

}  // namespace kvcache
