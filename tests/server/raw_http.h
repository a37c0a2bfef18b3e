// A deliberately plain HTTP/1.1 client over a TCP socket (no library): the end-to-end tests
// check the server's framing byte by byte, so nothing may parse it for them. One request per
// connection ("Connection: close"); chunked bodies are de-chunked and the raw form kept.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace kvcache::testing_util {

struct HttpReply {
  int status = -1;
  std::string headers;  // status line and header lines, CRLF separated
  std::string body;     // de-chunked
  std::string raw_body;
};

inline int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline std::string request_text(const std::string& method, const std::string& path,
                                const std::string& body, const std::string& extra_headers) {
  std::string r =
      method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + extra_headers;
  if (method == "POST")
    r +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  return r + "\r\n" + body;
}

inline bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

inline std::string dechunk(const std::string& raw) {
  std::string out;
  size_t pos = 0;
  while (pos < raw.size()) {
    const size_t eol = raw.find("\r\n", pos);
    if (eol == std::string::npos) break;
    const size_t len = std::strtoul(raw.substr(pos, eol - pos).c_str(), nullptr, 16);
    if (len == 0) break;
    out += raw.substr(eol + 2, len);
    pos = eol + 2 + len + 2;
  }
  return out;
}

inline HttpReply parse_reply(const std::string& all) {
  HttpReply r;
  const size_t split = all.find("\r\n\r\n");
  if (split == std::string::npos || all.size() < 12) return r;
  r.headers = all.substr(0, split);
  r.status = std::atoi(all.substr(9, 3).c_str());
  r.raw_body = all.substr(split + 4);
  r.body = r.headers.find("Transfer-Encoding: chunked") != std::string::npos ? dechunk(r.raw_body)
                                                                             : r.raw_body;
  return r;
}

// Gives up (status -1) when the server sends nothing for `timeout_s` seconds: a server that
// should answer and hangs fails its test instead of stalling the suite.
inline void set_receive_timeout(int fd, double timeout_s) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout_s);
  tv.tv_usec = static_cast<suseconds_t>((timeout_s - static_cast<double>(tv.tv_sec)) * 1e6);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

inline HttpReply http(int port, const std::string& method, const std::string& path,
                      const std::string& body = "", const std::string& extra_headers = "",
                      double timeout_s = 60) {
  const int fd = connect_loopback(port);
  if (fd < 0) return {};
  set_receive_timeout(fd, timeout_s);
  send_all(fd, request_text(method, path, body, extra_headers));
  std::string all;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;)
    all.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return parse_reply(all);
}

}  // namespace kvcache::testing_util
