// `baton generate --server=HOST:PORT`: the same prompts, flags and JSON as
// the local mode (cli/generate_command.h), served by a Baton cluster through
// the public API (baton.v1.Baton/Generate, one stream per prompt).
#ifndef BATON_CLI_REMOTE_GENERATE_H_
#define BATON_CLI_REMOTE_GENERATE_H_

#include <atomic>
#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "baton/v1/api.pb.h"
#include "baton/v1/types.pb.h"
#include "cli/generate_command.h"
#include "common/auth/bearer_interceptor.h"
#include "nlohmann/json.hpp"
#include "worker/sampler/sampling_params.h"

namespace baton::cli {

struct RemoteGenerateOptions {
  // host:port of the coordinator's Baton service. Required.
  std::string server;
  // TLS and API key (plaintext, no key by default).
  ClientSecurity security;
  // Model id as ListModels names it; empty: the only model served.
  std::string model_id;
  // Client deadline of each Generate RPC in milliseconds; 0: none.
  int64_t deadline_ms = 0;
  // Prompts, sampling and output format. model_path and engine are ignored.
  GenerateOptions generate;
  // When it becomes true (e.g. from a SIGINT handler), every stream still
  // open is cancelled and RunRemoteGenerate returns Cancelled. May be null.
  const std::atomic<bool>* interrupted = nullptr;
};

// Sends one Generate RPC per prompt, all at once. Without --json and with
// one prompt, the text is streamed to `out` as it arrives and a summary
// (timings, workers) goes to `err`; otherwise one JSON object per prompt, in
// input order, goes to `out` (GenerationJson's fields plus "request_id",
// "seed", "usage", "timings", "prefill_worker", "decode_worker" and, on
// error, "error_code" / "error_message").
//
// Returns the first failure: an RPC status as is (code and message), an
// in-band FINISH_REASON_ERROR as a status with the result's error code and
// message, and Cancelled "interrupted" after `interrupted` fired.
absl::Status RunRemoteGenerate(const RemoteGenerateOptions& options,
                               std::ostream& out, std::ostream& err);

// The proto form of `params`: every field set explicitly (seed and logprobs
// only when present).
v1::SamplingParams SamplingToProto(const SamplingParams& params);

// The request for one prompt: a one-message user chat, or `text` when raw.
v1::GenerateRequest MakeGenerateRequest(const std::string& prompt, bool raw,
                                        const std::string& model_id,
                                        const SamplingParams& sampling);

}  // namespace baton::cli

#endif  // BATON_CLI_REMOTE_GENERATE_H_
