// libFuzzer target: arbitrary bytes as an OpenAI request body (the first
// byte picks /v1/chat/completions or /v1/completions). Parsing succeeds or
// is InvalidArgument with a message (never an exception, crash or sanitizer
// report); a parsed request keeps its counts within the limits, and every
// choice of every prompt yields a Generate request.
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/check.h"
#include "coordinator/http/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto endpoint = (data[0] & 1) != 0 ? baton::http::Endpoint::kCompletion
                                           : baton::http::Endpoint::kChat;
  const absl::string_view body(reinterpret_cast<const char*>(data) + 1,
                               size - 1);
  auto request = baton::http::ParseOpenAiRequest(endpoint, body);
  if (!request.ok()) {
    BATON_CHECK(absl::IsInvalidArgument(request.status())) << request.status();
    BATON_CHECK(!request.status().message().empty());
    return 0;
  }
  BATON_CHECK(request->n >= 1 && request->n <= baton::http::kMaxChoices)
      << request->n;
  BATON_CHECK(!request->prompts.empty());
  BATON_CHECK(request->prompts.size() <=
              static_cast<size_t>(baton::http::kMaxPrompts));
  if (endpoint == baton::http::Endpoint::kChat) {
    BATON_CHECK(request->prompts.size() == 1u);
  }
  for (size_t p = 0; p < request->prompts.size(); ++p) {
    for (int c = 0; c < request->n; ++c) {
      const std::string id = absl::StrCat("fuzz-", p, "-", c);
      const auto generate =
          baton::http::ChoiceRequest(*request, static_cast<int>(p), c, id);
      BATON_CHECK(generate.request_id() == id);
    }
  }
  return 0;
}
