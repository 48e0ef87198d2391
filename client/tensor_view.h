// A tensor as the training code holds it: a pointer, an element type, a
// shape, and where the memory lives. The hook never keeps the pointer past
// the call that received it. Row-major, contiguous, little-endian.
#ifndef SONDE_CLIENT_TENSOR_VIEW_H_
#define SONDE_CLIENT_TENSOR_VIEW_H_

#include <cstdint>
#include <vector>

#include "proto/tensor.pb.h"

namespace sonde {

enum class Device { kHost, kCuda };

struct TensorView {
  const void* data = nullptr;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;  // {} for a scalar
  Device device = Device::kHost;
  int device_index = 0;        // CUDA device ordinal when device == kCuda
  // For device tensors: the cudaStream_t that produced the values (nullptr
  // is the legacy default stream). Sonde's reads are ordered after the work
  // already on it, and its later work waits for the reads to finish.
  void* stream = nullptr;
};

inline TensorView HostTensor(const float* data, std::vector<int64_t> shape) {
  return TensorView{data, v1::DTYPE_F32, std::move(shape), Device::kHost, 0, nullptr};
}
inline TensorView HostTensor(const double* data, std::vector<int64_t> shape) {
  return TensorView{data, v1::DTYPE_F64, std::move(shape), Device::kHost, 0, nullptr};
}

// A tensor in CUDA device memory (F32, F16, BF16 or F64).
inline TensorView CudaTensor(const void* data, v1::DType dtype, std::vector<int64_t> shape,
                             int device_index = 0, void* stream = nullptr) {
  return TensorView{data, dtype, std::move(shape), Device::kCuda, device_index, stream};
}

}  // namespace sonde

#endif  // SONDE_CLIENT_TENSOR_VIEW_H_
