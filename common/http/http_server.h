// A minimal HTTP/1.1 server for operators' endpoints (/metrics, /healthz,
// /readyz): GET only, one response per connection (Connection: close).
//
// One thread runs everything with poll(): it accepts, reads requests, runs
// the handler and writes responses, with every socket non-blocking. So a
// slow or silent client never holds up another scrape (each connection has
// a deadline for its whole exchange), and nothing here ever runs on, or
// waits for, the collector's own threads. Requests are bounded in size and
// open connections in number. Handlers run on that thread: keep them quick.
//
// Answers: the handler's response for a known path and GET; 404 for an
// unknown path; 405 (Allow: GET) for another method; 400 for a malformed
// request; 431 when the request head exceeds max_request_bytes; 408 when the
// request does not arrive in time; 503 when max_connections are open.
//
// Thread-safe. Destroying the server stops it and closes every connection.
#ifndef SONDE_COMMON_HTTP_HTTP_SERVER_H_
#define SONDE_COMMON_HTTP_HTTP_SERVER_H_

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sonde::http {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// Runs on the server's thread for each GET of its path.
using HttpHandler = std::function<HttpResponse()>;

struct HttpServerOptions {
  // host:port to listen on, e.g. "127.0.0.1:9464" or "[::1]:0"; port 0 picks
  // a free port (see HttpServer::address()). Required.
  std::string listen;
  // The whole exchange of one connection (request in, response out) must
  // finish within this. Default 5 s.
  absl::Duration io_timeout = absl::Seconds(5);
  // Largest request head (request line and headers). Default 8 KiB.
  size_t max_request_bytes = 8 << 10;
  // Connections open at once; more are answered 503 and closed. Default 64.
  int max_connections = 64;
};

class HttpServer {
 public:
  // Binds and starts serving `handlers` (path -> handler; the path is
  // matched exactly, query strings ignored). InvalidArgument for bad
  // options, Unavailable if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const HttpServerOptions& options, std::map<std::string, HttpHandler> handlers);
  ~HttpServer();

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The address actually bound, e.g. "127.0.0.1:40123" or "[::1]:40123".
  const std::string& address() const { return address_; }

 private:
  struct Connection;

  HttpServer(HttpServerOptions options, std::map<std::string, HttpHandler> handlers)
      : options_(std::move(options)), handlers_(std::move(handlers)) {}
  void Loop();
  // Parses a complete request head and fills the connection's response.
  void Respond(Connection& c, size_t head_end);

  const HttpServerOptions options_;
  const std::map<std::string, HttpHandler> handlers_;
  std::string address_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: tells the loop to stop
  std::thread thread_;
};

// The reason phrase of a status code ("Not Found"); "Unknown" if not one of
// the codes this server sends.
const char* ReasonPhrase(int status);

}  // namespace sonde::http

#endif  // SONDE_COMMON_HTTP_HTTP_SERVER_H_
