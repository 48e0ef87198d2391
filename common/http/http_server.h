// A minimal HTTP/1.1 server for operators' endpoints (/metrics, /healthz,
// /readyz, the job reports): GET only, one response per connection
// (Connection: close).
//
// One thread runs the sockets with poll(): it accepts, reads requests and
// writes responses, with every socket non-blocking. So a slow or silent
// client never holds up another scrape (each connection has deadlines), and
// nothing here ever runs on, or waits for, the collector's own threads.
// Requests are bounded in size and open connections in number.
//
// Handlers see an HttpRequest: the path, the percent-decoded query
// parameters, the header fields and the peer. A route's handler runs either
//  - on the poll thread (the default): it must be quick (a scrape, a probe);
//    nothing else is served while it runs;
//  - or, for a route marked `blocking`, on a small pool of its own
//    (blocking_threads) fed by a bounded queue (blocking_queue). The poll
//    thread goes on serving other connections and writes the response when
//    the handler returns. The request has blocking_timeout (not io_timeout)
//    to wait for a thread and run; past it the client gets 503 and the
//    handler's answer, when it comes, is dropped. When every thread is busy
//    and the queue is full, the client gets 503 with Retry-After.
//
// Answers: the handler's response for a known path and GET; 404 for an
// unknown path; 405 (Allow: GET) for another method; 400 for a malformed
// request (request line, header line, or query string: bad percent-encoding,
// an empty or repeated parameter name); 431 when the request head exceeds
// max_request_bytes; 408 when the request does not arrive in time; 503 when
// max_connections are open, when the blocking queue is full, or when a
// blocking handler outlives blocking_timeout.
//
// Thread-safe. Destroying the server stops it and closes every connection
// at once; it then waits for blocking handlers already running to return
// (their answers are dropped) and never starts the queued ones.
#ifndef SONDE_COMMON_HTTP_HTTP_SERVER_H_
#define SONDE_COMMON_HTTP_HTTP_SERVER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace sonde::http {

// What a handler is given. Plain data; the handler gets a const reference
// valid for the duration of the call.
struct HttpRequest {
  // The request target's path as sent, without query or fragment, e.g.
  // "/report" (not percent-decoded: routes match it exactly).
  std::string path;
  // Query parameters, names and values percent-decoded ('+' is a space). A
  // parameter without '=' has an empty value. Names are unique (a repeated
  // name is answered 400 before any handler runs).
  std::map<std::string, std::string, std::less<>> query;
  // Header fields: names lower-cased, values without surrounding
  // whitespace; a field sent more than once has its values joined with ", ".
  std::map<std::string, std::string, std::less<>> headers;
  // The client's address, e.g. "127.0.0.1:51234"; for logs.
  std::string peer;

  // The query parameter `name`, or null when absent.
  const std::string* QueryParam(absl::string_view name) const;
  // The header field `name` (give it lower-cased), or null when absent.
  const std::string* Header(absl::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  // More header fields, e.g. {"WWW-Authenticate", "Bearer"}. The server
  // always sends Content-Type, Content-Length, Cache-Control: no-store,
  // X-Content-Type-Options: nosniff and Connection: close itself. CR and LF
  // in names or values are sent as spaces (no header injection).
  std::vector<std::pair<std::string, std::string>> headers;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpRoute {
  HttpHandler handler;
  // false (default): runs on the poll thread; keep it to a scrape's cost.
  // true: runs on the blocking pool under blocking_timeout (see above).
  bool blocking = false;
  // Blocking routes only: runs on the poll thread before the request is
  // queued. An answer it returns is sent at once (e.g. a refused token), so
  // requests that would be refused never hold a place in the queue. Keep it
  // to a lookup. Empty: every request is queued.
  std::function<std::optional<HttpResponse>(const HttpRequest&)> admit;
};

struct HttpServerOptions {
  // host:port to listen on, e.g. "127.0.0.1:9464" or "[::1]:0"; port 0 picks
  // a free port (see HttpServer::address()). Required.
  std::string listen;
  // Reading one request, and writing one response, must each finish within
  // this (for routes on the poll thread: the whole exchange). Default 5 s.
  absl::Duration io_timeout = absl::Seconds(5);
  // Largest request head (request line and headers). Default 8 KiB.
  size_t max_request_bytes = 8 << 10;
  // Connections open at once; more are answered 503 and closed. Default 64.
  int max_connections = 64;
  // Threads running blocking routes' handlers, 1 to 16; started only when
  // some route is blocking. Default 1.
  int blocking_threads = 1;
  // Blocking requests that may wait for a thread (beyond those running);
  // more are answered 503 with Retry-After. 0 to 1024. Default 4.
  int blocking_queue = 4;
  // How long a blocking request may wait for a thread and run its handler,
  // from the moment its request head is read; replaces io_timeout for that
  // span. Past it: 503. Default 60 s.
  absl::Duration blocking_timeout = absl::Seconds(60);
};

// The Retry-After (seconds) sent with 503 when the blocking queue is full.
inline constexpr int kBusyRetryAfterSeconds = 5;

class HttpServer {
 public:
  // Binds and starts serving `routes` (path -> route; the path is matched
  // exactly, query strings and fragments aside). InvalidArgument for bad
  // options or a route without a handler, Unavailable if the address cannot
  // be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           std::map<std::string, HttpRoute> routes);
  ~HttpServer();

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The address actually bound, e.g. "127.0.0.1:40123" or "[::1]:40123".
  const std::string& address() const { return address_; }

  // Blocking requests accepted and not finished (queued or running,
  // including handlers still running past their timeout).
  size_t blocking_in_flight() const;

 private:
  struct Connection;
  // A blocking request handed to the pool.
  struct Work {
    uint64_t connection = 0;
    const HttpHandler* handler = nullptr;  // into routes_
    HttpRequest request;
  };

  HttpServer(HttpServerOptions options, std::map<std::string, HttpRoute> routes)
      : options_(std::move(options)), routes_(std::move(routes)) {}
  void Loop();
  void WorkerLoop();
  // Parses a complete request head and either fills the connection's
  // response or hands the request to the blocking pool.
  void Respond(Connection& c, size_t head_end);
  // Drops `connection`'s queued work, if still queued.
  void Cancel(uint64_t connection);

  const HttpServerOptions options_;
  const std::map<std::string, HttpRoute> routes_;
  std::string address_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: tells the loop to stop
  int done_fd_ = -1;  // eventfd: a blocking handler has answered
  std::thread thread_;
  std::vector<std::thread> workers_;

  mutable absl::Mutex work_mu_;
  absl::CondVar work_cv_;  // queue_ non-empty or stopping_
  std::deque<Work> queue_ ABSL_GUARDED_BY(work_mu_);
  // Answers of blocking handlers, by connection id, for the loop to send.
  std::vector<std::pair<uint64_t, HttpResponse>> done_ ABSL_GUARDED_BY(work_mu_);
  size_t in_flight_ ABSL_GUARDED_BY(work_mu_) = 0;  // queued + running
  bool stopping_ ABSL_GUARDED_BY(work_mu_) = false;
};

// The reason phrase of a status code ("Not Found"); "Unknown" if not one of
// the codes this server or its users send.
const char* ReasonPhrase(int status);

// Parses a query string ("a=1&b=x%20y", without the '?'): names and values
// percent-decoded, '+' as a space. InvalidArgument naming the parameter for
// malformed percent-encoding (a '%' not followed by two hex digits), an
// empty name, or a name given twice. Empty pieces ("a=1&&b=2") are skipped.
absl::StatusOr<std::map<std::string, std::string, std::less<>>> ParseQuery(
    absl::string_view query);

// Percent-encodes everything but RFC 3986's unreserved characters
// (A-Z a-z 0-9 - . _ ~), for building query strings.
std::string PercentEncode(absl::string_view text);

}  // namespace sonde::http

#endif  // SONDE_COMMON_HTTP_HTTP_SERVER_H_
