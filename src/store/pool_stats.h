// What a KV pool client (store/pool.h) counts, cumulative. Plain data with no dependencies, so
// that the worker protocol carries it as it is and the conductor sums it.
#pragma once

#include <cstdint>

namespace tandem::store {

struct PoolClientStats {
  uint64_t get_calls = 0, hit_objects = 0;  // lookups; objects found and read
  uint64_t miss_calls = 0;                  // lookups that read nothing
  uint64_t bytes_fetched = 0;
  double fetch_seconds = 0;     // wall time of the reads of every hit
  uint64_t fetch_failures = 0;  // objects listed but not read (the prefix stopped there)
  uint64_t put_objects = 0, put_existing = 0, put_no_space = 0, put_failures = 0;
  uint64_t bytes_put = 0;
  uint64_t master_unavailable = 0;  // calls that found no master
  uint64_t dram_bytes = 0;          // shared memory mounted as storage segments
  uint64_t checksum_failures = 0;   // replicas read whose bytes did not match (not used)
  uint64_t hot_copies = 0;          // replicas of hot objects this client copied
  // The node's SSD tier (store/ssd_tier.h): capacity and use now, then cumulative counts.
  uint64_t ssd_capacity_bytes = 0, ssd_used_bytes = 0;
  uint64_t ssd_hit_objects = 0, ssd_written_objects = 0, ssd_dropped_objects = 0;
  uint64_t ssd_corrupt_objects = 0, ssd_evictions = 0;

  PoolClientStats& operator+=(const PoolClientStats& o) {
    get_calls += o.get_calls;
    hit_objects += o.hit_objects;
    miss_calls += o.miss_calls;
    bytes_fetched += o.bytes_fetched;
    fetch_seconds += o.fetch_seconds;
    fetch_failures += o.fetch_failures;
    put_objects += o.put_objects;
    put_existing += o.put_existing;
    put_no_space += o.put_no_space;
    put_failures += o.put_failures;
    bytes_put += o.bytes_put;
    master_unavailable += o.master_unavailable;
    dram_bytes += o.dram_bytes;
    checksum_failures += o.checksum_failures;
    hot_copies += o.hot_copies;
    ssd_capacity_bytes += o.ssd_capacity_bytes;
    ssd_used_bytes += o.ssd_used_bytes;
    ssd_hit_objects += o.ssd_hit_objects;
    ssd_written_objects += o.ssd_written_objects;
    ssd_dropped_objects += o.ssd_dropped_objects;
    ssd_corrupt_objects += o.ssd_corrupt_objects;
    ssd_evictions += o.ssd_evictions;
    return *this;
  }
};

}  // namespace tandem::store
