#include "conductor/cluster_view.h"

#include <gtest/gtest.h>

namespace tandem::conductor {
namespace {

Clock::time_point At(double s) {
  return Clock::time_point(
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1000.0 + s)));
}

// A prefill worker runs its jobs in order: a job sent while an earlier one runs starts when
// that one ends, so its queue drains from then, not from when it was sent.
TEST(ClusterView, QueueDrainsFromTheEndOfThePreviousPrefill) {
  ClusterView view;
  view.workers()["p"].info.role = cluster::Role::kPrefill;
  view.workers()["d"].info.role = cluster::Role::kDecode;
  RequestLoad a, b;
  a.seq = 1;
  b.seq = 2;
  Placement p;
  p.predicted_prefill_s = 1.0;
  view.Commit(a, p, "d", "p", 1, At(0));
  view.Commit(b, p, "d", "p", 1, At(0.1));
  ASSERT_TRUE(view.Dispatch(1, "d", "p", 0, At(0)));
  ASSERT_TRUE(view.Dispatch(2, "d", "p", 0, At(0.1)));
  const ClusterView::Worker& w = *view.Find("p");
  EXPECT_NEAR(ClusterView::QueueSeconds(w, At(0.5)), 1.5, 1e-9);  // 0.5 of a done
  view.PrefillDone(a, "p", "d", 0.0, At(1.0));
  // b started at 1.0 (when a ended), not at 0.1 when it was sent: 0.5 s of it remain.
  EXPECT_NEAR(ClusterView::QueueSeconds(w, At(1.5)), 0.5, 1e-9);
  view.PrefillDone(b, "p", "d", 0.0, At(2.0));
  EXPECT_NEAR(ClusterView::QueueSeconds(w, At(2.0)), 0.0, 1e-9);
}

// The prefill scale follows measured compute time against the cost model for the same work:
// a worker twice as slow as its profile converges to 2; short prefills (fixed costs) and
// unknown workers change nothing.
TEST(ClusterView, PrefillScaleLearnsFromComputeTime) {
  ClusterView view;
  ClusterView::Worker& w = view.workers()["p"];
  w.info.cost.prefill_per_token_s = 0.001;
  w.info.cost.decode_base_s = 0.01;
  for (int i = 0; i < 100; ++i) view.PrefillMeasured("p", 1000, 0, 2.0);  // predicted 1 s
  EXPECT_NEAR(w.prefill_scale, 2.0, 0.01);
  view.PrefillMeasured("p", 10, 0, 5.0);  // predicted 10 ms: ignored
  EXPECT_NEAR(w.prefill_scale, 2.0, 0.01);
  // The cached part is not recomputed: 500 new tokens after 500 cached are 0.5 s of work.
  for (int i = 0; i < 100; ++i) view.PrefillMeasured("p", 500, 500, 0.5);
  EXPECT_NEAR(w.prefill_scale, 1.0, 0.01);
  view.PrefillMeasured("nobody", 1000, 0, 1.0);
  EXPECT_EQ(view.Find("nobody"), nullptr);
}

}  // namespace
}  // namespace tandem::conductor
