#include "common/dtype.h"

#include "math/float16_math.h"

#include <cstring>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sonde {

size_t DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F64:
    case v1::DTYPE_I64:
      return 8;
    case v1::DTYPE_F32:
    case v1::DTYPE_I32:
      return 4;
    case v1::DTYPE_F16:
    case v1::DTYPE_BF16:
    case v1::DTYPE_I16:
      return 2;
    case v1::DTYPE_I8:
    case v1::DTYPE_U8:
    case v1::DTYPE_BOOL:
      return 1;
    default:
      return 0;
  }
}

absl::string_view DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32: return "float32";
    case v1::DTYPE_F16: return "float16";
    case v1::DTYPE_BF16: return "bfloat16";
    case v1::DTYPE_F64: return "float64";
    case v1::DTYPE_I8: return "int8";
    case v1::DTYPE_I16: return "int16";
    case v1::DTYPE_I32: return "int32";
    case v1::DTYPE_I64: return "int64";
    case v1::DTYPE_U8: return "uint8";
    case v1::DTYPE_BOOL: return "bool";
    default: return "unspecified";
  }
}

absl::StatusOr<v1::DType> ParseDType(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  for (int d = v1::DType_MIN; d <= v1::DType_MAX; ++d) {
    auto dtype = static_cast<v1::DType>(d);
    if (dtype == v1::DTYPE_UNSPECIFIED) continue;
    std::string short_name = absl::AsciiStrToLower(v1::DType_Name(dtype).substr(6));
    if (n == DTypeName(dtype) || n == short_name) return dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "'"));
}

absl::string_view ModeName(v1::Mode mode) {
  switch (mode) {
    case v1::MODE_TRAIN: return "TRAIN";
    case v1::MODE_EVAL: return "EVAL";
    case v1::MODE_PREDICT: return "PREDICT";
    case v1::MODE_GLOBAL: return "GLOBAL";
    default: return "UNSPECIFIED";
  }
}

absl::StatusOr<v1::Mode> ParseMode(absl::string_view name) {
  const std::string n = absl::AsciiStrToUpper(name);
  if (n == "TRAIN") return v1::MODE_TRAIN;
  if (n == "EVAL") return v1::MODE_EVAL;
  if (n == "PREDICT") return v1::MODE_PREDICT;
  if (n == "GLOBAL") return v1::MODE_GLOBAL;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown mode '", name, "' (expected TRAIN, EVAL, PREDICT or GLOBAL)"));
}

absl::StatusOr<uint64_t> ElementCount(absl::Span<const int64_t> shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " has a negative dimension"));
    }
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " overflows 64 bits"));
    }
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

absl::StatusOr<uint64_t> TensorBytes(v1::DType dtype,
                                     absl::Span<const int64_t> shape) {
  const size_t size = DTypeSize(dtype);
  if (size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported dtype ", static_cast<int>(dtype)));
  }
  auto n = ElementCount(shape);
  if (!n.ok()) return n.status();
  if (*n > std::numeric_limits<uint64_t>::max() / size) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", ShapeString(shape), " overflows 64 bits"));
  }
  return *n * size;
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

namespace {

template <typename T>
double Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return static_cast<double>(v);
}

}  // namespace

double ElementAsDouble(const char* data, v1::DType dtype, uint64_t i) {
  const char* p = data + i * DTypeSize(dtype);
  switch (dtype) {
    case v1::DTYPE_F32: return Load<float>(p);
    case v1::DTYPE_F64: return Load<double>(p);
    case v1::DTYPE_F16: return HalfToFloat(static_cast<uint16_t>(Load<uint16_t>(p)));
    case v1::DTYPE_BF16: return BFloat16ToFloat(static_cast<uint16_t>(Load<uint16_t>(p)));
    case v1::DTYPE_I8: return Load<int8_t>(p);
    case v1::DTYPE_I16: return Load<int16_t>(p);
    case v1::DTYPE_I32: return Load<int32_t>(p);
    case v1::DTYPE_I64: return Load<int64_t>(p);
    case v1::DTYPE_U8: return Load<uint8_t>(p);
    case v1::DTYPE_BOOL: return *p != 0 ? 1.0 : 0.0;
    default: return 0.0;
  }
}

absl::StatusOr<std::vector<double>> DecodeAsDouble(absl::string_view bytes, v1::DType dtype) {
  const size_t size = DTypeSize(dtype);
  if (size == 0 || bytes.size() % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(bytes.size(), " bytes are not whole ",
                                                   DTypeName(dtype), " elements"));
  }
  std::vector<double> out(bytes.size() / size);
  for (size_t i = 0; i < out.size(); ++i) out[i] = ElementAsDouble(bytes.data(), dtype, i);
  return out;
}

float HalfToFloat(uint16_t h) { return SondeHalfToFloat(h); }
float BFloat16ToFloat(uint16_t b) { return SondeBf16ToFloat(b); }

}  // namespace sonde
