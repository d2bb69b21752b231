#include "worker/service/proto_convert.h"

#include <string>

namespace baton {

v1::TokenLogprobs ToProto(const TokenOutput& token) {
  v1::TokenLogprobs proto;
  proto.set_token_id(token.token);
  if (token.logprob.has_value()) proto.set_logprob(*token.logprob);
  for (const TokenLogprob& alt : token.top_logprobs) {
    v1::TokenLogprob* p = proto.add_top_logprobs();
    p->set_token_id(alt.token);
    p->set_logprob(alt.logprob);
  }
  for (const TokenProb& candidate : token.processed) {
    v1::TokenProb* p = proto.add_processed();
    p->set_token_id(candidate.token);
    p->set_prob(candidate.prob);
  }
  return proto;
}

v1::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

}  // namespace baton
