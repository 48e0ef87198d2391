#include "server/notifier.h"

#include <curl/curl.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/dtype.h"
#include "common/names.h"
#include "common/rule_json.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"

namespace sonde::server {
namespace {

size_t Discard(char*, size_t size, size_t n, void*) { return size * n; }

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// A header value of printable ASCII: no line break can end the header (or
// start another), and nothing needs RFC 2047 encoding.
std::string HeaderSafe(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) out.push_back(c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?');
  return out;
}

// Owns what one curl transfer was given.
struct Transfer {
  CURL* curl = curl_easy_init();
  curl_slist* headers = nullptr;
  curl_slist* recipients = nullptr;
  curl_mime* mime = nullptr;
  ~Transfer() {
    curl_mime_free(mime);
    curl_slist_free_all(headers);
    curl_slist_free_all(recipients);
    if (curl != nullptr) curl_easy_cleanup(curl);
  }
};

}  // namespace

absl::StatusOr<SmtpOptions> SmtpOptionsFromFlags(const std::string& url, const std::string& from,
                                                 const std::string& user,
                                                 const std::string& password_file,
                                                 bool require_tls) {
  SmtpOptions o;
  o.require_tls = require_tls;
  if (url.empty()) {
    if (!from.empty() || !user.empty() || !password_file.empty() || require_tls) {
      return absl::InvalidArgumentError("--smtp_* flags given without --smtp_url");
    }
    return o;
  }
  if (!absl::StartsWith(url, "smtp://") && !absl::StartsWith(url, "smtps://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--smtp_url '", url, "' must start with smtp:// (STARTTLS) or smtps:// (TLS)"));
  }
  o.url = url;
  if (!from.empty()) {
    if (absl::Status s = ValidateMailAddress(from); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--smtp_from: ", s.message()));
    }
    o.from = from;
  }
  if (password_file.empty() != user.empty()) {
    return absl::InvalidArgumentError("--smtp_user and --smtp_password_file go together");
  }
  o.user = user;
  if (!password_file.empty()) {
    std::ifstream in(password_file);
    if (!in) {
      return absl::NotFoundError(
          absl::StrCat("cannot read --smtp_password_file '", password_file, "'"));
    }
    std::getline(in, o.password);
    if (!o.password.empty() && o.password.back() == '\r') o.password.pop_back();
    if (o.password.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--smtp_password_file '", password_file, "' has no password on its first line"));
    }
  }
  return o;
}

std::string VerdictJson(const v1::Action& action) {
  nlohmann::json doc = RuleResultJson(action.verdict());
  doc["action"] = "Webhook";
  return DumpJson(doc);
}

VerdictMail VerdictMailOf(const v1::Action& action) {
  const v1::RuleResult& r = action.verdict();
  nlohmann::json doc = RuleResultJson(r);
  doc["action"] = "Email";
  const std::string rule = r.rule().empty() ? action.rule() : r.rule();
  VerdictMail mail;
  // Within SMTP's 998-byte lines whatever the names (rules' may be long).
  std::string short_rule = rule.size() > 200 ? rule.substr(0, 200) + "..." : rule;
  mail.subject = HeaderSafe(absl::StrCat("[sonde] job ", r.job(), ": ", short_rule,
                                         " found issues at step ", r.step()));
  std::string where = absl::StrCat("step ", r.step());
  if (r.mode() != v1::MODE_UNSPECIFIED) {
    absl::StrAppend(&where, " (", ModeName(r.mode()), " step ", r.mode_step(), ")");
  }
  if (r.worker() >= 0) absl::StrAppend(&where, ", worker ", r.worker());
  std::string& t = mail.text;
  absl::StrAppend(&t, "Rule ", rule, " (", r.rule_type(), ") found issues in job ", r.job(),
                  " at ", where, ".\n\n");
  if (!r.message().empty()) absl::StrAppend(&t, r.message(), "\n\n");
  if (r.tensors_size() > 0) absl::StrAppend(&t, "Tensors: ", absl::StrJoin(r.tensors(), ", "), "\n");
  if (r.observed() != 0 || r.threshold() != 0) {
    absl::StrAppend(&t, "Observed: ", r.observed(), "; threshold: ", r.threshold(), "\n");
  }
  if (!r.suggestion().empty()) absl::StrAppend(&t, "Suggestion: ", r.suggestion(), "\n");
  if (r.actions_taken_size() > 0) {
    absl::StrAppend(&t, "Actions taken: ", absl::StrJoin(r.actions_taken(), ", "), "\n");
  }
  absl::StrAppend(&t, "\nThe verdict as JSON:\n", DumpJson(doc, 2), "\n");
  return mail;
}

Notifier::Notifier(Options options)
    : options_(std::move(options)),
      from_(options_.smtp.from.empty() ? absl::StrCat("sonde@", HostName()) : options_.smtp.from) {
  static std::once_flag curl_once;
  std::call_once(curl_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  thread_ = std::thread([this] { Run(); });
}

Notifier::~Notifier() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    stop_deadline_ = absl::Now() + options_.shutdown_grace;
  }
  thread_.join();
}

absl::Status Notifier::CanDeliver(const std::string& action) const {
  if (absl::StartsWith(action, "Email:") && options_.smtp.url.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "action '", action, "' needs a mail relay, and this collector has none (start it with "
        "--smtp_url=smtp://host:port)"));
  }
  return absl::OkStatus();
}

void Notifier::Post(const v1::Action& action) {
  Delivery d;
  d.target = action.target();
  if (action.type() == v1::ACTION_EMAIL) {
    d.email = true;
    VerdictMail mail = VerdictMailOf(action);
    d.subject = std::move(mail.subject);
    // Mail's lines end in CRLF: so encoded, they stay lines (a bare LF
    // would travel as "=0A").
    d.body = absl::StrReplaceAll(mail.text, {{"\r\n", "\n"}});
    d.body = absl::StrReplaceAll(d.body, {{"\n", "\r\n"}});
  } else {
    d.body = VerdictJson(action);
  }
  const char* kind = d.email ? "email to " : "webhook ";
  absl::MutexLock lock(&mu_);
  if (stopping_ || queue_.size() >= options_.max_queue) {
    ++CountersOf(d).dropped;
    LOG(WARNING) << kind << d.target << ": " << (stopping_ ? "shutting down" : "queue full")
                 << ", verdict of rule " << action.rule() << " dropped";
    return;
  }
  queue_.push_back(std::move(d));
}

bool Notifier::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !delivering_; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

Notifier::Counters Notifier::webhooks() const {
  absl::MutexLock lock(&mu_);
  return webhooks_;
}

Notifier::Counters Notifier::emails() const {
  absl::MutexLock lock(&mu_);
  return emails_;
}

Notifier::Outcome Notifier::Attempt(const Delivery& d) {
  return d.email ? AttemptMail(d) : AttemptPost(d);
}

Notifier::Outcome Notifier::AttemptPost(const Delivery& d) {
  Transfer t;
  if (t.curl == nullptr) return {false, false, "cannot create a curl handle"};
  CURL* curl = t.curl;
  t.headers = curl_slist_append(nullptr, "Content-Type: application/json");
  curl_easy_setopt(curl, CURLOPT_URL, d.target.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, t.headers);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, d.body.c_str());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(d.body.size()));
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options_.request_timeout)));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Discard);
  const CURLcode rc = curl_easy_perform(curl);
  long code = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
  if (rc != CURLE_OK) return {false, false, curl_easy_strerror(rc)};
  if (code < 200 || code >= 300) {
    // The endpoint refused the request itself: the same one would be
    // refused again (but a timeout or "too many requests").
    const bool permanent = code >= 400 && code < 500 && code != 408 && code != 429;
    return {false, permanent, absl::StrCat("HTTP ", code)};
  }
  return {true, false, ""};
}

Notifier::Outcome Notifier::AttemptMail(const Delivery& d) {
  const SmtpOptions& smtp = options_.smtp;
  if (smtp.url.empty()) return {false, true, "no mail relay (--smtp_url)"};
  Transfer t;
  if (t.curl == nullptr) return {false, false, "cannot create a curl handle"};
  CURL* curl = t.curl;
  static std::atomic<uint64_t> sequence{0};
  const absl::Time now = absl::Now();
  const std::string host = HostName();
  for (const std::string& h : {
           absl::StrCat("Date: ", absl::FormatTime("%a, %d %b %Y %H:%M:%S +0000", now,
                                                  absl::UTCTimeZone())),
           absl::StrCat("From: ", HeaderSafe(from_)),
           absl::StrCat("To: ", HeaderSafe(d.target)),
           absl::StrCat("Subject: ", d.subject),
           absl::StrCat("Message-ID: <sonde.", absl::ToUnixMicros(now), ".", getpid(), ".",
                        sequence.fetch_add(1), "@", HeaderSafe(host), ">"),
           std::string("Auto-Submitted: auto-generated"),
       }) {
    t.headers = curl_slist_append(t.headers, h.c_str());
  }
  t.recipients = curl_slist_append(nullptr, absl::StrCat("<", d.target, ">").c_str());
  // One text part, quoted-printable: any line length and any UTF-8 in a
  // message travel. (libcurl dot-stuffs, so a line of "." does not end it.)
  t.mime = curl_mime_init(curl);
  curl_mimepart* part = curl_mime_addpart(t.mime);
  curl_mime_data(part, d.body.data(), d.body.size());
  curl_mime_type(part, "text/plain; charset=utf-8");
  curl_mime_encoder(part, "quoted-printable");
  curl_easy_setopt(curl, CURLOPT_URL, smtp.url.c_str());
  curl_easy_setopt(curl, CURLOPT_MAIL_FROM, absl::StrCat("<", from_, ">").c_str());
  curl_easy_setopt(curl, CURLOPT_MAIL_RCPT, t.recipients);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, t.headers);
  curl_easy_setopt(curl, CURLOPT_MIMEPOST, t.mime);
  const bool credentials = !smtp.user.empty();
  if (credentials) {
    curl_easy_setopt(curl, CURLOPT_USERNAME, smtp.user.c_str());
    curl_easy_setopt(curl, CURLOPT_PASSWORD, smtp.password.c_str());
  }
  // smtps:// is encrypted from the start; smtp:// upgrades with STARTTLS
  // when the relay offers it, and must when told to or with credentials.
  curl_easy_setopt(curl, CURLOPT_USE_SSL,
                   static_cast<long>(smtp.require_tls || credentials ? CURLUSESSL_ALL
                                                                     : CURLUSESSL_TRY));
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options_.request_timeout)));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  const CURLcode rc = curl_easy_perform(curl);
  if (rc != CURLE_OK) {
    long code = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
    // 5xx: the relay refuses for good (no such mailbox, relaying denied);
    // 4xx and a lost connection may pass.
    const bool permanent = (code >= 500 && code < 600) || rc == CURLE_USE_SSL_FAILED ||
                           rc == CURLE_LOGIN_DENIED;
    return {false, permanent,
            code > 0 ? absl::StrCat(curl_easy_strerror(rc), " (SMTP ", code, ")")
                     : std::string(curl_easy_strerror(rc))};
  }
  return {true, false, ""};
}

void Notifier::Run() {
  while (true) {
    Delivery d;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;
      if (stopping_ && absl::Now() > stop_deadline_) {
        for (const Delivery& left : queue_) ++CountersOf(left).dropped;
        LOG(WARNING) << "notifier: shutting down, " << queue_.size()
                     << " undelivered verdict(s) dropped";
        queue_.clear();
        return;
      }
      d = std::move(queue_.front());
      queue_.pop_front();
      delivering_ = true;
    }
    absl::Duration backoff = options_.initial_backoff;
    Outcome outcome;
    for (int attempt = 1; attempt <= options_.max_attempts; ++attempt) {
      outcome = Attempt(d);
      if (outcome.ok || outcome.permanent || attempt == options_.max_attempts) break;
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stop), backoff)) break;  // shutting down
      backoff *= 2;
    }
    absl::MutexLock lock(&mu_);
    delivering_ = false;
    if (outcome.ok) {
      ++CountersOf(d).delivered;
    } else {
      ++CountersOf(d).failed;
      LOG(WARNING) << (d.email ? "email to " : "webhook ") << d.target << ": giving up"
                   << (outcome.permanent ? " (not worth retrying)" : "") << ": " << outcome.error;
    }
  }
}

}  // namespace sonde::server
