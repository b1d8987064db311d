#include "cluster/policy.h"

#include <gtest/gtest.h>

namespace tandem::cluster {
namespace {

WorkerLoad W(std::string name, Role role, int inflight, int free_blocks = 1000, bool healthy = true) {
  return {std::move(name), role, healthy, inflight, free_blocks, 16};
}

TEST(PolicyTest, PicksLeastLoadedPrefillAndDecode) {
  const std::vector<WorkerLoad> ws = {W("p0", Role::kPrefill, 3), W("p1", Role::kPrefill, 1),
                                      W("d0", Role::kDecode, 5), W("d1", Role::kDecode, 2)};
  const Placement p = PlaceRequest(ws, {100, 10});
  EXPECT_EQ(p.prefill, 1);
  EXPECT_EQ(p.decode, 3);
  EXPECT_FALSE(p.local);
  EXPECT_TRUE(p.reject_reason.empty());
}

TEST(PolicyTest, SkipsUnhealthyAndFullWorkers) {
  const std::vector<WorkerLoad> ws = {W("p0", Role::kPrefill, 0, 1000, false),
                                      W("p1", Role::kPrefill, 9),
                                      W("d0", Role::kDecode, 0, 3),  // 3 blocks: 48 tokens
                                      W("d1", Role::kDecode, 7)};
  const Placement p = PlaceRequest(ws, {100, 10});
  EXPECT_EQ(p.prefill, 1);
  EXPECT_EQ(p.decode, 3);
  // A prompt that fits in d0's three blocks goes to the less loaded d0.
  EXPECT_EQ(PlaceRequest(ws, {40, 10}).decode, 2);
}

TEST(PolicyTest, NoPrefillWorkerMeansLocalAndNoDecoderMeansReject) {
  const std::vector<WorkerLoad> only_decode = {W("p0", Role::kPrefill, 0, 1000, false),
                                               W("d0", Role::kDecode, 0)};
  const Placement local = PlaceRequest(only_decode, {10, 10});
  EXPECT_TRUE(local.local);
  EXPECT_EQ(local.decode, 1);
  EXPECT_EQ(local.prefill, -1);

  const std::vector<WorkerLoad> no_decode = {W("p0", Role::kPrefill, 0),
                                             W("d0", Role::kDecode, 0, 1000, false)};
  const Placement rejected = PlaceRequest(no_decode, {10, 10});
  EXPECT_EQ(rejected.decode, -1);
  EXPECT_NE(rejected.reject_reason.find("no decode worker"), std::string::npos);

  const std::vector<WorkerLoad> full = {W("p0", Role::kPrefill, 0), W("d0", Role::kDecode, 0, 2)};
  EXPECT_NE(PlaceRequest(full, {100, 10}).reject_reason.find("room"), std::string::npos);
}

TEST(PolicyTest, ExcludedPrefillWorkersAreSkippedForRetries) {
  const std::vector<WorkerLoad> ws = {W("p0", Role::kPrefill, 0), W("p1", Role::kPrefill, 4),
                                      W("d0", Role::kDecode, 0)};
  const int excluded[] = {0};
  const Placement p = PlaceRequest(ws, {10, 10}, excluded);
  EXPECT_EQ(p.prefill, 1);
  const int both[] = {0, 1};
  EXPECT_TRUE(PlaceRequest(ws, {10, 10}, both).local);
}

TEST(PolicyTest, MixedWorkersDecodeButAreNotUsedAsPrefillPeers) {
  const std::vector<WorkerLoad> ws = {W("m0", Role::kMixed, 0), W("m1", Role::kMixed, 1)};
  const Placement p = PlaceRequest(ws, {10, 10});
  EXPECT_EQ(p.decode, 0);
  EXPECT_TRUE(p.local);
}

}  // namespace
}  // namespace tandem::cluster
