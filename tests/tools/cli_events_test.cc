// `kvcache serve --kv-events` and `kvcache events` as processes: the server says where it
// publishes, the subscriber prints the events of a request and of POST /reset_prefix_cache as
// JSON lines and exits after --count; too few events before --timeout is exit 1; bad endpoints
// are exit 2 before anything starts.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
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

// The events and replay addresses `serve --kv-events tcp://127.0.0.1:*` bound, from its stderr.
std::string events_endpoint(const std::string& err, const char* what = "kv events on") {
  std::smatch e;
  return std::regex_search(err, e,
                           std::regex(std::string(what) + " (tcp://127\\.0\\.0\\.1:[0-9]+)"))
             ? std::string(e[1])
             : std::string();
}

// The subscriber runs after the request: ZeroMQ's PUB drops what is published before a
// subscription arrives, so the events come from the replay socket (as a router that starts
// late, or reconnects, gets them), which makes the test independent of timing.
TEST(CliEvents, SubscriberPrintsTheServersEventsAsJsonLines) {
  const testing_util::ScratchDir scratch("cli_events");
  testing_util::ServeChild s;
  ASSERT_TRUE(s.start(
      scratch.str(),
      {"serve", "--model", "dummy:tiny", "--port", "0", "--max-cache-len", "256", "--kv-events",
       "tcp://127.0.0.1:*", "--kv-events-topic", "kv", "--kv-events-replay", "tcp://127.0.0.1:*"}))
      << s.err;
  const std::string events = events_endpoint(s.err);
  const std::string replay = events_endpoint(s.err, "replay on");
  ASSERT_FALSE(events.empty()) << s.err;
  ASSERT_FALSE(replay.empty()) << s.err;
  std::string prompt = "[1";
  for (int i = 1; i < 40; ++i) prompt += ", " + std::to_string(100 + 37 * i % 20000);
  prompt += "]";  // 40 tokens: 2 full blocks of 16
  const testing_util::HttpReply r =
      testing_util::http(s.port, "POST", "/v1/completions",
                         R"({"prompt": )" + prompt + R"(, "max_tokens": 2, "temperature": 0})");
  ASSERT_EQ(r.status, 200) << r.body << "\nserve's stderr:\n" << s.drain_err();
  // The publisher thread sends within its flush interval; the metric says when it has. Waiting
  // for the two blocks before the reset puts the reset's event in a later batch (seq >= 1), which
  // --from-seq 1 below relies on: a loaded host could otherwise flush all three in batch 0.
  const auto wait_published = [&](int n) {
    const std::string line = "kvcache_kv_events_published_total " + std::to_string(n);
    for (int i = 0; i < 200; ++i) {
      if (testing_util::http(s.port, "GET", "/metrics").body.find(line) != std::string::npos)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  };
  ASSERT_TRUE(wait_published(2)) << testing_util::http(s.port, "GET", "/metrics").body;
  ASSERT_EQ(testing_util::http(s.port, "POST", "/reset_prefix_cache").status, 200)
      << "serve's stderr:\n"
      << s.drain_err();
  ASSERT_TRUE(wait_published(3)) << testing_util::http(s.port, "GET", "/metrics").body;
  const testing_util::CliResult got = testing_util::run_cli(
      "events --endpoint " + events + " --replay " + replay + " --topic kv --count 2 --json");
  std::istringstream lines(got.out);
  std::vector<json> ev;
  for (std::string line; std::getline(lines, line);) ev.push_back(json::parse(line));
  ASSERT_EQ(ev.size(), 2u) << got.out;
  EXPECT_EQ(ev[0]["type"], "BlockStored");
  EXPECT_EQ(ev[0]["seq"], 0);
  EXPECT_TRUE(ev[0]["parent_block_hash"].is_null());
  EXPECT_EQ(ev[0]["group_idx"], 0);
  EXPECT_EQ(ev[0]["medium"], "CPU");
  EXPECT_EQ(ev[0]["block_size"], 16);
  ASSERT_GE(ev[0]["block_hashes"].size(), 1u);
  EXPECT_EQ(ev[0]["block_hashes"][0].get<std::string>().size(), 32u);  // 16 bytes in hex
  EXPECT_EQ(ev[0]["token_ids"][0], 1);
  // Both blocks in one event when one step stored them, as vLLM sends a run of new blocks.
  if (ev[0]["block_hashes"].size() == 2u) {
    EXPECT_EQ(ev[1]["type"], "AllBlocksCleared");
  } else {
    EXPECT_EQ(ev[1]["type"], "BlockStored");
  }
  const std::string metrics = testing_util::http(s.port, "GET", "/metrics").body;
  EXPECT_NE(metrics.find("kvcache_kv_events_published_total 3"), std::string::npos) << metrics;
  // --from-seq: from the second batch on, so the first line is what the second line was above.
  const testing_util::CliResult from1 = testing_util::run_cli(
      "events --endpoint " + events + " --replay " + replay + " --from-seq 1 --count 1 --json");
  EXPECT_EQ(from1.exit_code, 0) << from1.err;
  ASSERT_FALSE(from1.out.empty()) << from1.err;
  const json first = json::parse(from1.out.substr(0, from1.out.find('\n')));
  EXPECT_GE(first["seq"], 1) << first;
  for (const json& e : ev)
    if (e["seq"] >= 1) {
      EXPECT_EQ(first, e);
      break;
    }
  EXPECT_EQ(s.stop(), 0);
}

TEST(CliEvents, TooFewEventsBeforeTheTimeoutIsExit1) {
  const testing_util::CliResult r =
      testing_util::run_cli("events --endpoint tcp://127.0.0.1:1 --count 3 --timeout 0.3");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("saw 0 of 3 events"), std::string::npos) << r.err;
  // No --count: whatever came before the timeout is a success.
  EXPECT_EQ(testing_util::run_cli("events --endpoint tcp://127.0.0.1:1 --timeout 0.2").exit_code,
            0);
}

TEST(CliEvents, BadEndpointsAreExit2) {
  const testing_util::CliResult e = testing_util::run_cli("events --endpoint localhost:5557");
  EXPECT_EQ(e.exit_code, 2);
  EXPECT_NE(e.err.find("--endpoint"), std::string::npos) << e.err;
  const testing_util::CliResult f =
      testing_util::run_cli("events --endpoint tcp://127.0.0.1:1 --from-seq 3");
  EXPECT_EQ(f.exit_code, 2);
  EXPECT_NE(f.err.find("--replay"), std::string::npos) << f.err;
  for (const char* args : {"--kv-events 127.0.0.1:5557", "--kv-events tcp://127.0.0.1:99999",
                           "--kv-events-replay tcp://127.0.0.1:5558",
                           "--kv-events tcp://127.0.0.1:* --kv-events-replay ipc://"}) {
    const auto r = testing_util::run_cli(std::string("serve --model dummy:tiny --port 0 ") + args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find("--kv-events"), std::string::npos) << args << ": " << r.err;
  }
}

}  // namespace
}  // namespace kvcache
