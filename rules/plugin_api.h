/* Sonde's rule plugin interface, version 1: a stable C ABI.
 *
 * A plugin is a shared library loaded by the collector at start
 * (--rule_plugins=/path/libmyrules.so). It exports
 *
 *   int32_t sonde_rules_v1(const SondeRuleTypeV1** types, int32_t* count);
 *
 * which returns 0 and points *types at an array of *count rule types in
 * static storage. Only plain C types cross this boundary, so a plugin can be
 * built with any compiler and C or C++ runtime, and needs nothing of Sonde
 * but this header. Each rule instance is used by one thread at a time; a
 * plugin must not keep pointers into a SondeStep after on_step returns.
 */
#ifndef SONDE_RULES_PLUGIN_API_H_
#define SONDE_RULES_PLUGIN_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SONDE_PLUGIN_SYMBOL_V1 "sonde_rules_v1"

/* One tensor of a step: its identity, its statistics record (see
 * proto/tensor.proto for the definitions) and, when the rule asked for them
 * through wants_values, its raw little-endian values. */
typedef struct {
  const char* name;
  int32_t worker;
  const char* const* collections;
  int32_t collection_count;
  int32_t dtype; /* sonde.v1.DType: 1 F32, 2 F16, 3 BF16, 4 F64, 5 I8, 6 I16, 7 I32, 8 I64, 9 U8, 10 BOOL */
  const int64_t* shape;
  int32_t rank;
  uint64_t count, finite_count, nan_count, pos_inf_count, neg_inf_count, zero_count;
  double min, max, abs_min, abs_max, sum, mean, variance, std, l1, l2;
  const void* values; /* NULL unless wanted and sent with values */
  uint64_t values_bytes;
} SondeTensor;

typedef struct {
  int64_t step; /* global step */
  int32_t mode; /* sonde.v1.Mode: 1 TRAIN, 2 EVAL, 3 PREDICT, 4 GLOBAL */
  int64_t mode_step;
  const SondeTensor* tensors;
  int32_t tensor_count;
} SondeStep;

/* Filled by the rule when it finds an issue (strings are NUL-terminated). */
typedef struct {
  char message[1024];
  char tensor[512];
  char suggestion[512];
  int32_t worker;
  double observed;
  double threshold;
} SondeFinding;

typedef struct {
  const char* name;
  const char* default_value;
  const char* description;
} SondeParameter;

/* Return values of on_step and on_job_end. */
#define SONDE_RULE_QUIET 0 /* nothing found */
#define SONDE_RULE_ISSUE 1 /* finding filled */
#define SONDE_RULE_ERROR (-1) /* the rule failed; finding->message says why */

typedef struct {
  const char* rule_type;
  const char* description;
  const char* suggestion;
  const SondeParameter* parameters;
  int32_t parameter_count;
  const char* const* default_collections;
  int32_t default_collection_count;
  int32_t needs_values; /* 1 if it reads raw values of some tensors */
  /* Creates an instance from the user's parameters (only those given);
   * returns NULL and writes the reason to `error` for bad parameters. */
  void* (*create)(const char* const* keys, const char* const* values, int32_t count, char* error,
                  int32_t error_size);
  /* Whether the instance needs the raw values of this tensor (statistics
   * and identity filled, values NULL). May be NULL: never. Called from
   * ingest threads, concurrently with on_step: must not modify the instance. */
  int32_t (*wants_values)(const void* instance, const SondeTensor* tensor);
  int32_t (*on_step)(void* instance, const SondeStep* step, SondeFinding* finding);
  /* At the end of training; may be NULL. */
  int32_t (*on_job_end)(void* instance, SondeFinding* finding);
  void (*destroy)(void* instance);
} SondeRuleTypeV1;

typedef int32_t (*SondeRulesV1Fn)(const SondeRuleTypeV1** types, int32_t* count);

#ifdef __cplusplus
}
#endif

#endif /* SONDE_RULES_PLUGIN_API_H_ */
