// Fuzz target for user patterns (common/pattern.h): the one function every
// pattern a user sends goes through (queries' regex, rules' tensor_regex,
// collections' include_regex), and the two components that use it.
//
// Input: records (fuzz_input.h); control 0 sets the pattern, any other
// control adds a name. Properties, for the pattern against every name:
//   - Compile answers OK or InvalidArgument with a message, never anything
//     else, and refuses patterns over kMaxPatternBytes;
//   - Search is deterministic; a pattern of plain characters (letters,
//     digits, '_', '/', '-') finds exactly the names that contain it; the
//     quoted name anchored at both ends finds the name;
//   - TensorSelector (rules) accepts exactly the patterns Compile accepts,
//     and selects exactly the names Search finds;
//   - CollectionSet (the hook's include_regex) accepts exactly those too,
//     and puts in "default" exactly the names Search finds.
#ifndef SONDE_TESTS_FUZZ_PATTERNS_FUZZ_H_
#define SONDE_TESTS_FUZZ_PATTERNS_FUZZ_H_

#include <cstddef>
#include <cstdint>

namespace sonde::fuzz {

// Control byte of the record that sets the pattern; other records are names.
inline constexpr uint8_t kPatternRecord = 0;

// Always returns 0; aborts on a violated property.
int FuzzPatterns(const uint8_t* data, size_t size);

}  // namespace sonde::fuzz

#endif  // SONDE_TESTS_FUZZ_PATTERNS_FUZZ_H_
