// Tokenizer::FromHfJson: HF tokenizers' tokenizer.json (byte-level BPE
// subset) plus the optional tokenizer_config.json beside it.
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/tokenizer/pre_tokenizer.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/tokenizer_spec.h"
#include "nlohmann/json.hpp"

namespace baton {
namespace {

using Json = nlohmann::json;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return s.str();
}

std::string TypeOf(const Json& j) {
  if (j.is_object() && j.contains("type") && j["type"].is_string()) {
    return j["type"].get<std::string>();
  }
  return j.is_null() ? "null" : "(no type)";
}

bool BoolOr(const Json& obj, const char* key, bool fallback) {
  if (!obj.contains(key) || obj[key].is_null()) return fallback;
  return obj[key].is_boolean() ? obj[key].get<bool>() : fallback;
}

struct PreState {
  std::vector<PreTokenizerStep> steps;
  bool byte_level_seen = false;
};

absl::Status AddPre(const Json& pre, PreState* state) {
  const std::string type = TypeOf(pre);
  if (state->byte_level_seen) {
    return absl::UnimplementedError(absl::StrCat(
        "pre_tokenizer '", type, "' after ByteLevel is not supported"));
  }
  if (type == "Sequence") {
    if (!pre.contains("pretokenizers") || !pre["pretokenizers"].is_array()) {
      return absl::InvalidArgumentError(
          "pre_tokenizer Sequence has no pretokenizers array");
    }
    for (const Json& p : pre["pretokenizers"])
      BATON_RETURN_IF_ERROR(AddPre(p, state));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    if (BoolOr(pre, "add_prefix_space", false)) {
      return absl::UnimplementedError(
          "pre_tokenizer ByteLevel with add_prefix_space=true is not "
          "supported");
    }
    if (BoolOr(pre, "use_regex", true)) {
      state->steps.push_back(
          {std::string(kGpt2Pattern), false, SplitBehavior::kIsolated});
    }
    state->byte_level_seen = true;
    return absl::OkStatus();
  }
  if (type == "Digits") {
    state->steps.push_back({std::string(BoolOr(pre, "individual_digits", false)
                                            ? kSingleDigitPattern
                                            : kDigitRunPattern),
                            false, SplitBehavior::kIsolated});
    return absl::OkStatus();
  }
  if (type == "Split") {
    PreTokenizerStep step;
    const Json& pattern = pre.value("pattern", Json());
    if (pattern.is_object() && pattern.contains("Regex") &&
        pattern["Regex"].is_string()) {
      step.pattern = pattern["Regex"].get<std::string>();
    } else if (pattern.is_object() && pattern.contains("String") &&
               pattern["String"].is_string()) {
      step.pattern = pattern["String"].get<std::string>();
      step.literal = true;
    } else {
      return absl::InvalidArgumentError(
          "pre_tokenizer Split needs pattern {\"Regex\": ...} or {\"String\": "
          "...}");
    }
    const std::string behavior = pre.value("behavior", std::string("Isolated"));
    if (behavior == "Isolated") {
      step.behavior = SplitBehavior::kIsolated;
    } else if (behavior == "Removed") {
      step.behavior = SplitBehavior::kRemoved;
    } else {
      return absl::UnimplementedError(
          absl::StrCat("pre_tokenizer Split behavior '", behavior,
                       "' is not supported (Isolated, Removed)"));
    }
    if (BoolOr(pre, "invert", false)) {
      return absl::UnimplementedError(
          "pre_tokenizer Split with invert=true is not supported");
    }
    state->steps.push_back(std::move(step));
    return absl::OkStatus();
  }
  return absl::UnimplementedError(
      absl::StrCat("pre_tokenizer '", type,
                   "' is not supported (ByteLevel, Split, Digits, Sequence)"));
}

absl::Status CheckDecoder(const Json& decoder) {
  const std::string type = TypeOf(decoder);
  if (type == "ByteLevel") return absl::OkStatus();
  if (type == "Sequence" && decoder.contains("decoders") &&
      decoder["decoders"].is_array() && !decoder["decoders"].empty()) {
    for (const Json& d : decoder["decoders"])
      BATON_RETURN_IF_ERROR(CheckDecoder(d));
    return absl::OkStatus();
  }
  return absl::UnimplementedError(
      absl::StrCat("decoder '", type, "' is not supported (ByteLevel)"));
}

// Which special tokens the post-processor adds around a single sequence.
struct PostProcess {
  std::optional<int32_t> prefix;
  std::optional<int32_t> suffix;
};

absl::Status ReadPost(const Json& post, PostProcess* out) {
  const std::string type = TypeOf(post);
  if (type == "null" || type == "ByteLevel") return absl::OkStatus();
  if (type == "Sequence") {
    if (!post.contains("processors") || !post["processors"].is_array()) {
      return absl::InvalidArgumentError(
          "post_processor Sequence has no processors array");
    }
    for (const Json& p : post["processors"])
      BATON_RETURN_IF_ERROR(ReadPost(p, out));
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return absl::UnimplementedError(absl::StrCat(
        "post_processor '", type,
        "' is not supported (ByteLevel, TemplateProcessing, Sequence)"));
  }
  const Json& single = post.value("single", Json());
  const Json& specials = post.value("special_tokens", Json());
  if (!single.is_array()) {
    return absl::InvalidArgumentError(
        "post_processor TemplateProcessing has no 'single' array");
  }
  auto resolve = [&](const Json& item) -> absl::StatusOr<int32_t> {
    const std::string name = item["SpecialToken"].value("id", std::string());
    if (!specials.is_object() || !specials.contains(name) ||
        !specials[name].contains("ids") || !specials[name]["ids"].is_array() ||
        specials[name]["ids"].size() != 1 ||
        !specials[name]["ids"][0].is_number_integer()) {
      return absl::UnimplementedError(
          absl::StrCat("post_processor special token '", name,
                       "' must map to exactly one id"));
    }
    return specials[name]["ids"][0].get<int32_t>();
  };
  for (size_t i = 0; i < single.size(); ++i) {
    const Json& item = single[i];
    if (item.contains("Sequence")) continue;
    if (!item.contains("SpecialToken")) {
      return absl::InvalidArgumentError(
          "post_processor template item is neither Sequence nor SpecialToken");
    }
    BATON_ASSIGN_OR_RETURN(int32_t id, resolve(item));
    if (i == 0) {
      out->prefix = id;
    } else if (i + 1 == single.size()) {
      out->suffix = id;
    } else {
      return absl::UnimplementedError(
          "post_processor template with a special token between sequences");
    }
  }
  return absl::OkStatus();
}

// A tokenizer_config.json token field: "text", {"content": "text"} or null.
std::optional<std::string> ConfigToken(const Json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const Json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Build(const Json& root,
                                                 const Json& config) {
  if (!root.is_object())
    return absl::InvalidArgumentError("tokenizer.json is not an object");
  const Json& model = root.value("model", Json());
  if (TypeOf(model) != "BPE") {
    return absl::UnimplementedError(absl::StrCat("tokenizer.json model type '",
                                                 TypeOf(model),
                                                 "' is not supported (BPE)"));
  }
  if (BoolOr(model, "byte_fallback", false)) {
    return absl::UnimplementedError("BPE byte_fallback is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string() &&
        !model[key].get<std::string>().empty()) {
      return absl::UnimplementedError(
          absl::StrCat("BPE ", key, " is not supported"));
    }
  }
  if (model.contains("dropout") && model["dropout"].is_number() &&
      model["dropout"].get<double>() != 0.0) {
    return absl::UnimplementedError("BPE dropout is not supported");
  }
  if (!root.value("normalizer", Json()).is_null()) {
    return absl::UnimplementedError(
        absl::StrCat("normalizer '", TypeOf(root["normalizer"]),
                     "' is not supported (null only)"));
  }
  const Json& vocab = model.value("vocab", Json());
  if (!vocab.is_object() || vocab.empty()) {
    return absl::InvalidArgumentError(
        "tokenizer.json model.vocab is missing or empty");
  }
  if (!model.contains("merges") || !model["merges"].is_array()) {
    return absl::InvalidArgumentError("tokenizer.json model.merges is missing");
  }

  TokenizerSpec spec;
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX - 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("vocab entry '", it.key(), "' has no valid id"));
    }
    max_id = std::max<int64_t>(max_id, it.value().get<int64_t>());
  }
  const Json& added = root.value("added_tokens", Json::array());
  if (!added.is_array())
    return absl::InvalidArgumentError("added_tokens is not an array");
  for (const Json& a : added) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() > INT32_MAX - 1 ||
        !a.contains("content") || !a["content"].is_string()) {
      return absl::InvalidArgumentError(
          "added_tokens entry needs an integer id and string content");
    }
    max_id = std::max<int64_t>(max_id, a["id"].get<int64_t>());
  }
  if (max_id > 16 * static_cast<int64_t>(vocab.size() + added.size()) + 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", max_id, " is far beyond the ", vocab.size(),
                     " tokens given"));
  }
  const size_t n = static_cast<size_t>(max_id + 1);
  spec.texts.resize(n);
  spec.types.assign(n, TokenType::kUnused);
  spec.lstrip.assign(n, false);
  spec.rstrip.assign(n, false);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const size_t id = it.value().get<size_t>();
    if (spec.types[id] != TokenType::kUnused) {
      return absl::InvalidArgumentError(
          absl::StrCat("vocab id ", id, " is used twice"));
    }
    spec.texts[id] = it.key();
    spec.types[id] = TokenType::kNormal;
  }
  for (const Json& a : added) {
    if (BoolOr(a, "single_word", false)) {
      return absl::UnimplementedError(
          absl::StrCat("added token '", a["content"].get<std::string>(),
                       "' uses single_word"));
    }
    const size_t id = a["id"].get<size_t>();
    spec.texts[id] = a["content"].get<std::string>();
    spec.types[id] = BoolOr(a, "special", false) ? TokenType::kControl
                                                 : TokenType::kUserDefined;
    spec.lstrip[id] = BoolOr(a, "lstrip", false);
    spec.rstrip[id] = BoolOr(a, "rstrip", false);
  }

  const Json& merges = model["merges"];
  spec.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const Json& m = merges[i];
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sep = s.find(' ');
      if (sep == std::string::npos || sep == 0 || sep + 1 >= s.size() ||
          s.find(' ', sep + 1) != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("merges[", i, "] = '", s, "' is not 'left right'"));
      }
      spec.merges.emplace_back(s.substr(0, sep), s.substr(sep + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() &&
               m[1].is_string()) {
      spec.merges.emplace_back(m[0].get<std::string>(),
                               m[1].get<std::string>());
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "merges[", i, "] is neither \"a b\" nor [\"a\", \"b\"]"));
    }
  }
  spec.bpe.ignore_merges = BoolOr(model, "ignore_merges", false);
  spec.bpe.require_merges_in_vocab = true;

  PreState pre;
  BATON_RETURN_IF_ERROR(AddPre(root.value("pre_tokenizer", Json()), &pre));
  if (!pre.byte_level_seen) {
    return absl::UnimplementedError(
        "pre_tokenizer has no ByteLevel step (only byte-level BPE is "
        "supported)");
  }
  spec.pre_steps = std::move(pre.steps);
  spec.pre_name = "tokenizer.json pre_tokenizer";
  BATON_RETURN_IF_ERROR(CheckDecoder(root.value("decoder", Json())));

  PostProcess post;
  BATON_RETURN_IF_ERROR(ReadPost(root.value("post_processor", Json()), &post));
  auto id_of = [&](const std::string& text) -> std::optional<int32_t> {
    for (size_t i = 0; i < n; ++i) {
      if (spec.texts[i] == text && spec.types[i] != TokenType::kUnused) {
        return static_cast<int32_t>(i);
      }
    }
    return std::nullopt;
  };
  if (std::optional<std::string> bos = ConfigToken(config, "bos_token")) {
    spec.bos_id = id_of(*bos);
  }
  if (std::optional<std::string> eos = ConfigToken(config, "eos_token")) {
    spec.eos_id = id_of(*eos);
  }
  if (post.prefix.has_value()) {
    spec.bos_id = post.prefix;
    spec.add_bos = true;
  } else if (config.is_object() && BoolOr(config, "add_bos_token", false)) {
    spec.add_bos = spec.bos_id.has_value();
  }
  if (post.suffix.has_value()) {
    spec.eos_id = post.suffix;
    spec.add_eos = true;
  }
  if (config.is_object() && config.contains("chat_template")) {
    const Json& t = config["chat_template"];
    if (t.is_string()) {
      spec.chat_template = t.get<std::string>();
    } else if (t.is_array()) {
      for (const Json& named : t) {
        if (named.is_object() &&
            named.value("name", std::string()) == "default" &&
            named.contains("template") && named["template"].is_string()) {
          spec.chat_template = named["template"].get<std::string>();
        }
      }
    }
  }
  return Tokenizer::Create(std::move(spec));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromHfJsonText(
    absl::string_view tokenizer_json, absl::string_view config_json) {
  Json root = Json::parse(tokenizer_json.begin(), tokenizer_json.end(), nullptr,
                          /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError("tokenizer.json is not valid JSON");
  }
  Json config = Json::object();
  if (!config_json.empty()) {
    config =
        Json::parse(config_json.begin(), config_json.end(), nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(
          "tokenizer_config.json is not a JSON object");
    }
  }
  try {
    return Build(root, config);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json has an unexpected shape: ", e.what()));
  }
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromHfJson(
    const std::string& tokenizer_json_path) {
  BATON_ASSIGN_OR_RETURN(std::string text, ReadFile(tokenizer_json_path));
  const size_t slash = tokenizer_json_path.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? "." : tokenizer_json_path.substr(0, slash);
  std::string config;
  {
    std::ifstream probe(dir + "/tokenizer_config.json");
    if (probe) {
      BATON_ASSIGN_OR_RETURN(config, ReadFile(dir + "/tokenizer_config.json"));
    }
  }
  auto tok = FromHfJsonText(text, config);
  if (!tok.ok()) {
    return absl::Status(
        tok.status().code(),
        absl::StrCat(tokenizer_json_path, ": ", tok.status().message()));
  }
  return tok;
}

}  // namespace baton
