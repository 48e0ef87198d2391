#include "common/http/http_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
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
using ::testing::Not;

std::unique_ptr<HttpServer> StartOrDie(HttpServerOptions options,
                                       std::map<std::string, HttpRoute> routes) {
  auto server = HttpServer::Start(options, std::move(routes));
  EXPECT_THAT(server, ::sonde::testing::IsOk());
  return server.ok() ? std::move(*server) : nullptr;
}

HttpServerOptions Loopback() {
  HttpServerOptions o;
  o.listen = "127.0.0.1:0";
  return o;
}

std::map<std::string, HttpRoute> Hello() {
  return {{"/hello", {[](const HttpRequest&) {
             HttpResponse r;
             r.content_type = "text/plain; version=0.0.4";
             r.body = "hi\n";
             return r;
           }}}};
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

TEST(HttpServer, RoutesOnThePathAloneWhateverTheQuery) {
  auto server = StartOrDie(Loopback(), Hello());
  EXPECT_EQ(HttpGet(server->address(), "/hello?x=1").status, 200);
  EXPECT_EQ(HttpGet(server->address(), "/hello#frag").status, 200);
  EXPECT_EQ(HttpGet(server->address(), "/hello/?x=1").status, 404);
}

TEST(HttpServer, HandlerStatusIsPassedThrough) {
  auto server = StartOrDie(Loopback(), {{"/readyz", {[](const HttpRequest&) {
                                          HttpResponse r;
                                          r.status = 503;
                                          r.body = "shutting down\n";
                                          return r;
                                        }}}});
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
  auto server = StartOrDie(Loopback(), {{"/metrics", {[&](const HttpRequest&) {
                                           HttpResponse r;
                                           r.body = std::string(100000, 'x');
                                           served.fetch_add(1);
                                           return r;
                                         }}}});
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

// ------------------------------------------------------------ requests

TEST(ParseQuery, DecodesNamesAndValues) {
  auto q = ParseQuery("job=a%2Fb&x=1+2&empty=&flag&&e=%C3%A9&%6Ea%6De=v%25");
  ASSERT_THAT(q, ::sonde::testing::IsOk());
  const std::map<std::string, std::string, std::less<>> want = {
      {"job", "a/b"}, {"x", "1 2"}, {"empty", ""}, {"flag", ""}, {"e", "\xC3\xA9"},
      {"name", "v%"}};
  EXPECT_EQ(*q, want);
  EXPECT_THAT(ParseQuery(""), ::sonde::testing::IsOk());
}

TEST(ParseQuery, MalformedInputIsInvalidArgumentNamingTheParameter) {
  const struct {
    const char* query;
    const char* message;
  } cases[] = {
      {"job=%zz", "query parameter 'job': malformed percent-encoding '%zz'"},
      {"job=ab%4", "query parameter 'job': malformed percent-encoding '%4'"},
      {"job=ab%", "query parameter 'job': malformed percent-encoding '%'"},
      {"jo%g1=x", "query parameter name 'jo%g1': malformed percent-encoding '%g1'"},
      {"=x", "query parameter with an empty name"},
      {"job=a&job=b", "query parameter 'job' is given more than once"},
      {"job=a&j%6Fb=b", "query parameter 'job' is given more than once"},
  };
  for (const auto& c : cases) {
    EXPECT_THAT(ParseQuery(c.query), StatusIs(absl::StatusCode::kInvalidArgument, c.message))
        << c.query;
  }
}

TEST(PercentEncode, KeepsUnreservedAndRoundTrips) {
  EXPECT_EQ(PercentEncode("run-1.a_b~"), "run-1.a_b~");
  EXPECT_EQ(PercentEncode("a b&c=/\"<"), "a%20b%26c%3D%2F%22%3C");
  const std::string bytes = std::string("x\0\xff%+", 5);
  auto back = ParseQuery(absl::StrCat("k=", PercentEncode(bytes)));
  ASSERT_THAT(back, ::sonde::testing::IsOk());
  EXPECT_EQ(back->at("k"), bytes);
}

// Answers with what it was given, one "name=value" per line.
HttpRoute Echo(std::atomic<int>* calls = nullptr) {
  return {[calls](const HttpRequest& r) {
    if (calls != nullptr) calls->fetch_add(1);
    HttpResponse out;
    absl::StrAppend(&out.body, "path=", r.path, "\n");
    for (const auto& [k, v] : r.query) absl::StrAppend(&out.body, "q:", k, "=", v, "\n");
    for (const auto& [k, v] : r.headers) absl::StrAppend(&out.body, "h:", k, "=", v, "\n");
    const std::string* auth = r.Header("authorization");
    absl::StrAppend(&out.body, "auth=", auth != nullptr ? *auth : "(none)", "\n");
    absl::StrAppend(&out.body, "job=", r.QueryParam("job") != nullptr ? *r.QueryParam("job") : "(none)", "\n");
    absl::StrAppend(&out.body, "peer=", r.peer, "\n");
    return out;
  }};
}

TEST(HttpServer, HandlersSeeDecodedQueryHeadersAndPeer) {
  auto server = StartOrDie(Loopback(), {{"/echo", Echo()}});
  HttpReply reply = HttpExchange(server->address(),
                                 "GET /echo?job=team%2Drun+1&x=%3D HTTP/1.1\r\n"
                                 "Host: x\r\n"
                                 "Authorization:   Bearer abc  \r\n"
                                 "X-Dup: 1\r\n"
                                 "x-dup: 2\r\n\r\n");
  ASSERT_EQ(reply.status, 200) << reply.raw;
  EXPECT_THAT(reply.body, HasSubstr("path=/echo\n"));
  EXPECT_THAT(reply.body, HasSubstr("q:job=team-run 1\n"));
  EXPECT_THAT(reply.body, HasSubstr("q:x==\n"));
  EXPECT_THAT(reply.body, HasSubstr("h:authorization=Bearer abc\n"));
  EXPECT_THAT(reply.body, HasSubstr("h:host=x\n"));
  EXPECT_THAT(reply.body, HasSubstr("h:x-dup=1, 2\n"));
  EXPECT_THAT(reply.body, HasSubstr("auth=Bearer abc\n"));
  EXPECT_THAT(reply.body, HasSubstr("job=team-run 1\n"));
  EXPECT_THAT(reply.body, HasSubstr("peer=127.0.0.1:"));
  // No query, no such header.
  HttpReply bare = HttpExchange(server->address(), "GET /echo HTTP/1.0\r\n\r\n");
  EXPECT_THAT(bare.body, HasSubstr("auth=(none)\njob=(none)\n"));
}

TEST(HttpServer, MalformedQueryIs400BeforeTheHandlerRuns) {
  std::atomic<int> calls{0};
  auto server = StartOrDie(Loopback(), {{"/echo", Echo(&calls)}});
  for (const char* target : {"/echo?job=%zz", "/echo?job=a%", "/echo?job=a&job=b", "/echo?=1"}) {
    HttpReply reply = HttpGet(server->address(), target);
    EXPECT_EQ(reply.status, 400) << target;
    EXPECT_THAT(reply.body, HasSubstr("query parameter")) << target;
  }
  HttpReply reply = HttpGet(server->address(), "/echo?job=%zz");
  EXPECT_EQ(reply.body, "query parameter 'job': malformed percent-encoding '%zz' (want '%' and two hex digits)\n");
  EXPECT_EQ(calls.load(), 0);
}

TEST(HttpServer, MalformedHeaderLineIs400WithoutQuotingIt) {
  std::atomic<int> calls{0};
  auto server = StartOrDie(Loopback(), {{"/echo", Echo(&calls)}});
  for (const char* head : {"Authorization Bearer secret-token\r\n", ": x\r\n",
                           "Bad Name: x\r\n", "X-A: 1\r\n  folded secret-token\r\n"}) {
    HttpReply reply = HttpExchange(server->address(),
                                   absl::StrCat("GET /echo HTTP/1.1\r\nHost: x\r\n", head, "\r\n"));
    EXPECT_EQ(reply.status, 400) << head;
    EXPECT_THAT(reply.body, HasSubstr("header line")) << head;
    EXPECT_THAT(reply.body, Not(HasSubstr("secret"))) << head;
  }
  EXPECT_EQ(calls.load(), 0);
}

TEST(HttpServer, ResponseHeadersAreSentOnOneLineEach) {
  auto server = StartOrDie(Loopback(), {{"/h", {[](const HttpRequest&) {
                                           HttpResponse r;
                                           r.status = 401;
                                           r.headers.emplace_back("WWW-Authenticate", "Bearer");
                                           r.headers.emplace_back("X-Evil", "a\r\nSet-Cookie: x=1");
                                           return r;
                                         }}}});
  HttpReply reply = HttpGet(server->address(), "/h");
  EXPECT_EQ(reply.status, 401);
  EXPECT_THAT(reply.raw, ::testing::StartsWith("HTTP/1.1 401 Unauthorized\r\n"));
  EXPECT_EQ(reply.headers["www-authenticate"], "Bearer");
  EXPECT_EQ(reply.headers["x-evil"], "a  Set-Cookie: x=1");
  EXPECT_EQ(reply.headers.count("set-cookie"), 0u);
  EXPECT_EQ(reply.headers["x-content-type-options"], "nosniff");
}

// ------------------------------------------------------------ blocking routes

// A blocking route whose first call tells `started` and waits for
// `release`; later calls (release is then notified) answer at once.
struct SlowRoute {
  absl::Notification started;
  absl::Notification release;
  std::atomic<int> calls{0};
  std::atomic<int> returned{0};

  HttpRoute Route() {
    return {[this](const HttpRequest& r) {
              if (calls.fetch_add(1) == 0) started.Notify();
              release.WaitForNotification();
              HttpResponse out;
              out.body = absl::StrCat("slow ", r.QueryParam("n") != nullptr ? *r.QueryParam("n") : "", "\n");
              returned.fetch_add(1);
              return out;
            },
            /*blocking=*/true};
  }
};

// Sends a GET without reading the reply; the socket, or -1.
int SendGet(const std::string& address, const std::string& target) {
  const int fd = ConnectTo(address);
  if (fd >= 0) SendAll(fd, absl::StrCat("GET ", target, " HTTP/1.1\r\nHost: x\r\n\r\n"));
  return fd;
}

TEST(HttpServer, SlowHandlerDoesNotDelayAFastRoute) {
  SlowRoute slow;
  HttpServerOptions options = Loopback();
  options.io_timeout = absl::Hours(1);
  auto server = StartOrDie(options, {{"/slow", slow.Route()}, {"/healthz", Hello()["/hello"]}});
  const int fd = SendGet(server->address(), "/slow?n=1");
  ASSERT_GE(fd, 0);
  slow.started.WaitForNotification();
  // The slow handler is running and will not return until released: the
  // poll thread must still answer the fast route.
  HttpReply fast = HttpGet(server->address(), "/healthz");
  EXPECT_EQ(fast.status, 200);
  EXPECT_EQ(slow.returned.load(), 0);
  EXPECT_EQ(server->blocking_in_flight(), 1u);
  slow.release.Notify();
  HttpReply reply = ReadReply(fd);
  close(fd);
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body, "slow 1\n");
}

TEST(HttpServer, SlowHandlerOutlivesTheIoTimeout) {
  SlowRoute slow;
  HttpServerOptions options = Loopback();
  options.io_timeout = absl::Milliseconds(100);
  options.blocking_timeout = absl::Hours(1);
  auto server = StartOrDie(options, {{"/slow", slow.Route()}, {"/hello", Hello()["/hello"]}});
  const int fd = SendGet(server->address(), "/slow");
  ASSERT_GE(fd, 0);
  slow.started.WaitForNotification();
  // A connection opened after the slow one gets its 408: so io_timeout has
  // passed for the slow one too, which must still be waiting.
  const int silent = ConnectTo(server->address());
  SendAll(silent, "GET /hel");
  EXPECT_EQ(ReadReply(silent).status, 408);
  close(silent);
  pollfd p{fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0) << "the slow request was answered or closed early";
  slow.release.Notify();
  HttpReply reply = ReadReply(fd);
  close(fd);
  EXPECT_EQ(reply.status, 200);
}

TEST(HttpServer, BlockingTimeoutAnswers503AndDropsTheLateAnswer) {
  SlowRoute slow;
  HttpServerOptions options = Loopback();
  options.blocking_threads = 1;
  options.blocking_queue = 1;
  options.blocking_timeout = absl::Milliseconds(50);
  auto server = StartOrDie(options, {{"/slow", slow.Route()}});
  HttpReply late = HttpGet(server->address(), "/slow");  // returns while the handler waits
  EXPECT_EQ(late.status, 503);
  EXPECT_THAT(late.body, HasSubstr("no answer within 50ms"));
  EXPECT_EQ(slow.returned.load(), 0);
  slow.release.Notify();
  // The pool is usable again: one running (finishing) plus one queued fit.
  options.blocking_timeout = absl::Hours(1);
  HttpReply next = HttpGet(server->address(), "/slow?n=2");
  EXPECT_EQ(next.status, 200);
  EXPECT_EQ(next.body, "slow 2\n");
}

TEST(HttpServer, FullBlockingQueueIs503WithRetryAfter) {
  SlowRoute slow;
  HttpServerOptions options = Loopback();
  options.io_timeout = absl::Hours(1);
  options.blocking_threads = 1;
  options.blocking_queue = 1;
  auto server = StartOrDie(options, {{"/slow", slow.Route()}});
  const int first = SendGet(server->address(), "/slow?n=1");
  slow.started.WaitForNotification();
  // One thread busy, one place in the queue: of two more requests, the one
  // the server reads first is queued, the other refused at once.
  int fds[2] = {SendGet(server->address(), "/slow?n=2"), SendGet(server->address(), "/slow?n=3")};
  pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
  ASSERT_EQ(poll(p, 2, -1), 1) << "exactly one is answered before the release";
  const int refused = (p[0].revents != 0) ? fds[0] : fds[1];
  const int queued = (p[0].revents != 0) ? fds[1] : fds[0];
  HttpReply busy = ReadReply(refused);
  EXPECT_EQ(busy.status, 503);
  EXPECT_EQ(busy.headers["retry-after"], absl::StrCat(kBusyRetryAfterSeconds));
  EXPECT_THAT(busy.body, HasSubstr("busy"));
  slow.release.Notify();
  EXPECT_EQ(ReadReply(first).status, 200);
  EXPECT_EQ(ReadReply(queued).status, 200);
  for (int fd : {first, fds[0], fds[1]}) close(fd);
  EXPECT_EQ(slow.calls.load(), 2);
}

TEST(HttpServer, ZeroQueueRefusesWhileTheThreadIsBusy) {
  SlowRoute slow;
  HttpServerOptions options = Loopback();
  options.io_timeout = absl::Hours(1);
  options.blocking_queue = 0;
  auto server = StartOrDie(options, {{"/slow", slow.Route()}});
  const int first = SendGet(server->address(), "/slow");
  slow.started.WaitForNotification();
  EXPECT_EQ(HttpGet(server->address(), "/slow").status, 503);
  slow.release.Notify();
  EXPECT_EQ(ReadReply(first).status, 200);
  close(first);
}

TEST(HttpServer, StopsWhileASlowHandlerRuns) {
  SlowRoute slow;
  HttpServerOptions options = Loopback();
  options.io_timeout = absl::Hours(1);
  auto server = StartOrDie(options, {{"/slow", slow.Route()}});
  const int running = SendGet(server->address(), "/slow?n=1");
  slow.started.WaitForNotification();
  const int maybe_queued = SendGet(server->address(), "/slow?n=2");
  std::thread stopper([&] { server.reset(); });
  // Connections close at once, while the handler is still running...
  HttpReply cut = ReadReply(running);
  EXPECT_EQ(cut.status, 0) << cut.raw;
  // Queued, still unread, or read after the stop began (503): never run.
  EXPECT_NE(ReadReply(maybe_queued).status, 200);
  EXPECT_EQ(slow.returned.load(), 0);
  // ...and the server waits for it before it is gone; queued work never runs.
  slow.release.Notify();
  stopper.join();
  EXPECT_EQ(slow.calls.load(), 1);
  EXPECT_EQ(slow.returned.load(), 1);
  close(running);
  close(maybe_queued);
}

TEST(HttpServer, RejectsBadBlockingOptionsAndEmptyRoutes) {
  for (auto change : std::vector<std::function<void(HttpServerOptions&)>>{
           [](HttpServerOptions& o) { o.blocking_threads = 0; },
           [](HttpServerOptions& o) { o.blocking_threads = 17; },
           [](HttpServerOptions& o) { o.blocking_queue = -1; },
           [](HttpServerOptions& o) { o.blocking_timeout = absl::ZeroDuration(); }}) {
    HttpServerOptions options = Loopback();
    change(options);
    EXPECT_THAT(HttpServer::Start(options, Hello()),
                StatusIs(absl::StatusCode::kInvalidArgument, "blocking_threads"));
  }
  EXPECT_THAT(HttpServer::Start(Loopback(), {{"/x", HttpRoute()}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "route '/x' has no handler"));
}

}  // namespace
}  // namespace sonde::http
