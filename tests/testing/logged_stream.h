// Log entries as a Sonde gateway writes them (server/cluster), for tests
// that feed a partition's log without a gateway.
#ifndef SONDE_TESTS_TESTING_LOGGED_STREAM_H_
#define SONDE_TESTS_TESTING_LOGGED_STREAM_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/tensor_chunks.h"
#include "proto/cluster.pb.h"
#include "proto/rule.pb.h"

namespace sonde::testing {

// One client stream as a gateway logs it: numbered messages, grouped into
// entries.
class LoggedStream {
 public:
  LoggedStream(std::string gateway, uint64_t connection)
      : gateway_(std::move(gateway)), connection_(connection) {}

  v1::LogEntry Hello(const std::string& job, int32_t worker, int32_t world_size,
                     uint64_t client_id, const std::vector<v1::RuleSpec>& rules = {}) {
    v1::ClientMessage m;
    v1::Hello* h = m.mutable_hello();
    h->set_job(job);
    h->set_worker(worker);
    h->set_world_size(world_size);
    h->set_client_version("applier-test");
    h->set_client_id(client_id);
    for (const v1::RuleSpec& r : rules) *h->add_rules() = r;
    return Entry({m});
  }

  // A step with one F32 tensor of values `w` (chunked) and its step end.
  // `chunk_bytes`: small by default, so tests see many chunks per tensor.
  v1::LogEntry Step(int64_t step, const std::vector<float>& w, bool corrupt = false,
                    const std::string& name = "fc.weight", size_t chunk_bytes = 16) {
    v1::TensorChunk header;
    header.set_tensor_name(name);
    header.set_step(step);
    header.set_mode(v1::MODE_TRAIN);
    header.set_mode_step(step);
    header.set_dtype(v1::DTYPE_F32);
    header.add_shape(static_cast<int64_t>(w.size()));
    header.add_collections("weights");
    std::string bytes(w.size() * sizeof(float), '\0');
    std::memcpy(bytes.data(), w.data(), bytes.size());
    std::vector<v1::ClientMessage> messages;
    for (v1::TensorChunk& c : SplitIntoChunks(header, bytes, chunk_bytes)) {
      if (corrupt) c.set_crc32c(c.crc32c() ^ 1);
      v1::ClientMessage m;
      *m.mutable_chunk() = std::move(c);
      messages.push_back(std::move(m));
    }
    v1::ClientMessage end;
    end.mutable_step_end()->set_step(step);
    end.mutable_step_end()->set_mode(v1::MODE_TRAIN);
    end.mutable_step_end()->set_mode_step(step);
    end.mutable_step_end()->set_tensor_count(1);
    messages.push_back(std::move(end));
    return Entry(std::move(messages));
  }

  v1::LogEntry JobEnd() {
    v1::ClientMessage m;
    m.mutable_job_end()->set_reason("finished");
    v1::LogEntry e = Entry({m});
    e.set_closed(true);
    return e;
  }

  v1::LogEntry Close() { return Entry({}, /*closed=*/true); }

 private:
  v1::LogEntry Entry(std::vector<v1::ClientMessage> messages, bool closed = false) {
    v1::LogEntry e;
    e.set_gateway(gateway_);
    e.set_connection(connection_);
    for (v1::ClientMessage& m : messages) {
      m.set_seq(++seq_);
      *e.add_messages() = std::move(m);
    }
    e.set_closed(closed);
    return e;
  }

  const std::string gateway_;
  const uint64_t connection_;
  uint64_t seq_ = 0;
};

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_LOGGED_STREAM_H_
