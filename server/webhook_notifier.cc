#include "server/webhook_notifier.h"

#include <curl/curl.h>

#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/dtype.h"
#include "common/names.h"
#include "common/rule_json.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"

namespace sonde::server {
namespace {

size_t Discard(char*, size_t size, size_t n, void*) { return size * n; }

}  // namespace

std::string VerdictJson(const v1::Action& action) {
  nlohmann::json doc = RuleResultJson(action.verdict());
  doc["action"] = "Webhook";
  return DumpJson(doc);
}

WebhookNotifier::WebhookNotifier(Options options) : options_(options) {
  static std::once_flag curl_once;
  std::call_once(curl_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  thread_ = std::thread([this] { Run(); });
}

WebhookNotifier::~WebhookNotifier() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    stop_deadline_ = absl::Now() + options_.shutdown_grace;
  }
  thread_.join();
}

void WebhookNotifier::Post(const v1::Action& action) {
  Delivery d{action.target(), VerdictJson(action)};
  absl::MutexLock lock(&mu_);
  if (stopping_ || queue_.size() >= options_.max_queue) {
    ++counters_.dropped;
    LOG(WARNING) << "webhook " << d.url << ": " << (stopping_ ? "shutting down" : "queue full")
                 << ", verdict of rule " << action.rule() << " dropped";
    return;
  }
  queue_.push_back(std::move(d));
}

bool WebhookNotifier::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !delivering_; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

WebhookNotifier::Counters WebhookNotifier::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

bool WebhookNotifier::Attempt(const Delivery& d, std::string* error) {
  CURL* curl = curl_easy_init();
  if (curl == nullptr) {
    *error = "cannot create a curl handle";
    return false;
  }
  struct curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  curl_easy_setopt(curl, CURLOPT_URL, d.url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, d.body.c_str());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(d.body.size()));
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options_.request_timeout)));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Discard);
  const CURLcode rc = curl_easy_perform(curl);
  long code = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  if (rc != CURLE_OK) {
    *error = curl_easy_strerror(rc);
    return false;
  }
  if (code < 200 || code >= 300) {
    *error = absl::StrCat("HTTP ", code);
    return false;
  }
  return true;
}

void WebhookNotifier::Run() {
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
        counters_.dropped += queue_.size();
        LOG(WARNING) << "webhooks: shutting down, " << queue_.size()
                     << " undelivered verdict(s) dropped";
        queue_.clear();
        return;
      }
      d = std::move(queue_.front());
      queue_.pop_front();
      delivering_ = true;
    }
    absl::Duration backoff = options_.initial_backoff;
    std::string error;
    bool ok = false;
    for (int attempt = 1; attempt <= options_.max_attempts && !ok; ++attempt) {
      ok = Attempt(d, &error);
      if (ok || attempt == options_.max_attempts) break;
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stop), backoff)) break;  // shutting down
      backoff *= 2;
    }
    absl::MutexLock lock(&mu_);
    delivering_ = false;
    if (ok) {
      ++counters_.delivered;
    } else {
      ++counters_.failed;
      LOG(WARNING) << "webhook " << d.url << ": giving up: " << error;
    }
  }
}

}  // namespace sonde::server
