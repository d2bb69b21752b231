#include "tests/cluster/cluster_test_util.h"

#include <chrono>
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/grpc/grpc_status.h"
#include "common/test_util.h"
#include "worker/engine/engine.h"
#include "worker/engine/model_bundle.h"
#include "worker/service/proto_convert.h"

namespace baton::testing {

StreamResult RunGenerate(v1::Baton::Stub& stub,
                         const v1::GenerateRequest& request,
                         const StreamOptions& options) {
  grpc::ClientContext context;
  if (options.deadline != absl::InfiniteDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + options.deadline));
  }
  StreamResult out;
  auto reader = stub.Generate(&context, request);
  v1::GenerateResponse response;
  bool cancelled = false;
  while (reader->Read(&response)) {
    ++out.messages;
    out.tokens.insert(out.tokens.end(), response.token_ids().begin(),
                      response.token_ids().end());
    out.text += response.text();
    if (response.has_result()) {
      out.has_result = true;
      out.result = response.result();
    }
    if (options.on_message) options.on_message(out);
    if (!cancelled && options.cancel_after_tokens >= 0 &&
        static_cast<int>(out.tokens.size()) >= options.cancel_after_tokens) {
      context.TryCancel();
      cancelled = true;
    }
  }
  out.status = reader->Finish();
  if (!out.status.ok()) out.retry_after = RetryAfterFrom(context);
  return out;
}

namespace {

// The default model and an engine over it, for in-process runs.
class DefaultModelEngine {
 public:
  DefaultModelEngine(int num_threads, int64_t kv_cache_blocks) {
    auto bundle = LoadModelBundle(DefaultModelPath());
    BATON_CHECK(bundle.ok()) << bundle.status();
    bundle_ = std::move(*bundle);
    EngineOptions options;
    options.num_threads = num_threads;
    options.kv_cache_blocks = kv_cache_blocks;
    auto engine =
        Engine::Create(options, bundle_.weights.get(), bundle_.tokenizer.get());
    BATON_CHECK(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
  }
  Engine* operator->() { return engine_.get(); }
  const ModelBundle& bundle() const { return bundle_; }

 private:
  ModelBundle bundle_;
  std::unique_ptr<Engine> engine_;
};

}  // namespace

absl::Duration HostPace() {
  static const absl::Duration pace = [] {
    DefaultModelEngine engine(/*num_threads=*/1, /*kv_cache_blocks=*/64);
    GenerationRequest request;
    request.id = "pace";
    for (int32_t i = 0; i < 32; ++i) request.prompt.push_back(100 + i);
    request.params.temperature = 0.0;
    request.params.max_tokens = 4;
    request.params.ignore_eos = true;
    const absl::Time start = absl::Now();
    BATON_CHECK(engine->Submit(request, [](const RequestOutput&) {}).ok());
    engine->RunUntilIdle();
    const absl::Duration took = absl::Now() - start;
    std::fprintf(stderr, "host pace (32-token prefill + 4 decode steps): %s\n",
                 absl::FormatDuration(took).c_str());
    return took;
  }();
  return pace;
}

absl::Duration DefaultTestDeadline() {
  return absl::Seconds(60) + 200 * HostPace();
}

std::string Describe(const StreamResult& result) {
  std::string out = absl::StrCat(
      "rpc status ", static_cast<int>(result.status.error_code()), " '",
      result.status.error_message(), "', ", result.tokens.size(), " tokens");
  if (result.has_result) {
    absl::StrAppend(&out, ", finish_reason ",
                    v1::FinishReason_Name(result.result.finish_reason()),
                    ", error_code ", result.result.error_code(), " '",
                    result.result.error_message(), "'");
  } else {
    absl::StrAppend(&out, ", no result message");
  }
  return out;
}

v1::GenerateRequest ChatRequest(const std::string& user, int max_tokens,
                                double temperature, uint64_t seed) {
  v1::GenerateRequest request;
  v1::ChatMessage* message = request.mutable_chat()->add_messages();
  message->set_role("user");
  message->set_content(user);
  request.mutable_sampling()->set_max_tokens(max_tokens);
  request.mutable_sampling()->set_temperature(temperature);
  request.mutable_sampling()->set_seed(seed);
  if (temperature > 0) request.mutable_sampling()->set_top_p(0.9);
  return request;
}

std::vector<Expected> InProcessReference(
    const std::vector<v1::GenerateRequest>& requests, absl::Duration* took) {
  const absl::Time start = absl::Now();
  DefaultModelEngine engine(/*num_threads=*/2, /*kv_cache_blocks=*/2048);
  std::vector<Expected> expected(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const v1::GenerateRequest& r = requests[i];
    BATON_CHECK(r.has_chat() && r.chat().messages_size() == 1);
    GenerationRequest generation;
    generation.id = absl::StrCat("reference-", i);
    generation.prompt =
        engine.bundle().EncodePrompt(r.chat().messages(0).content(),
                                     /*raw=*/false);
    auto params = FromProto(r.sampling());
    BATON_CHECK(params.ok()) << params.status();
    generation.params = *params;
    Expected* e = &expected[i];
    BATON_CHECK(engine
                    ->Submit(generation,
                             [e](const RequestOutput& out) {
                               for (const TokenOutput& t : out.tokens) {
                                 e->tokens.push_back(t.token);
                               }
                               e->text += out.text;
                               if (out.finish_reason != FinishReason::kNone) {
                                 e->finish_reason = ToProto(out.finish_reason);
                               }
                             })
                    .ok());
  }
  engine->RunUntilIdle();
  if (took != nullptr) *took = absl::Now() - start;
  return expected;
}

}  // namespace baton::testing
