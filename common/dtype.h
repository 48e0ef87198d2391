// Element types and shapes of tensors: sizes, names, and the checked
// arithmetic that turns a shape into a byte count. Thread-safe; no state.
#ifndef SONDE_COMMON_DTYPE_H_
#define SONDE_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/tensor.pb.h"

namespace sonde {

// Bytes per element; 0 for DTYPE_UNSPECIFIED and unknown values.
size_t DTypeSize(v1::DType dtype);

// "float32", "float16", "bfloat16", "float64", "int8", ... (numpy's names).
absl::string_view DTypeName(v1::DType dtype);

// Accepts numpy names and the enum's short names ("f32", "F32", "float32").
absl::StatusOr<v1::DType> ParseDType(absl::string_view name);

// "TRAIN", "EVAL", "PREDICT", "GLOBAL".
absl::string_view ModeName(v1::Mode mode);
absl::StatusOr<v1::Mode> ParseMode(absl::string_view name);

// Number of elements of a tensor with this shape (1 for a scalar), or
// InvalidArgument for negative dimensions and overflow.
absl::StatusOr<uint64_t> ElementCount(absl::Span<const int64_t> shape);

// Bytes a tensor of this dtype and shape occupies, with the same checks.
absl::StatusOr<uint64_t> TensorBytes(v1::DType dtype,
                                     absl::Span<const int64_t> shape);

// "[2,3]" for messages and tables.
std::string ShapeString(absl::Span<const int64_t> shape);

// Every element of raw little-endian `bytes` as a double (for display and
// tests). InvalidArgument if the size is not a whole number of elements.
absl::StatusOr<std::vector<double>> DecodeAsDouble(absl::string_view bytes, v1::DType dtype);

// Element `i` of raw little-endian elements of `dtype` at `data`, as a
// double (0 for unknown dtypes); no bounds check.
double ElementAsDouble(const char* data, v1::DType dtype, uint64_t i);

// IEEE binary16 and bfloat16 to float, exactly (the same conversion the
// CUDA kernels use: math/float16_math.h).
float HalfToFloat(uint16_t h);
float BFloat16ToFloat(uint16_t b);

}  // namespace sonde

#endif  // SONDE_COMMON_DTYPE_H_
