// A small real HTTP/1.1 server on 127.0.0.1 port 0 for tests of webhook
// delivery: records each request and answers with the next status code of
// a script (200 once the script runs out). One connection at a time.
#ifndef SONDE_TESTS_TESTING_HTTP_SERVER_H_
#define SONDE_TESTS_TESTING_HTTP_SERVER_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tests/testing/unused_port.h"

namespace sonde::testing {

class TestHttpServer {
 public:
  struct Request {
    std::string method;
    std::string path;
    std::string body;
  };

  explicit TestHttpServer(std::vector<int> statuses = {})
      : statuses_(statuses.begin(), statuses.end()) {
    fd_ = ListenOnLoopback(&port_);
    thread_ = std::thread([this] { Serve(); });
  }

  ~TestHttpServer() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }

  std::string Url(const std::string& path) const {
    return absl::StrCat("http://127.0.0.1:", port_, path);
  }

  // Waits until `n` requests have arrived (or `timeout`); returns them all.
  std::vector<Request> WaitForRequests(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return requests_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return requests_;
  }

  std::vector<Request> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  void Serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      Handle(c);
      close(c);
    }
  }

  void Handle(int c) {
    std::string data;
    char buf[4096];
    size_t header_end = std::string::npos;
    size_t want = 0;
    while (true) {
      pollfd p{c, POLLIN, 0};
      if (poll(&p, 1, 2000) <= 0) return;
      const ssize_t n = read(c, buf, sizeof(buf));
      if (n <= 0) return;
      data.append(buf, n);
      if (header_end == std::string::npos) {
        header_end = data.find("\r\n\r\n");
        if (header_end == std::string::npos) continue;
        const size_t cl = data.find("Content-Length:");
        if (cl != std::string::npos && cl < header_end) {
          size_t v = 0;
          if (absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(data).substr(
                                   cl + 15, data.find("\r\n", cl) - cl - 15)),
                               &v)) {
            want = v;
          }
        }
      }
      if (data.size() >= header_end + 4 + want) break;
    }
    Request r;
    const size_t sp1 = data.find(' ');
    const size_t sp2 = data.find(' ', sp1 + 1);
    r.method = data.substr(0, sp1);
    r.path = data.substr(sp1 + 1, sp2 - sp1 - 1);
    r.body = data.substr(header_end + 4, want);
    int status = 200;
    {
      absl::MutexLock lock(&mu_);
      if (!statuses_.empty()) {
        status = statuses_.front();
        statuses_.pop_front();
      }
      requests_.push_back(std::move(r));
    }
    const std::string reply =
        absl::StrCat("HTTP/1.1 ", status, " Test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    (void)!write(c, reply.data(), reply.size());
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::deque<int> statuses_ ABSL_GUARDED_BY(mu_);
  std::vector<Request> requests_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_HTTP_SERVER_H_
