// The metadata service: a small key-value store where processes publish segment descriptors
// (and, later, cluster membership). Pluggable:
//   "embedded:<name>"      in-process; every store opened with the same name shares one map
//   "http://host:port"     a tandem process serving MetadataHttpServer
//   "etcd://host:port"     a real etcd (v3 API through its JSON gateway: /v3/kv/*, /v3/lease/*)
//
// Keys written with Put are bound to this client's lease: a background thread renews it every
// ttl/3; when the process dies (or the store is destroyed) the keys disappear within the TTL.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace tandem::transfer {

struct MetadataOptions {
  std::chrono::milliseconds ttl{5000};      // lease time to live (etcd rounds up to seconds)
  std::chrono::milliseconds timeout{2000};  // per remote call
};

// Thread-safety: thread-safe (every backend). Any method may be called from any thread, at once
// (a store is usually shared through its shared_ptr); only the destructor must not race with a
// call. There are no callbacks. The remote stores renew their lease on a background thread of
// their own that holds the store's lock while it talks to the server, so a Put or Delete may
// wait for a renewal in progress (each remote call is bounded by MetadataOptions::timeout); Get
// and List never wait for it.
class MetadataStore {
 public:
  virtual ~MetadataStore() = default;  // revokes the lease: this client's keys disappear
  // Writes key=value under this client's lease. Keys and values are arbitrary bytes; Put,
  // Get and Delete refuse the empty key (InvalidArgument).
  virtual Status Put(const std::string& key, const std::string& value) = 0;
  // Writes key=value bound to no lease: it stays until someone deletes it, after this client
  // and its process are gone (records that must outlive their writer, e.g. the KV pool
  // master's state). Replaces a leased key of the same name.
  virtual Status PutDurable(const std::string& key, const std::string& value) = 0;
  // NotFound if absent (or expired).
  virtual StatusOr<std::string> Get(const std::string& key) = 0;
  // Removes the key whoever wrote it; OK if it was absent.
  virtual Status Delete(const std::string& key) = 0;
  // All live pairs whose key starts with prefix, sorted by key.
  virtual StatusOr<std::vector<std::pair<std::string, std::string>>> List(
      const std::string& prefix) = 0;
};

// Parses the URI above and connects (checks the remote answers).
StatusOr<std::shared_ptr<MetadataStore>> OpenMetadataStore(const std::string& uri,
                                                           MetadataOptions options = {});

// Serves the HTTP key-value protocol used by "http://" stores, with TTL-based expiry of keys
// whose owner stops renewing. Runs its own threads; stops on destruction.
class MetadataHttpServer {
 public:
  // port 0: ephemeral; see port().
  static StatusOr<std::unique_ptr<MetadataHttpServer>> Start(const std::string& host, int port);
  virtual ~MetadataHttpServer() = default;
  virtual int port() const = 0;
};

}  // namespace tandem::transfer
