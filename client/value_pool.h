// Host buffers for the values of device tensors, kept for reuse.
//
// A download writes hundreds of MiB into host memory. Fresh memory (a new
// allocation that large is mapped anew each time) is faulted in page by
// page as the copy first touches it, at a fraction of memcpy's speed: on
// the H200 run the 1 GiB download went at 5.8-7.3 GB/s. Buffers handed back
// are kept, up to a byte limit, and the next values of a similar size are
// written into memory that is already there.
//
// Thread-safe. A buffer may outlive the pool's owner: it holds the pool.
#ifndef SONDE_CLIENT_VALUE_POOL_H_
#define SONDE_CLIENT_VALUE_POOL_H_

#include <cstdint>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace sonde {

class ValuePool : public std::enable_shared_from_this<ValuePool> {
 public:
  // Gives a buffer back to its pool (or frees it, past the pool's limit or
  // without a pool).
  // (unique_ptr::reset keeps its deleter: this one lets go of the pool
  // once it has given its buffer back.)
  struct Return {
    mutable std::shared_ptr<ValuePool> pool;
    uint64_t capacity = 0;
    void operator()(char* buffer) const;
  };
  using Buffer = std::unique_ptr<char[], Return>;

  // Keeps at most `max_bytes` of free buffers.
  static std::shared_ptr<ValuePool> Create(uint64_t max_bytes);
  ~ValuePool();

  // A buffer of at least `bytes` (not zeroed): a kept one no more than
  // twice that large, else a new one.
  Buffer Take(uint64_t bytes);

  uint64_t kept_bytes() const;
  uint64_t reused() const;  // Takes served by a kept buffer

 private:
  explicit ValuePool(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  void Keep(char* buffer, uint64_t capacity);

  const uint64_t max_bytes_;
  mutable absl::Mutex mu_;
  std::multimap<uint64_t, char*> free_ ABSL_GUARDED_BY(mu_);  // by capacity
  uint64_t kept_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reused_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sonde

#endif  // SONDE_CLIENT_VALUE_POOL_H_
