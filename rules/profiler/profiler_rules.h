// SageMaker Debugger's profiler rules, judged live: each rule gets every
// worker's ProfileBatch as it arrives (Rule::OnProfile) and evaluates its
// sliding windows at once, so a verdict comes seconds after the data, not
// at SageMaker's 60-second scans. Names, parameters and defaults follow
// SageMaker (docs/rules.md, "Profiler rules", says where its docs and its
// code disagree and which we chose); the window math is in windows.h.
//
// Metrics read (client/profiler/system_collector.h): gpu.<i>.util_percent,
// gpu.<i>.memory_used_bytes / gpu.<i>.memory_total_bytes (or
// gpu.<i>.memory_util_percent), cpu.<i>.util_percent, cpu.util_percent,
// cpu.iowait_percent, and framework.dataloader_workers (the number of
// data-loader processes, sent by the framework hook). Events: KIND_STEP and
// KIND_INIT. A data point is one metric snapshot or one event.
//
// The rules are plain Rule objects (one thread at a time, like every rule).
#ifndef SONDE_RULES_PROFILER_PROFILER_RULES_H_
#define SONDE_RULES_PROFILER_PROFILER_RULES_H_

#include <utility>
#include <vector>

#include "rules/rule_factory.h"

namespace sonde::rules::profiler {

// Every profiler rule type with its catalogue entry, for
// RegisterBuiltinRules to register (this library cannot link the factory
// itself: the factory links it).
std::vector<std::pair<RuleInfo, RuleMaker>> ProfilerRuleTypes();

}  // namespace sonde::rules::profiler

#endif  // SONDE_RULES_PROFILER_PROFILER_RULES_H_
