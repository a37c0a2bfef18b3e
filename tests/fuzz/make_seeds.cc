// Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/): small valid inputs of
// every kind each parser accepts, made with the project's own writers (GgufWriter,
// write_safetensors) or copied from the real files in ../shared (tok512.bin whole, the first
// bytes of the vocabulary GGUFs and of stories260K.bin). Deterministic; each seed is run through
// its target before the tool finishes, and none is larger than 64 KiB.
//   cmake --build build --target fuzz_make_seeds && build/tests/fuzz_make_seeds tests/fuzz/corpus
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "fuzz_targets.h"
#include "fuzz_util.h"
#include "model/dummy.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "model/weight_spec.h"

namespace kvcache::fuzz {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr size_t kMaxSeedBytes = 64 * 1024;

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw Error(ErrorKind::kIo, p.string() + ": cannot write");
}

void gguf_seeds(const fs::path& dir) {
  {  // a whole tiny llama model with its SentencePiece vocabulary, f32, tied embeddings
    const Vocabulary v = tiny_spm_vocabulary();
    ModelConfig c = tiny_llama_config();
    c.rope_interleaved = true;
    c.vocab_size = v.size();
    GgufWriter w;
    Weights ws;
    gguf_write_llama_config(w, c);
    put_vocabulary(w, v, "llama");
    put_llama_tensors(w, ws, c, DType::kF32);
    w.write((dir / "llama_spm_f32.gguf").string());
  }
  {  // q8_0 matrices (rows of 32), a byte-level BPE vocabulary, alignment 64, linear RoPE
    const Vocabulary v = tiny_bpe_vocabulary();
    ModelConfig c = tiny_llama_config();
    c.rope_interleaved = true;
    c.dim = 32;
    c.hidden_dim = 32;
    c.head_dim = 16;
    c.vocab_size = v.size();
    c.rope_scaling.type = RopeScalingType::kLinear;
    c.rope_scaling.factor = 2.0f;
    GgufWriter w(64);
    Weights ws;
    gguf_write_llama_config(w, c);
    put_vocabulary(w, v, "gpt2");
    w.set("tokenizer.ggml.pre", GgufValue::str("gpt-2"));
    std::vector<std::string> merges;
    for (const auto& [a, b] : tiny_bpe_merges()) merges.push_back(a + " " + b);
    w.set("tokenizer.ggml.merges", GgufValue::str_array(merges));
    put_llama_tensors(w, ws, c, DType::kQ8_0);
    w.write((dir / "llama_bpe_q8_0.gguf").string());
  }
  {  // vocabulary only, Llama 3 pre-tokenizer, f16 and bf16 tensors of no model
    GgufWriter w;
    Weights ws;
    const Vocabulary v = tiny_bpe_vocabulary();
    put_vocabulary(w, v, "gpt2");
    w.set("tokenizer.ggml.pre", GgufValue::str("llama-bpe"));
    std::vector<std::string> merges;
    for (const auto& [a, b] : tiny_bpe_merges()) merges.push_back(a + " " + b);
    w.set("tokenizer.ggml.merges", GgufValue::str_array(merges));
    w.add_tensor("f16.weight", ws.add(DType::kF16, {3, 5}));
    w.add_tensor("bf16.weight", ws.add(DType::kBF16, {7}));
    w.write((dir / "vocab_llama3_pre.gguf").string());
  }
  {  // metadata of every value type, an architecture only the planner reads, sliding window
    GgufWriter w;
    w.set("general.architecture", GgufValue::str("qwen3"));
    w.set("general.name", GgufValue::str("seed"));
    w.set("qwen3.block_count", GgufValue::u32(4));
    w.set("qwen3.attention.head_count", GgufValue::u32(8));
    w.set("qwen3.attention.head_count_kv", GgufValue::i32(2));
    w.set("qwen3.embedding_length", GgufValue::u64(512));
    w.set("qwen3.context_length", GgufValue::u32(32768));
    w.set("qwen3.attention.sliding_window", GgufValue::u32(4096));
    w.set("f32", GgufValue::f32(0.5f));
    w.set("bool", GgufValue::boolean(true));
    w.set("ints", GgufValue::i32_array({-1, 0, 1}));
    w.set("floats", GgufValue::f32_array({0.25f, -2.0f}));
    GgufValue nested;
    nested.type = GgufType::kArray;
    nested.array_type = GgufType::kArray;
    nested.items = {GgufValue::str_array({"a", "b"}), GgufValue::i32_array({7})};
    w.set("nested", nested);
    GgufValue i8;
    i8.type = GgufType::kInt8;
    i8.i = -3;
    w.set("i8", i8);
    GgufValue f64;
    f64.type = GgufType::kFloat64;
    f64.f = 1e300;
    w.set("f64", f64);
    w.write((dir / "metadata_all_types.gguf").string());
  }
  // The start of the real vocabularies: the fuzzer mutates from a real header and key layout.
  for (const char* name : {"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"}) {
    const fs::path real = fs::path(KVCACHE_SHARED_DIR) / "vocab" / name;
    if (fs::exists(real))
      write_file(dir / (std::string("head_of_") + name), read_file(real).substr(0, 16384));
  }
}

// The llama block's tensors under their Hugging Face names (the loader maps them to the GGUF
// names), untied: {name, shape, is a matrix}.
std::vector<WeightSpec> llama_hf_tensors(const ModelConfig& c) {
  const int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  std::vector<WeightSpec> w = {{"model.embed_tokens.weight", {c.vocab_size, c.dim}},
                               {"model.norm.weight", {c.dim}, false},
                               {"lm_head.weight", {c.vocab_size, c.dim}}};
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w.push_back({p + "input_layernorm.weight", {c.dim}, false});
    w.push_back({p + "self_attn.q_proj.weight", {q, c.dim}});
    w.push_back({p + "self_attn.k_proj.weight", {kv, c.dim}});
    w.push_back({p + "self_attn.v_proj.weight", {kv, c.dim}});
    w.push_back({p + "self_attn.o_proj.weight", {c.dim, q}});
    w.push_back({p + "post_attention_layernorm.weight", {c.dim}, false});
    w.push_back({p + "mlp.gate_proj.weight", {c.hidden_dim, c.dim}});
    w.push_back({p + "mlp.up_proj.weight", {c.hidden_dim, c.dim}});
    w.push_back({p + "mlp.down_proj.weight", {c.dim, c.hidden_dim}});
  }
  return w;
}

void safetensors_seeds(const fs::path& dir) {
  const ModelConfig c = tiny_llama_config();
  {  // the tiny llama of tiny_llama_config, f32
    Weights ws;
    std::vector<std::pair<std::string, TensorView>> tensors;
    for (const WeightSpec& s : llama_hf_tensors(c))
      tensors.emplace_back(s.name, ws.add(DType::kF32, s.shape));
    write_safetensors((dir / "llama_f32.safetensors").string(), tensors, {{"format", "pt"}});
  }
  {  // f16 matrices, bf16 norms, an extra tensor the llama block does not use
    Weights ws;
    std::vector<std::pair<std::string, TensorView>> tensors;
    for (const WeightSpec& s : llama_hf_tensors(c))
      tensors.emplace_back(s.name, ws.add(s.matrix ? DType::kF16 : DType::kBF16, s.shape));
    tensors.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", ws.add(DType::kF32, {2}));
    write_safetensors((dir / "llama_f16_bf16.safetensors").string(), tensors);
  }
  json index = {{"metadata", {{"total_size", 1234}}}, {"weight_map", json::object()}};
  for (const WeightSpec& s : llama_hf_tensors(c))
    index["weight_map"][s.name] =
        s.matrix ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  write_file(dir / "model.safetensors.index.json", index.dump(1));
}

void llama2c_checkpoint_seeds(const fs::path& dir) {
  // dim 8, hidden 16, 2 layers, 2 heads over 1 KV head, vocab 32 (negative: own classifier),
  // seq_len 16: the header then every float run.c reads, in its order.
  for (const int32_t vocab : {32, -32}) {
    const int32_t h[7] = {8, 16, 2, 2, 1, vocab, 16};
    const int64_t dim = 8, hidden = 16, layers = 2, hd = 4, kv = 4, v = 32, seq = 16;
    int64_t floats =
        v * dim + layers * (dim + dim * dim + 2 * kv * dim + dim * dim + dim + 3 * hidden * dim) +
        dim + seq * hd;  // freq_cis real + imag
    if (vocab < 0) floats += v * dim;
    std::string bytes(reinterpret_cast<const char*>(h), sizeof(h));
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    for (int64_t i = 0; i < floats; ++i) {
      const float x = u(rng);
      bytes.append(reinterpret_cast<const char*>(&x), sizeof(x));
    }
    write_file(dir / (vocab > 0 ? "tiny_shared.bin" : "tiny_own_classifier.bin"), bytes);
  }
  const fs::path real = fs::path(KVCACHE_SHARED_DIR) / "models/stories260K/stories260K.bin";
  if (fs::exists(real))
    write_file(dir / "head_of_stories260K.bin", read_file(real).substr(0, 4096));
}

void llama2c_tokenizer_seeds(const fs::path& dir) {
  const fs::path real = fs::path(KVCACHE_SHARED_DIR) / "models/stories260K/tok512.bin";
  if (fs::exists(real)) write_file(dir / "tok512.bin", read_file(real));
  // <unk> <s> </s>, the 256 byte tokens, some pieces with scores (the llama2.c layout).
  std::vector<std::pair<std::string, float>> entries = {
      {"<unk>", 0}, {"\n<s>\n", 0}, {"\n</s>\n", 0}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    entries.emplace_back(name, 0.0f);
  }
  float score = -100.0f;
  for (const char* p : {" ", "e", "h", "l", "o", " h", "he", "ll", "llo", "hello", " hello", " w",
                        "or", " wor", "ld", " world", "\xE4\xBD\xA0"})
    entries.emplace_back(p, score += 1.0f);
  std::string bytes;
  const int32_t max_len = 8;
  bytes.append(reinterpret_cast<const char*>(&max_len), 4);
  for (const auto& [piece, s] : entries) {
    const auto len = static_cast<int32_t>(piece.size());
    bytes.append(reinterpret_cast<const char*>(&s), 4);
    bytes.append(reinterpret_cast<const char*>(&len), 4);
    bytes += piece;
  }
  write_file(dir / "tiny_bytes_and_pieces.bin", bytes);
}

void hf_config_seeds(const fs::path& dir) {
  for (const char* preset : {"gemma2-tiny", "gptoss-tiny", "mla-tiny", "gemma3n-tiny"})
    write_file(dir / (std::string(preset) + ".json"), dummy_preset_config_json(preset));
  const std::pair<const char*, const char*> kConfigs[] = {
      {"llama31_rope_llama3.json",
       R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":256,"max_position_embeddings":131072,"rms_norm_eps":1e-5,
"rope_theta":500000.0,"rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
"original_max_position_embeddings":8192},"bos_token_id":1,"eos_token_id":[2,3],"tie_word_embeddings":false})"},
      {"mistral_sliding.json",
       R"({"architectures":["MistralForCausalLM"],"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
"num_attention_heads":4,"num_key_value_heads":1,"vocab_size":300,"sliding_window":16,"head_dim":16})"},
      {"qwen2_window_layers.json",
       R"({"model_type":"qwen2","hidden_size":64,"intermediate_size":96,"num_hidden_layers":4,"num_attention_heads":4,
"num_key_value_heads":2,"vocab_size":300,"use_sliding_window":true,"sliding_window":32,"max_window_layers":2,
"tie_word_embeddings":true,"rope_scaling":{"type":"linear","factor":2.0}})"},
      {"llama_v5_rope_parameters.json",
       R"({"model_type":"llama","hidden_size":32,"intermediate_size":64,"num_hidden_layers":1,"num_attention_heads":2,
"vocab_size":64,"rope_parameters":{"rope_type":"yarn","rope_theta":10000,"factor":4.0,"original_max_position_embeddings":64},
"layer_types":["chunked_attention"],"attention_chunk_size":8})"},
      {"deepseek_v2_moe.json",
       R"({"architectures":["DeepseekV2ForCausalLM"],"hidden_size":32,"intermediate_size":64,"num_hidden_layers":2,
"num_attention_heads":2,"vocab_size":64,"kv_lora_rank":16,"q_lora_rank":0,"qk_nope_head_dim":8,"qk_rope_head_dim":4,
"v_head_dim":8,"n_routed_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":16,"n_shared_experts":1,
"first_k_dense_replace":1,"topk_method":"greedy","scoring_func":"softmax"})"},
      {"gemma3n_multimodal_wrapper.json",
       R"({"architectures":["Gemma3nForConditionalGeneration"],"eos_token_id":1,"text_config":{"hidden_size":32,
"intermediate_size":[64,64],"num_hidden_layers":2,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":16,
"vocab_size":128,"vocab_size_per_layer_input":128,"hidden_size_per_layer_input":8,"laurel_rank":4,
"sliding_window":8,"layer_types":["sliding_attention","full_attention"],"activation_sparsity_pattern":[0.95,0.0]}})"},
      // Planner-only families: linear attention (Qwen3-Next), compressed layers (DeepSeek-V4),
      // Gemma-3's sliding pattern.
      {"plan_qwen3_next_linear.json",
       R"({"model_type":"qwen3_next","num_hidden_layers":8,"num_attention_heads":16,"num_key_value_heads":2,
"head_dim":256,"hidden_size":2048,"full_attention_interval":4,"linear_num_key_heads":16,
"linear_num_value_heads":32,"linear_key_head_dim":128,"linear_value_head_dim":128,"linear_conv_kernel_dim":4,
"num_experts":512,"max_position_embeddings":262144})"},
      {"plan_deepseek_v4_compressed.json",
       R"({"model_type":"deepseek_v4","num_hidden_layers":4,"num_attention_heads":64,"num_key_value_heads":1,
"head_dim":512,"hidden_size":4096,"sliding_window":128,"compress_rates":{"compressed_sparse_attention":4,
"heavily_compressed_attention":128},"layer_types":["sliding_attention","compressed_sparse_attention",
"heavily_compressed_attention","moe"],"num_kv_shared_layers":1,"kvcache_params":284000000000})"},
      {"plan_gemma3_pattern.json",
       R"({"text_config":{"model_type":"gemma3_text","num_hidden_layers":12,"num_attention_heads":8,
"num_key_value_heads":4,"head_dim":256,"hidden_size":2560,"sliding_window":1024,"sliding_window_pattern":6,
"intermediate_size":10240,"vocab_size":262208},"_name_or_path":"seed"})"},
  };
  for (const auto& [name, text] : kConfigs) write_file(dir / name, text);
}

void hf_tokenizer_seeds(const fs::path& dir) {
  const Vocabulary v = tiny_bpe_vocabulary();
  auto tokenizer_json = [&](bool llama3) {
    json vocab = json::object();
    json added = json::array();
    for (int32_t id = 0; id < v.size(); ++id) {
      const std::string& t = v.tokens[static_cast<size_t>(id)];
      const TokenType type = v.types[static_cast<size_t>(id)];
      if (type == TokenType::kNormal) {
        vocab[t] = id;
      } else {
        added.push_back({{"id", id}, {"content", t}, {"special", type != TokenType::kUserDefined}});
      }
    }
    json merges = json::array();
    for (const auto& [a, b] : tiny_bpe_merges())
      merges.push_back(llama3 ? json::array({a, b}) : json(a + " " + b));
    json pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
    if (llama3) {
      const char* kLlama3Regex =
          "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
          "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
          "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
      pre = {{"type", "Sequence"},
             {"pretokenizers",
              {{{"type", "Split"},
                {"pattern", {{"Regex", kLlama3Regex}}},
                {"behavior", "Isolated"},
                {"invert", false}},
               {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    }
    json j = {{"version", "1.0"},
              {"added_tokens", added},
              {"normalizer", nullptr},
              {"pre_tokenizer", pre},
              {"model",
               {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"ignore_merges", llama3}}}};
    return j.dump();
  };
  const std::string config = R"({"bos_token":"<s>","eos_token":{"content":"</s>","special":true}})";
  write_file(dir / "gpt2_bytelevel_with_config.json",
             tokenizer_json(false) + std::string(1, '\0') + config);
  write_file(dir / "llama3_split_regex.json", tokenizer_json(true));
  // SentencePiece-style: the same tokens spelled with U+2581 for the space, byte fallback, unk,
  // ICU normalizers, the Metaspace pre-tokenizer and per-token decoders.
  const std::string meta = "\xE2\x96\x81";
  json vocab = {{"<unk>", 0}, {"<0x41>", 1}, {meta, 2}, {"a", 3}, {"b", 4}, {meta + "a", 5}};
  json spm = {{"version", "1.0"},
              {"added_tokens", json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}}})},
              {"normalizer",
               {{"type", "Sequence"},
                {"normalizers",
                 {{{"type", "NFKC"}},
                  {{"type", "Lowercase"}},
                  {{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}},
                  {{"type", "NFD"}},
                  {{"type", "StripAccents"}}}}}},
              {"pre_tokenizer",
               {{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "WhitespaceSplit"}},
                  {{"type", "Metaspace"},
                   {"replacement", meta},
                   {"prepend_scheme", "first"},
                   {"split", true}}}}}},
              {"decoder",
               {{"type", "Sequence"},
                {"decoders",
                 {{{"type", "Metaspace"}, {"replacement", meta}, {"prepend_scheme", "first"}},
                  {{"type", "ByteFallback"}},
                  {{"type", "Fuse"}},
                  {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
              {"model",
               {{"type", "BPE"},
                {"vocab", vocab},
                {"merges", json::array({meta + " a"})},
                {"unk_token", "<unk>"},
                {"byte_fallback", true},
                {"fuse_unk", true}}}};
  write_file(dir / "spm_metaspace_normalizers.json", spm.dump());
}

void openai_request_seeds(const fs::path& dir) {
  // Bodies as tests/server/server_test.cc sends them, valid and refused.
  const char* kBodies[] = {
      R"({"model":"fuzz-model","prompt":"Hello world","max_tokens":4,"temperature":0.7,"top_p":0.9,"top_k":40,"min_p":0.05,"seed":3,"n":2,"stop":["\n","world"],"stop_token_ids":[2],"stream":true,"stream_options":{"include_usage":true}})",
      R"({"prompt":[1,15,16,17],"max_tokens":0,"echo":true,"logprobs":3,"repetition_penalty":1.1,"ignore_eos":true})",
      R"({"prompt":["one prompt"],"best_of":1,"suffix":"","presence_penalty":0,"frequency_penalty":0,"logit_bias":{}})",
      R"({"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello"},{"role":"developer","content":[{"type":"text","text":"part"}]}],"max_completion_tokens":8,"logprobs":true,"top_logprobs":2})",
      R"({"messages":[{"role":"user","content":"hi"}],"tools":[],"tool_choice":"none","response_format":{"type":"text"},"max_tokens":1})",
      R"({"messages":[{"role":"user","content":"hi"}],"top_logprobs":2})",
      R"({"messages":[{"role":3}]})",
      R"({"prompt":"hi","max_tokens":"ten"})",
      R"({"prompt":"hi","repetition_penalty":1e400})",
      R"({"model":"gpt-9","prompt":"hi"})",
  };
  int i = 0;
  for (const char* b : kBodies) write_file(dir / ("body_" + std::to_string(i++) + ".json"), b);
}

void chat_template_seeds(const fs::path& dir) {
  // Byte 0: bits 0-1 the --chat-template flag, bit 2 the BPE tokenizer (fuzz_chat_template.cc).
  auto input = [](uint8_t flag, const std::string& jinja,
                  const std::vector<std::pair<uint8_t, std::string>>& msgs) {
    std::string s(1, static_cast<char>(flag));
    s += jinja;
    for (const auto& [role, content] : msgs)
      s += std::string(1, '\0') + static_cast<char>(role) + content;
    return s;
  };
  const std::vector<std::pair<uint8_t, std::string>> msgs = {{0, "You are terse."},
                                                             {1, "Hello world <s> [INST]"},
                                                             {2, "hello"},
                                                             {1, "\xE4\xBD\xA0 <|im_end|>"}};
  write_file(dir / "chatml_jinja.bin", input(0,
                                             "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ "
                                             "m.content }}<|im_end|>\n{% endfor %}",
                                             msgs));
  write_file(dir / "llama3_jinja_bpe.bin",
             input(4,
                   "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role "
                   "}}<|end_header_id|>\n\n"
                   "{{ m.content }}<|eot_id|>{% endfor %}",
                   msgs));
  write_file(dir / "llama2_jinja.bin",
             input(0, "{{ bos_token + '[INST] ' + content + ' [/INST]' }}", msgs));
  write_file(
      dir / "unknown_jinja_bpe.bin",
      input(4, "{% for m in messages %}### {{ m.role }}: {{ m.content }}{% endfor %}", msgs));
  write_file(dir / "flag_llama3_system_only.bin", input(3, "", {{0, "only a system prompt"}}));
  write_file(dir / "flag_llama2_no_messages_bpe.bin", input(6, "", {}));
}

void http_seeds(const fs::path& dir) {
  // One request per seed (one file holds two, kept alive): every route, streamed and not, a
  // chunked body, a range, refusals.
  const auto post = [](const std::string& path, const std::string& body) {
    return "POST " + path +
           " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  };
  const auto get = [](const std::string& path, const std::string& extra = "") {
    return "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra + "\r\n";
  };
  write_file(dir / "get_health", get("/health"));
  write_file(dir / "get_models", get("/v1/models"));
  write_file(dir / "get_metrics", get("/metrics"));
  write_file(dir / "range_header", get("/metrics", "Range: bytes=0-10\r\n"));
  write_file(dir / "keep_alive_two", get("/health") + get("/v1/models"));
  write_file(dir / "not_found", "DELETE /v1/nothing HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  write_file(dir / "completion",
             post("/v1/completions",
                  R"({"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})"));
  write_file(
      dir / "completion_stream_logprobs",
      post(
          "/v1/completions",
          R"({"prompt": "hello", "max_tokens": 3, "stream": true, "logprobs": 2, "stream_options": {"include_usage": true}})"));
  write_file(dir / "completion_ids_echo",
             post("/v1/completions",
                  R"({"prompt": [1, 5, 9], "max_tokens": 0, "echo": true, "logprobs": 1})"));
  write_file(
      dir / "completion_n_stop",
      post(
          "/v1/completions",
          R"({"prompt": "a b c", "max_tokens": 5, "n": 2, "stop": [" b", "c"], "seed": 3, "temperature": 0.7})"));
  write_file(
      dir / "chat",
      post(
          "/v1/chat/completions",
          R"({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 3})"));
  write_file(
      dir / "chat_stream",
      post(
          "/v1/chat/completions",
          R"({"messages": [{"role": "user", "content": "hi"}], "stream": true, "logprobs": true, "top_logprobs": 2, "max_completion_tokens": 2})"));
  write_file(dir / "bad_json", post("/v1/completions", R"({"prompt": )"));
  write_file(dir / "chunked_body",
             "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
             "chunked\r\nContent-Type: application/json\r\n\r\n"
             "10\r\n{\"prompt\": \"hi\",\r\nf\r\n \"max_tokens\": 2\r\n1\r\n}\r\n0\r\n\r\n");
}

int run(const fs::path& root) {
  const struct {
    const char* target;
    void (*make)(const fs::path&);
  } kMakers[] = {{"gguf", gguf_seeds},
                 {"safetensors", safetensors_seeds},
                 {"llama2c_checkpoint", llama2c_checkpoint_seeds},
                 {"llama2c_tokenizer", llama2c_tokenizer_seeds},
                 {"hf_config", hf_config_seeds},
                 {"hf_tokenizer", hf_tokenizer_seeds},
                 {"openai_request", openai_request_seeds},
                 {"chat_template", chat_template_seeds},
                 {"http", http_seeds}};
  for (const auto& m : kMakers) {
    fs::create_directories(root / m.target);
    m.make(root / m.target);
  }
  // Every seed must be small and run clean through its own target.
  int bad = 0;
  uintmax_t total = 0;
  for (const Target& t : all_targets()) {
    for (const fs::directory_entry& e : fs::directory_iterator(root / std::string(t.name))) {
      const std::string bytes = read_file(e.path());
      total += bytes.size();
      std::printf("%8zu  %s\n", bytes.size(), e.path().string().c_str());
      if (bytes.size() > kMaxSeedBytes) {
        std::fprintf(stderr, "seed larger than %zu bytes: %s\n", kMaxSeedBytes,
                     e.path().string().c_str());
        ++bad;
      }
      t.run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    }
  }
  std::printf("%8ju  bytes in all\n", total);
  return bad == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvcache::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s tests/fuzz/corpus\n", argv[0]);
    return 2;
  }
  try {
    return kvcache::fuzz::run(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_seeds: %s\n", e.what());
    return 1;
  }
}
