#include "coordinator/http/openai_request.h"

#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "worker/sampler/sampling_params.h"

namespace baton::http {
namespace {

using Json = nlohmann::json;

std::string TypeName(const Json& value) {
  if (value.is_number_integer() || value.is_number_unsigned()) {
    return "integer";
  }
  if (value.is_number_float()) return "number";
  return value.type_name();
}

// Typed access to the optional fields of one JSON object. A missing field
// and an explicit null are both "absent"; a wrong type records the first
// error (status()) and reads as absent.
class FieldReader {
 public:
  explicit FieldReader(const Json& object) : object_(object) {}

  const absl::Status& status() const { return status_; }
  void Fail(std::string message) {
    if (status_.ok()) status_ = absl::InvalidArgumentError(std::move(message));
  }

  const Json* Get(const char* name) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<bool> Bool(const char* name) {
    const Json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) return WrongType(name, "a boolean", *v);
    return v->get<bool>();
  }

  std::optional<double> Number(const char* name) {
    const Json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) return WrongType(name, "a number", *v);
    return v->get<double>();
  }

  // An integer in [lo, hi].
  std::optional<int64_t> Integer(const char* name, int64_t lo, int64_t hi) {
    const Json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(hi) ||
          (lo > 0 && u < static_cast<uint64_t>(lo))) {
        return OutOfRange(name, lo, hi, *v);
      }
      return static_cast<int64_t>(u);
    }
    if (!v->is_number_integer()) return WrongType(name, "an integer", *v);
    const int64_t i = v->get<int64_t>();
    if (i < lo || i > hi) return OutOfRange(name, lo, hi, *v);
    return i;
  }

  std::optional<std::string> String(const char* name) {
    const Json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) return WrongType(name, "a string", *v);
    return v->get<std::string>();
  }

 private:
  std::nullopt_t WrongType(const char* name, const char* want,
                           const Json& got) {
    Fail(absl::StrCat(name, " must be ", want, ", got ", TypeName(got)));
    return std::nullopt;
  }
  std::nullopt_t OutOfRange(const char* name, int64_t lo, int64_t hi,
                            const Json& got) {
    Fail(absl::StrCat(name, " must be in [", lo, ", ", hi, "], got ",
                      got.dump()));
    return std::nullopt;
  }

  const Json& object_;
  absl::Status status_;
};

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Fields that change what is generated and that Baton does not implement:
// rejected rather than silently ignored.
absl::Status RejectUnsupported(FieldReader& f, Endpoint endpoint) {
  for (const char* name : {"tools", "functions", "logit_bias"}) {
    const Json* v = f.Get(name);
    if (v != nullptr && !v->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " is not supported by Baton"));
    }
  }
  if (const Json* v = f.Get("response_format"); v != nullptr) {
    if (!v->is_object() || v->value("type", "") != "text") {
      return absl::InvalidArgumentError(
          "response_format is not supported by Baton (only {\"type\": "
          "\"text\"})");
    }
  }
  if (endpoint == Endpoint::kCompletion) {
    if (f.Bool("echo").value_or(false)) {
      return absl::InvalidArgumentError("echo is not supported by Baton");
    }
    if (f.Integer("best_of", 1, kInt32Max).value_or(1) > 1) {
      return absl::InvalidArgumentError(
          "best_of > 1 is not supported by Baton (use n)");
    }
    if (const std::optional<std::string> s = f.String("suffix");
        s.has_value() && !s->empty()) {
      return absl::InvalidArgumentError("suffix is not supported by Baton");
    }
  }
  return f.status();
}

absl::StatusOr<std::string> ContentText(const Json& content,
                                        const std::string& field) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be a string or an array of text parts, got ",
                     TypeName(content)));
  }
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    const std::string name = absl::StrCat(field, "[", i, "]");
    if (!part.is_object() || part.value("type", "") != "text" ||
        !part.contains("text") || !part["text"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name,
          " must be {\"type\": \"text\", \"text\": string} (only text "
          "content is supported)"));
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

absl::Status ParseMessages(const Json* messages, v1::GenerateRequest& out) {
  if (messages == nullptr) {
    return absl::InvalidArgumentError("messages is required");
  }
  if (!messages->is_array() || messages->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("messages must be a non-empty array, got ",
                     messages->is_array() ? "[]" : TypeName(*messages)));
  }
  v1::ChatConversation* chat = out.mutable_chat();
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string field = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " must be an object, got ", TypeName(m)));
    }
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".role must be a string"));
    }
    v1::ChatMessage* message = chat->add_messages();
    // "developer" is the newer name of "system".
    message->set_role(*role == "developer" ? "system"
                                           : role->get<std::string>());
    auto content = m.find("content");
    if (content == m.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".content is required"));
    }
    auto text = ContentText(*content, field + ".content");
    if (!text.ok()) return text.status();
    message->set_content(std::move(*text));
  }
  return absl::OkStatus();
}

// One token-id array as a prompt; `field` names it in errors.
absl::Status TokenIds(const Json& ids, const std::string& field,
                      v1::GenerateRequest& out) {
  v1::TokenIds* tokens = out.mutable_token_ids();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!ids[i].is_number_integer() || ids[i].get<int64_t>() < 0 ||
        ids[i].get<int64_t>() > kInt32Max) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "[", i, "] must be a token id (integer >= 0), got ",
          ids[i].dump()));
    }
    tokens->add_token_ids(ids[i].get<int32_t>());
  }
  return absl::OkStatus();
}

// "prompt": a string, an array of strings, an array of token ids, or an
// array of token-id arrays. Appends one request per prompt.
absl::Status ParsePrompts(const Json* prompt,
                          std::vector<v1::GenerateRequest>& out) {
  if (prompt == nullptr)
    return absl::InvalidArgumentError("prompt is required");
  const char* kShape =
      "prompt must be a string, an array of strings, an array of token ids "
      "or an array of token-id arrays";
  if (prompt->is_string()) {
    if (prompt->get_ref<const std::string&>().empty()) {
      return absl::InvalidArgumentError("prompt must not be empty");
    }
    out.emplace_back().set_text(prompt->get<std::string>());
    return absl::OkStatus();
  }
  if (!prompt->is_array() || prompt->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kShape, ", got ", prompt->is_array() ? "[]" : TypeName(*prompt)));
  }
  if ((*prompt)[0].is_number())
    return TokenIds(*prompt, "prompt", out.emplace_back());
  if (prompt->size() > static_cast<size_t>(kMaxPrompts)) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt must hold at most ", kMaxPrompts, " prompts, got ",
                     prompt->size()));
  }
  // Strings only, or token-id arrays only (as OpenAI's API takes them).
  const bool strings = (*prompt)[0].is_string();
  for (size_t i = 0; i < prompt->size(); ++i) {
    const Json& p = (*prompt)[i];
    const std::string field = absl::StrCat("prompt[", i, "]");
    if ((p.is_string() || p.is_array()) && p.is_string() != strings) {
      return absl::InvalidArgumentError(
          absl::StrCat(kShape, "; ", field, " is ", TypeName(p),
                       " but prompt[0] is ", TypeName((*prompt)[0])));
    }
    if (p.is_string()) {
      if (p.get_ref<const std::string&>().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, " must not be empty"));
      }
      out.emplace_back().set_text(p.get<std::string>());
    } else if (p.is_array()) {
      if (p.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, " must hold at least one token id"));
      }
      if (absl::Status s = TokenIds(p, field, out.emplace_back()); !s.ok()) {
        return s;
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(kShape, "; ", field, " is ", TypeName(p)));
    }
  }
  return absl::OkStatus();
}

// "stop": a string or an array of strings.
absl::Status ParseStop(const Json* stop, v1::SamplingParams& sampling) {
  if (stop == nullptr) return absl::OkStatus();
  if (stop->is_string()) {
    sampling.add_stop(stop->get<std::string>());
    return absl::OkStatus();
  }
  if (stop->is_array()) {
    for (size_t i = 0; i < stop->size(); ++i) {
      if (!(*stop)[i].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "stop[", i, "] must be a string, got ", TypeName((*stop)[i])));
      }
      sampling.add_stop((*stop)[i].get<std::string>());
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "stop must be a string or an array of strings, got ", TypeName(*stop)));
}

absl::Status ParseSampling(FieldReader& f, Endpoint endpoint,
                           OpenAiRequest& out, v1::SamplingParams& s) {
  if (auto v = f.Number("temperature")) s.set_temperature(*v);
  if (auto v = f.Number("top_p")) s.set_top_p(*v);
  // vLLM's top_k: -1 (and 0) turn it off.
  if (auto v = f.Integer("top_k", -1, kInt32Max)) {
    s.set_top_k(static_cast<int32_t>(std::max<int64_t>(*v, 0)));
  }
  if (auto v = f.Number("min_p")) s.set_min_p(*v);
  if (auto v = f.Number("repetition_penalty")) s.set_repetition_penalty(*v);
  if (auto v = f.Number("presence_penalty")) s.set_presence_penalty(*v);
  if (auto v = f.Number("frequency_penalty")) s.set_frequency_penalty(*v);
  if (auto v = f.Bool("ignore_eos")) s.set_ignore_eos(*v);
  if (auto v = f.Integer("seed", 0, std::numeric_limits<int64_t>::max())) {
    s.set_seed(static_cast<uint64_t>(*v));
  }
  std::optional<int64_t> max_tokens =
      f.Integer("max_completion_tokens", 1, kInt32Max);
  if (!max_tokens.has_value())
    max_tokens = f.Integer("max_tokens", 1, kInt32Max);
  if (max_tokens.has_value()) {
    s.set_max_tokens(static_cast<int32_t>(*max_tokens));
  } else if (endpoint == Endpoint::kChat) {
    out.fill_context = true;
  }
  if (endpoint == Endpoint::kChat) {
    out.logprobs = f.Bool("logprobs").value_or(false);
    const std::optional<int64_t> top =
        f.Integer("top_logprobs", 0, kMaxLogprobs);
    if (top.has_value() && !out.logprobs && f.status().ok()) {
      return absl::InvalidArgumentError(
          "top_logprobs requires logprobs to be true");
    }
    out.top_logprobs = static_cast<int>(top.value_or(0));
  } else if (auto n = f.Integer("logprobs", 0, kMaxLogprobs)) {
    out.logprobs = true;
    out.top_logprobs = static_cast<int>(*n);
  }
  if (out.logprobs) s.set_logprobs(out.top_logprobs);
  if (f.Get("user") != nullptr) f.String("user");  // accepted, unused
  return ParseStop(f.Get("stop"), s);
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(Endpoint endpoint,
                                                 absl::string_view body) {
  const Json root = Json::parse(body.begin(), body.end(), /*cb=*/nullptr,
                                /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(
        "body is not valid JSON (expected an object)");
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("body must be a JSON object, got ", TypeName(root)));
  }
  OpenAiRequest out;
  out.endpoint = endpoint;
  FieldReader f(root);
  if (absl::Status s = RejectUnsupported(f, endpoint); !s.ok()) return s;

  std::optional<std::string> model = f.String("model");
  if (!f.status().ok()) return f.status();
  if (!model.has_value() || model->empty()) {
    return absl::InvalidArgumentError("model is required");
  }
  out.model = *model;
  out.stream = f.Bool("stream").value_or(false);
  if (const Json* options = f.Get("stream_options"); options != nullptr) {
    if (!options->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stream_options must be an object, got ", TypeName(*options)));
    }
    if (!out.stream) {
      return absl::InvalidArgumentError(
          "stream_options is only allowed when stream is true");
    }
    FieldReader o(*options);
    out.include_usage = o.Bool("include_usage").value_or(false);
    if (!o.status().ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("stream_options.", o.status().message()));
    }
  }
  out.n = static_cast<int>(f.Integer("n", 1, kMaxChoices).value_or(1));

  v1::GenerateRequest base;
  base.set_model(out.model);
  if (absl::Status s =
          ParseSampling(f, endpoint, out, *base.mutable_sampling());
      !s.ok()) {
    return s;
  }
  if (!f.status().ok()) return f.status();

  std::vector<v1::GenerateRequest> prompts;
  absl::Status prompt_status =
      endpoint == Endpoint::kChat
          ? ParseMessages(f.Get("messages"), prompts.emplace_back())
          : ParsePrompts(f.Get("prompt"), prompts);
  if (!prompt_status.ok()) return prompt_status;
  for (v1::GenerateRequest& p : prompts) {
    p.set_model(base.model());
    *p.mutable_sampling() = base.sampling();
  }
  out.prompts = std::move(prompts);
  return out;
}

v1::GenerateRequest ChoiceRequest(const OpenAiRequest& request, int prompt,
                                  int choice, const std::string& request_id) {
  v1::GenerateRequest out = request.prompts.at(static_cast<size_t>(prompt));
  out.set_request_id(request_id);
  if (out.sampling().has_seed()) {
    out.mutable_sampling()->set_seed(
        out.sampling().seed() +
        static_cast<uint64_t>(prompt * request.n + choice));
  }
  return out;
}

}  // namespace baton::http
