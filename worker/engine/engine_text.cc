// The engine's text side: when a sampled token ends a sequence (EOS, a
// stop string, max_tokens) and what text it releases.
#include "worker/engine/engine.h"

namespace baton {

FinishReason Engine::AdvanceText(Sequence* seq, int32_t token,
                                 RequestOutput* out) {
  const SamplingParams& params = seq->request.params;
  FinishReason reason = FinishReason::kNone;
  if (IsStopToken(params, token, eos_ids_)) {
    reason = FinishReason::kStop;
  } else {
    StopChecker::Result r =
        seq->stop_checker->Push(seq->detokenizer->Push(token));
    out->text += r.emit;
    if (r.stopped) reason = FinishReason::kStop;
  }
  if (reason == FinishReason::kNone &&
      seq->num_generated() >= params.max_tokens) {
    reason = FinishReason::kLength;
  }
  return reason;
}

void Engine::FlushText(Sequence* seq, FinishReason* reason,
                       RequestOutput* out) {
  if (seq->stop_checker->stopped()) return;
  // Flush a held-back partial character and held-back stop-string prefix.
  StopChecker::Result r = seq->stop_checker->Push(seq->detokenizer->Finish());
  out->text += r.emit;
  if (r.stopped) {
    *reason = FinishReason::kStop;
  } else {
    out->text += seq->stop_checker->Finish();
  }
}

}  // namespace baton
