/* An example rule plugin, in plain C: "LargeWeights" fires when a tensor of
 * the weights collection has an absolute value above `threshold` (default
 * 10) for `patience` saved steps in a row (default 1). Build it as a shared
 * library against rules/plugin_api.h only, and load it with
 * sonde-collector --rule_plugins=/path/liblarge_weights.so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rules/plugin_api.h"

typedef struct {
  double threshold;
  int patience;
  int streak;
} LargeWeights;

static int InWeights(const SondeTensor* t) {
  for (int32_t i = 0; i < t->collection_count; ++i) {
    if (strcmp(t->collections[i], "weights") == 0) return 1;
  }
  return 0;
}

static void* Create(const char* const* keys, const char* const* values, int32_t count,
                    char* error, int32_t error_size) {
  LargeWeights* r = (LargeWeights*)calloc(1, sizeof(LargeWeights));
  r->threshold = 10.0;
  r->patience = 1;
  for (int32_t i = 0; i < count; ++i) {
    char* end = NULL;
    if (strcmp(keys[i], "threshold") == 0) {
      r->threshold = strtod(values[i], &end);
      if (end == values[i] || *end != '\0' || r->threshold <= 0) {
        snprintf(error, error_size, "threshold='%s' must be a positive number", values[i]);
        free(r);
        return NULL;
      }
    } else if (strcmp(keys[i], "patience") == 0) {
      r->patience = (int)strtol(values[i], &end, 10);
      if (end == values[i] || *end != '\0' || r->patience < 1) {
        snprintf(error, error_size, "patience='%s' must be an integer >= 1", values[i]);
        free(r);
        return NULL;
      }
    } else {
      snprintf(error, error_size, "unknown parameter '%s'", keys[i]);
      free(r);
      return NULL;
    }
  }
  return r;
}

static int32_t OnStep(void* instance, const SondeStep* step, SondeFinding* f) {
  LargeWeights* r = (LargeWeights*)instance;
  const SondeTensor* worst = NULL;
  for (int32_t i = 0; i < step->tensor_count; ++i) {
    const SondeTensor* t = &step->tensors[i];
    if (!InWeights(t) || t->count == t->nan_count) continue;
    if (t->abs_max > r->threshold && (worst == NULL || t->abs_max > worst->abs_max)) worst = t;
  }
  r->streak = worst != NULL ? r->streak + 1 : 0;
  if (worst == NULL || r->streak < r->patience) return SONDE_RULE_QUIET;
  snprintf(f->message, sizeof(f->message), "weights '%s' reach %g at step %lld (threshold %g)",
           worst->name, worst->abs_max, (long long)step->step, r->threshold);
  snprintf(f->tensor, sizeof(f->tensor), "%s", worst->name);
  f->worker = worst->worker;
  f->observed = worst->abs_max;
  f->threshold = r->threshold;
  return SONDE_RULE_ISSUE;
}

static void Destroy(void* instance) { free(instance); }

static const SondeParameter kParameters[] = {
    {"threshold", "10", "largest healthy absolute weight"},
    {"patience", "1", "saved steps in a row above the threshold"},
};
static const char* const kCollections[] = {"weights"};

static const SondeRuleTypeV1 kTypes[] = {{
    "LargeWeights",
    "Example plugin: finds weights that grow too large.",
    "Add weight decay or lower the learning rate.",
    kParameters,
    2,
    kCollections,
    1,
    0,
    Create,
    NULL,
    OnStep,
    NULL,
    Destroy,
}};

int32_t sonde_rules_v1(const SondeRuleTypeV1** types, int32_t* count) {
  *types = kTypes;
  *count = 1;
  return 0;
}
