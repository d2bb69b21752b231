#include "model/tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/tokenizer/utf8.h"

namespace baton {

struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

namespace {

// The codepoint PCRE2 sees in place of `cpt`; same encoded length.
uint32_t MatchProxy(uint32_t cpt) {
  if (cpt >= 0xD800 && cpt <= 0xDFFF) return 0xFFFD;  // surrogate: Cs ~ So
  if (cpt > 0x10FFFF) return 0xF0000;                 // private use, 4 bytes
  if (cpt == 0x180E) return 0x200B;                   // Cf, not White_Space
  return cpt;
}

struct Segment {
  uint32_t begin;  // codepoint index
  uint32_t end;
};

struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};

}  // namespace

PreTokenizer::~PreTokenizer() = default;

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(
    std::vector<PreTokenizerStep> steps) {
  auto pre = std::unique_ptr<PreTokenizer>(new PreTokenizer());
  for (const PreTokenizerStep& step : steps) {
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    uint32_t options = PCRE2_UTF | PCRE2_UCP;
    if (step.literal) options |= PCRE2_LITERAL;
    auto compiled = std::make_unique<Compiled>();
    compiled->code = pcre2_compile(
        reinterpret_cast<PCRE2_SPTR>(step.pattern.data()), step.pattern.size(),
        options, &error, &error_offset, nullptr);
    if (compiled->code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return absl::InvalidArgumentError(
          absl::StrCat("pre-tokenizer regex '", step.pattern,
                       "' does not compile at offset ", error_offset, ": ",
                       reinterpret_cast<const char*>(message)));
    }
    // JIT is an optimisation: without it (unsupported platform) the
    // interpreter gives the same matches.
    (void)pcre2_jit_compile(compiled->code, PCRE2_JIT_COMPLETE);
    pre->compiled_.push_back(std::move(compiled));
  }
  pre->steps_ = std::move(steps);
  return pre;
}

void PreTokenizer::Split(absl::string_view text,
                         std::vector<std::string>* pieces) const {
  std::vector<uint32_t> cpts;
  cpts.reserve(text.size());
  utf8::DecodeLenient(text, &cpts);
  if (cpts.empty()) return;

  // The string PCRE2 matches, with byte offsets <-> codepoint indices.
  std::string subject;
  subject.reserve(text.size() + 8);
  std::vector<uint32_t> cpt_offset(cpts.size() + 1);
  for (size_t i = 0; i < cpts.size(); ++i) {
    cpt_offset[i] = static_cast<uint32_t>(subject.size());
    utf8::AppendEncoded(MatchProxy(cpts[i]), &subject);
  }
  cpt_offset[cpts.size()] = static_cast<uint32_t>(subject.size());
  std::vector<uint32_t> byte_to_cpt(subject.size() + 1, 0);
  for (size_t i = 0; i <= cpts.size(); ++i) byte_to_cpt[cpt_offset[i]] = i;

  std::vector<Segment> segments = {{0, static_cast<uint32_t>(cpts.size())}};
  std::vector<Segment> next;
  for (size_t s = 0; s < compiled_.size(); ++s) {
    const pcre2_code* code = compiled_[s]->code;
    const bool keep_matches = steps_[s].behavior == SplitBehavior::kIsolated;
    std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(
        pcre2_match_data_create_from_pattern(code, nullptr));
    next.clear();
    for (const Segment& seg : segments) {
      const uint32_t base = cpt_offset[seg.begin];
      const auto* subj = reinterpret_cast<PCRE2_SPTR>(subject.data() + base);
      const PCRE2_SIZE len = cpt_offset[seg.end] - base;
      PCRE2_SIZE gap_begin = 0;  // start of text not yet emitted
      PCRE2_SIZE search = 0;
      auto emit = [&](PCRE2_SIZE b, PCRE2_SIZE e) {
        if (e > b)
          next.push_back({byte_to_cpt[base + b], byte_to_cpt[base + e]});
      };
      while (search < len) {
        int rc = pcre2_match(code, subj, len, search, 0, md.get(), nullptr);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
          rc = pcre2_match(code, subj, len, search, PCRE2_NO_JIT, md.get(),
                           nullptr);
        }
        // No match, or a resource limit: the rest stays one piece.
        if (rc < 0) break;
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
        const PCRE2_SIZE mb = ov[0], me = ov[1];
        if (me <= mb) {  // an empty match splits nothing; step one character
          search = mb + 1;
          while (search < len && (subj[search] & 0xC0) == 0x80) ++search;
          continue;
        }
        emit(gap_begin, mb);
        if (keep_matches) emit(mb, me);
        gap_begin = me;
        search = me;
      }
      emit(gap_begin, len);
    }
    segments.swap(next);
  }

  for (const Segment& seg : segments) {
    std::string piece;
    piece.reserve(cpt_offset[seg.end] - cpt_offset[seg.begin]);
    for (uint32_t i = seg.begin; i < seg.end; ++i) {
      utf8::AppendEncoded(cpts[i], &piece);
    }
    pieces->push_back(std::move(piece));
  }
}

}  // namespace baton
