// What Sonde's TensorBoard export shows of a tensor at one step, as the
// values of a TensorFlow Summary:
//  - a one-element tensor: its value as a scalar tagged with the tensor's
//    name;
//  - any other tensor: chosen statistics of its stored record as scalars
//    tagged "<tensor>/<statistic>", and, when it carries a histogram (its
//    collection has save_histogram), a histogram tagged with its name.
// Records of one tensor from several workers are merged first (statistics
// of the union of the workers' tensors, histogram counts added, so a
// scalar becomes the mean over workers). Stateless and thread-safe.
#ifndef SONDE_SERVER_TENSORBOARD_SUMMARY_H_
#define SONDE_SERVER_TENSORBOARD_SUMMARY_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stats/histogram.h"
#include "proto/tensor.pb.h"
#include "proto/tensorboard.pb.h"

namespace sonde::server::tensorboard {

// The statistics written for tensors of more than one element when nothing
// else is asked for.
std::vector<std::string> DefaultStatistics();  // {"mean", "std", "l2"}

// Checks names of statistics: smdebug's reductions (min, max, mean, std,
// variance, sum, l1, l2 and their abs_ forms) and the counters (count,
// finite_count, nan_count, pos_inf_count, neg_inf_count, zero_count) or
// sum_squares. InvalidArgument naming the first unknown or repeated one.
absl::Status ValidateStatisticNames(const std::vector<std::string>& names);

// One named statistic of a record. A statistic over finite values of a
// tensor with none (min and max: with no non-NaN value) is NaN, so the
// chart shows the hole instead of a made-up 0. NotFound for unknown names.
absl::StatusOr<double> StatisticValue(const v1::Statistics& stats, absl::string_view name);

// The value of a one-element tensor from its statistics, or the mean of
// several one-element tensors merged: NaN if any is NaN (or if +Inf and
// -Inf meet), an infinity if any is, else the mean.
double ScalarValue(const v1::Statistics& stats);

// Sonde's histogram as TensorFlow's: bucket_limit[i] is the upper edge of
// the i-th kept counter (DBL_MAX for the counter that reaches to +Inf);
// counters before the first and after the last non-empty one are left
// out and runs of empty counters between are joined, as TensorFlow does.
// num, sum and sum_squares count finite elements (NaN and Inf have no
// bucket); min and max are the statistics' when finite, else the edges of
// the outermost non-empty counters. nullopt when no element is finite.
// InvalidArgument if the histogram's spec or counters are malformed.
absl::StatusOr<std::optional<tfevents::HistogramProto>> ToHistogramProto(
    const v1::Histogram& histogram, const v1::Statistics& stats);

// Adds the values of every tensor in `records` (one step of one run, in
// any order; several records of one name are merged) to `summary`, tags
// sorted. `statistics` must have passed ValidateStatisticNames. Returns
// the first problem met (records without statistics, histograms that do
// not merge or are malformed) after adding everything else.
absl::Status AddTensorValues(const std::vector<const v1::TensorRecord*>& records,
                             const std::vector<std::string>& statistics,
                             tfevents::Summary& summary);

}  // namespace sonde::server::tensorboard

#endif  // SONDE_SERVER_TENSORBOARD_SUMMARY_H_
