#include "tests/fuzz/keys_fuzz.h"

#include <algorithm>
#include <string>
#include <tuple>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "storage/keys.h"
#include "tests/fuzz/fuzz_input.h"
#include "common/names.h"

namespace sonde::fuzz {
namespace {

using storage::TensorKey;

std::string Hex(absl::string_view s) { return absl::BytesToHexString(s); }

template <typename T>
int Sign(const T& a, const T& b) {
  return a < b ? -1 : (b < a ? 1 : 0);
}

int KeySign(const std::string& a, const std::string& b) {
  const int c = a.compare(b);  // bytewise, unsigned (char_traits<char>)
  return c < 0 ? -1 : (c > 0 ? 1 : 0);
}

bool SameKey(const TensorKey& a, const TensorKey& b) {
  return a.job_id == b.job_id && a.mode == b.mode && a.mode_step == b.mode_step &&
         a.name == b.name && a.worker == b.worker;
}

std::string Describe(const TensorKey& k) {
  return absl::StrCat("{job ", k.job_id, " mode ", k.mode, " step ", k.mode_step, " name ",
                      Hex(k.name), " worker ", k.worker, "}");
}

// Part 1.
void DecodeWholeInput(absl::string_view input) {
  absl::StatusOr<TensorKey> k = storage::DecodeStatsKey(input);
  if (!k.ok()) {
    if (k.status().message().empty()) FuzzFail("DecodeStatsKey error without a message");
    return;
  }
  if (storage::StatsKey(*k) != input) {
    FuzzFail(absl::StrCat("DecodeStatsKey accepted ", Hex(input), " as ", Describe(*k),
                          ", which encodes differently"));
  }
}

// Part 2: on success `in` lost exactly `consumed`; on failure nothing.
void CheckConsumed(absl::string_view before, absl::string_view after, bool ok,
                   const std::string& reencoded, absl::string_view what) {
  if (!ok) {
    if (after != before || after.data() != before.data()) {
      FuzzFail(absl::StrCat(what, " failed but consumed bytes"));
    }
    return;
  }
  if (after.data() != before.data() + reencoded.size() ||
      after.size() + reencoded.size() != before.size() ||
      before.substr(0, reencoded.size()) != reencoded) {
    FuzzFail(absl::StrCat(what, " consumed the wrong bytes of ", Hex(before)));
  }
}

void ConsumeRun(absl::string_view in) {
  while (!in.empty()) {
    const uint8_t op = static_cast<uint8_t>(in[0]);
    in.remove_prefix(1);
    const absl::string_view before = in;
    std::string enc;
    bool ok = false;
    switch (op % 5) {
      case 0: {
        auto v = storage::ConsumeU64(in);
        if ((ok = v.ok())) storage::AppendU64(enc, *v);
        CheckConsumed(before, in, ok, enc, "ConsumeU64");
        break;
      }
      case 1: {
        auto v = storage::ConsumeU32(in);
        if ((ok = v.ok())) storage::AppendU32(enc, *v);
        CheckConsumed(before, in, ok, enc, "ConsumeU32");
        break;
      }
      case 2: {
        auto v = storage::ConsumeI64(in);
        if ((ok = v.ok())) storage::AppendI64(enc, *v);
        CheckConsumed(before, in, ok, enc, "ConsumeI64");
        break;
      }
      case 3: {
        auto v = storage::ConsumeI32(in);
        if ((ok = v.ok())) storage::AppendI32(enc, *v);
        CheckConsumed(before, in, ok, enc, "ConsumeI32");
        break;
      }
      default: {
        auto v = storage::ConsumeName(in);
        if ((ok = v.ok())) {
          if (v->find('\0') != std::string::npos) FuzzFail("ConsumeName returned a NUL");
          enc = *v;
          enc.push_back('\0');
        }
        CheckConsumed(before, in, ok, enc, "ConsumeName");
        break;
      }
    }
  }
}

// Part 3.
struct Parsed {
  TensorKey key;
  uint32_t piece = 0;
};

Parsed ReadKey(FuzzReader& in) {
  Parsed p;
  p.key.job_id = in.U64();
  p.key.mode = in.U8();
  p.key.mode_step = static_cast<int64_t>(in.U64());
  p.key.worker = static_cast<int32_t>(in.U32());
  p.piece = in.U32();
  p.key.name = std::string(in.Bytes(in.U8()));
  return p;
}

// Names reach keys only through ValidateDataName; check it refuses what the
// layout cannot hold, then make the name holdable.
void MakeHoldable(std::string& name) {
  const bool has_nul = name.find('\0') != std::string::npos;
  const bool utf8 = IsValidUtf8(name);
  const bool valid = ValidateDataName("tensor name", name).ok();
  if (valid == (has_nul || name.empty() || !utf8)) {
    FuzzFail(absl::StrCat("ValidateDataName said ", valid, " for name ", Hex(name)));
  }
  std::replace(name.begin(), name.end(), '\0', '\x01');
  if (!utf8) {
    // Keep the ASCII bytes, turn the rest into '?': the name stays holdable.
    for (char& c : name) {
      if (static_cast<unsigned char>(c) >= 0x80) c = '?';
    }
  }
}

// `prefix` matches `key` exactly when `should`, and [prefix, PrefixEnd)
// holds exactly the keys that start with it.
void CheckPrefix(const std::string& prefix, const std::string& key, bool should,
                 absl::string_view what) {
  const bool starts = absl::StartsWith(key, prefix);
  if (starts != should) {
    FuzzFail(absl::StrCat(what, ": prefix ", Hex(prefix), (should ? " misses " : " matches "),
                          "key ", Hex(key)));
  }
  const std::string end = storage::PrefixEnd(prefix);
  const bool in_range = prefix <= key && (end.empty() || key < end);
  if (in_range != starts) {
    FuzzFail(absl::StrCat(what, ": PrefixEnd(", Hex(prefix), ") = ", Hex(end),
                          " misplaces key ", Hex(key)));
  }
}

void CheckOrder(int encoded, int fields, absl::string_view what, const TensorKey& a,
                const TensorKey& b) {
  if (encoded != fields) {
    FuzzFail(absl::StrCat(what, " orders ", Describe(a), " and ", Describe(b), " as ", encoded,
                          ", the fields as ", fields));
  }
}

void IntegerCodecs(const Parsed& a, const Parsed& b) {
  std::string x, y;
  storage::AppendI64(x, a.key.mode_step);
  storage::AppendI64(y, b.key.mode_step);
  CheckOrder(KeySign(x, y), Sign(a.key.mode_step, b.key.mode_step), "AppendI64", a.key, b.key);
  absl::string_view v = x;
  auto i64 = storage::ConsumeI64(v);
  if (!i64.ok() || *i64 != a.key.mode_step || !v.empty()) FuzzFail("I64 round trip");

  x.clear();
  y.clear();
  storage::AppendI32(x, a.key.worker);
  storage::AppendI32(y, b.key.worker);
  CheckOrder(KeySign(x, y), Sign(a.key.worker, b.key.worker), "AppendI32", a.key, b.key);
  v = x;
  auto i32 = storage::ConsumeI32(v);
  if (!i32.ok() || *i32 != a.key.worker || !v.empty()) FuzzFail("I32 round trip");

  x.clear();
  y.clear();
  storage::AppendU64(x, a.key.job_id);
  storage::AppendU64(y, b.key.job_id);
  CheckOrder(KeySign(x, y), Sign(a.key.job_id, b.key.job_id), "AppendU64", a.key, b.key);
  v = x;
  auto u64 = storage::ConsumeU64(v);
  if (!u64.ok() || *u64 != a.key.job_id || !v.empty()) FuzzFail("U64 round trip");

  x.clear();
  y.clear();
  storage::AppendU32(x, a.piece);
  storage::AppendU32(y, b.piece);
  CheckOrder(KeySign(x, y), Sign(a.piece, b.piece), "AppendU32", a.key, b.key);
  v = x;
  auto u32 = storage::ConsumeU32(v);
  if (!u32.ok() || *u32 != a.piece || !v.empty()) FuzzFail("U32 round trip");
}

void TwoKeys(absl::string_view input) {
  FuzzReader in(input);
  const uint8_t same = in.U8();
  Parsed a = ReadKey(in);
  Parsed b = ReadKey(in);
  MakeHoldable(a.key.name);
  if (same & kKeySameJob) b.key.job_id = a.key.job_id;
  if (same & kKeySameMode) b.key.mode = a.key.mode;
  if (same & kKeySameStep) b.key.mode_step = a.key.mode_step;
  if (same & kKeySameWorker) b.key.worker = a.key.worker;
  if (same & kKeySameName) {
    b.key.name = a.key.name;
  } else if (same & kKeyNameExtends) {
    b.key.name = a.key.name + b.key.name;
  }
  MakeHoldable(b.key.name);
  const TensorKey& ka = a.key;
  const TensorKey& kb = b.key;

  // Round trips.
  for (const TensorKey* k : {&ka, &kb}) {
    auto back = storage::DecodeStatsKey(storage::StatsKey(*k));
    if (!back.ok() || !SameKey(*back, *k)) {
      FuzzFail(absl::StrCat("StatsKey of ", Describe(*k), " does not decode back: ",
                            back.ok() ? Describe(*back) : back.status().ToString()));
    }
  }
  IntegerCodecs(a, b);

  // Order: bytes against fields, steps and workers numerically.
  const auto stats_fields = [](const Parsed& p) {
    return std::make_tuple(p.key.job_id, p.key.mode, p.key.mode_step, p.key.name,
                           p.key.worker, p.piece);
  };
  const auto series_fields = [](const TensorKey& k) {
    return std::make_tuple(k.job_id, k.name, k.mode, k.mode_step, k.worker);
  };
  const auto fields_without_piece = [&](const Parsed& p) {
    auto t = stats_fields(p);
    std::get<5>(t) = 0;
    return t;
  };
  CheckOrder(KeySign(storage::StatsKey(ka), storage::StatsKey(kb)),
             Sign(fields_without_piece(a), fields_without_piece(b)), "StatsKey", ka, kb);
  CheckOrder(KeySign(storage::PayloadKey(ka, a.piece), storage::PayloadKey(kb, b.piece)),
             Sign(stats_fields(a), stats_fields(b)), "PayloadKey", ka, kb);
  CheckOrder(KeySign(storage::SeriesKey(ka), storage::SeriesKey(kb)),
             Sign(series_fields(ka), series_fields(kb)), "SeriesKey", ka, kb);
  CheckOrder(KeySign(storage::StepKey(ka.job_id, ka.mode, ka.mode_step, ka.worker),
                     storage::StepKey(kb.job_id, kb.mode, kb.mode_step, kb.worker)),
             Sign(std::make_tuple(ka.job_id, ka.mode, ka.mode_step, ka.worker),
                  std::make_tuple(kb.job_id, kb.mode, kb.mode_step, kb.worker)),
             "StepKey", ka, kb);
  CheckOrder(KeySign(storage::GlobalStepKey(ka.job_id, ka.mode_step, ka.worker),
                     storage::GlobalStepKey(kb.job_id, kb.mode_step, kb.worker)),
             Sign(std::make_tuple(ka.job_id, ka.mode_step, ka.worker),
                  std::make_tuple(kb.job_id, kb.mode_step, kb.worker)),
             "GlobalStepKey", ka, kb);
  CheckOrder(KeySign(storage::TensorNameKey(ka.job_id, ka.name),
                     storage::TensorNameKey(kb.job_id, kb.name)),
             Sign(std::make_tuple(ka.job_id, ka.name), std::make_tuple(kb.job_id, kb.name)),
             "TensorNameKey", ka, kb);

  // Prefix isolation, both ways round.
  for (int round = 0; round < 2; ++round) {
    const Parsed& p = round == 0 ? a : b;
    const Parsed& q = round == 0 ? b : a;
    const TensorKey& x = p.key;
    const TensorKey& y = q.key;
    const bool same_job = x.job_id == y.job_id;
    CheckPrefix(storage::StatsStepPrefix(x.job_id, x.mode, x.mode_step), storage::StatsKey(y),
                same_job && x.mode == y.mode && x.mode_step == y.mode_step, "StatsStepPrefix");
    CheckPrefix(storage::SeriesPrefix(x.job_id, x.name, x.mode), storage::SeriesKey(y),
                same_job && x.name == y.name && x.mode == y.mode, "SeriesPrefix");
    CheckPrefix(storage::SeriesSeek(x.job_id, x.name, x.mode, x.mode_step),
                storage::SeriesKey(y),
                same_job && x.name == y.name && x.mode == y.mode && x.mode_step == y.mode_step,
                "SeriesSeek");
    CheckPrefix(storage::PayloadPrefix(x), storage::PayloadKey(y, q.piece), SameKey(x, y),
                "PayloadPrefix");
    CheckPrefix(storage::StepPrefix(x.job_id, x.mode),
                storage::StepKey(y.job_id, y.mode, y.mode_step, y.worker),
                same_job && x.mode == y.mode, "StepPrefix");
    CheckPrefix(storage::GlobalStepPrefix(x.job_id, x.mode_step),
                storage::GlobalStepKey(y.job_id, y.mode_step, y.worker),
                same_job && x.mode_step == y.mode_step, "GlobalStepPrefix");
    CheckPrefix(storage::TensorNamePrefix(x.job_id), storage::TensorNameKey(y.job_id, y.name),
                same_job, "TensorNamePrefix");
    CheckPrefix(storage::TensorNameKey(x.job_id, x.name),
                storage::TensorNameKey(y.job_id, y.name), same_job && x.name == y.name,
                "TensorNameKey as a prefix");
    CheckPrefix(storage::RuleResultPrefix(x.job_id), storage::RuleResultKey(y.job_id, y.name),
                same_job, "RuleResultPrefix");
    // Another job's rule state never shares a rule result's prefix.
    CheckPrefix(storage::RuleResultPrefix(x.job_id), storage::RuleStateKey(y.job_id, y.name),
                false, "RuleResultPrefix against a rule state key");
    CheckPrefix(storage::JobInfoPrefix(), storage::JobInfoKey(y.job_id), true, "JobInfoPrefix");
    CheckPrefix(storage::JobInfoKey(x.job_id), storage::JobInfoKey(y.job_id), same_job,
                "JobInfoKey as a prefix");
  }
}

}  // namespace

int FuzzStorageKeys(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  DecodeWholeInput(input);
  ConsumeRun(input);
  TwoKeys(input);
  return 0;
}

}  // namespace sonde::fuzz
