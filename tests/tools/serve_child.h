// `kvcache serve` as a child process (the CLI tests' one way to start it): waits for the ready
// line on stderr, SIGTERM to stop (exit status), SIGKILL after 10 s.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace kvcache::testing_util {

// `kvcache serve` as a child process on a free port; the ready line's port, SIGTERM to stop.
struct ServeChild {
  pid_t pid = -1;
  int port = 0;
  std::string err;
  int err_fd = -1;
  bool start(const std::string& cache, const std::vector<std::string>& args) {
    int err_pipe[2];
    if (::pipe(err_pipe) != 0) return false;
    pid = ::fork();
    if (pid < 0) return false;
    if (pid == 0) {
      ::dup2(err_pipe[1], 2);
      ::close(err_pipe[0]);
      ::setenv("XDG_CACHE_HOME", cache.c_str(), 1);
      std::vector<char*> argv = {const_cast<char*>(KVCACHE_CLI)};
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(KVCACHE_CLI, argv.data());
      ::_exit(127);
    }
    ::close(err_pipe[1]);
    err_fd = err_pipe[0];
    std::smatch m;
    const std::regex ready("listening on http://127\\.0\\.0\\.1:([0-9]+)\n");
    char buf[256];
    while (!std::regex_search(err, m, ready)) {
      const ssize_t n = ::read(err_fd, buf, sizeof buf);
      if (n <= 0) return false;
      err.append(buf, static_cast<size_t>(n));
    }
    port = std::stoi(m[1]);
    return true;
  }
  // What the child wrote to stderr since the ready line, without waiting (a failed request's
  // diagnosis: a sanitizer report, an error).
  std::string drain_err() {
    if (err_fd < 0) return err;
    const int flags = ::fcntl(err_fd, F_GETFL);
    ::fcntl(err_fd, F_SETFL, flags | O_NONBLOCK);
    char buf[4096];
    for (ssize_t n; (n = ::read(err_fd, buf, sizeof buf)) > 0;)
      err.append(buf, static_cast<size_t>(n));
    ::fcntl(err_fd, F_SETFL, flags);
    return err;
  }
  int stop() {  // exit status, or -1 when it had to be killed
    if (pid <= 0) return -1;
    ::kill(pid, SIGTERM);
    int status = 0;
    pid_t done = 0;
    for (int i = 0; i < 200 && done == 0; ++i) {
      done = ::waitpid(pid, &status, WNOHANG);
      if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (done == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    }
    pid = -1;
    if (err_fd >= 0) ::close(err_fd);
    err_fd = -1;
    return done != 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ~ServeChild() { stop(); }
};

}  // namespace kvcache::testing_util
