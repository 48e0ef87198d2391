#include "common/tensor_chunks.h"

#include <string>

#include "common/crc32c.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

using ::sonde::testing::StatusIs;

v1::TensorChunk Header(std::vector<int64_t> shape) {
  v1::TensorChunk h;
  h.set_tensor_name("fc1.weight");
  h.set_step(120);
  h.set_mode(v1::MODE_TRAIN);
  h.set_mode_step(120);
  h.set_dtype(v1::DTYPE_F32);
  for (auto d : shape) h.add_shape(d);
  h.add_collections("weights");
  return h;
}

std::string Payload(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 7 + 3);
  return s;
}

TEST(TensorChunks, SplitThenAssembleIsBitExact) {
  const std::string bytes = Payload(4 * 1000);
  for (uint64_t max_chunk : {1ull << 20, 4000ull, 1000ull, 999ull, 4ull}) {
    auto chunks = SplitIntoChunks(Header({10, 100}), bytes, max_chunk);
    EXPECT_EQ(chunks.size(), (bytes.size() + max_chunk - 1) / max_chunk);
    TensorAssembler a(TensorAssembler::Limits{max_chunk, 1 << 20});
    for (const auto& c : chunks) SONDE_ASSERT_OK(a.Add(c));
    ASSERT_TRUE(a.complete());
    EXPECT_EQ(a.bytes(), bytes);
    EXPECT_EQ(a.header().tensor_name(), "fc1.weight");
    EXPECT_TRUE(a.header().payload().empty());
  }
}

TEST(TensorChunks, EmptyTensorIsOneEmptyChunk) {
  auto chunks = SplitIntoChunks(Header({0, 3}), "", 1024);
  ASSERT_EQ(chunks.size(), 1u);
  TensorAssembler a;
  SONDE_ASSERT_OK(a.Add(chunks[0]));
  EXPECT_TRUE(a.complete());
  EXPECT_TRUE(a.bytes().empty());
}

TEST(TensorChunks, StatisticsTravelOnlyOnChunkZero) {
  v1::TensorChunk h = Header({4});
  h.mutable_statistics()->set_count(4);
  auto chunks = SplitIntoChunks(h, Payload(16), 8);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_TRUE(chunks[0].has_statistics());
  EXPECT_FALSE(chunks[1].has_statistics());
}

TEST(TensorChunks, RejectsByteCountThatDoesNotMatchShape) {
  v1::TensorChunk c = SplitIntoChunks(Header({10}), Payload(36), 1024)[0];
  TensorAssembler a;
  EXPECT_THAT(a.Add(c), StatusIs(absl::StatusCode::kInvalidArgument,
                                 "shape [10] needs 40 bytes, total_bytes says 36"));
}

TEST(TensorChunks, RejectsCrcMismatchAsDataLoss) {
  auto chunks = SplitIntoChunks(Header({4}), Payload(16), 1024);
  chunks[0].mutable_payload()->at(3) ^= 1;
  TensorAssembler a;
  EXPECT_THAT(a.Add(chunks[0]), StatusIs(absl::StatusCode::kDataLoss, "crc32c"));
}

TEST(TensorChunks, RejectsOutOfOrderMissingAndDuplicateChunks) {
  auto chunks = SplitIntoChunks(Header({8}), Payload(32), 8);
  ASSERT_EQ(chunks.size(), 4u);
  {
    TensorAssembler a(TensorAssembler::Limits{8, 1024});
    SONDE_ASSERT_OK(a.Add(chunks[0]));
    EXPECT_THAT(a.Add(chunks[2]), StatusIs(absl::StatusCode::kInvalidArgument,
                                           "chunk 2 of tensor 'fc1.weight' at step 120: "
                                           "expected chunk index 1"));
  }
  {
    TensorAssembler a(TensorAssembler::Limits{8, 1024});
    SONDE_ASSERT_OK(a.Add(chunks[0]));
    EXPECT_THAT(a.Add(chunks[0]),
                StatusIs(absl::StatusCode::kInvalidArgument, "expected chunk index 1"));
  }
  {
    TensorAssembler a(TensorAssembler::Limits{8, 1024});
    v1::TensorChunk bad = chunks[1];
    SONDE_ASSERT_OK(a.Add(chunks[0]));
    bad.set_byte_offset(4);
    EXPECT_THAT(a.Add(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "expected byte_offset 8, got 4"));
  }
}

TEST(TensorChunks, RejectsLastChunkThatLeavesBytesMissing) {
  v1::TensorChunk c = SplitIntoChunks(Header({4}), Payload(16), 1024)[0];
  c.set_payload(c.payload().substr(0, 12));
  c.set_crc32c(Crc32c(c.payload()));
  TensorAssembler a;
  EXPECT_THAT(a.Add(c), StatusIs(absl::StatusCode::kInvalidArgument,
                                 "leaves the tensor at 12 of 16 bytes"));
}

TEST(TensorChunks, RejectsChangedDescriptionMidTensor) {
  auto chunks = SplitIntoChunks(Header({8}), Payload(32), 16);
  chunks[1].set_dtype(v1::DTYPE_I32);
  TensorAssembler a(TensorAssembler::Limits{16, 1024});
  SONDE_ASSERT_OK(a.Add(chunks[0]));
  EXPECT_THAT(a.Add(chunks[1]),
              StatusIs(absl::StatusCode::kInvalidArgument, "descriptive fields differ"));
}

TEST(TensorChunks, EnforcesChunkAndTensorLimits) {
  auto big_chunk = SplitIntoChunks(Header({1024}), Payload(4096), 4096)[0];
  TensorAssembler small(TensorAssembler::Limits{1024, 1 << 20});
  EXPECT_THAT(small.Add(big_chunk),
              StatusIs(absl::StatusCode::kInvalidArgument, "chunk_count 1 cannot carry 4096"));
  TensorAssembler tiny(TensorAssembler::Limits{4096, 100});
  EXPECT_THAT(tiny.Add(big_chunk),
              StatusIs(absl::StatusCode::kInvalidArgument, "exceeds the limit of 100"));
}

TEST(TensorChunks, RejectsZeroChunkCountAndEmptyName) {
  v1::TensorChunk c = SplitIntoChunks(Header({1}), Payload(4), 16)[0];
  c.set_chunk_count(0);
  TensorAssembler a;
  EXPECT_THAT(a.Add(c), StatusIs(absl::StatusCode::kInvalidArgument, "chunk_count is 0"));
  v1::TensorChunk d = SplitIntoChunks(Header({1}), Payload(4), 16)[0];
  d.clear_tensor_name();
  TensorAssembler b;
  EXPECT_THAT(b.Add(d), StatusIs(absl::StatusCode::kInvalidArgument, "empty tensor name"));
}

}  // namespace
}  // namespace sonde
