// UcxWorker: endpoints and connections to peers (creation, the connection handshake, rkeys),
// and their failure, reset and close.
#include <ucp/api/ucp.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "transfer/ucx_transport_internal.h"

namespace tandem::transfer::internal {
namespace {

// A flush completes once the endpoint's handshake and everything issued on it completed.
struct ConnectWait {
  bool done = false;
  ucs_status_t status = UCS_OK;
  char byte = 0;  // destination of the probing read
};

void OnConnectFlush(void* request, ucs_status_t st, void* user) {
  auto* wait = static_cast<ConnectWait*>(user);
  wait->done = true;
  wait->status = st;
  ucp_request_free(request);
}

}  // namespace

StatusOr<Endpoint*> UcxWorker::CurrentEndpoint(Peer* peer) {
  if (peer->current != nullptr) return peer->current.get();
  auto e = std::make_shared<Endpoint>();
  e->worker = this;
  e->peer = peer;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(peer->key.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxWorker::OnEndpointError;
  ep.err_handler.arg = e.get();
  ucs_status_t st = ucp_ep_create(worker_, &ep, &e->ep);
  if (st == UCS_ERR_UNREACHABLE) {
    // UCX's shared-memory transports cannot detect peer failure; without it, a dead peer's
    // requests end at their deadlines instead of at the endpoint error.
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    st = ucp_ep_create(worker_, &ep, &e->ep);
    if (st == UCS_OK) log_->debug("ucx[{}]: peer reachable without failure detection", name_);
  }
  if (st != UCS_OK) return UcsStatus("ucp_ep_create", st);
  endpoints_.push_back(e);
  for (auto& [id, key] : peer->packed) {
    ucp_rkey_h rkey = nullptr;
    st = ucp_ep_rkey_unpack(e->ep, key.packed.data(), &rkey);
    if (st != UCS_OK) {
      Abandon(e.get());
      return UcsStatus("ucp_ep_rkey_unpack", st);
    }
    e->rkeys[id] = rkey;
  }
  // Finish the connection handshake, both ways, before any use: UCX 1.13 aborts (an assertion
  // in its pending-queue purge, removed upstream later) when an endpoint is closed or its worker
  // destroyed while a handshake message is still queued. An endpoint that does not connect in
  // time is abandoned, never closed.
  Status connected = WaitConnected(
      e.get(), std::chrono::milliseconds(std::min(options_.open_timeout_ms / 2, 2000)));
  if (!connected.ok()) {
    Abandon(e.get());
    return connected;
  }
  peer->current = e;
  return e.get();
}

void UcxWorker::Abandon(Endpoint* e) {
  e->closing = true;
  for (auto& [id, rkey] : e->rkeys) ucp_rkey_destroy(rkey);
  e->rkeys.clear();
}

StatusOr<std::pair<uint64_t, uint64_t>> UcxWorker::Connect(const UcxAddress& addr) {
  Peer* peer = nullptr;
  auto known = peer_ids_.find(addr.worker);
  if (known != peer_ids_.end()) peer = peers_.at(known->second).get();
  if (peer == nullptr) {
    auto p = std::make_unique<Peer>();
    p->id = next_id_++;
    p->key = addr.worker;
    peer = p.get();
    peers_[p->id] = std::move(p);
    peer_ids_[peer->key] = peer->id;
  }
  const uint64_t rkey_id = next_id_++;
  peer->packed[rkey_id] = RemoteKey{addr.rkey, addr.base};
  if (peer->current != nullptr) {
    ucp_rkey_h rkey = nullptr;
    const ucs_status_t st = ucp_ep_rkey_unpack(peer->current->ep, addr.rkey.data(), &rkey);
    if (st != UCS_OK) {
      peer->packed.erase(rkey_id);
      return UcsStatus("ucp_ep_rkey_unpack", st);
    }
    peer->current->rkeys[rkey_id] = rkey;
  } else {
    auto e = CurrentEndpoint(peer);  // unpacks every rkey of the peer, this one included
    if (!e.ok()) {
      peer->packed.erase(rkey_id);
      return e.status();
    }
  }
  return std::make_pair(peer->id, rkey_id);
}

void UcxWorker::ReleaseRkey(uint64_t peer_id, uint64_t rkey_id) {
  auto it = peers_.find(peer_id);
  if (it == peers_.end()) return;
  Peer* peer = it->second.get();
  peer->packed.erase(rkey_id);
  if (peer->current != nullptr) {
    auto r = peer->current->rkeys.find(rkey_id);
    if (r != peer->current->rkeys.end()) {
      ucp_rkey_destroy(r->second);
      peer->current->rkeys.erase(r);
    }
  }
  if (peer->packed.empty() && peer->current == nullptr) {  // nothing refers to the peer now
    if (peer_ids_.count(peer->key) && peer_ids_[peer->key] == peer_id) peer_ids_.erase(peer->key);
    peers_.erase(it);
  }
}

Status UcxWorker::WaitConnected(Endpoint* e, std::chrono::milliseconds timeout) {
  auto* wait = new ConnectWait();
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &OnConnectFlush;
  p.user_data = wait;
  ucs_status_ptr_t sp;
  if (!e->rkeys.empty()) {
    const auto& [id, rkey] = *e->rkeys.begin();
    sp = ucp_get_nbx(e->ep, &wait->byte, 1, e->peer->packed.at(id).base, rkey, &p);
  } else {
    sp = ucp_ep_flush_nbx(e->ep, &p);
  }
  if (sp == nullptr || UCS_PTR_IS_ERR(sp)) {
    delete wait;
    return sp == nullptr ? OkStatus() : UcsStatus("ucx connect", UCS_PTR_STATUS(sp));
  }
  const auto until = Clock::now() + timeout;
  while (!wait->done && Clock::now() < until) {
    if (ucp_worker_progress(worker_) == 0) std::this_thread::yield();
  }
  if (!wait->done) {
    // `wait` stays allocated: UCX may still complete the flush.
    return Unavailable("ucx peer did not complete the connection in time");
  }
  const ucs_status_t st = wait->status;
  delete wait;
  return st == UCS_OK ? OkStatus() : UcsStatus("ucx connect", st);
}

void UcxWorker::OnCloseDone(void* request, ucs_status_t st, void* user) {
  auto* e = static_cast<Endpoint*>(user);
  ucp_request_free(request);
  e->worker->OnClosed(e);
}

void UcxWorker::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t st) {
  auto* e = static_cast<Endpoint*>(arg);
  if (e->closing) return;  // being closed anyway; its peer may be gone
  Status error = UcsStatus("ucx peer unreachable", st);
  e->peer->failed = true;  // no new endpoint to a dead peer; reopen the segment to retry
  e->peer->error = error;
  e->worker->to_reset_.emplace_back(e, error);  // ucp_ep_close_nbx may not run in here
}

void UcxWorker::ResetDeferred() {
  if (to_reset_.empty()) return;
  std::vector<std::pair<Endpoint*, Status>> pending;
  pending.swap(to_reset_);
  for (auto& [e, error] : pending) {
    if (e->closing) continue;
    log_->warn("ucx[{}]: endpoint failed: {}", name_, error.message());
    Peer* peer = e->peer;
    Reset(e, error);
    if (peer->failed && peer_ids_.count(peer->key) && peer_ids_[peer->key] == peer->id) {
      peer_ids_.erase(peer->key);  // a later Open connects afresh
    }
  }
}

void UcxWorker::Reset(Endpoint* e, const Status& reason) {
  if (e->closing) return;
  e->closing = true;
  if (e->peer->current.get() == e) e->peer->current = nullptr;
  for (Op* op : e->ops) {
    if (op->status.ok()) op->status = reason;
  }
  std::vector<Op*> unflushed;
  unflushed.swap(e->unflushed);
  for (Op* op : unflushed) Release(op, UCS_ERR_CANCELED);  // their flush will never be issued
  for (auto& [id, rkey] : e->rkeys) ucp_rkey_destroy(rkey);
  e->rkeys.clear();
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;  // cancels what is in flight; never waits for the peer
  p.cb.send = &UcxWorker::OnCloseDone;
  p.user_data = e;
  ++closing_;
  const ucs_status_ptr_t sp = ucp_ep_close_nbx(e->ep, &p);
  if (sp == nullptr || UCS_PTR_IS_ERR(sp)) OnClosed(e);
}

void UcxWorker::OnClosed(Endpoint* e) {
  --closing_;
  e->ep = nullptr;
  // UCX is done with every request of the endpoint: report those whose completions it dropped.
  std::vector<Op*> ops(e->ops.begin(), e->ops.end());
  for (Op* op : ops) {
    Finish(op, op->status.ok() ? Cancelled("ucx endpoint closed") : op->status);
    all_ops_.erase(op);
    orphans_.insert(op);
  }
}

}  // namespace tandem::transfer::internal
