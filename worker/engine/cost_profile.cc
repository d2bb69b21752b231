#include "worker/engine/cost_profile.h"

#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

using Json = nlohmann::json;

absl::Status Number(const Json& json, const std::string& path, double min,
                    bool strict, double* out) {
  const size_t dot = path.find('.');
  const Json* node = &json;
  for (const std::string& key :
       dot == std::string::npos
           ? std::vector<std::string>{path}
           : std::vector<std::string>{path.substr(0, dot),
                                      path.substr(dot + 1)}) {
    if (!node->is_object() || !node->contains(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: '", path, "' is missing"));
    }
    node = &(*node)[key];
  }
  if (!node->is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile: '", path, "' must be a number"));
  }
  const double v = node->get<double>();
  if (!std::isfinite(v) || v < min || (strict && v == min)) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile: '", path, "' must be ",
                     strict ? "> " : ">= ", min, ", got ", v));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status Integer(const Json& json, const std::string& key, int64_t* out) {
  double v = 0;
  if (absl::Status s = Number(json, key, 0, /*strict=*/true, &v); !s.ok()) {
    return s;
  }
  if (v != std::floor(v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile: '", key, "' must be an integer, got ", v));
  }
  *out = static_cast<int64_t>(v);
  return absl::OkStatus();
}

absl::Status Model(const Json& json, const std::string& key, CostModel* m) {
  for (auto [name, field] : {std::pair{"c0", &m->c0}, std::pair{"c1", &m->c1},
                             std::pair{"c2", &m->c2}}) {
    if (absl::Status s = Number(json, absl::StrCat(key, ".", name), 0,
                                /*strict=*/false, field);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// decode_batch_factors: [[B, factor], ...], B ascending integers >= 1,
// factors in (0, 10].
absl::Status BatchFactors(const Json& json, WorkerProfile* p) {
  if (!json.contains("decode_batch_factors")) return absl::OkStatus();
  const Json& list = json["decode_batch_factors"];
  if (!list.is_array()) {
    return absl::InvalidArgumentError(
        "profile: 'decode_batch_factors' must be a list of [batch, factor]");
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& e = list[i];
    const std::string where = absl::StrCat("decode_batch_factors[", i, "]");
    if (!e.is_array() || e.size() != 2 || !e[0].is_number() ||
        !e[1].is_number()) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: '", where, "' must be [batch, factor]"));
    }
    const double batch = e[0].get<double>(), factor = e[1].get<double>();
    const int64_t previous = p->decode_batch_factors.empty()
                                 ? 0
                                 : p->decode_batch_factors.back().batch;
    if (!std::isfinite(batch) || batch != std::floor(batch) ||
        batch <= static_cast<double>(previous) || batch > 1e9) {
      return absl::InvalidArgumentError(absl::StrCat(
          "profile: '", where, "': the batch must be an integer above ",
          previous, " (ascending), got ", batch));
    }
    if (!std::isfinite(factor) || factor <= 0 || factor > 10) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: '", where,
                       "': the factor must be in (0, 10], got ", factor));
    }
    p->decode_batch_factors.push_back({static_cast<int64_t>(batch), factor});
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<WorkerProfile> ParseProfile(const Json& json) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError("profile: not a JSON object");
  }
  WorkerProfile p;
  p.name = json.value("name", "");
  p.source = json.value("source", "");
  if (absl::Status s = Model(json, "prefill", &p.prefill); !s.ok()) return s;
  if (absl::Status s = Model(json, "decode", &p.decode); !s.ok()) return s;
  if (absl::Status s =
          Number(json, "transfer.alpha_s", 0, false, &p.transfer_alpha_s);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Number(json, "transfer.bytes_per_s", 0, true,
                              &p.transfer_bytes_per_s);
      !s.ok()) {
    return s;
  }
  if (json.contains("transfer") && json["transfer"].is_object() &&
      json["transfer"].contains("s_per_token2")) {
    if (absl::Status s = Number(json, "transfer.s_per_token2", 0, false,
                                &p.transfer_s_per_token2);
        !s.ok()) {
      return s;
    }
  }
  if (json.contains("neighbor_slowdown")) {
    WorkerProfile::NeighborSlowdown& n = p.neighbor_slowdown;
    if (json["neighbor_slowdown"].is_object()) {
      for (auto [path, field] :
           {std::pair{"neighbor_slowdown.prefill", &n.prefill},
            std::pair{"neighbor_slowdown.decode", &n.decode}}) {
        if (absl::Status s = Number(json, path, 0, false, field); !s.ok()) {
          return s;
        }
      }
    } else if (absl::Status s =
                   Number(json, "neighbor_slowdown", 0, false, &n.prefill);
               !s.ok()) {
      return s;
    } else {
      n.decode = n.prefill;
    }
  }
  if (absl::Status s = BatchFactors(json, &p); !s.ok()) return s;
  for (auto [key, field] :
       {std::pair{"kv_bytes_per_token", &p.kv_bytes_per_token},
        std::pair{"kv_blocks", &p.kv_blocks},
        std::pair{"block_size", &p.block_size},
        std::pair{"max_batch_tokens", &p.max_batch_tokens},
        std::pair{"max_num_seqs", &p.max_num_seqs}}) {
    if (absl::Status s = Integer(json, key, field); !s.ok()) return s;
  }
  return p;
}

absl::StatusOr<WorkerProfile> LoadProfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  Json json = Json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  }
  absl::StatusOr<WorkerProfile> p = ParseProfile(json);
  if (!p.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", p.status().message()));
  }
  return p;
}

Json ProfileJson(const WorkerProfile& p) {
  auto model = [](const CostModel& m) {
    return Json{{"c0", m.c0}, {"c1", m.c1}, {"c2", m.c2}};
  };
  Json json = {{"name", p.name},
               {"source", p.source},
               {"prefill", model(p.prefill)},
               {"decode", model(p.decode)},
               {"transfer",
                {{"alpha_s", p.transfer_alpha_s},
                 {"bytes_per_s", p.transfer_bytes_per_s},
                 {"s_per_token2", p.transfer_s_per_token2}}},
               {"kv_bytes_per_token", p.kv_bytes_per_token},
               {"kv_blocks", p.kv_blocks},
               {"block_size", p.block_size},
               {"max_batch_tokens", p.max_batch_tokens},
               {"max_num_seqs", p.max_num_seqs},
               {"neighbor_slowdown",
                {{"prefill", p.neighbor_slowdown.prefill},
                 {"decode", p.neighbor_slowdown.decode}}}};
  if (!p.decode_batch_factors.empty()) {
    Json factors = Json::array();
    for (const WorkerProfile::BatchFactor& f : p.decode_batch_factors) {
      factors.push_back({f.batch, f.factor});
    }
    json["decode_batch_factors"] = std::move(factors);
  }
  return json;
}

double PrefillSeconds(const WorkerProfile& p,
                      std::span<const int64_t> lengths) {
  double sum = 0, squares = 0;
  for (int64_t l : lengths) {
    sum += static_cast<double>(l);
    squares += static_cast<double>(l) * static_cast<double>(l);
  }
  return p.prefill.c0 + p.prefill.c1 * sum + p.prefill.c2 * squares;
}

double PrefillSeconds(const WorkerProfile& p,
                      std::span<const PrefillPiece> pieces) {
  double sum = 0, squares = 0;
  for (const PrefillPiece& piece : pieces) {
    const auto start = static_cast<double>(piece.start);
    const double end = start + static_cast<double>(piece.tokens);
    sum += static_cast<double>(piece.tokens);
    squares += end * end - start * start;
  }
  return p.prefill.c0 + p.prefill.c1 * sum + p.prefill.c2 * squares;
}

double DecodeBatchFactor(const WorkerProfile& p, int64_t batch) {
  const std::vector<WorkerProfile::BatchFactor>& f = p.decode_batch_factors;
  if (f.empty()) return 1;
  if (batch <= f.front().batch) return f.front().factor;
  if (batch >= f.back().batch) return f.back().factor;
  size_t i = 1;
  while (f[i].batch < batch) ++i;
  const double t = static_cast<double>(batch - f[i - 1].batch) /
                   static_cast<double>(f[i].batch - f[i - 1].batch);
  return f[i - 1].factor + t * (f[i].factor - f[i - 1].factor);
}

double DecodeSeconds(const WorkerProfile& p, int64_t sum_context,
                     int64_t batch) {
  return (p.decode.c0 + p.decode.c1 * static_cast<double>(sum_context) +
          p.decode.c2 * static_cast<double>(batch)) *
         DecodeBatchFactor(p, batch);
}

double TransferSeconds(const WorkerProfile& p, int64_t tokens) {
  const auto t = static_cast<double>(tokens);
  return p.transfer_alpha_s +
         t * static_cast<double>(p.kv_bytes_per_token) /
             p.transfer_bytes_per_s +
         p.transfer_s_per_token2 * t * t;
}

}  // namespace baton
