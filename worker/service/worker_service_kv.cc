// WorkerService's TCP KV plumbing: the receiver's options and the sink of a
// split prefill's handoff, both simulated (no bytes) when the worker runs
// with --simulate_kv_transfers.
#include <string>
#include <utility>

#include "worker/engine/simulated_runner.h"
#include "worker/service/worker_service.h"

namespace baton {

TcpKvReceiverOptions WorkerService::KvReceiverOptions(
    const WorkerServiceOptions& options) {
  TcpKvReceiverOptions receiver_options;
  receiver_options.host = options.kv_host;
  receiver_options.port = options.kv_port;
  receiver_options.stall_timeout = options.kv_stall_timeout;
  receiver_options.tls = options.kv_tls;
  receiver_options.accept_simulated_layers =
      options.simulated_kv_transfers.has_value();
  return receiver_options;
}

KvSinkFactory WorkerService::TcpKvSink(const std::string& address,
                                       uint64_t transfer_id,
                                       const std::string& secret) const {
  TcpKvSenderOptions sender_options;
  sender_options.pool = kv_connections_;
  sender_options.stall_timeout = options_.kv_stall_timeout;
  sender_options.transfer_secret = secret;
  sender_options.tls = options_.kv_tls;
  sender_options.simulated_layers = options_.simulated_kv_transfers.has_value();
  KvSinkFactory sink =
      TcpKvSinkFactory(address, transfer_id, options_.model_id, sender_options);
  if (!options_.simulated_kv_transfers.has_value()) return sink;
  return SimulatedTransferSinkFactory(std::move(sink),
                                      *options_.simulated_kv_transfers);
}

}  // namespace baton
