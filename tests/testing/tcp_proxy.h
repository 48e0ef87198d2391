// A real TCP proxy on 127.0.0.1 port 0 for network fault injection: clients
// connect to it, it connects on to a target and pumps bytes both ways. A
// test can cut every connection at once, stop forwarding one direction (the
// bytes are read and thrown away, as when acks are lost), or cut a
// connection after a number of client bytes (a disconnect mid-message).
#ifndef SONDE_TESTS_TESTING_TCP_PROXY_H_
#define SONDE_TESTS_TESTING_TCP_PROXY_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"

namespace sonde::testing {

class TcpProxy {
 public:
  // `target`: "127.0.0.1:PORT".
  explicit TcpProxy(const std::string& target) : target_(target) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(listen_fd_, 16);
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    address_ = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }

  ~TcpProxy() {
    stop_ = true;
    shutdown(listen_fd_, SHUT_RDWR);
    close(listen_fd_);
    accept_thread_.join();
    CutAll();
    std::vector<std::thread> pumps;
    {
      absl::MutexLock lock(&mu_);
      pumps.swap(pumps_);
    }
    for (std::thread& t : pumps) t.join();
  }

  const std::string& address() const { return address_; }

  // Closes every open connection (both sides see a reset or EOF).
  void CutAll() {
    absl::MutexLock lock(&mu_);
    for (int fd : open_fds_) shutdown(fd, SHUT_RDWR);
  }
  // A network partition: while true, every open connection is cut and new
  // ones are closed as soon as they are accepted.
  void set_partitioned(bool on) {
    partitioned_ = on;
    if (on) CutAll();
  }
  // While false, bytes from the target are read and discarded.
  void set_forward_to_client(bool on) { forward_to_client_ = on; }
  // Cuts the next connection made (once) after it has forwarded this many
  // client bytes.
  void CutAfterClientBytes(uint64_t bytes) { cut_after_client_bytes_ = bytes; }

  int connections() const { return connections_.load(); }

 private:
  void AcceptLoop() {
    while (!stop_) {
      const int client = accept(listen_fd_, nullptr, nullptr);
      if (client < 0) return;
      if (partitioned_) {
        close(client);
        continue;
      }
      const int upstream = Connect();
      if (upstream < 0) {
        close(client);
        continue;
      }
      ++connections_;
      absl::MutexLock lock(&mu_);
      open_fds_.push_back(client);
      open_fds_.push_back(upstream);
      pumps_.emplace_back([this, client, upstream] { Pump(client, upstream); });
    }
  }

  int Connect() {
    std::vector<std::string> parts = absl::StrSplit(target_, ':');
    int port = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &port)) return -1;
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    inet_pton(AF_INET, parts[0].c_str(), &addr.sin_addr);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  }

  // Moves bytes both ways until either side closes or the proxy cuts.
  void Pump(int client, int upstream) {
    char buf[64 << 10];
    uint64_t client_bytes = 0;
    const uint64_t cut_after = cut_after_client_bytes_.exchange(0);
    while (true) {
      pollfd fds[2] = {{client, POLLIN, 0}, {upstream, POLLIN, 0}};
      if (poll(fds, 2, 100) < 0) break;
      if (stop_) break;
      bool done = false;
      for (int i = 0; i < 2 && !done; ++i) {
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        const int from = fds[i].fd;
        const int to = i == 0 ? upstream : client;
        size_t want = sizeof(buf);
        if (i == 0 && cut_after > 0) want = std::min<uint64_t>(want, cut_after - client_bytes);
        const ssize_t n = read(from, buf, want);
        if (n <= 0) {
          done = true;
          break;
        }
        if (i == 1 && !forward_to_client_) continue;  // lost on the way back
        if (!WriteAll(to, buf, static_cast<size_t>(n))) done = true;
        if (i == 0) {
          client_bytes += static_cast<uint64_t>(n);
          if (cut_after > 0 && client_bytes >= cut_after) done = true;
        }
      }
      if (done) break;
    }
    absl::MutexLock lock(&mu_);
    shutdown(client, SHUT_RDWR);
    shutdown(upstream, SHUT_RDWR);
    close(client);
    close(upstream);
    open_fds_.erase(std::remove_if(open_fds_.begin(), open_fds_.end(),
                                   [&](int fd) { return fd == client || fd == upstream; }),
                    open_fds_.end());
  }

  static bool WriteAll(int fd, const char* data, size_t n) {
    while (n > 0) {
      const ssize_t w = send(fd, data, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      data += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }

  const std::string target_;
  std::string address_;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<bool> partitioned_{false};
  std::atomic<bool> forward_to_client_{true};
  std::atomic<uint64_t> cut_after_client_bytes_{0};
  std::atomic<int> connections_{0};
  std::thread accept_thread_;
  absl::Mutex mu_;
  std::vector<int> open_fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_TCP_PROXY_H_
