#include "client/spill_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "client/positional_io.h"
#include "common/crc32c.h"

namespace sonde {
namespace {

// Record layout: u32 magic, u32 body length, u32 crc32c(body), body.
// Body: u8 kind, then for a step end its serialized proto; for a tensor:
// name, collections, dtype, shape, step, mode, mode step, flags, histogram
// spec, device id, values (strings as u64 length + bytes; integers
// little-endian).
constexpr uint32_t kMagic = 0x534f4e44;  // "SOND"
constexpr size_t kHeader = 12;

static_assert(std::is_trivially_copyable_v<HistogramSpecHD>);

void PutU64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
void PutU32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
void PutString(std::string& out, const std::string& s) {
  PutU64(out, s.size());
  out.append(s);
}

// Reads from the front of a body; fails once on a short read.
class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  bool ok() const { return ok_; }
  uint64_t U64() { return Fixed<uint64_t>(); }
  uint32_t U32() { return Fixed<uint32_t>(); }
  uint8_t U8() { return Fixed<uint8_t>(); }
  std::string String() {
    const uint64_t n = U64();
    if (!ok_ || n > in_.size() - pos_) {
      ok_ = false;
      return {};
    }
    std::string s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  template <typename T>
  T Fixed() {
    T v{};
    if (!ok_ || sizeof(T) > in_.size() - pos_) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  bool at_end() const { return pos_ == in_.size(); }

 private:
  const std::string& in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

std::string Encode(const SpillRecord& r) {
  std::string body;
  body.push_back(r.is_step_end ? 1 : 0);
  if (r.is_step_end) {
    body.append(r.step_end.SerializeAsString());
    return body;
  }
  const QueuedTensor& t = r.tensor;
  PutString(body, t.name);
  PutU64(body, t.collections.size());
  for (const std::string& c : t.collections) PutString(body, c);
  PutU32(body, static_cast<uint32_t>(t.dtype));
  PutU64(body, t.shape.size());
  for (int64_t d : t.shape) PutU64(body, static_cast<uint64_t>(d));
  PutU64(body, static_cast<uint64_t>(t.step));
  PutU32(body, static_cast<uint32_t>(t.mode));
  PutU64(body, static_cast<uint64_t>(t.mode_step));
  body.push_back(static_cast<char>((t.send_values ? 1 : 0) | (t.histogram ? 2 : 0)));
  body.append(reinterpret_cast<const char*>(&t.histogram_spec), sizeof(HistogramSpecHD));
  PutU64(body, t.device_id);
  PutString(body, t.bytes);
  return body;
}

absl::StatusOr<SpillRecord> Decode(const std::string& body) {
  SpillRecord r;
  if (body.empty()) return absl::DataLossError("empty spill record");
  if (body[0] == 1) {
    r.is_step_end = true;
    if (!r.step_end.ParseFromArray(body.data() + 1, static_cast<int>(body.size() - 1))) {
      return absl::DataLossError("spilled step end does not parse");
    }
    return r;
  }
  Reader in(body);
  in.U8();
  QueuedTensor& t = r.tensor;
  t.name = in.String();
  const uint64_t collections = in.U64();
  for (uint64_t i = 0; in.ok() && i < collections; ++i) t.collections.push_back(in.String());
  t.dtype = static_cast<v1::DType>(in.U32());
  const uint64_t dims = in.U64();
  for (uint64_t i = 0; in.ok() && i < dims; ++i) t.shape.push_back(static_cast<int64_t>(in.U64()));
  t.step = static_cast<int64_t>(in.U64());
  t.mode = static_cast<v1::Mode>(in.U32());
  t.mode_step = static_cast<int64_t>(in.U64());
  const uint8_t flags = in.U8();
  t.send_values = (flags & 1) != 0;
  t.histogram = (flags & 2) != 0;
  t.histogram_spec = in.Fixed<HistogramSpecHD>();
  t.device_id = in.U64();
  t.bytes = in.String();
  if (!in.ok() || !in.at_end()) return absl::DataLossError("spilled tensor record is malformed");
  return r;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SpillFile>> SpillFile::Create(const std::string& dir,
                                                             std::shared_ptr<SpillBudget> budget) {
  absl::StatusOr<int> fd = CreateUnlinkedFile(dir, "sonde-spill", "a spill file");
  if (!fd.ok()) return fd.status();
  return std::unique_ptr<SpillFile>(new SpillFile(*fd, std::move(budget)));
}

absl::StatusOr<std::unique_ptr<SpillFile>> SpillFile::Create(const std::string& dir,
                                                             uint64_t max_bytes) {
  return Create(dir, std::make_shared<SpillBudget>(max_bytes));
}

SpillFile::~SpillFile() {
  close(fd_);
  budget_->Give(end_ - punched_);
}

absl::Status SpillFile::Append(const SpillRecord& record) {
  if (!record.is_step_end && record.tensor.pending != nullptr) {
    return absl::InvalidArgumentError("device tensors are not spilled");
  }
  const std::string body = Encode(record);
  if (body.size() > UINT32_MAX) return absl::InvalidArgumentError("spill record too large");
  const uint64_t size = kHeader + body.size();
  if (!budget_->TryTake(size)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the spill files would pass their limit of ", budget_->limit(),
                     " bytes (max_spill_bytes; ", budget_->held(), " held)"));
  }
  std::string header;
  PutU32(header, kMagic);
  PutU32(header, static_cast<uint32_t>(body.size()));
  PutU32(header, Crc32c(body));
  absl::Status s = PWriteAll(fd_, header.data(), header.size(), end_, "spill write");
  if (s.ok()) s = PWriteAll(fd_, body.data(), body.size(), end_ + kHeader, "spill write");
  if (!s.ok()) {
    budget_->Give(size);
    return s;  // end_ unchanged: the partial record is overwritten next time
  }
  end_ += size;
  sizes_.push_back(size);
  is_step_end_.push_back(record.is_step_end);
  step_ends_ += record.is_step_end;
  return absl::OkStatus();
}

uint64_t SpillFile::NextSize() const { return sizes_.empty() ? 0 : sizes_.front(); }

absl::StatusOr<SpillRecord> SpillFile::ReadNext() {
  if (sizes_.empty()) return absl::FailedPreconditionError("no spilled record");
  const uint64_t size = sizes_.front();
  const uint64_t at = head_;
  sizes_.pop_front();
  step_ends_ -= is_step_end_.front();
  is_step_end_.pop_front();
  head_ += size;
  absl::StatusOr<SpillRecord> record = ReadAt(at, size);
  if (sizes_.empty()) {
    // Every record is read: give the disk space back. (If truncating fails,
    // appending simply goes on after the old data.)
    if (ftruncate(fd_, 0) == 0) {
      budget_->Give(end_ - punched_);
      head_ = end_ = punched_ = 0;
    }
  } else if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(at),
                       static_cast<off_t>(size)) == 0) {
    // Read, never read again: its blocks come back now. (Where the file
    // system cannot punch holes, they count until the truncation.)
    budget_->Give(size);
    punched_ += size;
  }
  return record;
}

absl::StatusOr<SpillRecord> SpillFile::ReadAt(uint64_t at, uint64_t size) const {
  std::string header(kHeader, '\0');
  absl::Status s = PReadAll(fd_, header.data(), kHeader, at, "spill read");
  if (!s.ok()) return s;
  uint32_t magic, length, crc;
  std::memcpy(&magic, header.data(), 4);
  std::memcpy(&length, header.data() + 4, 4);
  std::memcpy(&crc, header.data() + 8, 4);
  if (magic != kMagic || kHeader + length != size) {
    return absl::DataLossError("spill record header is corrupt");
  }
  std::string body(length, '\0');
  s = PReadAll(fd_, body.data(), length, at + kHeader, "spill read");
  if (!s.ok()) return s;
  if (Crc32c(body) != crc) return absl::DataLossError("spill record fails its CRC");
  return Decode(body);
}

}  // namespace sonde
