// The uploads' progress relayed through a real (file) store: what is published, and how long a
// waiter waits (checkpoint/storage_progress.h).
#include "checkpoint/storage_progress.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "comm/process_group.h"
#include "comm/test_util.h"
#include "core/io_progress.h"

namespace tessera::checkpoint {
namespace {

using comm::Millis;
using comm::test_util::Clock;
using comm::test_util::seconds_since;

int64_t count(comm::Store& store, const std::string& key) { return store.add(key, 0); }

TEST(StorageProgress, PublishesTheBytesMovedNeverThoseRelayed) {
  comm::test_util::TempDir dir;
  auto store = comm::make_file_store(dir.path, "job", "r0.tier");
  io_progress::add(11);  // before: not this upload's
  {
    const PublishedProgress published({store.get(), "moved", Millis(20)});
    io_progress::relay(1000);  // what a waiter credits is never published again
    io_progress::add(300);
    for (int i = 0; i < 100 && count(*store, "moved") != 300; ++i) std::this_thread::sleep_for(Millis(10));
    EXPECT_EQ(count(*store, "moved"), 300);  // within its period, not only at the end
    io_progress::add(7);
  }
  EXPECT_EQ(count(*store, "moved"), 307);  // once more as it ends
  io_progress::add(5);
  std::this_thread::sleep_for(Millis(60));
  EXPECT_EQ(count(*store, "moved"), 307);  // and no more after
}

TEST(StorageProgress, AWaiterLivesForAsLongAsTheUploadsMove) {
  comm::test_util::TempDir dir;
  auto store = comm::make_file_store(dir.path, "job", "r0.checkpoint");
  auto tier = comm::make_file_store(dir.path, "job", "r0.tier");
  std::thread uploader([&] {  // 1.2 s of uploads, a few bytes every 50 ms, then the verdict
    for (int i = 0; i < 24; ++i) {
      std::this_thread::sleep_for(Millis(50));
      tier->add("moved", 10);
    }
    store->set("verdict", comm::bytes_of("-1"));
  });
  const uint64_t seen = io_progress::seen();
  const Clock::time_point t0 = Clock::now();
  comm::Bytes verdict;
  EXPECT_NO_THROW(
      verdict = await_while_progressing(*store, "verdict", {tier.get(), "moved", Millis(50)}, Millis(500), "verdict"));
  uploader.join();
  EXPECT_EQ(comm::string_of(verdict), "-1");
  EXPECT_GT(seconds_since(t0), 1.0);
  EXPECT_GE(io_progress::seen() - seen, 200u);  // the uploads' bytes, credited to this heartbeat
}

TEST(StorageProgress, AWaiterGivesUpOnceTheUploadsStandStill) {
  comm::test_util::TempDir dir;
  auto store = comm::make_file_store(dir.path, "job", "r0.checkpoint");
  auto tier = comm::make_file_store(dir.path, "job", "r0.tier");
  tier->add("moved", 40);  // moved before the wait: no sign of life now
  const uint64_t seen = io_progress::seen();
  const Clock::time_point t0 = Clock::now();
  try {
    await_while_progressing(*store, "verdict", {tier.get(), "moved", Millis(50)}, Millis(300), "verdict of rank 0");
    ADD_FAILURE() << "no verdict and no upload moving, yet the wait ended without an error";
  } catch (const comm::StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("no verdict of rank 0 (verdict) within 300 ms"), std::string::npos)
        << e.what();
  }
  EXPECT_GE(seconds_since(t0), 0.3);
  EXPECT_LT(seconds_since(t0), 2.0);
  EXPECT_EQ(io_progress::seen(), seen);
}

TEST(StorageProgress, ARankInACollectiveIsCreditedWithTheLoadsItAwaits) {
  comm::test_util::TempDir dir;
  auto tier = comm::make_file_store(dir.path, "job", "r0.tier");
  tier->add("moved", 1000);  // before: not what this rank awaits
  const uint64_t seen = io_progress::seen();
  {
    const RelayedProgress relayed({tier.get(), "moved", Millis(20)});
    std::this_thread::sleep_for(Millis(60));
    tier->add("moved", 64);
    for (int i = 0; i < 100 && io_progress::seen() - seen < 64; ++i) std::this_thread::sleep_for(Millis(10));
    EXPECT_EQ(io_progress::seen() - seen, 64u);  // while it waits
  }
  tier->add("moved", 5);
  std::this_thread::sleep_for(Millis(60));
  EXPECT_EQ(io_progress::seen() - seen, 64u);  // and no more after
}

TEST(StorageProgress, TheCounterIsReadLessOftenInALargeJob) {
  EXPECT_EQ(progress_counter(parallel::Distributed()).store, nullptr);  // a single process: nothing to relay
  EXPECT_EQ(progress_period(8), Millis(1000));
  EXPECT_EQ(progress_period(255), Millis(1000));
  EXPECT_EQ(progress_period(1024), Millis(8000));  // 128 requests a second
  EXPECT_EQ(progress_period(16384), Millis(30000));
}

TEST(StorageProgress, AVerdictAlreadyThereIsReturnedAtOnce) {
  comm::test_util::TempDir dir;
  auto store = comm::make_file_store(dir.path, "job", "r0.checkpoint");
  auto tier = comm::make_file_store(dir.path, "job", "r0.tier");
  store->set("verdict", comm::bytes_of("10"));
  EXPECT_EQ(comm::string_of(await_while_progressing(*store, "verdict", {tier.get(), "moved"}, Millis(0), "verdict")),
            "10");
}

}  // namespace
}  // namespace tessera::checkpoint
