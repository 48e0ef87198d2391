#include "server/statistics_check.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace sonde::server {
namespace {

bool Lossy(v1::DType d) { return d == v1::DTYPE_F16 || d == v1::DTYPE_BF16; }

// Relative rounding of one conversion to the dtype (half an ulp), and the
// largest finite value.
double Epsilon(v1::DType d) {
  switch (d) {
    case v1::DTYPE_F16: return 1.0 / 2048;
    case v1::DTYPE_BF16: return 1.0 / 256;
    default: return 0;
  }
}
double Largest(v1::DType d) { return d == v1::DTYPE_F16 ? 65504.0 : 3.3895313892515355e38; }
double SmallestNormal(v1::DType d) { return d == v1::DTYPE_F16 ? 6.103515625e-05 : 1.1754943508222875e-38; }

absl::Status Disagree(const char* field, double client, double computed) {
  return absl::InvalidArgumentError(absl::StrCat(field, " is ", client, " in the statistics but ",
                                                 computed, " in the values"));
}

// An extreme of the original values against the same extreme of their
// converted copies.
bool ExtremeAgrees(double client, double computed, v1::DType dtype) {
  if (client == computed) return true;
  if (!Lossy(dtype)) return false;
  if (std::isinf(computed)) return std::abs(client) >= Largest(dtype) * (1 - Epsilon(dtype)) &&
                                    std::signbit(client) == std::signbit(computed);
  if (computed == 0) return std::abs(client) <= SmallestNormal(dtype);
  return std::abs(client - computed) <= 2 * Epsilon(dtype) * std::abs(computed);
}

}  // namespace

absl::Status CheckClientStatistics(const v1::Statistics& client, const v1::Statistics& computed,
                                   v1::DType dtype) {
  if (client.count() != computed.count()) {
    return Disagree("count", client.count(), computed.count());
  }
  if (client.nan_count() != computed.nan_count()) {
    return Disagree("nan_count", client.nan_count(), computed.nan_count());
  }
  const bool lossy = Lossy(dtype);
  if (!lossy) {
    const std::pair<const char*, std::pair<uint64_t, uint64_t>> counts[] = {
        {"finite_count", {client.finite_count(), computed.finite_count()}},
        {"pos_inf_count", {client.pos_inf_count(), computed.pos_inf_count()}},
        {"neg_inf_count", {client.neg_inf_count(), computed.neg_inf_count()}},
        {"zero_count", {client.zero_count(), computed.zero_count()}},
    };
    for (const auto& [field, c] : counts) {
      if (c.first != c.second) return Disagree(field, c.first, c.second);
    }
  }
  if (computed.count() == computed.nan_count()) return absl::OkStatus();  // no extremes
  const std::pair<const char*, std::pair<double, double>> extremes[] = {
      {"min", {client.min(), computed.min()}},
      {"max", {client.max(), computed.max()}},
      {"abs_min", {client.abs_min(), computed.abs_min()}},
      {"abs_max", {client.abs_max(), computed.abs_max()}},
  };
  for (const auto& [field, e] : extremes) {
    if (!ExtremeAgrees(e.first, e.second, dtype)) return Disagree(field, e.first, e.second);
  }
  // Sums over finite elements: summation order (GPU against CPU) moves
  // them by rounding, conversion by up to epsilon of each element. Where
  // conversion changed which elements are finite, they cannot be compared.
  if (lossy && client.finite_count() != computed.finite_count()) return absl::OkStatus();
  const double n = static_cast<double>(computed.finite_count()) + 1;
  const double order = 64 * n * std::numeric_limits<double>::epsilon() +
                       (dtype == v1::DTYPE_F32 ? 1e-6 : 0);
  const double relative = order + 2.5 * Epsilon(dtype);
  const double l1 = std::max(std::abs(computed.l1()), std::abs(client.l1()));
  const double squares = std::max(std::abs(computed.sum_squares()), std::abs(client.sum_squares()));
  auto close = [](double a, double b, double scale, double rel) {
    return std::abs(a - b) <= rel * scale + std::numeric_limits<double>::min();
  };
  if (!close(client.sum(), computed.sum(), l1, relative)) {
    return Disagree("sum", client.sum(), computed.sum());
  }
  if (!close(client.l1(), computed.l1(), l1, relative)) {
    return Disagree("l1", client.l1(), computed.l1());
  }
  if (!close(client.sum_squares(), computed.sum_squares(), squares, 2 * relative)) {
    return Disagree("sum_squares", client.sum_squares(), computed.sum_squares());
  }
  if (!close(client.m2(), computed.m2(), squares, 4 * relative)) {
    return Disagree("m2", client.m2(), computed.m2());
  }
  return absl::OkStatus();
}

}  // namespace sonde::server
