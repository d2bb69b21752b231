#include "model/synth/synth_vocab.h"

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

std::string Utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    s.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
  return s;
}

// Appends `count` merges over lowercase letters, and the tokens they make, in
// rank order: "Ġ x"; then for L = 2, 3, ...: every "s c" and then every
// "Ġs c" with s a string of L - 1 letters. Each merge's parts are tokens
// made earlier, so every token is reachable.
void AppendLetterMerges(int64_t count, SynthVocab& v) {
  const std::string space = ByteLevelSymbol(' ');
  const size_t target = v.merges.size() + static_cast<size_t>(count);
  auto more = [&] { return v.merges.size() < target; };
  auto add = [&](const std::string& left, const std::string& right) {
    v.merges.push_back(absl::StrCat(left, " ", right));
    v.tokens.push_back(left + right);
    v.token_types.push_back(kSynthTokenNormal);
  };
  for (char c = 'a'; c <= 'z' && more(); ++c) add(space, std::string(1, c));
  for (int len = 1; more(); ++len) {  // len = letters on the left
    int64_t combos = 1;
    for (int i = 0; i < len; ++i) combos *= 26;
    for (const std::string& prefix : {std::string(), space}) {
      for (int64_t k = 0; k < combos && more(); ++k) {
        std::string left(len, 'a');
        for (int64_t i = len - 1, x = k; i >= 0; --i, x /= 26) {
          left[i] = static_cast<char>('a' + x % 26);
        }
        for (char c = 'a'; c <= 'z' && more(); ++c) {
          add(prefix + left, std::string(1, c));
        }
      }
    }
  }
}

constexpr char kChatMlTemplate[] =
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

constexpr char kLlama3Template[] =
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}";

// Llama 3's 256 special tokens, in id order from 128000.
std::vector<std::string> Llama3Specials() {
  std::vector<std::string> named = {"<|begin_of_text|>",
                                    "<|end_of_text|>",
                                    "",
                                    "",
                                    "",
                                    "",
                                    "<|start_header_id|>",
                                    "<|end_header_id|>",
                                    "<|eom_id|>",
                                    "<|eot_id|>",
                                    "<|python_tag|>"};
  named.resize(256);
  int reserved = 0;
  for (std::string& s : named) {
    if (s.empty()) {
      s = absl::StrCat("<|reserved_special_token_", reserved++, "|>");
    }
  }
  return named;
}

}  // namespace

std::string ByteLevelSymbol(uint8_t byte) {
  auto printable = [](int b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  };
  if (printable(byte)) return Utf8(byte);
  // Non-printable bytes take code points 256, 257, ... in byte order.
  uint32_t n = 0;
  for (int b = 0; b < byte; ++b) {
    if (!printable(b)) ++n;
  }
  return Utf8(256 + n);
}

absl::StatusOr<SynthVocab> BuildSynthVocab(SynthTokenizerStyle style,
                                           int64_t vocab_size) {
  SynthVocab v;
  std::vector<std::string> head_specials;  // before the bytes
  std::vector<std::string> tail_specials;  // the last ids
  if (style == SynthTokenizerStyle::kSmolLM) {
    head_specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    v.pre = "smollm";
    v.chat_template = kChatMlTemplate;
    v.unknown_id = 0;
    v.bos_id = 1;
    v.eos_id = 2;
    v.padding_id = 2;
    v.add_bos = false;
  } else {
    tail_specials = Llama3Specials();
    v.pre = "llama-bpe";
    v.chat_template = kLlama3Template;
    v.add_bos = true;
  }
  const int64_t fixed =
      static_cast<int64_t>(head_specials.size() + tail_specials.size()) + 256;
  if (vocab_size < fixed) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocabulary size ", vocab_size, " cannot hold the ", fixed,
                     " special and byte tokens"));
  }
  v.tokens.reserve(vocab_size);
  v.token_types.reserve(vocab_size);
  auto add = [&v](std::string token, int32_t type) {
    v.tokens.push_back(std::move(token));
    v.token_types.push_back(type);
  };
  for (std::string& s : head_specials) add(std::move(s), kSynthTokenControl);
  for (int b = 0; b < 256; ++b) {
    add(ByteLevelSymbol(static_cast<uint8_t>(b)), kSynthTokenNormal);
  }
  AppendLetterMerges(vocab_size - static_cast<int64_t>(v.tokens.size()) -
                         static_cast<int64_t>(tail_specials.size()),
                     v);
  if (style == SynthTokenizerStyle::kLlama3) {
    const int64_t first = static_cast<int64_t>(v.tokens.size());
    v.bos_id = first;      // <|begin_of_text|>
    v.eos_id = first + 9;  // <|eot_id|>
  }
  for (std::string& s : tail_specials) add(std::move(s), kSynthTokenControl);
  return v;
}

}  // namespace baton
