// A JSON field of the wrong type is bad input: every JSON reader reports it as kvcache::Error
// (kFormat) naming the file, never as a raw nlohmann exception (which the CLI would report
// with exit code 1 instead of 2).
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <string>

#include "core/error.h"
#include "model/hf_config.h"
#include "model/kv_plan.h"
#include "model/tokenizer.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

void expect_format_error_naming(const std::function<void()>& f, const std::string& name) {
  try {
    f();
    FAIL() << "expected kvcache::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

TEST(JsonTypes, HfConfigWrongFieldType) {
  expect_format_error_naming(
      [] { parse_hf_config(R"({"model_type": 5, "num_hidden_layers": 2})", "cfg.json"); },
      "cfg.json");
}

TEST(JsonTypes, PlanConfigWrongFieldType) {
  expect_format_error_naming(
      [] {
        plan_model_from_hf_json(R"({"num_hidden_layers":2,"num_attention_heads":2,"hidden_size":8,
          "intermediate_size":16,"vocab_size":10,"tie_word_embeddings":"yes"})",
                                "plan.json");
      },
      "plan.json");
}

TEST(JsonTypes, TokenizerJsonWrongFieldType) {
  const testing_util::ScratchDir scratch("json_types");
  const std::string path = scratch.file("wrong_type_tokenizer.json");
  std::ofstream(path) << R"({"model": {"type": 7}})";
  expect_format_error_naming([&] { load_hf_tokenizer(path); }, path);
}

}  // namespace
}  // namespace kvcache
