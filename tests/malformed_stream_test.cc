// Messages that do not parse end the ingest stream with INVALID_ARGUMENT
// naming the message, not with OK as a half-close would (issue 16, item
// 6), and what was acknowledged before stays stored.
#include <memory>
#include <string>

#include "client/query_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/collector.pb.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/raw_stream.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

using ::sonde::testing::InProcessCollector;
using ::sonde::testing::RawStream;
using ::testing::HasSubstr;

v1::ClientMessage Hello(const std::string& job) {
  v1::ClientMessage m;
  m.set_seq(1);
  m.mutable_hello()->set_job(job);
  m.mutable_hello()->set_world_size(1);
  m.mutable_hello()->set_client_id(42);
  return m;
}

// Hello, its ack, and one committed step (a summary and its step end).
void OneStoredStep(RawStream& s, const std::string& job) {
  ASSERT_TRUE(s.Write(Hello(job)));
  v1::ServerMessage in;
  ASSERT_TRUE(s.Read(&in));
  ASSERT_TRUE(in.has_hello_ack()) << in.DebugString();
  v1::ClientMessage summary;
  summary.set_seq(2);
  v1::TensorSummary* t = summary.mutable_summary();
  t->set_step(0);
  t->set_mode(v1::MODE_TRAIN);
  t->set_tensor_name("loss");
  t->set_dtype(v1::DTYPE_F64);
  t->mutable_statistics()->set_count(1);
  t->mutable_statistics()->set_finite_count(1);
  ASSERT_TRUE(s.Write(summary));
  v1::ClientMessage end;
  end.set_seq(3);
  end.mutable_step_end()->set_step(0);
  end.mutable_step_end()->set_mode(v1::MODE_TRAIN);
  end.mutable_step_end()->set_tensor_count(1);
  ASSERT_TRUE(s.Write(end));
  ASSERT_TRUE(s.Read(&in));
  ASSERT_TRUE(in.has_ack()) << in.DebugString();
  EXPECT_EQ(in.ack().acked_seq(), 3u);
}

TEST(MalformedStream, GarbageBytesAreInvalidArgumentNotAHalfClose) {
  InProcessCollector collector;
  RawStream s(collector.address());
  s.WriteBytes("\xff\xff\xff\xff garbage \x01\x02");
  const grpc::Status status = s.Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("message 1 of the stream (15 bytes)"));
  EXPECT_THAT(status.error_message(), HasSubstr("is not a sonde.v1.ClientMessage"));
}

TEST(MalformedStream, ATruncatedMessageAfterAStoredStepEndsTheStreamAndKeepsTheStep) {
  InProcessCollector collector;
  RawStream s(collector.address());
  OneStoredStep(s, "truncated");
  v1::ClientMessage chunk;
  chunk.set_seq(4);
  chunk.mutable_chunk()->set_tensor_name("fc1.weight");
  chunk.mutable_chunk()->set_step(1);
  chunk.mutable_chunk()->set_payload(std::string(1000, 'x'));
  const std::string bytes = chunk.SerializeAsString();
  s.WriteBytes(bytes.substr(0, bytes.size() / 2));
  const grpc::Status status = s.Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("message 4 of the stream"));
  auto q = QueryClient::Connect(collector.address());
  auto steps = q->ListSteps("truncated");
  SONDE_ASSERT_OK(steps);
  ASSERT_EQ(steps->size(), 1u);
  EXPECT_EQ((*steps)[0].tensor_count(), 1u);
}

TEST(MalformedStream, AStringThatIsNotUtf8IsInvalidArgument) {
  InProcessCollector collector;
  RawStream s(collector.address());
  v1::ClientMessage hello = Hello("placeholder");
  std::string bytes = hello.SerializeAsString();
  // The job name's bytes, replaced in place by an invalid UTF-8 sequence.
  const size_t at = bytes.find("placeholder");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 3, "\xc3\x28\xa0");
  s.WriteBytes(bytes);
  const grpc::Status status = s.Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("UTF-8"));
  // The collector still serves.
  RawStream next(collector.address());
  OneStoredStep(next, "after");
  EXPECT_TRUE(next.Finish().ok());
}

}  // namespace
}  // namespace sonde
