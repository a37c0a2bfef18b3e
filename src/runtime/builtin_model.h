// Models built into the binary: "stories260K", llama2.c's TinyStories 260K checkpoint and its
// vocabulary (models/stories260K/), so that `make run` and `--model stories260K` show a real
// model with nothing to download.
#pragma once

#include <optional>
#include <string>

namespace kvcache {

// The checkpoint path of a built-in model, written (with its vocabulary beside it) to the model
// cache folder on first use; nullopt when `name` is not a built-in model. Error(kIo) when the
// folder cannot be written.
std::optional<std::string> builtin_model_path(const std::string& name);

}  // namespace kvcache
