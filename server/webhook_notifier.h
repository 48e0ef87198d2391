// Delivers rule verdicts to webhooks: an HTTP POST of a JSON document per
// action, from its own thread, with retries and exponential backoff, so
// neither ingest nor rules ever wait for a slow endpoint. The queue is
// bounded; what does not fit is dropped and logged. Thread-safe.
#ifndef SONDE_SERVER_WEBHOOK_NOTIFIER_H_
#define SONDE_SERVER_WEBHOOK_NOTIFIER_H_

#include <cstdint>
#include <deque>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/collector.pb.h"

namespace sonde::server {

struct WebhookNotifierOptions {
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
};

class WebhookNotifier {
 public:
  using Options = WebhookNotifierOptions;

  explicit WebhookNotifier(Options options);
  ~WebhookNotifier();  // waits for queued deliveries, then gives up on the rest

  // Queues the action's verdict for `action.target()`. Never blocks.
  void Post(const v1::Action& action);

  struct Counters {
    uint64_t delivered = 0;
    uint64_t failed = 0;   // every attempt failed
    uint64_t dropped = 0;  // queue full
  };
  Counters counters() const;

  // Waits until nothing is queued or being delivered.
  bool WaitIdle(absl::Duration timeout);

 private:
  struct Delivery {
    std::string url;
    std::string body;
  };
  void Run();
  bool Attempt(const Delivery& d, std::string* error);

  const Options options_;
  mutable absl::Mutex mu_;
  std::deque<Delivery> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time stop_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool delivering_ ABSL_GUARDED_BY(mu_) = false;
  Counters counters_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// The JSON document a webhook receives: the rule result as
// common/rule_json.h shapes it, plus "action": "Webhook".
std::string VerdictJson(const v1::Action& action);

}  // namespace sonde::server

#endif  // SONDE_SERVER_WEBHOOK_NOTIFIER_H_
