// How one multi-tensor launch splits its work: every tensor of a batch is cut
// into chunks (TensorChunkElements: `chunk_elements`, larger for a tensor
// that would have more than kMaxChunksPerTensor), and the grid has one
// block per chunk, so hundreds of tensors of any sizes take one launch (in
// the style of multi-tensor-apply). The tables are plain structs built on
// the host and read by the kernels; the planning is host code tested on the
// CPU.
#ifndef SONDE_CUDA_MULTI_TENSOR_H_
#define SONDE_CUDA_MULTI_TENSOR_H_

#include <cstdint>
#include <vector>

#include "math/histogram_math.h"
#include "math/stats_math.h"

namespace sonde {

// Element types the kernels read, numbered as sonde.v1.DType.
enum KernelDType : int32_t {
  kKernelF32 = 1,
  kKernelF16 = 2,
  kKernelBF16 = 3,
  kKernelF64 = 4,
};

struct KernelTensor {
  const void* data = nullptr;  // device pointer
  uint64_t count = 0;          // elements
  int32_t dtype = 0;           // KernelDType
  int32_t histogram = 0;       // 1: fill counters at hist_offset
  uint32_t first_chunk = 0;    // index of its first chunk in the chunk table
  uint32_t chunk_count = 0;
  uint64_t hist_offset = 0;    // into the batch's counter array
};

struct KernelChunk {
  uint32_t tensor = 0;  // index into the tensor table
  uint32_t reserved = 0;
  uint64_t begin = 0;   // first element of the chunk
  uint64_t count = 0;   // elements in the chunk
};

struct BatchPlan {
  std::vector<KernelTensor> tensors;
  std::vector<KernelChunk> chunks;
  uint64_t histogram_counters = 0;  // total counters over all tensors
};

// The default chunk: 32 Ki elements (128 KiB of F32) per block, so that a
// 64 MiB tensor alone gives 512 blocks, several waves on a 132-SM GPU. Two
// runs of gpu_check's sweep on an NVIDIA H200 (docs/statistics.md) chose it:
// a step's batch of 300 tensors read at 0.75-0.76 of a plain sum against
// 0.72 with 16 Ki (fewer chunk records to merge); other sizes within 0.01.
inline constexpr uint64_t kDefaultChunkElements = uint64_t{1} << 15;

// A tensor has at most this many chunks: above it, its chunks double until
// it fits, which keeps the merge of its chunk records short (a 1 GiB F32
// tensor: 2,048 chunks of 128 Ki elements, still several waves).
inline constexpr uint64_t kMaxChunksPerTensor = 2048;

// Elements per chunk of a tensor of `count` elements: `chunk_elements`
// doubled until the tensor has at most kMaxChunksPerTensor chunks.
inline uint64_t TensorChunkElements(uint64_t count, uint64_t chunk_elements) {
  uint64_t per = chunk_elements > 0 ? chunk_elements : 1;
  while ((count + per - 1) / per > kMaxChunksPerTensor) per *= 2;
  return per;
}

// Cuts `tensors` (data, count, dtype, histogram set by the caller) into
// chunks of TensorChunkElements(count, chunk_elements); fills first_chunk/chunk_count/hist_offset. A tensor with no
// elements gets no chunk; its record stays empty. `hist_counters` is the
// number of counters of the batch's histogram spec.
BatchPlan PlanBatch(std::vector<KernelTensor> tensors, uint64_t chunk_elements,
                    uint32_t hist_counters);

}  // namespace sonde

#endif  // SONDE_CUDA_MULTI_TENSOR_H_
