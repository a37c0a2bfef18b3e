// HttpTransport: cpp-httplib's Server with the connection handling a public server needs and
// Debian's cpp-httplib 0.11 lacks: a cap on open connections (the one past it gets a 503 at
// once, on the accepting thread, instead of queueing behind slow clients), a deadline to
// receive each whole request (headers and body; a client sending a byte every few seconds no
// longer holds a thread for hours), an idle timeout between keep-alive requests, a write timeout,
// and closing every connection at shutdown. HTTP parsing and routing stay cpp-httplib's: this
// class only replaces its per-connection loop (process_and_close_socket, which 0.11 declares
// virtual) and its thread pool. handle_raw() runs the same parser and routes on bytes in
// memory, for fuzzing and tests.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

namespace kvcache {

struct TransportLimits {
  int max_connections = 256;      // open connections; each holds one thread while open
  double request_timeout_s = 10;  // to receive a whole request once its first byte arrived
  double idle_timeout_s = 5;      // between keep-alive requests
  double write_timeout_s = 10;    // one write may block this long (a client not reading)
  size_t max_body_bytes = size_t{8} << 20;
  int send_buffer_bytes = 0;  // SO_SNDBUF of each connection; 0 keeps the kernel's autotuning
};

struct TransportStats {
  int64_t open = 0;       // connections open now
  int64_t accepted = 0;   // served (not rejected) since the start
  int64_t rejected = 0;   // answered 503 because max_connections were open
  int64_t timed_out = 0;  // requests cut by the request deadline
};

class HttpTransport : public httplib::Server {
 public:
  explicit HttpTransport(const TransportLimits& limits);
  ~HttpTransport() override;

  // cpp-httplib 0.11 listens with a backlog of 5: a burst of new connections overflows it and
  // the kernel drops SYNs that clients then resend a second later. Linux lets listen() be called
  // again on a listening socket to change the backlog; call after binding.
  void widen_backlog(int backlog);
  // Shuts every open connection down (their threads see EOF and end). After stop().
  void close_connections();
  TransportStats stats() const;
  // Parses `request` (raw HTTP/1.1 bytes) and runs the matching route as if it came on a
  // connection; returns the raw response bytes (status line, headers, body as sent).
  std::string handle_raw(std::string_view request);

 private:
  bool process_and_close_socket(socket_t sock) override;
  void reject(socket_t sock);

  TransportLimits limits_;
  mutable std::mutex mu_;
  std::set<socket_t> open_;
  std::atomic<int64_t> accepted_{0}, rejected_{0}, timed_out_{0};
};

}  // namespace kvcache
