// A tensor saved by the hook and queued for the sender: its values copied
// out of the training code's memory (or, for a device tensor, the pending
// results of the device engine). Internal to client/.
#ifndef SONDE_CLIENT_QUEUED_TENSOR_H_
#define SONDE_CLIENT_QUEUED_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/device_capture.h"
#include "math/histogram_math.h"
#include "proto/tensor.pb.h"

namespace sonde {

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
  // A device tensor whose statistics (and values, if wanted) are still on
  // their way: the sender waits for them on its own thread before writing.
  std::shared_ptr<PendingDeviceTensor> pending;
  // A device tensor in the spill file: its record holds this id, and the
  // sender keeps `pending` in memory under it until the record is read back.
  uint64_t device_id = 0;
};

}  // namespace sonde

#endif  // SONDE_CLIENT_QUEUED_TENSOR_H_
