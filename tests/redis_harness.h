// Real redis-server processes for tests: a standalone server, or a Redis Cluster of N masters
// created with `redis-cli --cluster create`, each on a free loopback port, in a temporary
// directory, stopped (SIGTERM, then SIGKILL) and removed by the destructor. Tests skip with the
// reason from redis_unavailable() only where redis-server / redis-cli are absent
// (scripts/install_deps.sh installs both).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "scratch_dir.h"

namespace kvcache::testing_util {

inline bool on_path(const std::string& prog) {
  return std::system(("command -v " + prog + " >/dev/null 2>&1").c_str()) == 0;
}

// Empty when redis-server and redis-cli can run; else why not (for GTEST_SKIP).
inline std::string redis_unavailable() {
  for (const char* p : {"redis-server", "redis-cli"})
    if (!on_path(p))
      return std::string(p) + " not found on PATH (scripts/install_deps.sh installs Debian's " +
             "redis-server and redis-tools)";
  return "";
}

// A loopback TCP port free now (bound to port 0 and released); the cluster bus uses port+10000,
// checked free too.
inline int free_port() {
  for (int attempt = 0; attempt < 200; ++attempt) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ::close(fd);
      continue;
    }
    ::close(fd);
    const int port = ntohs(a.sin_port);
    if (port + 10000 > 65535) continue;
    int fd2 = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in b = a;
    b.sin_port = htons(static_cast<uint16_t>(port + 10000));
    const bool bus_free = ::bind(fd2, reinterpret_cast<sockaddr*>(&b), sizeof b) == 0;
    ::close(fd2);
    if (bus_free) return port;
  }
  throw std::runtime_error("no free loopback port");
}

// Runs a shell command, returning its stdout (stderr appended); exit status in *status.
inline std::string run_capture(const std::string& cmd, int* status = nullptr) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + cmd);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = ::pclose(p);
  if (status) *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

// One redis-server process.
class RedisProcess {
 public:
  // Starts redis-server on `port` with its files in `dir` and `extra` config lines; waits until
  // it answers PING (throws after 10 s).
  RedisProcess(int port, const std::filesystem::path& dir, const std::vector<std::string>& extra)
      : port_(port), dir_(dir) {
    std::filesystem::create_directories(dir_);
    const std::filesystem::path conf = dir_ / "redis.conf";
    {
      std::ofstream f(conf);
      f << "bind 127.0.0.1\nport " << port << "\ndir " << dir_.string()
        << "\nsave \"\"\nappendonly no\nprotected-mode no\ndaemonize no\n"
        << "logfile " << (dir_ / "redis.log").string() << "\n";
      for (const std::string& line : extra) f << line << "\n";
    }
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::execlp("redis-server", "redis-server", conf.c_str(), static_cast<char*>(nullptr));
      std::_Exit(127);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!ping()) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("redis-server on port " + std::to_string(port) +
                                 " exited at start; log: " + (dir_ / "redis.log").string());
      }
      if (std::chrono::steady_clock::now() > until) {
        kill();  // a constructor that throws runs no destructor
        throw std::runtime_error("redis-server on port " + std::to_string(port) +
                                 " did not answer PING in 10 s (a requirepass in `extra`? set "
                                 "it after start with CONFIG SET)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~RedisProcess() { stop(); }
  RedisProcess(const RedisProcess&) = delete;
  RedisProcess& operator=(const RedisProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  std::string cli(const std::string& args, int* status = nullptr) const {
    return run_capture("redis-cli -h 127.0.0.1 -p " + std::to_string(port_) + " " + args, status);
  }
  bool ping() const {
    int st = 0;
    return cli("PING", &st).find("PONG") != std::string::npos && st == 0;
  }
  // Pauses / resumes the process (a hung server: connections open, no replies).
  void pause() const { ::kill(pid_, SIGSTOP); }
  void resume() const { ::kill(pid_, SIGCONT); }
  // SIGKILL, as a crash.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 200; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill();
  }

 private:
  int port_;
  std::filesystem::path dir_;
  pid_t pid_ = -1;
};

// A redis-server on a free port, in dir/<port>: another test process (ctest runs several at
// once) may take the port between free_port() and the server's bind, so a server that exits at
// start is retried on another port, up to 5 times.
inline std::unique_ptr<RedisProcess> start_redis(const std::filesystem::path& dir,
                                                 const std::vector<std::string>& extra) {
  for (int attempt = 1;; ++attempt) {
    const int port = free_port();
    try {
      return std::make_unique<RedisProcess>(port, dir / std::to_string(port), extra);
    } catch (const std::runtime_error&) {
      if (attempt == 5) throw;
    }
  }
}

// A standalone server with LRU eviction under a memory limit (the tier's documented settings).
class RedisStandalone {
 public:
  explicit RedisStandalone(const std::string& maxmemory = "256mb")
      : dir_("redis-standalone"),
        proc_(
            start_redis(dir_.path(), {"maxmemory " + maxmemory, "maxmemory-policy allkeys-lru"})) {}
  RedisProcess& server() { return *proc_; }
  int port() const { return proc_->port(); }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(proc_->port()); }

 private:
  ScratchDir dir_;
  std::unique_ptr<RedisProcess> proc_;
};

// A Redis Cluster of `masters` masters, no replicas, cluster-require-full-coverage no (a dead
// master's slots fail, the others keep serving), created by `redis-cli --cluster create`; ready
// when every node reports cluster_state:ok.
class RedisCluster {
 public:
  explicit RedisCluster(int masters = 3, const std::string& maxmemory = "256mb")
      : dir_("redis-cluster") {
    std::string addrs;
    for (int i = 0; i < masters; ++i) {
      nodes_.push_back(
          start_redis(dir_.path(), {"cluster-enabled yes", "cluster-config-file nodes.conf",
                                    "cluster-node-timeout 1000", "cluster-require-full-coverage no",
                                    "maxmemory " + maxmemory, "maxmemory-policy allkeys-lru"}));
      addrs += " 127.0.0.1:" + std::to_string(nodes_.back()->port());
    }
    int st = 0;
    const std::string out = run_capture(
        "redis-cli --cluster create" + addrs + " --cluster-replicas 0 --cluster-yes", &st);
    if (st != 0) throw std::runtime_error("redis-cli --cluster create failed:\n" + out);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      bool ok = true;
      for (const auto& n : nodes_)
        ok = ok && n->cli("CLUSTER INFO").find("cluster_state:ok") != std::string::npos;
      if (ok) break;
      if (std::chrono::steady_clock::now() > until)
        throw std::runtime_error("the cluster did not reach cluster_state:ok in 20 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  RedisProcess& node(size_t i) { return *nodes_.at(i); }
  size_t size() const { return nodes_.size(); }
  // redis://127.0.0.1:p1,127.0.0.1:p2,... (every node a seed)
  std::string url() const {
    std::string u = "redis://";
    for (size_t i = 0; i < nodes_.size(); ++i)
      u += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(nodes_[i]->port());
    return u;
  }

 private:
  ScratchDir dir_;
  std::vector<std::unique_ptr<RedisProcess>> nodes_;
};

}  // namespace kvcache::testing_util
