// The UCX transport (built with TANDEM_WITH_UCX): one-sided RMA through UCX's UCP layer, so the
// data path is whatever UCX picks for the peer (RDMA verbs where present; TCP, CMA or shared
// memory otherwise; UCX_TLS in the environment narrows the choice).
//
// One UCP context and one worker per transport (so per engine), driven by a single progress
// thread that owns every UCX object: Submit only queues work for that thread and never blocks.
//
// Target side: OnRegister maps the segment's memory with ucp_mem_map, packs its rkey and
// publishes "ucx1:<worker address hex>:<base address hex>:<rkey hex>" in
// SegmentDescriptor::ucx_address. The target's progress thread also serves emulated RMA when the
// chosen UCX transport has no native one (UCX over TCP).
//
// Initiator side: Open creates (or reuses) one endpoint per peer worker address, with peer
// error handling, and unpacks the rkey. A write completes once the put is remotely complete (a
// flush of the endpoint issued after it returned); a read once the data is in local memory.
// RMA cannot be cancelled one request at a time, so a request still running at its deadline
// force-closes its endpoint: once UCX has let go of every buffer of that endpoint, the late
// request ends with DeadlineExceeded and the others on it with Unavailable; the next request to
// that peer opens a fresh endpoint. As transport.h requires, no buffer is touched after done.
// When a peer dies, the endpoint's error handler fails every outstanding request to that peer
// and later requests fail at once with Unavailable (open the segment again to reconnect). UCX's
// shared-memory transports (posix, sysv, cma in UCX 1.13) cannot detect peer failure: to such a
// peer the endpoint is created without it, and requests to a dead peer end at their deadline.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "transfer/transport.h"

namespace tandem::transfer {

struct UcxTransportOptions {
  // If non-empty, overrides UCX_TLS for this transport's context (e.g. "tcp", "posix,cma,self").
  std::string tls;
  // The progress thread busy-polls while requests are in flight and this long (µs) after the
  // last activity (a target serving emulated RMA), then sleeps on UCX's wakeup fd.
  int progress_spin_us = 20000;
  int open_timeout_ms = 5000;  // bound on OnRegister / Open waiting for the progress thread
};

// Creates the UCP context, worker and progress thread. `host` (may be null in tests) outlives
// the transport and only names it in logs: UCX is one-sided, so the target's engine sees no
// per-request traffic (no bytes_served counts) and notifications keep travelling over TCP.
// Unavailable if UCX finds no usable transport (e.g. UCX_TLS names none present here).
StatusOr<std::unique_ptr<Transport>> MakeUcxTransport(TransportHost* host,
                                                      const UcxTransportOptions& options = {});

}  // namespace tandem::transfer
