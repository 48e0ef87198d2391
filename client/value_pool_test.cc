#include "client/value_pool.h"

#include <cstring>
#include <memory>

#include "gtest/gtest.h"

namespace sonde {
namespace {

TEST(ValuePool, AFreedBufferServesTheNextTakeOfASimilarSize) {
  std::shared_ptr<ValuePool> pool = ValuePool::Create(1 << 20);
  ValuePool::Buffer a = pool->Take(1000);
  const char* first = a.get();
  std::memset(a.get(), 7, 1000);  // all of it is writable
  a.reset();
  EXPECT_EQ(pool->kept_bytes(), 1000u);
  ValuePool::Buffer b = pool->Take(600);  // at most twice as large: reused
  EXPECT_EQ(b.get(), first);
  EXPECT_EQ(pool->reused(), 1u);
  EXPECT_EQ(pool->kept_bytes(), 0u);
  b.reset();
  ValuePool::Buffer c = pool->Take(400);  // 1000 is more than twice 400: a new one
  EXPECT_NE(c.get(), first);
  ValuePool::Buffer d = pool->Take(2000);  // larger than any kept
  EXPECT_NE(d.get(), first);
  EXPECT_EQ(pool->reused(), 1u);
}

TEST(ValuePool, KeepsNoMoreThanItsLimit) {
  std::shared_ptr<ValuePool> pool = ValuePool::Create(1500);
  ValuePool::Buffer a = pool->Take(1000);
  ValuePool::Buffer b = pool->Take(1000);
  a.reset();
  b.reset();  // would pass 1500: freed
  EXPECT_EQ(pool->kept_bytes(), 1000u);
}

TEST(ValuePool, BuffersOutliveTheirOwnersReference) {
  ValuePool::Buffer kept;
  std::weak_ptr<ValuePool> watch;
  {
    std::shared_ptr<ValuePool> pool = ValuePool::Create(1 << 20);
    watch = pool;
    kept = pool->Take(64);
  }
  EXPECT_FALSE(watch.expired());  // the buffer holds its pool
  std::memset(kept.get(), 1, 64);
  kept.reset();  // back to the pool, which then goes
  EXPECT_TRUE(watch.expired());
  ValuePool::Buffer none;  // no pool: nothing to free
  none.reset();
  EXPECT_EQ(none.get(), nullptr);
}

}  // namespace
}  // namespace sonde
