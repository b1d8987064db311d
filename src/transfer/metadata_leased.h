// Private to tandem_metadata. LeasedStore is the MetadataStore of the remote backends (HTTP and
// etcd): it holds one lease on the server, binds every Put to it, renews it from a background
// thread every ttl/3 and revokes it on destruction. The backend only speaks the wire protocol.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "transfer/metadata.h"

namespace tandem::transfer::internal {

// The wire operations of one remote store. Implementations are thread-safe (each call stands
// alone) and bound every call by the store's timeout.
class KvBackend {
 public:
  struct Lease {
    int64_t id = 0;
    std::chrono::milliseconds ttl{0};  // as granted by the server (may be rounded up)
  };

  virtual ~KvBackend() = default;
  // "etcd 127.0.0.1:2379": names the server in logs and errors.
  virtual std::string Describe() const = 0;
  virtual StatusOr<Lease> GrantLease(std::chrono::milliseconds ttl) = 0;
  // NotFound when the lease has expired or was never granted.
  virtual Status KeepAlive(int64_t lease) = 0;
  virtual Status Revoke(int64_t lease) = 0;
  // NotFound only when `lease` no longer exists on the server. Lease 0: the key has no lease
  // (it lives until deleted).
  virtual Status Put(const std::string& key, const std::string& value, int64_t lease) = 0;
  virtual StatusOr<std::string> Get(const std::string& key) = 0;
  // OK whether or not the key existed.
  virtual Status Delete(const std::string& key) = 0;
  // Sorted by key.
  virtual StatusOr<std::vector<std::pair<std::string, std::string>>> List(
      const std::string& prefix) = 0;
};

class LeasedStore final : public MetadataStore {
 public:
  // Grants the first lease (which also checks that the server answers) and starts renewing it.
  static StatusOr<std::shared_ptr<MetadataStore>> Open(std::unique_ptr<KvBackend> backend,
                                                       std::chrono::milliseconds ttl);
  // Stops the renewal thread, then revokes the lease so this client's keys go at once.
  ~LeasedStore() override;

  Status Put(const std::string& key, const std::string& value) override TANDEM_EXCLUDES(mu_);
  Status PutDurable(const std::string& key, const std::string& value) override TANDEM_EXCLUDES(mu_);
  StatusOr<std::string> Get(const std::string& key) override;
  Status Delete(const std::string& key) override TANDEM_EXCLUDES(mu_);
  StatusOr<std::vector<std::pair<std::string, std::string>>> List(
      const std::string& prefix) override;

 private:
  LeasedStore(std::unique_ptr<KvBackend> backend, std::chrono::milliseconds ttl,
              KvBackend::Lease lease);
  void RenewLoop() TANDEM_EXCLUDES(mu_);
  // The lease was lost (e.g. this process was stalled past the TTL): grants a new one and
  // writes this client's keys again under it.
  Status RecoverLocked() TANDEM_REQUIRES(mu_);

  const std::unique_ptr<KvBackend> backend_;
  const std::chrono::milliseconds requested_ttl_;

  Mutex mu_;  // guards everything below; held across the lease's remote calls
  CondVar wake_;
  bool stopping_ TANDEM_GUARDED_BY(mu_) = false;
  KvBackend::Lease lease_ TANDEM_GUARDED_BY(mu_);
  // The keys this client wrote (and has not deleted), to write again after a lost lease.
  std::map<std::string, std::string> own_ TANDEM_GUARDED_BY(mu_);

  std::thread renewer_;  // last member: started after the others are initialised
};

}  // namespace tandem::transfer::internal
