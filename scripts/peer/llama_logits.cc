// llama_logits: the peer side of scripts/peer/compare_top1.sh (issue 42, check 2). Loads a GGUF
// with llama.cpp (through its public llama.h only), evaluates a given list of token ids and
// writes the next-token logits of every position as float32 [n][vocab], row-major, the same
// layout `kvcache logits -o` writes, so the two files can be compared byte for byte.
//
// Not part of the CMake build (it links llama.cpp, which the project does not depend on).
// Build it against a llama.cpp build tree, e.g.:
//   g++ -O2 -std=c++17 scripts/peer/llama_logits.cc -I$LLAMA/include -I$LLAMA/ggml/include
//       -L$LLAMA/build/bin -lllama -Wl,-rpath,$LLAMA/build/bin -o /tmp/llama_logits
// Run:
//   /tmp/llama_logits -m model.gguf --prompt-ids "1 403 407" -o out.f32 [-t 2] [--one-by-one]
//   /tmp/llama_logits -m model.gguf --print-bos     (prints the file's BOS id as llama.cpp reads
//   it)
//
// The ids are passed as they are: nothing is added (no BOS), so both engines see exactly the
// same sequence. Without --one-by-one all ids go in one llama_decode call with logits requested
// at every position (a prefill); with --one-by-one each id is its own llama_decode call (the
// decode path, where llama.cpp takes its single-row matrix-vector kernels).
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

namespace {

void usage() {
  std::fprintf(stderr,
               "usage: llama_logits -m MODEL.gguf --prompt-ids \"ID ID ...\" -o OUT.f32 "
               "[-t THREADS] [--one-by-one] [--flash-attn auto|on|off] [--verbose]\n"
               "       llama_logits -m MODEL.gguf --print-bos\n"
               "       llama_logits -m MODEL.gguf --tokenize < TEXT\n");
}

// llama.cpp logs every tensor at load; keep only warnings and errors unless --verbose.
void quiet_log(enum ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) {
    std::fputs(text, stderr);
  }
}

bool parse_ids(const std::string& s, std::vector<llama_token>& out) {
  const char* p = s.c_str();
  while (*p != '\0') {
    while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') ++p;
    if (*p == '\0') break;
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(p, &end, 10);
    if (end == p || errno != 0 || v < 0 || v > 0x7fffffffL) {
      std::fprintf(stderr, "llama_logits: bad token id near \"%.20s\" in --prompt-ids\n", p);
      return false;
    }
    out.push_back(static_cast<llama_token>(v));
    p = end;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, ids_text, out_path, fa = "auto";
  int threads = 2;
  bool one_by_one = false, verbose = false, print_bos = false, tokenize = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "llama_logits: %s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "-m" || a == "--model") {
      model_path = value("-m");
    } else if (a == "--prompt-ids") {
      ids_text = value("--prompt-ids");
    } else if (a == "-o" || a == "--output") {
      out_path = value("-o");
    } else if (a == "-t" || a == "--threads") {
      threads = std::atoi(value("-t"));
    } else if (a == "--one-by-one") {
      one_by_one = true;
    } else if (a == "--flash-attn") {
      fa = value("--flash-attn");
    } else if (a == "--tokenize") {
      tokenize = true;
    } else if (a == "--print-bos") {
      print_bos = true;
    } else if (a == "--verbose") {
      verbose = true;
    } else {
      std::fprintf(stderr, "llama_logits: unknown argument %s\n", a.c_str());
      usage();
      return 2;
    }
  }
  if ((print_bos || tokenize) && !model_path.empty()) {
    if (!verbose) llama_log_set(quiet_log, nullptr);
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
    if (model == nullptr) {
      std::fprintf(stderr, "llama_logits: llama.cpp could not load %s (rerun with --verbose)\n",
                   model_path.c_str());
      return 1;
    }
    const llama_vocab* vocab = llama_model_get_vocab(model);
    if (print_bos) {
      std::printf("%d\n", llama_vocab_bos(vocab));
    } else {
      std::string text;
      char buf[4096];
      size_t got;
      while ((got = std::fread(buf, 1, sizeof buf, stdin)) > 0) text.append(buf, got);
      // No BOS/EOS added and no special-token parsing: the ids of the text alone, as
      // `kvcache tokenize` prints them.
      std::vector<llama_token> out(text.size() + 8);
      const int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()),
                                       out.data(), static_cast<int32_t>(out.size()), false, false);
      if (n < 0) {
        std::fprintf(stderr, "llama_logits: llama_tokenize failed (%d)\n", n);
        return 1;
      }
      for (int32_t i = 0; i < n; ++i)
        std::printf(i == 0 ? "%d" : " %d", out[static_cast<size_t>(i)]);
      std::printf("\n");
    }
    llama_model_free(model);
    return 0;
  }
  if (model_path.empty() || ids_text.empty() || out_path.empty() || threads < 1) {
    usage();
    return 2;
  }
  std::vector<llama_token> ids;
  if (!parse_ids(ids_text, ids)) return 2;
  if (ids.empty()) {
    std::fprintf(stderr, "llama_logits: --prompt-ids holds no ids\n");
    return 2;
  }
  enum llama_flash_attn_type fa_type;
  if (fa == "auto") {
    fa_type = LLAMA_FLASH_ATTN_TYPE_AUTO;
  } else if (fa == "on") {
    fa_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
  } else if (fa == "off") {
    fa_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  } else {
    std::fprintf(stderr, "llama_logits: --flash-attn takes auto, on or off, not %s\n", fa.c_str());
    return 2;
  }

  if (!verbose) llama_log_set(quiet_log, nullptr);
  llama_backend_init();

  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
  if (model == nullptr) {
    std::fprintf(stderr, "llama_logits: llama.cpp could not load %s (rerun with --verbose)\n",
                 model_path.c_str());
    return 1;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  const int n = static_cast<int>(ids.size());
  for (llama_token t : ids) {
    if (t >= n_vocab) {
      std::fprintf(stderr, "llama_logits: token id %d is outside the vocabulary (%d)\n", t,
                   n_vocab);
      return 2;
    }
  }

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(n < 256 ? 256 : n);
  cp.n_batch = static_cast<uint32_t>(n);
  cp.n_ubatch = static_cast<uint32_t>(n);
  cp.n_seq_max = 1;
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  cp.flash_attn_type = fa_type;
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) {
    std::fprintf(stderr, "llama_logits: llama_init_from_model failed\n");
    return 1;
  }

  std::vector<float> out(static_cast<size_t>(n) * static_cast<size_t>(n_vocab));
  const int step = one_by_one ? 1 : n;
  llama_batch batch = llama_batch_init(step, 0, 1);
  for (int start = 0; start < n; start += step) {
    batch.n_tokens = step;
    for (int j = 0; j < step; ++j) {
      batch.token[j] = ids[static_cast<size_t>(start + j)];
      batch.pos[j] = start + j;
      batch.n_seq_id[j] = 1;
      batch.seq_id[j][0] = 0;
      batch.logits[j] = 1;
    }
    const int rc = llama_decode(ctx, batch);
    if (rc != 0) {
      std::fprintf(stderr, "llama_logits: llama_decode returned %d at position %d\n", rc, start);
      return 1;
    }
    for (int j = 0; j < step; ++j) {
      const float* row = llama_get_logits_ith(ctx, j);
      if (row == nullptr) {
        std::fprintf(stderr, "llama_logits: no logits for position %d\n", start + j);
        return 1;
      }
      std::memcpy(&out[static_cast<size_t>(start + j) * static_cast<size_t>(n_vocab)], row,
                  sizeof(float) * static_cast<size_t>(n_vocab));
    }
  }
  llama_batch_free(batch);

  FILE* f = std::fopen(out_path.c_str(), "wb");
  if (f == nullptr || std::fwrite(out.data(), sizeof(float), out.size(), f) != out.size() ||
      std::fclose(f) != 0) {
    std::fprintf(stderr, "llama_logits: could not write %s: %s\n", out_path.c_str(),
                 std::strerror(errno));
    return 1;
  }
  std::fprintf(stderr, "llama_logits: %d positions x %d logits -> %s\n", n, n_vocab,
               out_path.c_str());
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
