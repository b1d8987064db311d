#include "transfer/metadata_leased.h"

#include <algorithm>

#include "common/logging.h"

namespace tandem::transfer::internal {
namespace {

Status CheckKey(const std::string& key) {
  if (key.empty()) return InvalidArgument("metadata key must not be empty");
  return OkStatus();
}

// Renewal period: a third of the granted TTL, so two renewals may fail before the lease lapses.
std::chrono::milliseconds RenewPeriod(const KvBackend::Lease& lease) {
  return std::max(std::chrono::milliseconds(1), lease.ttl / 3);
}

}  // namespace

StatusOr<std::shared_ptr<MetadataStore>> LeasedStore::Open(std::unique_ptr<KvBackend> backend,
                                                           std::chrono::milliseconds ttl) {
  TANDEM_ASSIGN_OR_RETURN(KvBackend::Lease lease, backend->GrantLease(ttl));
  GetLogger("metadata")
      ->debug("{}: lease {} granted, ttl {} ms", backend->Describe(), lease.id, lease.ttl.count());
  return std::shared_ptr<MetadataStore>(new LeasedStore(std::move(backend), ttl, lease));
}

LeasedStore::LeasedStore(std::unique_ptr<KvBackend> backend, std::chrono::milliseconds ttl,
                         KvBackend::Lease lease)
    : backend_(std::move(backend)), requested_ttl_(ttl), lease_(lease) {
  renewer_ = std::thread([this] { RenewLoop(); });
}

LeasedStore::~LeasedStore() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  wake_.NotifyAll();
  renewer_.join();
  const Status st = backend_->Revoke(lease_.id);
  if (!st.ok()) {
    // The keys still go when the lease expires on the server.
    GetLogger("metadata")
        ->warn("{}: revoking lease {} failed: {}", backend_->Describe(), lease_.id, st.ToString());
  }
}

void LeasedStore::RenewLoop() {
  MutexLock lock(&mu_);
  while (!stopping_) {
    // The predicate runs inside the wait, with mu_ held.
    wake_.WaitFor(&mu_, RenewPeriod(lease_), [this] {
      mu_.AssertHeld();
      return stopping_;
    });
    if (stopping_) break;
    Status st = backend_->KeepAlive(lease_.id);
    if (st.code() == StatusCode::kNotFound) {
      GetLogger("metadata")
          ->warn("{}: lease {} expired; granting a new one", backend_->Describe(), lease_.id);
      st = RecoverLocked();
    }
    if (!st.ok()) {
      // Retried at the next period; the keys survive as long as the lease has not lapsed.
      GetLogger("metadata")
          ->warn("{}: renewing lease {} failed: {}", backend_->Describe(), lease_.id,
                 st.ToString());
    }
  }
}

Status LeasedStore::RecoverLocked() {
  TANDEM_ASSIGN_OR_RETURN(lease_, backend_->GrantLease(requested_ttl_));
  for (const auto& [key, value] : own_) {
    TANDEM_RETURN_IF_ERROR(backend_->Put(key, value, lease_.id));
  }
  return OkStatus();
}

Status LeasedStore::Put(const std::string& key, const std::string& value) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key));
  MutexLock lock(&mu_);
  Status st = backend_->Put(key, value, lease_.id);
  if (st.code() == StatusCode::kNotFound) {  // the lease lapsed before the renewer noticed
    TANDEM_RETURN_IF_ERROR(RecoverLocked());
    st = backend_->Put(key, value, lease_.id);
  }
  TANDEM_RETURN_IF_ERROR(st);
  own_[key] = value;
  return OkStatus();
}

Status LeasedStore::PutDurable(const std::string& key, const std::string& value) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key));
  TANDEM_RETURN_IF_ERROR(backend_->Put(key, value, /*lease=*/0));
  MutexLock lock(&mu_);
  own_.erase(key);  // no longer this lease's: a recovery must not bind it again
  return OkStatus();
}

StatusOr<std::string> LeasedStore::Get(const std::string& key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key));
  return backend_->Get(key);
}

Status LeasedStore::Delete(const std::string& key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key));
  TANDEM_RETURN_IF_ERROR(backend_->Delete(key));
  MutexLock lock(&mu_);
  own_.erase(key);
  return OkStatus();
}

StatusOr<std::vector<std::pair<std::string, std::string>>> LeasedStore::List(
    const std::string& prefix) {
  return backend_->List(prefix);
}

}  // namespace tandem::transfer::internal
