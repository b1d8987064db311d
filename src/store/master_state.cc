#include "store/master_state.h"

#include <algorithm>
#include <set>

namespace tandem::store {

MasterState::MasterState(MasterOptions options) : options_(options) {}

Status MasterState::Mount(const std::string& segment, const std::string& node, uint64_t capacity,
                          Clock::time_point lease_deadline) {
  if (capacity == 0) return InvalidArgument("segment " + segment + " has no capacity");
  auto it = segments_.find(segment);
  if (it != segments_.end()) {
    if (it->second.capacity != capacity || it->second.node != node) {
      return InvalidArgument("segment " + segment + " is mounted with another size or node");
    }
    it->second.lease_deadline = std::max(it->second.lease_deadline, lease_deadline);
    return OkStatus();
  }
  Segment s;
  s.node = node;
  s.capacity = capacity;
  s.lease_deadline = lease_deadline;
  s.free[0] = capacity;
  segments_.emplace(segment, std::move(s));
  capacity_ += capacity;
  NoteSegment(segment);
  return OkStatus();
}

void MasterState::Unmount(const std::string& segment) {
  auto seg = segments_.find(segment);
  if (seg == segments_.end()) return;
  for (auto it = objects_.begin(); it != objects_.end();) {
    Object& o = it->second;
    if (o.pending_replica.size > 0 && o.pending_replica.segment == segment) {
      used_ -= o.pending_replica.size;  // its space goes with the segment
      o.pending_replica = Location{};
    }
    auto& reps = o.replicas;
    const auto gone = std::remove_if(reps.begin(), reps.end(),
                                     [&](const Location& l) { return l.segment == segment; });
    const size_t lost = static_cast<size_t>(reps.end() - gone);
    for (auto r = gone; r != reps.end(); ++r) used_ -= r->size;
    reps.erase(gone, reps.end());
    counters_.replicas_lost += lost;
    if (lost > 0 && o.visible) NoteObject(it->first);
    if (reps.empty()) {
      if (it->second.visible) ++counters_.objects_lost;
      auto next = std::next(it);
      Drop(it);
      it = next;
    } else {
      ++it;
    }
  }
  capacity_ -= seg->second.capacity;
  segments_.erase(seg);
  NoteSegment(segment);
}

bool MasterState::Allocate(Segment& seg, uint64_t size, uint64_t* offset) {
  for (auto it = seg.free.begin(); it != seg.free.end(); ++it) {
    const uint64_t start =
        (it->first + options_.alignment - 1) / options_.alignment * options_.alignment;
    const uint64_t end = it->first + it->second;
    if (start + size > end) continue;
    const uint64_t head = start - it->first, tail = end - (start + size);
    const uint64_t base = it->first;
    seg.free.erase(it);
    if (head > 0) seg.free[base] = head;
    if (tail > 0) seg.free[start + size] = tail;
    seg.used += size;
    ++seg.objects;
    used_ += size;
    *offset = start;
    return true;
  }
  return false;
}

bool MasterState::AllocateAt(Segment& seg, uint64_t offset, uint64_t size) {
  if (size == 0 || offset > seg.capacity || size > seg.capacity - offset) return false;
  // The free run that starts at or before `offset` must cover the whole range.
  auto it = seg.free.upper_bound(offset);
  if (it == seg.free.begin()) return false;
  --it;
  const uint64_t base = it->first, end = it->first + it->second;
  if (offset + size > end) return false;
  seg.free.erase(it);
  if (offset > base) seg.free[base] = offset - base;
  if (end > offset + size) seg.free[offset + size] = end - (offset + size);
  seg.used += size;
  ++seg.objects;
  used_ += size;
  return true;
}

void MasterState::Release(const Location& loc) {
  auto it = segments_.find(loc.segment);
  if (it == segments_.end()) return;  // unmounted: its space went with it
  Segment& seg = it->second;
  seg.used -= loc.size;
  --seg.objects;
  used_ -= loc.size;
  uint64_t start = loc.offset, length = loc.size;
  auto next = seg.free.lower_bound(start);
  if (next != seg.free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      length += prev->second;
      seg.free.erase(prev);
    }
  }
  if (next != seg.free.end() && start + length == next->first) {
    length += next->second;
    seg.free.erase(next);
  }
  seg.free[start] = length;
}

void MasterState::Drop(std::unordered_map<std::string, Object>::iterator it) {
  for (const Location& l : it->second.replicas) Release(l);
  if (it->second.pending_replica.size > 0) Release(it->second.pending_replica);
  if (it->second.visible) {
    lru_.erase(it->second.lru_pos);
    NoteObject(it->first);
  }
  objects_.erase(it);
}

void MasterState::MakeRoom(uint64_t incoming, Clock::time_point now) {
  const auto high = static_cast<uint64_t>(options_.high_watermark * static_cast<double>(capacity_));
  if (used_ + incoming <= high) return;
  const auto low = static_cast<uint64_t>(options_.low_watermark * static_cast<double>(capacity_));
  std::vector<std::string> victims;  // least recently used first
  uint64_t freed = 0;
  for (auto it = lru_.rbegin(); it != lru_.rend() && used_ - freed + incoming > low; ++it) {
    const Object& o = objects_.at(*it);
    if (!Evictable(o, now)) continue;
    victims.push_back(*it);
    freed += o.size * o.replicas.size();
  }
  for (const std::string& key : victims) {
    Drop(objects_.find(key));
    ++counters_.evictions;
  }
}

std::vector<PutReservation> MasterState::PutStart(const std::vector<std::string>& keys,
                                                  uint64_t size, int replicas,
                                                  const std::string& writer_node,
                                                  Clock::time_point now,
                                                  Clock::time_point write_deadline) {
  std::vector<PutReservation> out(keys.size());
  if (size == 0 || replicas < 1) return out;  // kNoSpace: nothing can be stored
  for (size_t k = 0; k < keys.size(); ++k) {
    if (objects_.count(keys[k]) > 0) {
      out[k].decision = PutDecision::kExists;
      ++counters_.puts_existing;
      continue;
    }
    MakeRoom(size, now);
    // Candidates: the writer's own segments first, then the emptiest; one replica per node.
    std::vector<std::pair<std::string, Segment*>> order;
    for (auto& [name, seg] : segments_) order.emplace_back(name, &seg);
    std::stable_sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
      const bool wa = a.second->node == writer_node, wb = b.second->node == writer_node;
      if (wa != wb) return wa;
      return a.second->capacity - a.second->used > b.second->capacity - b.second->used;
    });
    Object obj;
    obj.size = size;
    obj.write_deadline = write_deadline;
    std::set<std::string> nodes;
    for (auto& [name, seg] : order) {
      if (static_cast<int>(obj.replicas.size()) == replicas) break;
      if (nodes.count(seg->node) > 0) continue;
      uint64_t offset = 0;
      if (!Allocate(*seg, size, &offset)) continue;
      nodes.insert(seg->node);
      obj.replicas.push_back({name, seg->node, offset, size});
    }
    if (obj.replicas.empty()) {
      ++counters_.puts_no_space;
      continue;
    }
    out[k].decision = PutDecision::kReserved;
    out[k].locations = obj.replicas;
    objects_.emplace(keys[k], std::move(obj));
  }
  return out;
}

void MasterState::PutEnd(const std::vector<std::string>& keys, const std::vector<bool>& ok,
                         const std::vector<uint64_t>& checksums) {
  for (size_t k = 0; k < keys.size(); ++k) {
    auto it = objects_.find(keys[k]);
    if (it == objects_.end() || it->second.visible) continue;
    if (k < ok.size() && ok[k] && k < checksums.size() && !it->second.remove_pending) {
      it->second.visible = true;
      it->second.checksum = checksums[k];
      lru_.push_front(keys[k]);
      it->second.lru_pos = lru_.begin();
      ++counters_.puts_committed;
      NoteObject(keys[k]);
    } else {
      Drop(it);
      ++counters_.puts_aborted;
    }
  }
}

std::vector<FoundObject> MasterState::GetPrefix(const std::vector<std::string>& keys,
                                                Clock::time_point now,
                                                Clock::time_point lease_deadline) {
  std::vector<FoundObject> out;
  for (const std::string& key : keys) {
    auto it = objects_.find(key);
    if (it == objects_.end() || !it->second.visible || it->second.remove_pending) {
      ++counters_.get_misses;
      break;
    }
    Object& o = it->second;
    o.lease_deadline = std::max(o.lease_deadline, std::max(now, lease_deadline));
    lru_.splice(lru_.begin(), lru_, o.lru_pos);
    FoundObject found{o.checksum, o.restored, o.replicas, Location{}};
    ++o.gets;
    if (options_.hot_gets > 0 && o.gets >= options_.hot_gets && o.pending_replica.size == 0 &&
        static_cast<int>(o.replicas.size()) < options_.max_replicas &&
        ReserveExtraReplica(o, &o.pending_replica)) {
      o.pending_deadline = std::max(now, lease_deadline);
      found.replicate_to = o.pending_replica;
    }
    out.push_back(std::move(found));
    ++counters_.get_hits;
  }
  return out;
}

bool MasterState::ReserveExtraReplica(Object& o, Location* out) {
  std::set<std::string> nodes;
  for (const Location& l : o.replicas) nodes.insert(l.node);
  std::vector<std::pair<std::string, Segment*>> order;
  for (auto& [name, seg] : segments_) {
    if (nodes.count(seg.node) == 0) order.emplace_back(name, &seg);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second->capacity - a.second->used > b.second->capacity - b.second->used;
  });
  // Only free space: a copy for speed never evicts anything.
  const auto high = static_cast<uint64_t>(options_.high_watermark * static_cast<double>(capacity_));
  if (used_ + o.size > high) return false;
  for (auto& [name, seg] : order) {
    uint64_t offset = 0;
    if (!Allocate(*seg, o.size, &offset)) continue;
    *out = Location{name, seg->node, offset, o.size};
    return true;
  }
  return false;
}

void MasterState::ReplicaEnd(const std::string& key, const std::string& segment, bool ok) {
  auto it = objects_.find(key);
  if (it == objects_.end()) return;
  Object& o = it->second;
  if (o.pending_replica.size == 0 || o.pending_replica.segment != segment) return;
  if (ok && o.visible) {
    o.replicas.push_back(o.pending_replica);
    o.gets = 0;
    ++counters_.hot_replicas;
    NoteObject(key);
  } else {
    Release(o.pending_replica);
  }
  o.pending_replica = Location{};
}

std::vector<bool> MasterState::Exist(const std::vector<std::string>& keys) const {
  std::vector<bool> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) {
    auto it = objects_.find(key);
    out.push_back(it != objects_.end() && it->second.visible && !it->second.remove_pending);
  }
  return out;
}

void MasterState::ReportBadReplica(const std::string& key, const std::string& segment) {
  auto it = objects_.find(key);
  if (it == objects_.end()) return;
  auto& reps = it->second.replicas;
  auto r = std::find_if(reps.begin(), reps.end(),
                        [&](const Location& l) { return l.segment == segment; });
  if (r == reps.end()) return;
  Release(*r);
  reps.erase(r);
  ++counters_.replicas_lost;
  if (it->second.visible) NoteObject(key);
  if (reps.empty()) {
    if (it->second.visible) ++counters_.objects_lost;
    Drop(it);
  }
}

int MasterState::Remove(const std::vector<std::string>& keys, Clock::time_point now) {
  int known = 0;
  for (const std::string& key : keys) {
    auto it = objects_.find(key);
    if (it == objects_.end()) continue;
    ++known;
    ++counters_.removed;
    if (Evictable(it->second, now)) {
      Drop(it);
    } else {
      it->second.remove_pending = true;
    }
  }
  return known;
}

void MasterState::Expire(Clock::time_point now) {
  for (auto it = objects_.begin(); it != objects_.end();) {
    Object& o = it->second;
    auto next = std::next(it);
    if (o.pending_replica.size > 0 && o.pending_deadline <= now) {  // the copier never reported
      Release(o.pending_replica);
      o.pending_replica = Location{};
    }
    if (!o.visible && o.write_deadline <= now) {
      Drop(it);
      ++counters_.puts_expired;
    } else if (o.remove_pending && Evictable(o, now)) {
      Drop(it);
    }
    it = next;
  }
  std::vector<std::string> lapsed;
  for (const auto& [name, seg] : segments_) {
    if (seg.lease_deadline <= now) lapsed.push_back(name);
  }
  for (const std::string& name : lapsed) Unmount(name);
  MakeRoom(0, now);
}

MasterChanges MasterState::TakeChanges() {
  MasterChanges c;
  c.objects.assign(changed_objects_.begin(), changed_objects_.end());
  c.segments.assign(changed_segments_.begin(), changed_segments_.end());
  changed_objects_.clear();
  changed_segments_.clear();
  return c;
}

bool MasterState::ObjectRecordOf(const std::string& key, ObjectRecord* out) const {
  auto it = objects_.find(key);
  if (it == objects_.end() || !it->second.visible || it->second.remove_pending) return false;
  *out = ObjectRecord{key, it->second.size, it->second.checksum, it->second.replicas};
  return true;
}

bool MasterState::SegmentRecordOf(const std::string& name, SegmentRecord* out) const {
  auto it = segments_.find(name);
  if (it == segments_.end()) return false;
  *out = SegmentRecord{name, it->second.node, it->second.capacity};
  return true;
}

int MasterState::Restore(const std::vector<SegmentRecord>& segments,
                         const std::vector<ObjectRecord>& objects,
                         Clock::time_point segment_deadline) {
  for (const SegmentRecord& s : segments) {
    (void)Mount(s.name, s.node, s.capacity, segment_deadline);  // a conflicting record: skipped
  }
  int restored = 0;
  for (const ObjectRecord& r : objects) {
    // A record restored as it is stays in the journal as it is; one restored with fewer
    // replicas is written again, one not restored is deleted (NoteObject).
    if (r.size == 0 || objects_.count(r.key) > 0) {
      NoteObject(r.key);
      continue;
    }
    Object o;
    o.size = r.size;
    o.checksum = r.checksum;
    o.restored = true;
    for (const Location& l : r.replicas) {
      auto seg = segments_.find(l.segment);
      if (l.size != r.size || seg == segments_.end() || seg->second.node != l.node) continue;
      if (!AllocateAt(seg->second, l.offset, l.size)) continue;  // overlaps: stale, dropped
      o.replicas.push_back(l);
    }
    if (o.replicas.size() != r.replicas.size()) NoteObject(r.key);
    if (o.replicas.empty()) continue;
    o.visible = true;
    lru_.push_back(r.key);  // restored objects are the least recently used
    o.lru_pos = std::prev(lru_.end());
    objects_.emplace(r.key, std::move(o));
    ++restored;
  }
  counters_.restored += static_cast<uint64_t>(restored);
  return restored;
}

std::vector<SegmentUsage> MasterState::Usage() const {
  std::vector<SegmentUsage> out;
  for (const auto& [name, seg] : segments_) {
    out.push_back({name, seg.node, seg.capacity, seg.used, seg.objects});
  }
  return out;
}

}  // namespace tandem::store
