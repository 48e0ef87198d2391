// The contract every DeviceStats engine keeps, as test bodies shared by the
// real engine's tests (which run where there is a GPU) and the emulated
// engine's (which run everywhere): the same assertions, so what CI checks
// on the emulator is what a GPU machine checks on the hardware.
#ifndef SONDE_CUDA_ENGINE_CONTRACT_H_
#define SONDE_CUDA_ENGINE_CONTRACT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cuda/device_stats.h"

namespace sonde {

// Where an engine's tensors live, for the tests.
class ContractMemory {
 public:
  virtual ~ContractMemory() = default;
  // `bytes` in the engine's memory, written on the producer stream.
  virtual const void* Upload(const std::string& bytes) = 0;
  // Overwrites memory from Upload, ordered on the producer stream after
  // everything enqueued on it so far (as training's next kernel would be).
  virtual void Overwrite(const void* at, const std::string& bytes) = 0;
  // Sets `bytes` bytes at `at` to `value`, on the producer stream, as a
  // device-side write (no host copy to wait for first).
  virtual void Fill(const void* at, int value, size_t bytes) = 0;
  virtual void* producer_stream() = 0;
  // Waits for the producer stream.
  virtual void Sync() = 0;
};

struct ContractTarget {
  std::function<absl::StatusOr<std::unique_ptr<DeviceStats>>(const DeviceStatsOptions&)> engine;
  std::function<std::unique_ptr<ContractMemory>()> memory;
};

// Each checks one clause with gtest assertions.
void ContractStatisticsMatchTheCpu(const ContractTarget& target);
void ContractSnapshotsConvertLikeTheCpu(const ContractTarget& target);
void ContractLargeTensorsTravelInPieces(const ContractTarget& target);
void ContractSnapshotIsTakenBeforeTheProducerGoesOn(const ContractTarget& target);
void ContractSnapshotMemoryIsBoundedAndComesBack(const ContractTarget& target);
void ContractDeferredReadsFinishBeforeAFencedWrite(const ContractTarget& target);
void ContractFullSlotsRefuseRatherThanBlock(const ContractTarget& target);
void ContractUnknownTicketsAndDiscards(const ContractTarget& target);
void ContractOptionsOutOfRangeAreRefused(const ContractTarget& target);

// Collects until `want` completions of `kind` have arrived or `timeout`
// has passed; every completion collected is returned.
std::vector<DeviceCompletion> CollectUntil(DeviceStats& engine, DeviceCompletion::Kind kind,
                                           size_t want, double timeout_seconds = 30);

}  // namespace sonde

// Defines one TEST per clause for a fixture whose `target()` returns the
// ContractTarget (and which skips where its engine cannot run).
#define SONDE_ENGINE_CONTRACT_TESTS(Fixture)                                                     \
  TEST_F(Fixture, StatisticsMatchTheCpu) { ::sonde::ContractStatisticsMatchTheCpu(target()); }   \
  TEST_F(Fixture, SnapshotsConvertLikeTheCpu) {                                                  \
    ::sonde::ContractSnapshotsConvertLikeTheCpu(target());                                       \
  }                                                                                              \
  TEST_F(Fixture, LargeTensorsTravelInPieces) {                                                  \
    ::sonde::ContractLargeTensorsTravelInPieces(target());                                       \
  }                                                                                              \
  TEST_F(Fixture, SnapshotIsTakenBeforeTheProducerGoesOn) {                                      \
    ::sonde::ContractSnapshotIsTakenBeforeTheProducerGoesOn(target());                           \
  }                                                                                              \
  TEST_F(Fixture, DeferredReadsFinishBeforeAFencedWrite) {                                       \
    ::sonde::ContractDeferredReadsFinishBeforeAFencedWrite(target());                            \
  }                                                                                              \
  TEST_F(Fixture, SnapshotMemoryIsBoundedAndComesBack) {                                         \
    ::sonde::ContractSnapshotMemoryIsBoundedAndComesBack(target());                              \
  }                                                                                              \
  TEST_F(Fixture, FullSlotsRefuseRatherThanBlock) {                                              \
    ::sonde::ContractFullSlotsRefuseRatherThanBlock(target());                                   \
  }                                                                                              \
  TEST_F(Fixture, UnknownTicketsAndDiscards) {                                                   \
    ::sonde::ContractUnknownTicketsAndDiscards(target());                                        \
  }                                                                                              \
  TEST_F(Fixture, OptionsOutOfRangeAreRefused) {                                                 \
    ::sonde::ContractOptionsOutOfRangeAreRefused(target());                                      \
  }

#endif  // SONDE_CUDA_ENGINE_CONTRACT_H_
