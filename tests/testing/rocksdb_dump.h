// Reads a Sonde database with RocksDB directly, bypassing storage::Store, so
// tests can check what is really on disk: every key and value of every
// column family, and which job each key belongs to (storage/keys.h).
// Open it only while no Store has the database open.
#ifndef SONDE_TESTS_TESTING_ROCKSDB_DUMP_H_
#define SONDE_TESTS_TESTING_ROCKSDB_DUMP_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "rocksdb/db.h"
#include "storage/keys.h"

namespace sonde::testing {

// Column family name -> key -> value.
using DatabaseDump = std::map<std::string, std::map<std::string, std::string>>;

inline absl::StatusOr<DatabaseDump> DumpDatabase(const std::string& path) {
  std::vector<std::string> names;
  rocksdb::Status s = rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), path, &names);
  if (!s.ok()) return absl::InternalError(s.ToString());
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const std::string& n : names) families.emplace_back(n, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  s = rocksdb::DB::OpenForReadOnly(rocksdb::DBOptions(), path, families, &handles, &raw);
  if (!s.ok()) return absl::InternalError(s.ToString());
  std::unique_ptr<rocksdb::DB> db(raw);
  DatabaseDump dump;
  for (size_t i = 0; i < handles.size(); ++i) {
    auto& out = dump[names[i]];
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), handles[i]));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      out[it->key().ToString()] = it->value().ToString();
    }
    s = it->status();
    it.reset();
    db->DestroyColumnFamilyHandle(handles[i]);
    if (!s.ok()) return absl::InternalError(s.ToString());
  }
  return dump;
}

// The id of the job a key belongs to; 0 for a key of no job (the next-id
// counter); InvalidArgument for a key of no known shape, so that a new kind
// of key makes the tests that use this look at it.
inline absl::StatusOr<uint64_t> KeyOwner(const std::string& family, absl::string_view key,
                                         absl::string_view value) {
  if (family == "stats" || family == "series" || family == "payloads") {
    return storage::ConsumeU64(key);
  }
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat("empty key in ", family));
  const char tag = key[0];
  key.remove_prefix(1);
  if (family == "jobs") {
    if (tag == 'I' && key.empty()) return 0;
    if (tag == 'N') return storage::ConsumeU64(value);
    if (tag == 'J' || tag == 'S' || tag == 'G' || tag == 'T' || tag == 'D' || tag == 'W') {
      return storage::ConsumeU64(key);
    }
  }
  if (family == "rules" && (tag == 'R' || tag == 'C')) return storage::ConsumeU64(key);
  if (family == "profile" && (tag == 'M' || tag == 'm' || tag == 'E')) {
    return storage::ConsumeU64(key);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown key in column family '", family, "' with tag '",
                   std::string(1, tag), "'"));
}

// The keys (and values) of one job, by column family.
inline DatabaseDump KeysOfJob(const DatabaseDump& dump, uint64_t job_id) {
  DatabaseDump out;
  for (const auto& [family, entries] : dump) {
    for (const auto& [k, v] : entries) {
      auto owner = KeyOwner(family, k, v);
      if (owner.ok() && *owner == job_id) out[family][k] = v;
    }
  }
  return out;
}

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_ROCKSDB_DUMP_H_
