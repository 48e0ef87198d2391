#include "tests/fuzz/ingest_fuzz.h"

#include <stdlib.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/dtype.h"
#include "common/thread_pool.h"
#include "glog/logging.h"
#include "rules/rule_factory.h"
#include "server/job_registry.h"
#include "storage/store.h"
#include "tests/fuzz/fuzz_input.h"
#include "rules/builtin_rules.h"

namespace sonde::fuzz {
namespace {

// Inputs between two fresh stores: bounds the database's size in long runs.
constexpr uint64_t kInputsPerStore = 5000;

// What every input shares: a Store in a temporary directory, the rule pool
// and the rule factory. Made on first use, removed at exit.
class Environment {
 public:
  // The clean-up is registered after the first store is open, so that it
  // runs before the destructors of RocksDB's own statics.
  static Environment& Get() {
    static Environment* const env = new Environment();
    static const int cleanup = std::atexit([] { delete env; });
    (void)cleanup;
    return *env;
  }

  storage::Store* store() { return store_.get(); }
  ThreadPool* pool() { return &pool_; }
  const rules::RuleFactory* factory() { return factory_.get(); }

  // A suffix that no earlier input of this process used; opens a fresh
  // store every kInputsPerStore inputs.
  std::string NextInputSuffix() {
    if (inputs_ > 0 && inputs_ % kInputsPerStore == 0) OpenFreshStore();
    return absl::StrCat("-", inputs_++);
  }

 private:
  Environment() {
    // The registry logs every refused hello and step at WARNING: noise here.
    FLAGS_minloglevel = google::GLOG_ERROR;
    const char* base = std::getenv("TEST_TMPDIR");
    if (base == nullptr || *base == '\0') base = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(base != nullptr && *base != '\0' ? base : "/tmp",
                                       "/sonde-ingest-fuzz-XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) FuzzFail("cannot make a temporary directory");
    dir_ = pattern;
    OpenFreshStore();
  }
  ~Environment() {
    store_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void OpenFreshStore() {
    std::error_code ec;
    if (store_ != nullptr) {
      store_.reset();
      std::filesystem::remove_all(db_path_, ec);
    }
    storage::Store::Options o;
    db_path_ = absl::StrCat(dir_, "/db", generation_++);
    o.path = db_path_;
    o.payload_piece_bytes = 32;  // several pieces per tensor
    o.block_cache_bytes = 1 << 20;
    auto store = storage::Store::Open(o);
    if (!store.ok()) FuzzFail(absl::StrCat("cannot open the store: ", store.status().ToString()));
    store_ = std::move(*store);
  }

  std::string dir_;
  std::string db_path_;
  uint64_t generation_ = 0;
  uint64_t inputs_ = 0;
  std::unique_ptr<storage::Store> store_;
  ThreadPool pool_{2, 64};
  std::unique_ptr<rules::RuleFactory> factory_ = rules::BuiltinRuleFactory();
};

void CheckError(absl::string_view what, const absl::Status& s) {
  if (s.ok()) FuzzFail(absl::StrCat(what, ": an error with an OK status"));
  if (s.message().empty()) {
    FuzzFail(absl::StrCat(what, ": error without a message: ", s.ToString()));
  }
  if (s.code() == absl::StatusCode::kUnknown || s.code() == absl::StatusCode::kInternal) {
    FuzzFail(absl::StrCat(what, ": bad input answered with ", s.ToString()));
  }
}

// The client end of one stream, as the registry sees it.
class Handle : public server::StreamHandle {
 public:
  void Send(const v1::ServerMessage& message) override { sent_.fetch_add(1); }
  void Abort(const absl::Status& status) override {
    CheckError("StreamHandle::Abort", status);
    aborted_.store(true);
  }
  bool aborted() const { return aborted_.load(); }

 private:
  std::atomic<uint64_t> sent_{0};
  std::atomic<bool> aborted_{false};
};

// One stream slot: successive connections of one training process.
struct Stream {
  std::unique_ptr<Handle> handle;
  std::optional<server::IngestSession> session;
  uint64_t seq = 0;  // last seq the session accepted
  uint64_t job_id = 0;
  int32_t worker = 0;
};

// Ends the stream as the reactor does: Close, then the handle goes away.
void End(Stream& s) {
  if (s.session.has_value()) s.session->Close(s.handle.get());
  s.session.reset();
  s.handle.reset();
  s.seq = 0;
  s.job_id = 0;
}

std::string Unique(const std::string& job, const std::string& suffix) {
  if (job.empty() || job.size() > 128) return job;  // refused either way
  return job.substr(0, 128 - suffix.size()) + suffix;
}

class Run {
 public:
  Run(server::IngestLimits limits, std::string suffix)
      : env_(Environment::Get()),
        limits_(limits),
        suffix_(std::move(suffix)),
        registry_(NewRegistry()) {}
  ~Run() {
    for (Stream& s : streams_) End(s);
  }

  const IngestOutcome& outcome() const { return outcome_; }

  void Deliver(uint8_t control, v1::ClientMessage m) {
    if (control & kIngestRestart) {
      // The collector restarts: every stream breaks, a new registry loads
      // the jobs from the store (JobRegistry's replay of stored steps).
      for (Stream& stream : streams_) End(stream);
      registry_.reset();
      registry_ = NewRegistry();
    }
    Stream& s = streams_[control & kIngestSecondStream ? 1 : 0];
    if ((control & kIngestReconnect) || (s.handle != nullptr && s.handle->aborted())) End(s);
    if (!s.session.has_value()) {
      s.handle = std::make_unique<Handle>();
      s.session.emplace(registry_.get(), limits_);
    }
    if (m.has_hello()) m.mutable_hello()->set_job(Unique(m.hello().job(), suffix_));
    if (m.has_chunk()) {
      v1::TensorChunk* c = m.mutable_chunk();
      if (!c->job().empty()) c->set_job(Unique(c->job(), suffix_));
      if (control & kIngestFixCrc) c->set_crc32c(Crc32c(c->payload()));
    }
    if ((control & kIngestRawSeq) == 0) m.set_seq(s.seq + 1);

    absl::StatusOr<server::IngestSession::Next> next = s.session->OnMessage(m);
    if (!next.ok()) {
      ++outcome_.errors;
      CheckError("OnMessage", next.status());
      End(s);
      return;
    }
    s.seq = m.seq();
    switch (*next) {
      case server::IngestSession::Next::kRead:
        return;
      case server::IngestSession::Next::kHello: {
        auto joined = s.session->Join(s.handle.get());
        if (!joined.ok()) {
          ++outcome_.errors;
          CheckError("Join", joined.status());
          End(s);
          return;
        }
        if (joined->ack.max_chunk_bytes() != limits_.max_chunk_bytes ||
            joined->ack.resume_step() < -1 || joined->ack.job_id() == 0) {
          FuzzFail(absl::StrCat("hello ack: ", joined->ack.ShortDebugString()));
        }
        ++outcome_.joins;
        s.job_id = joined->ack.job_id();
        s.worker = m.hello().worker();
        return;
      }
      case server::IngestSession::Next::kCommit: {
        auto ack = s.session->Commit();
        if (!ack.ok()) {
          ++outcome_.errors;
          CheckError("Commit", ack.status());
          End(s);
          return;
        }
        if (ack->acked_seq() != m.seq() || ack->tensors() > limits_.max_tensors_per_step ||
            ack->bytes() > limits_.max_step_bytes || ack->step() != m.step_end().step()) {
          FuzzFail(absl::StrCat("commit ack ", ack->ShortDebugString(), " for step end ",
                                m.ShortDebugString()));
        }
        ++outcome_.commits;
        if (ack->duplicate()) {
          ++outcome_.duplicates;
        } else {
          CheckStored(s, m.step_end(), *ack);
        }
        return;
      }
      case server::IngestSession::Next::kEndJob: {
        auto ack = s.session->EndJob();
        if (!ack.ok()) {
          ++outcome_.errors;
          CheckError("EndJob", ack.status());
          End(s);
          return;
        }
        if (ack->acked_seq() != m.seq()) {
          FuzzFail(absl::StrCat("job end ack ", ack->ShortDebugString(), " for seq ", m.seq()));
        }
        ++outcome_.job_ends;
        return;
      }
      case server::IngestSession::Next::kProfile: {
        auto stored = s.session->StoreProfile();
        if (!stored.ok()) {
          ++outcome_.errors;
          CheckError("StoreProfile", stored.status());
          End(s);
        }
        return;
      }
    }
    FuzzFail("OnMessage returned an unknown Next");
  }

 private:
  std::unique_ptr<server::JobRegistry> NewRegistry() {
    return std::make_unique<server::JobRegistry>(env_.store(), env_.pool(), env_.factory(),
                                                 std::vector<v1::RuleSpec>{});
  }

  // What an acknowledged step left in the store.
  void CheckStored(const Stream& s, const v1::StepEnd& end, const v1::Ack& ack) {
    storage::Store* store = env_.store();
    auto records = store->TensorsAtStep(s.job_id, ack.mode(), end.mode_step());
    if (!records.ok()) {
      FuzzFail(absl::StrCat("reading a stored step: ", records.status().ToString()));
    }
    uint32_t mine = 0;
    for (const v1::TensorRecord& r : *records) {
      if (r.worker() != s.worker || r.step() != ack.step()) continue;
      ++mine;
      auto elements = ElementCount(r.shape());
      if (!elements.ok() || r.statistics().count() != *elements) {
        FuzzFail(absl::StrCat("stored statistics do not count the shape's elements: ",
                              r.ShortDebugString()));
      }
      if (!r.has_values()) continue;
      std::string bytes;
      auto read = store->ReadTensor(s.job_id, ack.mode(), end.mode_step(), r.tensor_name(),
                                    s.worker,
                                    [&](const v1::TensorRecord&, absl::string_view piece) {
                                      bytes.append(piece.data(), piece.size());
                                      return absl::OkStatus();
                                    });
      auto want = TensorBytes(r.dtype(), r.shape());
      if (!read.ok() || !want.ok() || bytes.size() != *want) {
        FuzzFail(absl::StrCat("stored values of '", r.tensor_name(), "': ", bytes.size(),
                              " bytes, read status ", read.status().ToString()));
      }
    }
    if (mine != ack.tensors()) {
      FuzzFail(absl::StrCat("ack says ", ack.tensors(), " tensors, the store has ", mine,
                            " of worker ", s.worker, " at step ", ack.step()));
    }
  }

  Environment& env_;
  const server::IngestLimits limits_;
  const std::string suffix_;
  IngestOutcome outcome_;
  // Declared before the streams: the registry outlives every session.
  std::unique_ptr<server::JobRegistry> registry_;
  Stream streams_[2];
};

}  // namespace

server::IngestLimits LimitsFor(uint8_t b) {
  if (b & kIngestDefaultLimits) return server::IngestLimits();
  server::IngestLimits l;
  l.max_chunk_bytes = uint64_t{16} << (b & 3);
  l.max_tensor_bytes = uint64_t{256} << ((b >> 2) & 3);
  l.max_step_bytes = uint64_t{512} << ((b >> 4) & 3);
  l.max_tensors_per_step = (b & 0x40) ? 8 : 2;
  return l;
}

IngestOutcome RunIngestInput(const uint8_t* data, size_t size) {
  QuietProtobufLogs();
  FuzzReader in(data, size);
  const server::IngestLimits limits = LimitsFor(in.U8());
  Run run(limits, Environment::Get().NextInputSuffix());
  FuzzReader::Record record;
  while (in.NextRecord(record)) {
    v1::ClientMessage m;
    if (!m.ParseFromArray(record.bytes.data(), static_cast<int>(record.bytes.size()))) continue;
    run.Deliver(record.control, std::move(m));
  }
  return run.outcome();
}

int FuzzIngestSession(const uint8_t* data, size_t size) {
  RunIngestInput(data, size);
  return 0;
}

}  // namespace sonde::fuzz
