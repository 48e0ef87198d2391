#include "common/http/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace sonde::http {
namespace {

// After the response, how long a connection may still send what we did not
// read (so closing does not reset the connection under the response).
constexpr absl::Duration kLinger = absl::Milliseconds(500);
// Connections accepted per turn of the loop.
constexpr int kAcceptBatch = 16;
constexpr int kMaxBlockingThreads = 16;
constexpr int kMaxBlockingQueue = 1024;

// A header name or value goes out on one line, whatever the handler gave.
std::string OneLine(absl::string_view text) {
  std::string out(text);
  for (char& ch : out) {
    if (ch == '\r' || ch == '\n') ch = ' ';
  }
  return out;
}

std::string Serialize(const HttpResponse& r) {
  std::string out = absl::StrCat("HTTP/1.1 ", r.status, " ", ReasonPhrase(r.status), "\r\n",
                                 "Content-Type: ", OneLine(r.content_type), "\r\n",
                                 "Content-Length: ", r.body.size(), "\r\n",
                                 "Cache-Control: no-store\r\n",
                                 "X-Content-Type-Options: nosniff\r\n", "Connection: close\r\n");
  for (const auto& [name, value] : r.headers) {
    absl::StrAppend(&out, OneLine(name), ": ", OneLine(value), "\r\n");
  }
  out += "\r\n";
  out += r.body;
  return out;
}

HttpResponse Plain(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

int HexValue(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

// One name or value of a query string, percent-decoded, '+' as a space.
absl::StatusOr<std::string> DecodeComponent(absl::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '+') {
      out += ' ';
    } else if (in[i] == '%') {
      const int hi = i + 1 < in.size() ? HexValue(in[i + 1]) : -1;
      const int lo = i + 2 < in.size() ? HexValue(in[i + 2]) : -1;
      if (hi < 0 || lo < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "malformed percent-encoding '", in.substr(i, 3), "' (want '%' and two hex digits)"));
      }
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      out += in[i];
    }
  }
  return out;
}

// The header fields of a request head split into lines (CR removed); the
// first line is the request line. Messages never quote a line: it may hold
// a credential.
absl::Status ParseHeaders(const std::vector<absl::string_view>& lines, HttpRequest& request) {
  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    if (line.empty()) continue;  // the blank line that ends the head
    if (line[0] == ' ' || line[0] == '\t') {
      return absl::InvalidArgumentError(
          absl::StrCat("header line ", i, " is folded (obsolete; not supported)"));
    }
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || colon == 0 ||
        line.substr(0, colon).find_first_of(" \t") != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("header line ", i, " is not 'Name: value'"));
    }
    std::string name = absl::AsciiStrToLower(line.substr(0, colon));
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    auto [it, inserted] = request.headers.emplace(std::move(name), std::string(value));
    if (!inserted) absl::StrAppend(&it->second, ", ", value);
  }
  return absl::OkStatus();
}

// Splits "host:port" / "[v6]:port".
absl::Status SplitHostPort(const std::string& listen, std::string* host, std::string* port) {
  size_t colon;
  if (!listen.empty() && listen[0] == '[') {
    const size_t close = listen.find(']');
    if (close == std::string::npos || close + 1 >= listen.size() || listen[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("listen address '", listen, "' is not [host]:port"));
    }
    *host = listen.substr(1, close - 1);
    colon = close + 1;
  } else {
    colon = listen.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("listen address '", listen, "' is not host:port"));
    }
    *host = listen.substr(0, colon);
  }
  *port = listen.substr(colon + 1);
  int number = -1;
  if (host->empty() || !absl::SimpleAtoi(*port, &number) || number < 0 || number > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address '", listen, "' needs a host and a port from 0 to 65535"));
  }
  return absl::OkStatus();
}

std::string FormatAddress(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    return absl::StrCat("[", text, "]:", ntohs(a->sin6_port));
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
  inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
  return absl::StrCat(text, ":", ntohs(a->sin_port));
}

}  // namespace

const char* ReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

absl::StatusOr<std::map<std::string, std::string, std::less<>>> ParseQuery(
    absl::string_view query) {
  std::map<std::string, std::string, std::less<>> out;
  for (absl::string_view piece : absl::StrSplit(query, '&')) {
    if (piece.empty()) continue;
    const size_t eq = piece.find('=');
    const absl::string_view raw_name = piece.substr(0, eq);
    const absl::string_view raw_value =
        eq == absl::string_view::npos ? absl::string_view() : piece.substr(eq + 1);
    auto name = DecodeComponent(raw_name);
    if (!name.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("query parameter name '", raw_name, "': ", name.status().message()));
    }
    if (name->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("query parameter with an empty name: '", piece, "'"));
    }
    auto value = DecodeComponent(raw_value);
    if (!value.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("query parameter '", *name, "': ", value.status().message()));
    }
    if (!out.emplace(*name, std::move(*value)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("query parameter '", *name, "' is given more than once"));
    }
  }
  return out;
}

std::string PercentEncode(absl::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char ch : text) {
    if (absl::ascii_isalnum(ch) || ch == '-' || ch == '.' || ch == '_' || ch == '~') {
      out += ch;
    } else {
      const auto byte = static_cast<unsigned char>(ch);
      out += '%';
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
    }
  }
  return out;
}

const std::string* HttpRequest::QueryParam(absl::string_view name) const {
  const auto it = query.find(name);
  return it == query.end() ? nullptr : &it->second;
}

const std::string* HttpRequest::Header(absl::string_view name) const {
  const auto it = headers.find(name);
  return it == headers.end() ? nullptr : &it->second;
}

struct HttpServer::Connection {
  // kReading: the request head; kWaiting: a blocking handler's answer (the
  // socket is only watched for errors); kWriting: the response; kDraining:
  // what the client still sends, until it closes or kLinger passes.
  enum class State { kReading, kWaiting, kWriting, kDraining };
  uint64_t id = 0;  // unique per server; names the connection to the pool
  int fd = -1;
  std::string peer;
  State state = State::kReading;
  bool finished = false;  // close at the next turn of the loop
  absl::Time deadline;
  std::string in;
  std::string out;
  size_t sent = 0;
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpServerOptions& options, std::map<std::string, HttpRoute> routes) {
  if (options.max_request_bytes < 16 || options.max_connections < 1 ||
      options.io_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "http server needs max_request_bytes >= 16, max_connections >= 1, io_timeout > 0");
  }
  if (options.blocking_threads < 1 || options.blocking_threads > kMaxBlockingThreads ||
      options.blocking_queue < 0 || options.blocking_queue > kMaxBlockingQueue ||
      options.blocking_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http server needs blocking_threads from 1 to ", kMaxBlockingThreads,
        ", blocking_queue from 0 to ", kMaxBlockingQueue, ", blocking_timeout > 0; got ",
        options.blocking_threads, ", ", options.blocking_queue, ", ",
        absl::FormatDuration(options.blocking_timeout)));
  }
  bool any_blocking = false;
  for (const auto& [path, route] : routes) {
    if (!route.handler) {
      return absl::InvalidArgumentError(absl::StrCat("http route '", path, "' has no handler"));
    }
    any_blocking |= route.blocking;
  }
  std::string host, port;
  absl::Status split = SplitHostPort(options.listen, &host, &port);
  if (!split.ok()) return split;

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int gai = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (gai != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", options.listen, "': ", gai_strerror(gai)));
  }
  int fd = -1;
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0) {
      error = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on '", options.listen, "': ", error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);

  std::unique_ptr<HttpServer> server(new HttpServer(options, std::move(routes)));
  server->listen_fd_ = fd;
  server->address_ = FormatAddress(bound);
  server->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  server->done_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (server->wake_fd_ < 0 || server->done_fd_ < 0) {
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  if (any_blocking) {
    for (int i = 0; i < options.blocking_threads; ++i) {
      server->workers_.emplace_back([s = server.get()] { s->WorkerLoop(); });
    }
  }
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

HttpServer::~HttpServer() {
  {
    // First, so no queued request starts (not even one a handler finishing
    // now would pick up next) and the loop hands out no more.
    absl::MutexLock lock(&work_mu_);
    stopping_ = true;
    in_flight_ -= queue_.size();
    queue_.clear();
    work_cv_.SignalAll();
  }
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    thread_.join();  // every accepted connection is closed once it returns
  }
  // Resets connections still waiting in the backlog, rather than leaving
  // them hanging while a handler finishes.
  if (listen_fd_ >= 0) close(listen_fd_);
  for (std::thread& worker : workers_) worker.join();  // handlers already running finish
  if (done_fd_ >= 0) close(done_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

size_t HttpServer::blocking_in_flight() const {
  absl::MutexLock lock(&work_mu_);
  return in_flight_;
}

void HttpServer::WorkerLoop() {
  while (true) {
    Work work;
    {
      absl::MutexLock lock(&work_mu_);
      while (!stopping_ && queue_.empty()) work_cv_.Wait(&work_mu_);
      if (stopping_) return;
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    HttpResponse response = (*work.handler)(work.request);
    {
      absl::MutexLock lock(&work_mu_);
      --in_flight_;
      if (stopping_) return;
      done_.emplace_back(work.connection, std::move(response));
    }
    const uint64_t one = 1;
    (void)!write(done_fd_, &one, sizeof(one));
  }
}

void HttpServer::Cancel(uint64_t connection) {
  absl::MutexLock lock(&work_mu_);
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if (it->connection == connection) {
      queue_.erase(it);
      --in_flight_;
      return;
    }
  }
}

void HttpServer::Respond(Connection& c, size_t head_end) {
  auto finish = [&c](const HttpResponse& r) {
    c.out = Serialize(r);
    c.sent = 0;
    c.state = Connection::State::kWriting;
  };
  std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(c.in).substr(0, head_end), '\n');
  for (absl::string_view& line : lines) absl::ConsumeSuffix(&line, "\r");
  const std::vector<absl::string_view> parts = absl::StrSplit(lines[0], ' ');
  if (parts.size() != 3 || parts[0].empty() || parts[1].empty() ||
      !absl::StartsWith(parts[2], "HTTP/1.")) {
    return finish(Plain(400, "malformed request line\n"));
  }
  absl::string_view target = parts[1];
  target = target.substr(0, target.find('#'));
  const size_t question = target.find('?');
  HttpRequest request;
  request.path = std::string(target.substr(0, question));
  const auto route = routes_.find(request.path);
  if (route == routes_.end()) {
    return finish(Plain(404, absl::StrCat("no such path: ", request.path, "\n")));
  }
  if (parts[0] != "GET") {
    HttpResponse r = Plain(405, "only GET is supported\n");
    r.headers.emplace_back("Allow", "GET");
    return finish(r);
  }
  if (question != absl::string_view::npos) {
    auto query = ParseQuery(target.substr(question + 1));
    if (!query.ok()) return finish(Plain(400, absl::StrCat(query.status().message(), "\n")));
    request.query = std::move(*query);
  }
  if (absl::Status s = ParseHeaders(lines, request); !s.ok()) {
    return finish(Plain(400, absl::StrCat(s.message(), "\n")));
  }
  request.peer = c.peer;
  if (!route->second.blocking) return finish(route->second.handler(request));
  if (route->second.admit) {
    if (std::optional<HttpResponse> refused = route->second.admit(request)) {
      return finish(*refused);
    }
  }

  bool busy = false;
  {
    absl::MutexLock lock(&work_mu_);
    if (stopping_) return finish(Plain(503, "shutting down\n"));
    if (in_flight_ >= static_cast<size_t>(options_.blocking_threads + options_.blocking_queue)) {
      busy = true;
    } else {
      queue_.push_back(Work{c.id, &route->second.handler, std::move(request)});
      ++in_flight_;
      work_cv_.Signal();
    }
  }
  if (busy) {
    HttpResponse r = Plain(503, absl::StrCat("busy: ", options_.blocking_threads,
                                             " running and ", options_.blocking_queue,
                                             " queued requests of this kind; retry later\n"));
    r.headers.emplace_back("Retry-After", absl::StrCat(kBusyRetryAfterSeconds));
    return finish(r);
  }
  c.state = Connection::State::kWaiting;
  c.deadline = absl::Now() + options_.blocking_timeout;
}

void HttpServer::Loop() {
  std::vector<std::unique_ptr<Connection>> conns;
  uint64_t next_id = 1;
  char buf[4096];

  // Does what the connection's state allows without blocking; false when
  // the connection is finished and should be closed.
  auto advance = [&](Connection& c) -> bool {
    while (c.state == Connection::State::kReading) {
      const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
      if (n == 0) return false;  // gone before asking anything
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      c.in.append(buf, static_cast<size_t>(n));
      size_t end = c.in.find("\r\n\r\n");
      size_t head_end = end == std::string::npos ? end : end + 4;
      if (head_end == std::string::npos) {
        end = c.in.find("\n\n");  // bare LF, tolerated as RFC 9112 allows
        head_end = end == std::string::npos ? end : end + 2;
      }
      if (head_end != std::string::npos && head_end <= options_.max_request_bytes) {
        Respond(c, head_end);
      } else if (c.in.size() > options_.max_request_bytes) {
        c.out = Serialize(Plain(431, "request head too large\n"));
        c.state = Connection::State::kWriting;
      }
    }
    while (c.state == Connection::State::kWriting) {
      const ssize_t n =
          send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      c.sent += static_cast<size_t>(n);
      if (c.sent == c.out.size()) {
        shutdown(c.fd, SHUT_WR);
        c.state = Connection::State::kDraining;
        c.deadline = std::min(c.deadline, absl::Now() + kLinger);
      }
    }
    while (c.state == Connection::State::kDraining) {
      const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
      if (n == 0) return false;
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    }
    return true;  // kWaiting: the pool has the request
  };

  // From kWaiting to kWriting `response`, with a fresh io_timeout to send it.
  auto answer = [&](Connection& c, const HttpResponse& response, absl::Time now) {
    c.out = Serialize(response);
    c.sent = 0;
    c.state = Connection::State::kWriting;
    c.deadline = now + options_.io_timeout;
    if (!advance(c)) c.finished = true;
  };

  constexpr size_t kFixed = 3;  // wake_fd_, done_fd_, listen_fd_
  while (true) {
    std::vector<pollfd> fds;
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({done_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    absl::Time next = absl::Now() + absl::Seconds(1);
    for (const auto& c : conns) {
      short events = POLLIN;
      if (c->state == Connection::State::kWriting) events = POLLOUT;
      if (c->state == Connection::State::kWaiting) events = 0;  // errors and hang-ups only
      fds.push_back({c->fd, events, 0});
      next = std::min(next, c->deadline);
    }
    const int64_t wait_ms =
        std::max<int64_t>(0, absl::ToInt64Milliseconds(next - absl::Now()) + 1);
    if (poll(fds.data(), fds.size(), static_cast<int>(wait_ms)) < 0 && errno != EINTR) break;
    if (fds[0].revents != 0) break;  // stopping

    const absl::Time now = absl::Now();
    // Answers from the pool first: they only change connections' states,
    // so the pollfds below still line up with `conns`.
    if (fds[1].revents != 0) {
      uint64_t count = 0;
      (void)!read(done_fd_, &count, sizeof(count));
      std::vector<std::pair<uint64_t, HttpResponse>> done;
      {
        absl::MutexLock lock(&work_mu_);
        done.swap(done_);
      }
      for (const auto& [id, response] : done) {
        for (const auto& c : conns) {
          // Not waiting any more (timed out): the answer is dropped.
          if (c->id == id && c->state == Connection::State::kWaiting) {
            answer(*c, response, now);
            break;
          }
        }
      }
    }

    // Then the connections, then deadlines, then new connections.
    std::vector<std::unique_ptr<Connection>> keep;
    for (size_t i = 0; i < conns.size(); ++i) {
      Connection& c = *conns[i];
      const short revents = fds[i + kFixed].revents;
      bool open = !c.finished;
      if (open && revents != 0) {
        if (c.state == Connection::State::kWaiting) {
          open = (revents & (POLLERR | POLLHUP | POLLNVAL)) == 0;  // the client is gone
        } else {
          open = advance(c);
        }
      }
      if (open && now >= c.deadline) {
        if (c.state == Connection::State::kReading) {
          // Best effort: tell the client why, then close.
          const std::string reply = Serialize(Plain(408, "request timeout\n"));
          (void)!send(c.fd, reply.data(), reply.size(), MSG_NOSIGNAL);
          open = false;
        } else if (c.state == Connection::State::kWaiting) {
          Cancel(c.id);
          answer(c,
                 Plain(503, absl::StrCat("no answer within ",
                                         absl::FormatDuration(options_.blocking_timeout),
                                         "; try again later\n")),
                 now);
          open = !c.finished;
        } else {
          open = false;
        }
      }
      if (open) {
        keep.push_back(std::move(conns[i]));
      } else {
        if (c.state == Connection::State::kWaiting) Cancel(c.id);
        close(c.fd);
      }
    }
    conns = std::move(keep);

    if (fds[2].revents != 0) {
      // A bounded batch, so clients that keep connecting cannot starve the
      // open connections (their closes would go unnoticed and fill the table).
      for (int batch = 0; batch < kAcceptBatch; ++batch) {
        sockaddr_storage peer{};
        socklen_t peer_len = sizeof(peer);
        const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &peer_len,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        if (conns.size() >= static_cast<size_t>(options_.max_connections)) {
          const std::string reply = Serialize(Plain(503, "too many connections\n"));
          (void)!send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
          close(fd);
          continue;
        }
        auto c = std::make_unique<Connection>();
        c->id = next_id++;
        c->fd = fd;
        c->peer = FormatAddress(peer);
        c->deadline = absl::Now() + options_.io_timeout;
        if (advance(*c)) {
          conns.push_back(std::move(c));
        } else {
          if (c->state == Connection::State::kWaiting) Cancel(c->id);
          close(fd);
        }
      }
    }
  }
  for (const auto& c : conns) close(c->fd);
}

}  // namespace sonde::http
