// VmmPool's refill schedule: a lone producer's fill defers the making of the
// next allocation; a second fill, a daemon-side take or the end of the fill
// starts it. Needs no GPU: without one the pool's thread fails to make the
// allocation (logged), which changes nothing checked here.
#include "store/vmm_pool.h"

#include <gtest/gtest.h>

namespace gpufs {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(VmmPoolTest, ALoneProducersFillDefersTheRefillUntilItEnds) {
  VmmPool pool(0, 64 * kMiB);
  EXPECT_EQ(pool.Take(2 * kMiB, true), nullptr);  // nothing ready yet
  EXPECT_EQ(pool.DeferredForTesting(), 1u);
  pool.Filled();
  EXPECT_EQ(pool.DeferredForTesting(), 0u);
}

TEST(VmmPoolTest, ASecondFillStartsTheDeferredRefills) {
  VmmPool pool(0, 64 * kMiB);
  pool.Take(2 * kMiB, true);
  EXPECT_EQ(pool.DeferredForTesting(), 1u);
  pool.Take(4 * kMiB, true);  // two producers at once: nothing waits
  EXPECT_EQ(pool.DeferredForTesting(), 0u);
  pool.Filled();
  pool.Take(2 * kMiB, true);  // one fill still in progress: no wait
  EXPECT_EQ(pool.DeferredForTesting(), 0u);
  pool.Filled();
  pool.Filled();
  pool.Filled();  // one too many: harmless
  pool.Take(6 * kMiB, true);  // a size not asked for yet (one of 2 MiB may still be coming)
  EXPECT_EQ(pool.DeferredForTesting(), 1u);
}

TEST(VmmPoolTest, ATakeTheDaemonFillsItselfIsRefilledAtOnce) {
  VmmPool pool(0, 64 * kMiB);
  pool.Take(2 * kMiB, false);
  EXPECT_EQ(pool.DeferredForTesting(), 0u);
  // Also while a producer's fill is in progress: it is a second Take.
  pool.Take(6 * kMiB, true);
  EXPECT_EQ(pool.DeferredForTesting(), 1u);
  pool.Take(4 * kMiB, false);
  EXPECT_EQ(pool.DeferredForTesting(), 0u);
}

TEST(VmmPoolTest, TheBudgetBoundsWhatIsWanted) {
  VmmPool pool(0, 3 * kMiB);
  pool.Take(3 * kMiB, true);  // within the budget: deferred
  EXPECT_EQ(pool.DeferredForTesting(), 1u);
  pool.Filled();
  VmmPool small(0, 1 * kMiB);
  small.Take(2 * kMiB, false);  // over the budget, for the daemon itself: never wanted
  EXPECT_EQ(small.DeferredForTesting(), 0u);
  EXPECT_EQ(small.ready_bytes(), 0u);
}

TEST(VmmPoolTest, AnObjectSavedAgainPastTheBudgetHasOneOfItsSizeMadeReady) {
  VmmPool pool(0, 1 * kMiB);
  pool.Take(6 * kMiB, true, UINT64_MAX, true);  // an object's first save: nothing held for it
  EXPECT_EQ(pool.DeferredForTesting(), 0u);
  EXPECT_EQ(pool.ready_bytes(), 0u);
  pool.Filled();
  pool.Take(6 * kMiB, true, UINT64_MAX, true);  // saved again: one of its size wanted
  EXPECT_EQ(pool.DeferredForTesting(), 1u);
  EXPECT_EQ(pool.ready_bytes(), 6 * kMiB);  // reserved for it (its making waits for the fill)
  pool.Take(8 * kMiB, true, UINT64_MAX, true);  // another, twice, past the budget beside it
  pool.Take(8 * kMiB, true, UINT64_MAX, true);
  // Never both: one such size at a time (the 8 MiB one only once the 6 MiB
  // one is gone, as where no GPU lets the pool's thread make it).
  EXPECT_LE(pool.ready_bytes(), 8 * kMiB);
  for (int i = 0; i < 3; ++i) pool.Filled();
  VmmPool cramped(0, 1 * kMiB);
  for (int i = 0; i < 2; ++i) {
    cramped.Take(6 * kMiB, true, /*spare=*/11 * kMiB, true);  // more than half the room
    cramped.Filled();
  }
  EXPECT_EQ(cramped.DeferredForTesting(), 0u);
  EXPECT_EQ(cramped.ready_bytes(), 0u);
  VmmPool none(0, 0);  // a pool of budget 0 keeps nothing ready
  for (int i = 0; i < 2; ++i) {
    none.Take(6 * kMiB, true, UINT64_MAX, true);
    none.Filled();
  }
  EXPECT_EQ(none.ready_bytes(), 0u);
  VmmPool copies(0, 1 * kMiB);
  for (int i = 0; i < 2; ++i) {
    copies.Take(6 * kMiB, true);  // a reader's private copy, say: the budget holds
    copies.Filled();
  }
  EXPECT_EQ(copies.ready_bytes(), 0u);
}

TEST(VmmPoolTest, TheStoresRoomBoundsWhatIsWanted) {
  VmmPool pool(0, 64 * kMiB);
  pool.Take(4 * kMiB, true, /*spare=*/2 * kMiB);  // no room beside the store's blobs
  EXPECT_EQ(pool.DeferredForTesting(), 0u);
  pool.Filled();
  pool.Take(4 * kMiB, true, /*spare=*/4 * kMiB);
  EXPECT_EQ(pool.DeferredForTesting(), 1u);
  pool.Filled();
  pool.AwaitMadeForTesting();  // made (a GPU) or failed to be (none)
  pool.Trim(0);
  EXPECT_EQ(pool.ready_bytes(), 0u);  // nothing held once the store has no room
}

TEST(VmmPoolTest, ABurstOfOneSizeWantsOneNotOnePerTake) {
  VmmPool pool(0, 1024 * kMiB);
  for (int i = 0; i < 32; ++i) {
    pool.Take(8 * kMiB, false);  // readers' copies, say: each starts a refill at once
    // Ready or being made: never more than one allocation of the size.
    EXPECT_LE(pool.ready_bytes(), 8 * kMiB) << "take " << i;
  }
}

}  // namespace
}  // namespace gpufs
