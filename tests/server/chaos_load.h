// A chaotic load on a running server: many concurrent clients, each sending completions with a
// random prompt, `n`, stop strings, max_tokens and temperature, mostly streamed, and dropping a
// share of the streams at a random point. Every reply that is read to its end is checked (status
// 200, SSE framing ending in [DONE], every chunk valid JSON, no error event). Used by
// tests/server/load_test.cc at a small scale and by bench/bench_chaos.cc at a large one.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "raw_http.h"

namespace kvcache::testing_util {

struct ChaosOptions {
  int clients = 64;
  int requests_per_client = 2;
  uint32_t seed = 1;
  int max_tokens = 24;             // each request: uniform in [1, max_tokens]
  int max_n = 3;                   // each request: uniform in [1, max_n]
  double disconnect_share = 0.25;  // streams dropped after a random number of events
  double non_streamed_share = 0.2;
  double timeout_s = 120;  // a reply stalled this long is a problem
};

struct ChaosResult {
  int64_t requests = 0, completed = 0, disconnected = 0, refused = 0;  // refused: 429/503
  std::vector<std::string> problems;  // anything unexpected, one line each (capped)
  double seconds = 0;
};

namespace chaos_detail {

inline int connect_to(int port, double timeout_s) {
  const int fd = connect_loopback(port);
  if (fd >= 0) set_receive_timeout(fd, timeout_s);
  return fd;
}

inline nlohmann::json random_body(std::mt19937& rng, const ChaosOptions& o, bool stream) {
  static const char* const kWords[] = {"Once", "upon",  "a",    "time", "there", "was", "little",
                                       "girl", "named", "Lily", "she",  "liked", "to",  "play",
                                       "in",   "the",   "park", "with", "her",   "dog", "."};
  constexpr int kNumWords = static_cast<int>(sizeof kWords / sizeof kWords[0]);
  std::string prompt;
  const int words = 2 + static_cast<int>(rng() % 40);
  for (int i = 0; i < words; ++i) prompt += std::string(i ? " " : "") + kWords[rng() % kNumWords];
  nlohmann::json b = {
      {"prompt", prompt},
      {"max_tokens", 1 + static_cast<int>(rng() % static_cast<uint32_t>(o.max_tokens))},
      {"n", 1 + static_cast<int>(rng() % static_cast<uint32_t>(o.max_n))},
      {"temperature", rng() % 2 ? 0.0 : 0.9},
      {"seed", static_cast<int>(rng() % 1000)},
      {"stream", stream}};
  if (rng() % 3 == 0) {
    nlohmann::json stops = nlohmann::json::array();
    const int k = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < k; ++i) stops.push_back(std::string(" ") + kWords[rng() % kNumWords]);
    b["stop"] = stops;
  }
  if (rng() % 4 == 0) b["ignore_eos"] = true;
  return b;
}

// Reads the reply to its end and checks it; "" when it is as expected.
inline std::string check_reply(const std::string& all, bool stream, bool& refused) {
  refused = false;
  const size_t split = all.find("\r\n\r\n");
  if (all.size() < 12 || split == std::string::npos)
    return "no complete HTTP reply (" + std::to_string(all.size()) + " bytes)";
  const int status = std::atoi(all.substr(9, 3).c_str());
  if (status == 429 || status == 503) {
    refused = true;
    return "";
  }
  if (status != 200) return "status " + std::to_string(status) + ": " + all.substr(split + 4, 300);
  std::string body = all.substr(split + 4);
  if (all.substr(0, split).find("Transfer-Encoding: chunked") != std::string::npos) {
    std::string out;
    size_t pos = 0;
    while (pos < body.size()) {
      const size_t eol = body.find("\r\n", pos);
      if (eol == std::string::npos) return "broken chunked framing";
      const size_t len = std::strtoul(body.substr(pos, eol - pos).c_str(), nullptr, 16);
      if (len == 0) break;
      out += body.substr(eol + 2, len);
      pos = eol + 2 + len + 2;
    }
    body = out;
  }
  if (!stream) {
    const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    if (!j.is_object() || j.contains("error") || !j.contains("choices"))
      return "bad reply: " + body.substr(0, 300);
    return "";
  }
  size_t pos = 0;
  std::string last;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos || body.compare(pos, 6, "data: ") != 0)
      return "broken SSE framing";
    last = body.substr(pos + 6, end - pos - 6);
    pos = end + 2;
    if (last == "[DONE]") break;
    const nlohmann::json j = nlohmann::json::parse(last, nullptr, false);
    if (!j.is_object() || j.contains("error")) return "bad event: " + last.substr(0, 300);
  }
  if (last != "[DONE]") return "stream without [DONE]";
  return "";
}

}  // namespace chaos_detail

inline ChaosResult run_chaos(int port, const ChaosOptions& o) {
  ChaosResult res;
  std::mutex mu;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < o.clients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(o.seed * 7919u + static_cast<uint32_t>(c));
      std::uniform_real_distribution<double> unit(0, 1);
      for (int r = 0; r < o.requests_per_client; ++r) {
        const bool stream = unit(rng) >= o.non_streamed_share;
        const bool drop = stream && unit(rng) < o.disconnect_share;
        const int drop_after = 1 + static_cast<int>(rng() % 6);  // "data:" events before dropping
        const std::string body = chaos_detail::random_body(rng, o, stream).dump();
        const int fd = chaos_detail::connect_to(port, o.timeout_s);
        std::string problem, all;
        bool refused = false, dropped = false;
        if (fd < 0) {
          problem = "cannot connect";
        } else {
          const std::string req =
              "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
              "Content-Type: application/json\r\nContent-Length: " +
              std::to_string(body.size()) + "\r\n\r\n" + body;
          ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
          char buf[4096];
          for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
            all.append(buf, static_cast<size_t>(n));
            if (drop) {
              size_t events = 0;
              for (size_t p = all.find("data: "); p != std::string::npos;
                   p = all.find("data: ", p + 1))
                ++events;
              if (events >= static_cast<size_t>(drop_after)) {
                dropped = true;
                break;
              }
            }
          }
          ::close(fd);  // a dropped stream: mid-reply, the server sees a failed write or EOF
          if (!dropped) problem = chaos_detail::check_reply(all, stream, refused);
        }
        std::lock_guard<std::mutex> lock(mu);
        ++res.requests;
        if (dropped)
          ++res.disconnected;
        else if (refused)
          ++res.refused;
        else if (problem.empty())
          ++res.completed;
        if (!problem.empty() && res.problems.size() < 20)
          res.problems.push_back(problem + " <- " + body);
      }
    });
  }
  for (std::thread& t : clients) t.join();
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace kvcache::testing_util
