// `kvcache serve` and `kvcache batch` as processes: the ready line on stderr, a request over a
// plain socket, SIGTERM -> clean exit 0; batch writes one JSON line per input line.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../server/raw_http.h"
#include "cli_util.h"
#include "scratch_dir.h"
#include "serve_child.h"

namespace kvcache {
namespace {

using nlohmann::json;
using testing_util::ServeChild;

TEST(CliServe, PrintsTheReadyLineServesAndStopsOnSigterm) {
  const testing_util::ScratchDir scratch("cli_serve");  // the child's dummy-model cache
  ServeChild s;
  // --cache paged: accepted (it is what serve uses anyway); --max-cache-len sizes the pool.
  ASSERT_TRUE(
      s.start(scratch.str(), {"serve", "--model", "dummy:tiny", "--port", "0", "--max-cache-len",
                              "512", "--cache", "paged", "--kernel", "eager"}))
      << s.err;
  const int port = s.port;
  EXPECT_EQ(testing_util::http(port, "GET", "/health").status, 200);
  // Token-id prompts work with or without a vocabulary.
  const testing_util::HttpReply r =
      testing_util::http(port, "POST", "/v1/completions",
                         R"({"prompt": [1, 450, 4996, 17354], "max_tokens": 5, "temperature": 0})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["usage"]["prompt_tokens"], 4);

  // An idle connection and one stuck in its headers must not hold the stop back until their
  // timeouts: the drain closes every connection.
  const int idle = testing_util::connect_loopback(port);
  const int slow = testing_util::connect_loopback(port);
  ASSERT_TRUE(testing_util::send_all(slow, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(s.stop(), 0) << "serve did not exit 0 within 10 s of SIGTERM";
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);
  ::close(idle);
  ::close(slow);
}

// --kv-bits 4: the pool's pages are 4-bit KIVI (one group per block, the partial block the
// residual), the tokens are those of the dense quantized cache with group = residual = block, and
// the response and /metrics say which pages and policy served. A model whose cache the format
// cannot hold is refused before listening, saying why.
// serve --kv-policy streaming: the requests' default, a request's own kv_policy, usage and
// /metrics say which served; an exact request never hits the streaming request's blocks; a
// policy the paged store cannot run is a 400.
TEST(CliServe, StreamingPolicyPerServerAndPerRequest) {
  const testing_util::ScratchDir scratch("cli_serve_streaming");
  ServeChild s;
  ASSERT_TRUE(
      s.start(scratch.str(), {"serve", "--model", "dummy:tiny", "--port", "0", "--max-cache-len",
                              "512", "--kv-policy", "streaming:sink=4,window=64"}))
      << s.err;
  std::ostringstream prompt_text;  // 40 tokens: two full blocks
  prompt_text << "[1";
  for (int i = 1; i < 40; ++i) prompt_text << ", " << 100 + 37 * i;
  prompt_text << ']';
  const auto ask = [&](const std::string& extra) {
    return testing_util::http(s.port, "POST", "/v1/completions",
                              R"({"prompt": )" + prompt_text.str() +
                                  R"(, "max_tokens": 8, "temperature": 0)" + extra + "}");
  };
  const testing_util::HttpReply a = ask("");
  ASSERT_EQ(a.status, 200) << a.body;
  const json ja = json::parse(a.body);
  EXPECT_EQ(ja["usage"]["kv_cache"]["policy"], "streaming:sink=4,window=64") << a.body;
  EXPECT_EQ(ja["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << a.body;
  const testing_util::HttpReply b = ask(R"(, "kv_policy": "exact")");
  ASSERT_EQ(b.status, 200) << b.body;
  const json jb = json::parse(b.body);
  EXPECT_EQ(jb["usage"]["kv_cache"]["policy"], "exact") << b.body;
  EXPECT_EQ(jb["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << b.body;
  const testing_util::HttpReply c = ask("");
  ASSERT_EQ(c.status, 200) << c.body;
  // a's two full blocks and its tail (a evicted nothing: 48 tokens < the window)
  EXPECT_EQ(json::parse(c.body)["usage"]["prompt_tokens_details"]["cached_tokens"], 39) << c.body;
  const testing_util::HttpReply bad = ask(R"(, "kv_policy": "h2o")");
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_NE(bad.body.find("per KV head by attention"), std::string::npos) << bad.body;
  const testing_util::HttpReply typo = ask(R"(, "kv_policy": "streaming:window=0")");
  EXPECT_EQ(typo.status, 400) << typo.body;
  const std::string metrics = testing_util::http(s.port, "GET", "/metrics").body;
  EXPECT_NE(metrics.find("policy=\"streaming:sink=4,window=64\"} 1"), std::string::npos) << metrics;
  EXPECT_NE(
      metrics.find("kvcache_requests_kv_policy_total{policy=\"streaming:sink=4,window=64\"} 2"),
      std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("kvcache_requests_kv_policy_total{policy=\"exact\"} 1"), std::string::npos)
      << metrics;
  EXPECT_EQ(s.stop(), 0);
}

TEST(CliServe, QuantizedPagesServeTheDenseQuantizedTokensAndSaySo) {
  const testing_util::ScratchDir scratch("cli_serve_quant");
  ServeChild s;
  ASSERT_TRUE(s.start(scratch.str(), {"serve", "--model", "dummy:tiny", "--port", "0",
                                      "--max-cache-len", "512", "--kv-bits", "4"}))
      << s.err;
  std::ostringstream ids_text, prompt_text;  // 40 tokens: two full (packed) blocks + residual
  ids_text << 1;
  prompt_text << "[1";
  for (int i = 1; i < 40; ++i) {
    ids_text << ' ' << 100 + 37 * i;
    prompt_text << ", " << 100 + 37 * i;
  }
  prompt_text << ']';
  const std::string ids = ids_text.str(), prompt = prompt_text.str();
  const testing_util::HttpReply r =
      testing_util::http(s.port, "POST", "/v1/completions",
                         R"({"prompt": )" + prompt + R"(, "max_tokens": 12, "temperature": 0})");
  ASSERT_EQ(r.status, 200) << r.body;
  const json body = json::parse(r.body);
  EXPECT_EQ(body["usage"]["kv_cache"]["pages"], "kivi-4") << r.body;
  EXPECT_EQ(body["usage"]["kv_cache"]["policy"], "exact") << r.body;
  const std::string metrics = testing_util::http(s.port, "GET", "/metrics").body;
  EXPECT_NE(metrics.find("kvcache_kv_cache_info{pages=\"kivi-4\",policy=\"exact\"} 1"),
            std::string::npos)
      << metrics;
  EXPECT_EQ(s.stop(), 0);
  // batch on the same pages: the tokens of the dense quantized cache with group = residual =
  // 16 (the block), alone and after a prefix hit on the packed blocks.
  const std::string in = scratch.file("q.jsonl");
  {
    std::ofstream f(in);
    f << R"({"prompt": )" << prompt << R"(, "max_tokens": 12, "temperature": 0})"
      << "\n";
    f << R"({"prompt": )" << prompt << R"(, "max_tokens": 12, "temperature": 0})"
      << "\n";
  }
  const testing_util::CliResult b = testing_util::run_cli(
      "batch --model dummy:tiny --kv-bits 4 --max-running 1 --input '" + in + "'");
  ASSERT_EQ(b.exit_code, 0) << b.err;
  std::vector<json> lines;
  {
    std::istringstream ss(b.out);
    for (std::string l; std::getline(ss, l);) lines.push_back(json::parse(l));
  }
  ASSERT_EQ(lines.size(), 2u) << b.out;
  EXPECT_EQ(lines[0]["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << lines[0];
  EXPECT_EQ(lines[1]["usage"]["prompt_tokens_details"]["cached_tokens"], 32) << lines[1];
  const testing_util::CliResult g = testing_util::run_cli(
      "generate --model dummy:tiny --prompt-ids '" + ids +
      "' -n 12 --temp 0 --output ids --cache quantized --kv-bits 4 --kv-group 16 "
      "--kv-residual 16");
  ASSERT_EQ(g.exit_code, 0) << g.err;
  std::vector<int> want;
  {
    std::istringstream ss(g.out);
    for (int t; ss >> t;) want.push_back(t);
  }
  const std::vector<int> got = lines[0]["choices"][0]["tokens"].get<std::vector<int>>();
  ASSERT_GE(want.size(), got.size()) << g.out;
  want.erase(want.begin(), want.end() - static_cast<std::ptrdiff_t>(got.size()));
  EXPECT_EQ(got, want) << g.out;
  EXPECT_EQ(lines[1]["choices"][0]["tokens"], lines[0]["choices"][0]["tokens"]);

  const auto mla = testing_util::run_cli("serve --model dummy:mla-tiny --port 0 --kv-bits 4");
  EXPECT_EQ(mla.exit_code, 2) << mla.err;
  EXPECT_NE(mla.err.find("MLA"), std::string::npos) << mla.err;
}

TEST(CliServe, BadSettingsExitWith2BeforeListening) {
  for (const char* args :
       {"--port 70000", "--port 0 --default-max-tokens 0", "--port 0 --max-running 0",
        "--port 0 --max-connections 0", "--port 0 --request-timeout 0",
        "--port 0 --idle-timeout -1", "--port 0 --write-timeout 0", "--port 0 --drain-timeout 0",
        "--port 0 --max-body-bytes 10", "--port 0 --max-prompt-tokens -1",
        "--port 0 --max-running 4 --max-n 8", "--port 0 --max-stop-bytes 0",
        "--port 0 --max-stop-strings -1"}) {
    const auto r = testing_util::run_cli(std::string("serve --model dummy:tiny ") + args);
    EXPECT_EQ(r.exit_code, 2) << args;
    const std::string flag = std::string(args).substr(std::string(args).rfind("--"));
    EXPECT_NE(r.err.find(flag.substr(0, flag.find(' '))), std::string::npos)
        << args << ": " << r.err;
  }
}

TEST(CliServe, TheDiskTierKeepsThePrefixCacheAcrossARestart) {
  const testing_util::ScratchDir scratch("cli_serve_disk");
  const std::string disk = scratch.file("kv");
  const std::vector<std::string> args = {"serve", "--model",          "dummy:tiny", "--port",
                                         "0",     "--max-cache-len",  "512",        "--kv-disk",
                                         disk,    "--kv-disk-budget", "64MiB"};
  std::string prompt = "[1";
  for (int i = 0; i < 69; ++i) prompt += ", " + std::to_string(100 + 37 * i % 20000);
  prompt += "]";
  const std::string body = R"({"prompt": )" + prompt + R"(, "max_tokens": 4, "temperature": 0})";
  json first;
  {
    ServeChild s;
    ASSERT_TRUE(s.start(scratch.str(), args)) << s.err;
    const auto r = testing_util::http(s.port, "POST", "/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    first = json::parse(r.body);
    EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    ASSERT_EQ(s.stop(), 0);  // the RAM prefix cache goes to disk as the engine ends
  }
  ServeChild s;
  ASSERT_TRUE(s.start(scratch.str(), args)) << s.err;
  EXPECT_NE(s.err.find("disk tier"), std::string::npos) << s.err;
  const auto r = testing_util::http(s.port, "POST", "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json again = json::parse(r.body);
  EXPECT_EQ(again["choices"][0]["text"], first["choices"][0]["text"]);
  const json& details = again["usage"]["prompt_tokens_details"];
  EXPECT_EQ(details["cached_tokens"], 64) << r.body;  // 4 full blocks of 16
  EXPECT_EQ(details["cached_tokens_disk"], 64) << r.body;
  EXPECT_EQ(details["cached_tokens_ram"], 0) << r.body;
  const std::string metrics = testing_util::http(s.port, "GET", "/metrics").body;
  EXPECT_NE(metrics.find("kvcache_prompt_tokens_cached_by_tier_total{tier=\"disk\"} 64"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("\nkvcache_disk_hits_total 4\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\nkvcache_disk_budget_bytes 67108864\n"), std::string::npos) << metrics;
  EXPECT_EQ(s.stop(), 0);
}

TEST(CliServe, KvDiskBudgetWithoutKvDiskIsRefused) {
  for (const char* cmd : {"serve --port 0", "batch --input /dev/null"}) {
    const auto r =
        testing_util::run_cli(std::string(cmd) + " --model dummy:tiny --kv-disk-budget 1GiB");
    EXPECT_EQ(r.exit_code, 2) << cmd;
    EXPECT_NE(r.err.find("--kv-disk-budget"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--kv-disk"), std::string::npos) << r.err;
  }
  const auto r = testing_util::run_cli(
      "serve --port 0 --model dummy:tiny --kv-disk /tmp/x "
      "--kv-disk-budget lots");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--kv-disk-budget"), std::string::npos) << r.err;
}

TEST(CliBatch, WritesOneJsonLinePerRequestInInputOrder) {
  const testing_util::ScratchDir scratch("cli_batch");
  const std::string in = scratch.file("in.jsonl");
  std::ofstream(in)
      << R"({"id": "a", "prompt": [1, 450, 4996], "max_tokens": 4, "temperature": 0, "logprobs": 1})"
      << "\n"
      << R"({"prompt": [1, 450, 4996], "max_tokens": 6, "temperature": 0, "n": 2})"
      << "\n"
      << R"({"prompt": [], "max_tokens": 2})"
      << "\n"
      << "not json\n"
      << R"({"prompt": [1, 450], "max_tokens": 1e400})"
      << "\n"  // parses, out of range
      << R"({"prompt": [1, 450], "max_tokens": 2, "top_k": -1})"
      << "\n"
      << R"({"prompt": [1, 450, 4996], "max_tokens": 0, "echo": true, "logprobs": 0})"
      << "\n";
  const auto r =
      testing_util::run_cli("batch --model dummy:tiny --max-cache-len 256 --input '" + in + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<json> lines;
  std::istringstream ss(r.out);
  for (std::string l; std::getline(ss, l);) lines.push_back(json::parse(l));
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_EQ(lines[0]["id"], "a");
  EXPECT_EQ(lines[0]["choices"][0]["tokens"].size(), 4u);
  EXPECT_EQ(lines[0]["choices"][0]["logprobs"]["token_logprobs"].size(), 4u);  // asked for
  EXPECT_FALSE(lines[1]["choices"][0].contains("logprobs"));                   // not asked for
  EXPECT_EQ(lines[0]["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(lines[1]["choices"].size(), 2u);
  // Greedy: the 4 tokens of request a are the start of request b's 6.
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(lines[1]["choices"][0]["tokens"][i], lines[0]["choices"][0]["tokens"][i]);
  EXPECT_TRUE(lines[1]["stats"].contains("ttft_s"));
  EXPECT_TRUE(lines[2].contains("error"));
  EXPECT_TRUE(lines[3].contains("error"));
  EXPECT_NE(lines[4].value("error", "").find("out_of_range"), std::string::npos) << lines[4];
  EXPECT_NE(lines[5].value("error", "").find("top_k"), std::string::npos) << lines[5];
  // echo: the prompt scored (the first token has no score), nothing generated.
  const json& echo = lines[6]["choices"][0];
  EXPECT_TRUE(echo["tokens"].empty()) << lines[6];
  ASSERT_EQ(echo["logprobs"]["token_logprobs"].size(), 3u) << lines[6];
  EXPECT_TRUE(echo["logprobs"]["token_logprobs"][0].is_null());
  EXPECT_LT(echo["logprobs"]["token_logprobs"][2].get<double>(), 0.0);
}

}  // namespace
}  // namespace kvcache
