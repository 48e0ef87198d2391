// Fuzz target for the RocksDB key codec (storage/keys.h).
//
// The whole input is decoded three ways:
//   1. as a stats key (DecodeStatsKey): never crashes or reads past the
//      end; a key it accepts encodes back to exactly the input;
//   2. as a run of Consume* calls (each op byte picks U64, U32, I64, I32 or
//      a name): on success exactly the field's bytes are consumed and encode
//      back to them; on failure nothing is consumed;
//   3. as two tensor keys A and B (layout below): StatsKey decodes back to
//      the key, byte order of every key kind equals the order of its fields
//      (steps and workers numerically), and a prefix of one job, step, mode
//      or tensor matches exactly the keys that share those fields, never
//      another job's or a longer name's; PrefixEnd bounds exactly the keys
//      with the prefix.
// Key layout of part 3: [which fields B copies from A u8] then A and B each
// as [job u64][mode u8][step u64][worker u32][piece u32][name length u8]
// [name], all little endian (FuzzReader). A name with a 0x00 byte must be
// refused by ValidateDataName and is then used with 0x00 replaced by 0x01.
#ifndef SONDE_TESTS_FUZZ_KEYS_FUZZ_H_
#define SONDE_TESTS_FUZZ_KEYS_FUZZ_H_

#include <cstddef>
#include <cstdint>

namespace sonde::fuzz {

// Bits of the first byte of part 3: B takes this field from A.
inline constexpr uint8_t kKeySameJob = 1 << 0;
inline constexpr uint8_t kKeySameMode = 1 << 1;
inline constexpr uint8_t kKeySameStep = 1 << 2;
inline constexpr uint8_t kKeySameName = 1 << 3;
inline constexpr uint8_t kKeySameWorker = 1 << 4;
// B's name is A's name plus B's own name bytes ("fc1" and "fc10").
inline constexpr uint8_t kKeyNameExtends = 1 << 5;

// Always returns 0; aborts on a violated property.
int FuzzStorageKeys(const uint8_t* data, size_t size);

}  // namespace sonde::fuzz

#endif  // SONDE_TESTS_FUZZ_KEYS_FUZZ_H_
