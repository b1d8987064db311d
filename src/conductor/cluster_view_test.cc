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

// A pipelined prefill keeps every stage busy: its later stages' queues hold it (scaled by their
// own prefill_scale) while it runs, the first stage's holds the pipeline's time instead of the
// one-worker prediction; after a failure the first stage gets its one-worker prefill back.
TEST(ClusterView, APipelineIsInTheQueueOfEveryStage) {
  ClusterView view;
  view.workers()["p0"].info.role = cluster::Role::kPrefill;
  view.workers()["p1"].info.role = cluster::Role::kPrefill;
  view.workers()["p1"].prefill_scale = 2.0;
  view.workers()["d"].info.role = cluster::Role::kDecode;
  RequestLoad a;
  a.seq = 1;
  Placement p;
  p.predicted_prefill_s = 10.0;
  view.Commit(a, p, "d", "p0", 1, At(0));
  ASSERT_TRUE(view.Dispatch(1, "d", "p0", 0, At(0)));
  const ClusterView::Worker& p0 = *view.Find("p0");
  const ClusterView::Worker& p1 = *view.Find("p1");
  EXPECT_NEAR(ClusterView::QueueSeconds(p1, At(0)), 0.0, 1e-9);
  view.PipelineStarted(1, {"p0", "p1"}, 6.0, At(1));
  EXPECT_NEAR(ClusterView::QueueSeconds(p0, At(2)), 5.0, 1e-9);   // 6 s from 1, 1 s done
  EXPECT_NEAR(ClusterView::QueueSeconds(p1, At(2)), 11.0, 1e-9);  // 2 x 6 s, 1 s done
  view.PipelineEnded(1, {"p0", "p1"}, /*succeeded=*/false, At(3));
  EXPECT_NEAR(ClusterView::QueueSeconds(p1, At(3)), 0.0, 1e-9);
  EXPECT_NEAR(ClusterView::QueueSeconds(p0, At(3)), 10.0, 1e-9);  // alone, from now
  view.PipelineStarted(1, {"p0", "p1"}, 6.0, At(4));
  view.PipelineEnded(1, {"p0", "p1"}, /*succeeded=*/true, At(8));
  EXPECT_NEAR(ClusterView::QueueSeconds(p1, At(8)), 0.0, 1e-9);
  view.PrefillDone(a, "p0", "d", 0.0, At(8));
  EXPECT_NEAR(ClusterView::QueueSeconds(p0, At(8)), 0.0, 1e-9);
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
