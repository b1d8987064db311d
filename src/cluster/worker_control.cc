// The worker's role and engine-thread changes (POST /v1/role, /v1/threads) and what it
// publishes for them (elastic pools; worker_impl_internal.h).
#include "cluster/worker_impl_internal.h"

namespace tandem::cluster::worker_internal {

void WorkerImpl::HandleRole(const httplib::Request& req, httplib::Response& res) {
  auto change = RoleChange::FromJson(req.body);
  if (!change.ok()) return ReplyError(res, change.status());
  MutexLock lock(&role_mu_);  // one switch at a time; the published info follows the role
  RoleChangeResult r;
  r.previous = role_.load();
  r.role = change->role;
  r.prefills_in_flight = prefills_in_flight_.load();
  r.decodes_in_flight = decodes_in_flight_.load();
  if (r.role != r.previous) {
    WorkerInfo published = PublishedLocked();
    published.role = r.role;
    if (Status st = metadata_->Put(std::string(kWorkersPrefix) + options_.name, published.ToJson());
        !st.ok()) {
      return ReplyError(res, Unavailable("cannot publish the new role: " + st.message()));
    }
    // New calls see the new role from here; calls already accepted finish as they would have.
    role_.store(r.role);
    log_->info("role {} -> {} ({}); {} prefills and {} decode streams in flight finish as they are",
               RoleName(r.previous), RoleName(r.role),
               change->reason.empty() ? "asked" : change->reason, r.prefills_in_flight,
               r.decodes_in_flight);
  }
  res.set_content(r.ToJson(), "application/json");
}

WorkerInfo WorkerImpl::PublishedLocked() const {
  WorkerInfo published = info_;
  published.role = role_.load();
  published.threads = threads_;
  published.cost = CostAt(threads_);
  return published;
}

void WorkerImpl::HandleThreads(const httplib::Request& req, httplib::Response& res) {
  auto change = ThreadsChange::FromJson(req.body);
  if (!change.ok()) return ReplyError(res, change.status());
  MutexLock lock(&role_mu_);  // one change at a time; the published info follows it
  ThreadsChangeResult r;
  r.previous = threads_;
  r.threads = change->threads;
  if (r.threads != r.previous) {
    // The engine first: from its next step it computes on the new count.
    if (Status st = backend_->SetEngineThreads(r.threads); !st.ok()) return ReplyError(res, st);
    threads_ = r.threads;
    log_->info("threads {} -> {} ({})", r.previous, r.threads,
               change->reason.empty() ? "asked" : change->reason);
  }
  // Published even when unchanged, so that a retry after a failed publication catches up.
  if (Status st =
          metadata_->Put(std::string(kWorkersPrefix) + options_.name, PublishedLocked().ToJson());
      !st.ok()) {
    return ReplyError(res, Unavailable("the engine computes on " + std::to_string(r.threads) +
                                       " threads, but cannot publish it: " + st.message()));
  }
  res.set_content(r.ToJson(), "application/json");
}

}  // namespace tandem::cluster::worker_internal
