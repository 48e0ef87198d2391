// Delivers rule verdicts to people and systems outside the collector: an
// HTTP POST of a JSON document to a webhook, or a mail through an SMTP
// relay, one per action, from the notifier's own thread, with retries and
// exponential backoff, so neither ingest nor rules ever wait for a slow
// endpoint. The queue is bounded; what does not fit is dropped, counted
// and logged. Thread-safe.
#ifndef SONDE_SERVER_NOTIFIER_H_
#define SONDE_SERVER_NOTIFIER_H_

#include <cstdint>
#include <deque>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/collector.pb.h"

namespace sonde::server {

// The relay Email actions go through. Without a URL the collector sends no
// mail, and refuses rules that ask for it.
struct SmtpOptions {
  // smtp://host[:port] (STARTTLS when the relay offers it, or always with
  // require_tls) or smtps://host[:port] (TLS from the start).
  std::string url;
  // The sender's address. Default: sonde@<this host's name>.
  std::string from;
  // Credentials for the relay (AUTH), if it asks for them. Given a user,
  // the connection must be encrypted: require_tls is then implied.
  std::string user;
  std::string password;
  bool require_tls = false;
};

// SmtpOptions from the collector's flags: checks the URL's scheme and the
// sender's address, and reads the password from `password_file` (its
// first line), so it never shows in a process list.
absl::StatusOr<SmtpOptions> SmtpOptionsFromFlags(const std::string& url, const std::string& from,
                                                 const std::string& user,
                                                 const std::string& password_file,
                                                 bool require_tls);

struct NotifierOptions {
  // Attempts per delivery (the first included). Default 5.
  int max_attempts = 5;
  // Wait before the second attempt; doubles each time. Default 500 ms.
  absl::Duration initial_backoff = absl::Milliseconds(500);
  // Connect plus transfer time of one attempt. Default 5 s.
  absl::Duration request_timeout = absl::Seconds(5);
  // Deliveries waiting at most. Default 1000.
  size_t max_queue = 1000;
  // At shutdown, how long queued deliveries still get (one attempt each);
  // what remains after is dropped. Default 5 s.
  absl::Duration shutdown_grace = absl::Seconds(5);
  SmtpOptions smtp;
};

class Notifier {
 public:
  using Options = NotifierOptions;

  explicit Notifier(Options options);
  ~Notifier();  // waits for queued deliveries, then gives up on the rest

  // Queues the action's verdict: ACTION_WEBHOOK to the URL in
  // `action.target()`, ACTION_EMAIL to the address there. Never blocks.
  void Post(const v1::Action& action);

  // OK if this notifier can take `action` (an Email action needs a relay).
  absl::Status CanDeliver(const std::string& action) const;

  struct Counters {
    uint64_t delivered = 0;
    uint64_t failed = 0;   // every attempt failed
    uint64_t dropped = 0;  // queue full, or shutting down
  };
  Counters webhooks() const;
  Counters emails() const;

  // Waits until nothing is queued or being delivered.
  bool WaitIdle(absl::Duration timeout);

 private:
  struct Delivery {
    bool email = false;
    std::string target;  // URL or address
    std::string body;    // JSON, or the mail's text
    std::string subject;
  };
  // One try. On failure, `error` says why and `permanent` whether
  // trying again cannot help (a missing relay, an HTTP 4xx but 408 and
  // 429, an SMTP 5xx, TLS required and not offered).
  struct Outcome {
    bool ok = false;
    bool permanent = false;
    std::string error;
  };
  void Run();
  Outcome Attempt(const Delivery& d);
  Outcome AttemptPost(const Delivery& d);
  Outcome AttemptMail(const Delivery& d);
  Counters& CountersOf(const Delivery& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return d.email ? emails_ : webhooks_;
  }

  const Options options_;
  const std::string from_;  // options_.smtp.from, or its default
  mutable absl::Mutex mu_;
  std::deque<Delivery> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time stop_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool delivering_ ABSL_GUARDED_BY(mu_) = false;
  Counters webhooks_ ABSL_GUARDED_BY(mu_);
  Counters emails_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// The JSON document a webhook receives: the rule result as
// common/rule_json.h shapes it, plus "action": "Webhook".
std::string VerdictJson(const v1::Action& action);

// An Email action's mail: its subject (one line of printable ASCII) and its
// text (a readable summary, then the verdict as JSON).
struct VerdictMail {
  std::string subject;
  std::string text;
};
VerdictMail VerdictMailOf(const v1::Action& action);

}  // namespace sonde::server

#endif  // SONDE_SERVER_NOTIFIER_H_
