// The hook's background half: a bounded queue and one thread that turns
// queued tensors into statistics and chunks and streams them to the
// collector over gRPC, plus a reader thread for acks and actions. The
// training thread only copies bytes into the queue; it never waits for the
// network. When the queue is full a tensor is dropped and counted (logged
// once). A broken stream is logged once per kind of failure and the sender
// reconnects with backoff, going on with what is still queued.
// Thread-safe. Internal to client/.
#ifndef SONDE_CLIENT_SENDER_H_
#define SONDE_CLIENT_SENDER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/device_capture.h"
#include "cuda/histogram.h"
#include "proto/collector.grpc.pb.h"

namespace sonde {

struct SenderOptions {
  std::string collector;              // host:port
  v1::Hello hello;                    // job, worker, world size, rules...
  uint64_t max_queue_bytes = 256 << 20;  // bytes of queued tensor values
  uint64_t max_chunk_bytes = 1 << 20;    // payload per chunk (the collector may lower it)
  absl::Duration reconnect_min = absl::Milliseconds(100);
  absl::Duration reconnect_max = absl::Seconds(5);
  std::function<void(const v1::Action&)> on_action;  // called on the reader thread
  std::function<void(const v1::HelloAck&)> on_hello_ack;  // likewise, once per stream
  // Waits for a device tensor's results (set when the hook captures device
  // tensors); the sender thread calls it.
  std::function<absl::Status(const std::shared_ptr<PendingDeviceTensor>&)> await_device;
};

// One tensor to send: values copied out of the training code's memory.
struct QueuedTensor {
  std::string name;
  std::vector<std::string> collections;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  std::string bytes;
  bool send_values = true;  // else statistics only
  int64_t step = 0;
  v1::Mode mode = v1::MODE_GLOBAL;
  int64_t mode_step = 0;
  // A histogram of the values is wanted, with this spec.
  bool histogram = false;
  HistogramSpecHD histogram_spec;
  // A device tensor whose statistics (and values, if copied) are still on
  // their way: the sender waits for them on its own thread before writing.
  std::shared_ptr<PendingDeviceTensor> pending;
};

struct SenderCounters {
  uint64_t tensors_queued = 0;
  uint64_t tensors_dropped = 0;  // queue full
  uint64_t messages_sent = 0;   // on the current stream
  uint64_t last_acked_seq = 0;  // on the current stream
  uint64_t steps_acked = 0;
  uint64_t reconnects = 0;
};

class Sender {
 public:
  explicit Sender(SenderOptions options);
  ~Sender();  // Close(absl::ZeroDuration()) if not closed

  // Never block on the network. Enqueue returns false when the tensor was
  // dropped because the queue is full.
  bool EnqueueTensor(QueuedTensor tensor);
  void EnqueueStepEnd(int64_t step, v1::Mode mode, int64_t mode_step, double duration);

  // Sends the job end and waits up to `timeout` for the collector to
  // acknowledge everything. DeadlineExceeded if it did not.
  absl::Status Close(const std::string& reason, absl::Duration timeout);

  SenderCounters counters() const;

  // A buffer for a tensor's copy, recycled from tensors already sent when
  // one is free: its pages are already mapped, so copying into it costs a
  // memcpy, not page faults. Thread-safe.
  std::string AcquireBuffer(size_t bytes);

  // Waits until the collector has accepted the hello on the current stream.
  bool WaitForHelloAck(absl::Duration timeout);
  // Waits until everything queued so far has been written and acknowledged.
  bool WaitForAcks(absl::Duration timeout);

 private:
  struct Item {
    enum Kind { kTensor, kStepEnd, kJobEnd } kind;
    QueuedTensor tensor;
    v1::StepEnd step_end;
    v1::JobEnd job_end;
  };

  void Run();
  // Streams queued items until the stream fails or the job end is acked.
  // Returns true when done for good.
  bool StreamOnce();
  bool WriteItem(grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>* stream,
                 const Item& item);
  void LogOnce(const std::string& key, const std::string& message);

  const SenderOptions options_;

  mutable absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;      // the sender thread has exited
  bool job_end_acked_ ABSL_GUARDED_BY(mu_) = false;
  bool give_up_ ABSL_GUARDED_BY(mu_) = false;   // Close timed out: stop retrying
  bool connected_ ABSL_GUARDED_BY(mu_) = false;  // hello acked on the current stream
  SenderCounters counters_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> logged_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> free_buffers_ ABSL_GUARDED_BY(mu_);  // sent tensors' buffers
  uint64_t free_bytes_ ABSL_GUARDED_BY(mu_) = 0;

  grpc::ClientContext* active_context_ ABSL_GUARDED_BY(mu_) = nullptr;

  // Used by the sender thread only.
  uint64_t seq_ = 0;
  uint64_t job_end_seq_ = 0;
  uint32_t step_tensors_ = 0;  // tensors written for the open step on this stream
  uint64_t chunk_limit_ = 0;

  std::thread thread_;
};

}  // namespace sonde

#endif  // SONDE_CLIENT_SENDER_H_
