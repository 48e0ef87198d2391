#include "common/http/http_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/http_get.h"
#include "tests/testing/status_matchers.h"

namespace sonde::http {
namespace {

using ::sonde::testing::ConnectTo;
using ::sonde::testing::HttpExchange;
using ::sonde::testing::HttpGet;
using ::sonde::testing::HttpReply;
using ::sonde::testing::ReadReply;
using ::sonde::testing::SendAll;
using ::sonde::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<HttpServer> StartOrDie(HttpServerOptions options,
                                       std::map<std::string, HttpHandler> handlers) {
  auto server = HttpServer::Start(options, std::move(handlers));
  EXPECT_THAT(server, ::sonde::testing::IsOk());
  return server.ok() ? std::move(*server) : nullptr;
}

HttpServerOptions Loopback() {
  HttpServerOptions o;
  o.listen = "127.0.0.1:0";
  return o;
}

std::map<std::string, HttpHandler> Hello() {
  return {{"/hello", [] {
             HttpResponse r;
             r.content_type = "text/plain; version=0.0.4";
             r.body = "hi\n";
             return r;
           }}};
}

TEST(HttpServer, ServesGetWithContentTypeLengthAndClose) {
  auto server = StartOrDie(Loopback(), Hello());
  ASSERT_NE(server, nullptr);
  EXPECT_THAT(server->address(), ::testing::StartsWith("127.0.0.1:"));
  EXPECT_NE(server->address(), "127.0.0.1:0");
  HttpReply reply = HttpGet(server->address(), "/hello");
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.headers["content-type"], "text/plain; version=0.0.4");
  EXPECT_EQ(reply.headers["content-length"], "3");
  EXPECT_EQ(reply.headers["connection"], "close");
  EXPECT_EQ(reply.body, "hi\n");
}

TEST(HttpServer, IgnoresTheQueryString) {
  auto server = StartOrDie(Loopback(), Hello());
  EXPECT_EQ(HttpGet(server->address(), "/hello?x=1").status, 200);
}

TEST(HttpServer, HandlerStatusIsPassedThrough) {
  auto server = StartOrDie(Loopback(), {{"/readyz", [] {
                                          HttpResponse r;
                                          r.status = 503;
                                          r.body = "shutting down\n";
                                          return r;
                                        }}});
  HttpReply reply = HttpGet(server->address(), "/readyz");
  EXPECT_EQ(reply.status, 503);
  EXPECT_EQ(reply.body, "shutting down\n");
  EXPECT_THAT(reply.raw, ::testing::StartsWith("HTTP/1.1 503 Service Unavailable\r\n"));
}

TEST(HttpServer, UnknownPathIs404) {
  auto server = StartOrDie(Loopback(), Hello());
  HttpReply reply = HttpGet(server->address(), "/nope");
  EXPECT_EQ(reply.status, 404);
  EXPECT_THAT(reply.raw, ::testing::StartsWith("HTTP/1.1 404 Not Found\r\n"));
}

TEST(HttpServer, OtherMethodsAre405WithAllow) {
  auto server = StartOrDie(Loopback(), Hello());
  for (const char* method : {"POST", "PUT", "DELETE", "HEAD", "get"}) {
    HttpReply reply = HttpExchange(
        server->address(), absl::StrCat(method, " /hello HTTP/1.1\r\nHost: x\r\n"
                                                "Content-Length: 4\r\n\r\nbody"));
    EXPECT_EQ(reply.status, 405) << method;
    EXPECT_EQ(reply.headers["allow"], "GET") << method;
  }
}

TEST(HttpServer, MalformedRequestLineIs400) {
  auto server = StartOrDie(Loopback(), Hello());
  EXPECT_EQ(HttpExchange(server->address(), "GARBAGE\r\n\r\n").status, 400);
  EXPECT_EQ(HttpExchange(server->address(), "GET /hello SPDY/3\r\n\r\n").status, 400);
  EXPECT_EQ(HttpExchange(server->address(), "GET  /hello HTTP/1.1\r\n\r\n").status, 400);
}

TEST(HttpServer, AcceptsBareLineFeeds) {
  auto server = StartOrDie(Loopback(), Hello());
  EXPECT_EQ(HttpExchange(server->address(), "GET /hello HTTP/1.0\nHost: x\n\n").status, 200);
}

TEST(HttpServer, RequestHeadOverTheLimitIs431) {
  HttpServerOptions options = Loopback();
  options.max_request_bytes = 1024;
  auto server = StartOrDie(options, Hello());
  const std::string big = absl::StrCat("GET /hello HTTP/1.1\r\nX-Fill: ",
                                       std::string(4096, 'a'), "\r\n\r\n");
  HttpReply reply = HttpExchange(server->address(), big);
  EXPECT_EQ(reply.status, 431);
  // A request just under the limit is fine.
  const std::string fits = absl::StrCat("GET /hello HTTP/1.1\r\nX-Fill: ",
                                        std::string(900, 'a'), "\r\n\r\n");
  EXPECT_EQ(HttpExchange(server->address(), fits).status, 200);
}

TEST(HttpServer, SilentClientGets408AndIsClosed) {
  HttpServerOptions options = Loopback();
  options.io_timeout = absl::Milliseconds(50);
  auto server = StartOrDie(options, Hello());
  const int fd = ConnectTo(server->address());
  ASSERT_GE(fd, 0);
  SendAll(fd, "GET /hel");  // never finishes
  HttpReply reply = ReadReply(fd);  // returns once the server closes
  close(fd);
  EXPECT_EQ(reply.status, 408);
}

TEST(HttpServer, SlowClientDoesNotHoldUpOtherScrapes) {
  HttpServerOptions options = Loopback();
  options.io_timeout = absl::Hours(1);  // the slow ones would block forever
  auto server = StartOrDie(options, Hello());
  std::vector<int> slow;
  for (int i = 0; i < 3; ++i) {
    slow.push_back(ConnectTo(server->address()));
    ASSERT_GE(slow.back(), 0);
    SendAll(slow.back(), "GET /hello HTTP/1.1\r\nHost:");
  }
  HttpReply reply = HttpGet(server->address(), "/hello");
  EXPECT_EQ(reply.status, 200);
  for (int fd : slow) {
    // Still open and unanswered: finishing the request now gets a reply.
    pollfd p{fd, POLLIN, 0};
    EXPECT_EQ(poll(&p, 1, 0), 0);
    SendAll(fd, " x\r\n\r\n");
    EXPECT_EQ(ReadReply(fd).status, 200);
    close(fd);
  }
}

TEST(HttpServer, ConnectionsOverTheLimitGet503) {
  HttpServerOptions options = Loopback();
  options.max_connections = 2;
  options.io_timeout = absl::Hours(1);
  auto server = StartOrDie(options, Hello());
  std::vector<int> held;
  for (int i = 0; i < 2; ++i) {
    held.push_back(ConnectTo(server->address()));
    SendAll(held.back(), "G");
  }
  // The server has accepted both once it reads their first byte; a request
  // on a third connection is then refused.
  HttpReply third;
  for (int attempt = 0; attempt < 1000 && third.status != 503; ++attempt) {
    third = HttpGet(server->address(), "/hello");
  }
  EXPECT_EQ(third.status, 503);
  for (int fd : held) close(fd);
}

TEST(HttpServer, ConcurrentScrapesAllSucceed) {
  std::atomic<int> served{0};
  auto server = StartOrDie(Loopback(), {{"/metrics", [&] {
                                           HttpResponse r;
                                           r.body = std::string(100000, 'x');
                                           served.fetch_add(1);
                                           return r;
                                         }}});
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        HttpReply reply = HttpGet(server->address(), "/metrics");
        if (reply.status == 200 && reply.body.size() == 100000) ok.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 400);
  EXPECT_EQ(served.load(), 400);
}

TEST(HttpServer, RejectsBadAddresses) {
  HttpServerOptions options;
  for (const char* bad : {"", "9464", ":9464", "127.0.0.1:", "127.0.0.1:99999", "[::1",
                          "127.0.0.1:http"}) {
    options.listen = bad;
    EXPECT_THAT(HttpServer::Start(options, Hello()),
                StatusIs(absl::StatusCode::kInvalidArgument, "listen address"))
        << bad;
  }
}

TEST(HttpServer, PortInUseIsUnavailable) {
  auto first = StartOrDie(Loopback(), Hello());
  HttpServerOptions options;
  options.listen = first->address();
  EXPECT_THAT(HttpServer::Start(options, Hello()),
              StatusIs(absl::StatusCode::kUnavailable, "cannot listen"));
}

TEST(HttpServer, StopsWithOpenConnections) {
  HttpServerOptions options = Loopback();
  options.io_timeout = absl::Hours(1);
  auto server = StartOrDie(options, Hello());
  const int fd = ConnectTo(server->address());
  SendAll(fd, "GET /hello");
  server.reset();  // must not wait for the client
  HttpReply reply = ReadReply(fd);
  close(fd);
  EXPECT_EQ(reply.status, 0);
}

}  // namespace
}  // namespace sonde::http
