// Workspace: the activation buffers of one forward, owned by a Forward and lent to the blocks.
// Each block kind declares its scratch as a ScratchKind (buffers sized from the config for a
// number of rows = batch x chunk tokens); a model family lists the kinds its blocks use, so a
// new block kind brings its own scratch without a field in shared code. Sized from the config
// alone, never from weights: the paged planner predicts a forward's bytes (bytes_for) before
// any weight is read, and a Forward reserved for that many rows holds exactly that much.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "model/model_file.h"

namespace kvcache {

// One buffer: rows * per_row + fixed floats. Both 0: the block grows it itself (grow()) to
// what a call needs (MLA's expansion follows the visible history); not part of the plan.
struct ScratchBuffer {
  int64_t per_row = 0;
  int64_t fixed = 0;
};

struct ScratchKind {
  const char* name;  // the block kind, for messages
  std::vector<ScratchBuffer> (*buffers)(const ModelConfig& config);
  // The widest input of the kind's linears: the prefill GEMM packs one such input (0: none).
  int64_t (*widest_input)(const ModelConfig& config);
};

class Workspace {
 public:
  // Nothing is allocated until reserve().
  Workspace(const ModelConfig& config, std::vector<const ScratchKind*> kinds);

  // Every planned buffer sized for `rows` rows (reallocated only when rows grows).
  void reserve(int64_t rows);
  int64_t rows() const { return rows_; }
  const ModelConfig& config() const { return config_; }

  // Buffer i of `kind` (a kind the model's family listed: a bug otherwise).
  Tensor& tensor(const ScratchKind& kind, size_t i);
  float* data(const ScratchKind& kind, size_t i) { return tensor(kind, i).data_as<float>(); }
  // A self-sized buffer grown to at least n floats (geometrically: a decode step's history
  // grows by one token).
  float* grow(const ScratchKind& kind, size_t i, int64_t n);
  // The prefill GEMM's packed-input scratch (nullptr while fewer rows than it takes).
  float* pack() { return pack_.numel() > 0 ? pack_.data_as<float>() : nullptr; }
  size_t pack_floats() const { return static_cast<size_t>(pack_.numel()); }

  size_t bytes() const;  // everything allocated, self-sized buffers included
  // What bytes() is after reserve(rows) for these kinds (self-sized buffers not counted).
  static size_t bytes_for(const ModelConfig& config, std::span<const ScratchKind* const> kinds,
                          int64_t rows);

 private:
  struct Part {
    const ScratchKind* kind;
    std::vector<ScratchBuffer> plan;
    std::vector<Tensor> buffers;
  };
  const ModelConfig& config_;
  std::vector<Part> parts_;
  Tensor pack_;
  int64_t rows_ = 0;
};

}  // namespace kvcache
