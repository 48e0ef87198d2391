// A small real SMTP server (RFC 5321's commands a relay client sends) on
// 127.0.0.1 port 0, for tests of Email actions: records each mail it takes
// (envelope and data, dot-unstuffed) and answers DATA with the next code of
// a script (250 once the script runs out). It never offers STARTTLS or
// AUTH. One connection at a time.
#ifndef SONDE_TESTS_TESTING_SMTP_SERVER_H_
#define SONDE_TESTS_TESTING_SMTP_SERVER_H_

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
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tests/testing/unused_port.h"

namespace sonde::testing {

class TestSmtpServer {
 public:
  struct Mail {
    std::string from;                 // MAIL FROM's path, without <>
    std::vector<std::string> to;      // RCPT TO's, without <>
    std::string data;                 // headers and body, CRLF lines
    int reply = 0;                    // what DATA was answered
    // The value of header `name` (case-insensitive), "" if none.
    std::string Header(absl::string_view name) const {
      const size_t end = data.find("\r\n\r\n");
      for (absl::string_view line :
           absl::StrSplit(absl::string_view(data).substr(0, end), "\r\n")) {
        const size_t colon = line.find(':');
        if (colon != absl::string_view::npos &&
            absl::EqualsIgnoreCase(line.substr(0, colon), name)) {
          return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
        }
      }
      return "";
    }
  };

  explicit TestSmtpServer(std::vector<int> data_replies = {})
      : data_replies_(data_replies.begin(), data_replies.end()) {
    fd_ = ListenOnLoopback(&port_);
    thread_ = std::thread([this] { Serve(); });
  }

  ~TestSmtpServer() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }

  std::string Url() const { return absl::StrCat("smtp://127.0.0.1:", port_); }

  // Every mail whose DATA was answered, taken (250) or not.
  std::vector<Mail> mails() {
    absl::MutexLock lock(&mu_);
    return mails_;
  }
  // Waits until `n` mails were answered (or `timeout`); returns them all.
  std::vector<Mail> WaitForMails(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return mails_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return mails_;
  }

 private:
  void Serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      Session(c);
      close(c);
    }
  }

  static bool Send(int c, const std::string& reply) {
    return write(c, reply.data(), reply.size()) == static_cast<ssize_t>(reply.size());
  }

  // The next CRLF line from `c` (without the CRLF); false on EOF or a 5 s silence.
  static bool ReadLine(int c, std::string& buffer, std::string* line) {
    while (true) {
      const size_t eol = buffer.find("\r\n");
      if (eol != std::string::npos) {
        *line = buffer.substr(0, eol);
        buffer.erase(0, eol + 2);
        return true;
      }
      pollfd p{c, POLLIN, 0};
      if (poll(&p, 1, 5000) <= 0) return false;
      char buf[4096];
      const ssize_t n = read(c, buf, sizeof(buf));
      if (n <= 0) return false;
      buffer.append(buf, static_cast<size_t>(n));
    }
  }

  static std::string Path(absl::string_view arg) {
    const size_t open = arg.find('<');
    const size_t close = arg.find('>', open);
    if (open == absl::string_view::npos || close == absl::string_view::npos) return "";
    return std::string(arg.substr(open + 1, close - open - 1));
  }

  void Session(int c) {
    std::string buffer, line;
    Mail mail;
    if (!Send(c, "220 sonde-test ESMTP\r\n")) return;
    while (ReadLine(c, buffer, &line)) {
      const std::string verb = absl::AsciiStrToUpper(line.substr(0, 4));
      if (verb == "EHLO") {
        Send(c, "250-sonde-test\r\n250-8BITMIME\r\n250 SIZE 10485760\r\n");
      } else if (verb == "HELO" || verb == "NOOP") {
        Send(c, "250 OK\r\n");
      } else if (verb == "RSET") {
        mail = Mail();
        Send(c, "250 OK\r\n");
      } else if (verb == "MAIL") {
        mail = Mail();
        mail.from = Path(line);
        Send(c, "250 OK\r\n");
      } else if (verb == "RCPT") {
        mail.to.push_back(Path(line));
        Send(c, "250 OK\r\n");
      } else if (verb == "DATA") {
        Send(c, "354 End data with <CR><LF>.<CR><LF>\r\n");
        while (true) {
          if (!ReadLine(c, buffer, &line)) return;
          if (line == ".") break;
          // A line the client started with "." came with another in front.
          if (absl::StartsWith(line, ".")) line.erase(0, 1);
          absl::StrAppend(&mail.data, line, "\r\n");
        }
        absl::MutexLock lock(&mu_);
        mail.reply = 250;
        if (!data_replies_.empty()) {
          mail.reply = data_replies_.front();
          data_replies_.pop_front();
        }
        Send(c, absl::StrCat(mail.reply, mail.reply == 250 ? " OK queued\r\n" : " Try later\r\n"));
        mails_.push_back(std::move(mail));
        mail = Mail();
      } else if (verb == "QUIT") {
        Send(c, "221 Bye\r\n");
        return;
      } else {
        Send(c, "502 Command unrecognized\r\n");
      }
    }
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::deque<int> data_replies_ ABSL_GUARDED_BY(mu_);
  std::vector<Mail> mails_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// The text of a quoted-printable body (RFC 2045): soft line breaks joined,
// =XX decoded.
inline std::string DecodeQuotedPrintable(absl::string_view in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '=') {
      out.push_back(in[i]);
      continue;
    }
    if (in.substr(i + 1, 2) == "\r\n") {
      i += 2;
      continue;
    }
    if (i + 2 < in.size() && absl::ascii_isxdigit(in[i + 1]) && absl::ascii_isxdigit(in[i + 2])) {
      auto hex = [](char h) { return absl::ascii_isdigit(h) ? h - '0' : absl::ascii_tolower(h) - 'a' + 10; };
      out.push_back(static_cast<char>(hex(in[i + 1]) * 16 + hex(in[i + 2])));
      i += 2;
      continue;
    }
    out.push_back('=');
  }
  return out;
}

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_SMTP_SERVER_H_
