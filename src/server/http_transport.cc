#include "server/http_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace kvcache {

namespace {

using Clock = std::chrono::steady_clock;

// Set while the accepting thread runs a connection it could not give a thread to: that
// connection is answered 503 and closed (see ConnectionPool::enqueue).
thread_local bool t_over_capacity = false;

int to_ms(double seconds) {
  return static_cast<int>(std::clamp(seconds * 1000.0, 0.0, 3.6e6));
}

// poll() for one event, retried on EINTR; > 0 ready, 0 timed out, < 0 error.
int wait_for(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  const Clock::time_point end = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const int r = ::poll(&p, 1, timeout_ms);
    if (r >= 0 || errno != EINTR) return r;
    timeout_ms = static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count()));
  }
}

void address_of(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  const int r = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                     : ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ip.clear();
  port = 0;
  if (r != 0) return;
  char buf[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    port = ntohs(a->sin6_port);
  }
  ip = buf;
}

// One connection's socket. Reads are buffered (cpp-httplib reads request lines a byte at a
// time) and bounded by the request's deadline: the whole request — line, headers, body — must
// arrive within TransportLimits::request_timeout_s of its first byte. The first write ends the
// reading phase (a response only starts once its request was read).
class SocketStream final : public httplib::Stream {
 public:
  SocketStream(int fd, const TransportLimits& limits) : fd_(fd), limits_(limits) {}

  // Waits for the next request's first byte (idle timeout); false: none came, or EOF/error.
  bool wait_for_request() {
    if (begin_ < end_) return true;
    return wait_for(fd_, POLLIN, to_ms(limits_.idle_timeout_s)) > 0;
  }
  void begin_request() {
    deadline_ = Clock::now() + std::chrono::milliseconds(to_ms(limits_.request_timeout_s));
    reading_ = true;
    timed_out_ = false;
  }
  bool timed_out() const { return timed_out_; }

  bool is_readable() const override {
    return begin_ < end_ || wait_for(fd_, POLLIN, read_wait_ms().first) > 0;
  }
  bool is_writable() const override {
    if (wait_for(fd_, POLLOUT, to_ms(limits_.write_timeout_s)) <= 0) return false;
    // Writable also when the peer has gone; a peek tells (EOF or reset: gone).
    if (wait_for(fd_, POLLIN, 0) <= 0) return true;
    char c = 0;
    return ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
  }
  ssize_t read(char* ptr, size_t size) override {
    if (begin_ == end_) {
      const auto [wait, cut] = read_wait_ms();
      if (wait <= 0 || wait_for(fd_, POLLIN, wait) <= 0) {
        if (cut) timed_out_ = true;
        return -1;
      }
      ssize_t n = 0;
      do {
        n = ::recv(fd_, buf_, sizeof buf_, 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      begin_ = 0;
      end_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, end_ - begin_);
    std::memcpy(ptr, buf_ + begin_, n);
    begin_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    reading_ = false;
    size_t done = 0;
    while (done < size) {
      if (wait_for(fd_, POLLOUT, to_ms(limits_.write_timeout_s)) <= 0) return -1;
      const ssize_t n = ::send(fd_, ptr + done, size - done, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return -1;
      done += static_cast<size_t>(n);
    }
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address_of(fd_, true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address_of(fd_, false, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  // How long one read may wait: the request timeout, cut to what is left of the request's
  // deadline (rounded up); second: whether the deadline is what bounds it.
  std::pair<int, bool> read_wait_ms() const {
    const int ms = to_ms(limits_.request_timeout_s);
    if (!reading_) return {ms, false};
    const auto left_us =
        std::chrono::duration_cast<std::chrono::microseconds>(deadline_ - Clock::now()).count();
    const int64_t left = left_us <= 0 ? 0 : (left_us + 999) / 1000;
    return left < ms ? std::pair{static_cast<int>(left), true} : std::pair{ms, false};
  }

  int fd_;
  const TransportLimits& limits_;
  Clock::time_point deadline_{};
  bool reading_ = false, timed_out_ = false;
  char buf_[4096];
  size_t begin_ = 0, end_ = 0;
};

// A request in memory, its response collected (handle_raw).
class MemoryStream final : public httplib::Stream {
 public:
  explicit MemoryStream(std::string_view in) : in_(in) {}
  const std::string& out() const { return out_; }
  bool is_readable() const override { return pos_ < in_.size(); }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, in_.size() - pos_);
    std::memcpy(ptr, in_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    out_.append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 0;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 0;
  }
  socket_t socket() const override { return INVALID_SOCKET; }

 private:
  std::string_view in_;
  size_t pos_ = 0;
  std::string out_;
};

// One thread per open connection, created on demand and kept for the next one, at most
// `max_threads`: a connection never waits in a queue for a thread (a queue of slow clients in
// front of /health was the failure this replaces). Past the cap the accepting thread runs the
// connection itself with t_over_capacity set, which answers 503 without reading.
class ConnectionPool final : public httplib::TaskQueue {
 public:
  explicit ConnectionPool(int max_threads) : max_(static_cast<size_t>(std::max(1, max_threads))) {}
  ~ConnectionPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!stopping_ && busy_ < max_) {
        bool ok = true;
        if (idle_ == 0) {
          try {
            threads_.emplace_back([this] { work(); });
            ++idle_;
          } catch (const std::system_error&) {  // no thread to be had: treat as over capacity
            ok = false;
          }
        }
        if (ok) {
          ++busy_;
          --idle_;
          jobs_.push_back(std::move(fn));
          cv_.notify_one();
          return;
        }
      }
    }
    t_over_capacity = true;
    fn();
    t_over_capacity = false;
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ && threads_.empty()) return;
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !jobs_.empty() || stopping_; });
        if (jobs_.empty()) return;
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
      std::lock_guard<std::mutex> lock(mu_);
      --busy_;
      ++idle_;
    }
  }

  const size_t max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t busy_ = 0, idle_ = 0;
  bool stopping_ = false;
};

}  // namespace

HttpTransport::HttpTransport(const TransportLimits& limits) : limits_(limits) {
  const int threads = limits_.max_connections;
  new_task_queue = [threads] { return new ConnectionPool(threads); };
  set_payload_max_length(limits_.max_body_bytes);
}

HttpTransport::~HttpTransport() = default;

void HttpTransport::reject(socket_t sock) {
  ++rejected_;
  static const std::string body =
      R"({"error":{"message":"too many open connections; retry later","type":"server_error","param":null,"code":"too_many_connections"}})";
  const std::string response =
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\nConnection: close\r\nRetry-After: 1\r\n\r\n" + body;
  // On the accepting thread: never block. A fresh socket's send buffer takes this whole.
  [[maybe_unused]] const ssize_t sent =
      ::send(sock, response.data(), response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  // Reading what already arrived lets close() end with FIN rather than a reset that could
  // discard the 503 before the client reads it.
  char drain[4096];
  while (::recv(sock, drain, sizeof drain, MSG_DONTWAIT) > 0) {
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
}

bool HttpTransport::process_and_close_socket(socket_t sock) {
  if (t_over_capacity) {
    reject(sock);
    return false;
  }
  ++accepted_;
  if (limits_.send_buffer_bytes > 0)
    ::setsockopt(sock, SOL_SOCKET, SO_SNDBUF, &limits_.send_buffer_bytes,
                 sizeof limits_.send_buffer_bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    open_.insert(sock);
  }
  SocketStream strm(sock, limits_);
  bool ret = false;
  for (size_t left = keep_alive_max_count_; left > 0 && svr_sock_ != INVALID_SOCKET; --left) {
    if (!strm.wait_for_request()) break;
    strm.begin_request();
    bool closed = false;
    ret = process_request(strm, left == 1, closed, nullptr);
    if (strm.timed_out()) ++timed_out_;
    if (!ret || closed) break;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    open_.erase(sock);
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ret;
}

void HttpTransport::widen_backlog(int backlog) {
  const socket_t s = svr_sock_;
  if (s != INVALID_SOCKET) ::listen(s, backlog);
}

void HttpTransport::close_connections() {
  std::lock_guard<std::mutex> lock(mu_);
  // shutdown() only: the connection's own thread still closes the descriptor, so no number is
  // closed twice or reused under it.
  for (const socket_t s : open_) ::shutdown(s, SHUT_RDWR);
}

TransportStats HttpTransport::stats() const {
  TransportStats st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    st.open = static_cast<int64_t>(open_.size());
  }
  st.accepted = accepted_.load();
  st.rejected = rejected_.load();
  st.timed_out = timed_out_.load();
  return st;
}

std::string HttpTransport::handle_raw(std::string_view request) {
  MemoryStream strm(request);
  bool closed = false;
  process_request(strm, /*close_connection=*/true, closed, nullptr);
  return strm.out();
}

}  // namespace kvcache
