// Helpers shared by the remote metadata backends: base64 and one JSON POST with timeouts.
#include <httplib.h>

#include <array>

#include "common/http.h"
#include "transfer/metadata_internal.h"

namespace tandem::transfer::internal {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// byte -> 6-bit value, or -1 for a byte outside the alphabet.
std::array<int, 256> DecodeTable() {
  std::array<int, 256> table;
  table.fill(-1);
  for (int i = 0; i < 64; ++i) table[static_cast<unsigned char>(kAlphabet[i])] = i;
  return table;
}

}  // namespace

std::string Base64Encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) |
                       (uint32_t(uint8_t(bytes[i + 1])) << 8) | uint32_t(uint8_t(bytes[i + 2]));
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (rest == 2) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

StatusOr<std::string> Base64Decode(const std::string& text) {
  static const std::array<int, 256> table = DecodeTable();
  if (text.size() % 4 != 0) {
    return InvalidArgument("base64 text length " + std::to_string(text.size()) +
                           " is not a multiple of 4");
  }
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    int pad = 0;
    if (last && text[i + 3] == '=') pad = text[i + 2] == '=' ? 2 : 1;
    uint32_t v = 0;
    for (int j = 0; j < 4; ++j) {
      int d = 0;
      if (j < 4 - pad) {
        d = table[static_cast<unsigned char>(text[i + j])];
        if (d < 0)
          return InvalidArgument("invalid base64 character at offset " + std::to_string(i + j));
      }
      v = (v << 6) | uint32_t(d);
    }
    out += char((v >> 16) & 0xff);
    if (pad < 2) out += char((v >> 8) & 0xff);
    if (pad < 1) out += char(v & 0xff);
  }
  return out;
}

StatusOr<JsonReply> PostJson(const std::string& host, int port, const std::string& path,
                             const nlohmann::json& body, std::chrono::milliseconds timeout,
                             bool cluster_call) {
  const std::string where = host + ":" + std::to_string(port) + path;
  // One client per call: no connection is kept, so calls from several threads never share one.
  httplib::Client client(host, port);
  SetHttpClientDeadline(client, std::chrono::steady_clock::now() + timeout, timeout, timeout);
  const std::string text = body.dump();
  const ClusterCallHeaders signed_call =
      cluster_call ? SignClusterCall("POST", path, text) : ClusterCallHeaders{};
  httplib::Result res = client.Post(path, signed_call.headers, text, "application/json");
  if (!res) {
    return Unavailable("metadata server " + where +
                       " unreachable: " + httplib::to_string(res.error()));
  }
  if (cluster_call) {
    TANDEM_RETURN_IF_ERROR(CheckClusterReply(*res, signed_call.nonce, "metadata server " + where));
  }
  JsonReply reply;
  reply.http_status = res->status;
  if (!res->body.empty()) {
    reply.body = nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false);
    if (reply.body.is_discarded()) {
      return Internal("metadata server " + where + " answered HTTP " + std::to_string(res->status) +
                      " with a body that is not JSON: " + res->body.substr(0, 200));
    }
  }
  return reply;
}

}  // namespace tandem::transfer::internal
