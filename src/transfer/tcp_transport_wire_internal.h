// Internal to the TCP transport: the framing on its connections.
//
// Every message starts with a 40-byte header in little-endian order, followed by variable
// parts whose sizes the header gives:
//   write   header | segment name | payload (length bytes)          initiator -> target
//   read    header | segment name                                    initiator -> target
//   notify  header | segment name | sender name | message (length)  initiator -> target
//   reply   header | error text (name_len) | payload (length bytes, successful reads only)
// The target answers every request on the same connection, in order, with a reply carrying
// the request's id and a StatusCode. Requests are validated by the target again (segment known,
// offset + length inside it) before any payload lands in its memory.
#pragma once

#include <cstdint>
#include <cstring>

namespace tandem::transfer::wire {

inline constexpr uint32_t kMagic = 0x31584454;  // "TDX1"
inline constexpr size_t kHeaderBytes = 40;
inline constexpr uint32_t kMaxNameBytes = 4096;        // segment / sender names, error texts
inline constexpr uint64_t kMaxNotifyBytes = 64 << 10;  // notification messages

enum class MsgType : uint8_t { kWrite = 1, kRead = 2, kNotify = 3, kReply = 4 };

struct Header {
  MsgType type = MsgType::kReply;
  uint8_t code = 0;       // reply: StatusCode
  uint64_t id = 0;        // chosen by the initiator, unique per connection
  uint64_t offset = 0;    // bytes from the segment base
  uint64_t length = 0;    // payload bytes (write / read / reply), message bytes (notify)
  uint32_t name_len = 0;  // segment name (requests) or error text (replies)
  uint32_t from_len = 0;  // notify: sender name
};

namespace detail {
inline void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
inline void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}
inline uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
inline uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}
}  // namespace detail

// Layout: magic u32 | type u8 | code u8 | reserved u16 | id u64 | offset u64 | length u64 |
//         name_len u32 | from_len u32.
inline void Encode(const Header& h, uint8_t out[kHeaderBytes]) {
  std::memset(out, 0, kHeaderBytes);
  detail::Put32(out, kMagic);
  out[4] = static_cast<uint8_t>(h.type);
  out[5] = h.code;
  detail::Put64(out + 8, h.id);
  detail::Put64(out + 16, h.offset);
  detail::Put64(out + 24, h.length);
  detail::Put32(out + 32, h.name_len);
  detail::Put32(out + 36, h.from_len);
}

// False when the magic or the type is wrong (the stream is not ours or lost its framing).
inline bool Decode(const uint8_t in[kHeaderBytes], Header* h) {
  if (detail::Get32(in) != kMagic) return false;
  if (in[4] < 1 || in[4] > 4) return false;
  h->type = static_cast<MsgType>(in[4]);
  h->code = in[5];
  h->id = detail::Get64(in + 8);
  h->offset = detail::Get64(in + 16);
  h->length = detail::Get64(in + 24);
  h->name_len = detail::Get32(in + 32);
  h->from_len = detail::Get32(in + 36);
  return true;
}

}  // namespace tandem::transfer::wire
