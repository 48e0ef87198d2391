#include "cuda/multi_tensor.h"

#include <algorithm>

namespace sonde {

BatchPlan PlanBatch(std::vector<KernelTensor> tensors, uint64_t chunk_elements,
                    uint32_t hist_counters) {
  BatchPlan plan;
  plan.tensors = std::move(tensors);
  for (uint32_t t = 0; t < plan.tensors.size(); ++t) {
    KernelTensor& tensor = plan.tensors[t];
    tensor.first_chunk = static_cast<uint32_t>(plan.chunks.size());
    const uint64_t per = TensorChunkElements(tensor.count, chunk_elements);
    for (uint64_t begin = 0; begin < tensor.count; begin += per) {
      KernelChunk chunk;
      chunk.tensor = t;
      chunk.begin = begin;
      chunk.count = std::min(per, tensor.count - begin);
      plan.chunks.push_back(chunk);
    }
    tensor.chunk_count = static_cast<uint32_t>(plan.chunks.size()) - tensor.first_chunk;
    if (tensor.histogram) {
      tensor.hist_offset = plan.histogram_counters;
      plan.histogram_counters += hist_counters;
    }
  }
  return plan;
}

}  // namespace sonde
