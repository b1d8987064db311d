#include "conductor/cluster_view.h"

#include <gtest/gtest.h>

namespace tandem::conductor {
namespace {

Clock::time_point At(double s) {
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(1000.0 + s)));
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

}  // namespace
}  // namespace tandem::conductor
