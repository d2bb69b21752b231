#include "model/tokenizer/byte_level.h"

#include <array>
#include <vector>

#include "model/tokenizer/utf8.h"

namespace baton::byte_level {
namespace {

struct Tables {
  std::array<uint32_t, 256> byte_to_cpt;
  std::array<int16_t, 512> cpt_to_byte;  // every image codepoint is < 512
};

bool MapsToItself(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) ||
         (b >= 0xAE && b <= 0xFF);
}

const Tables& GetTables() {
  static const Tables tables = [] {
    Tables t;
    t.cpt_to_byte.fill(-1);
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cpt = MapsToItself(b) ? static_cast<uint32_t>(b) : next++;
      t.byte_to_cpt[b] = cpt;
      t.cpt_to_byte[cpt] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}

}  // namespace

uint32_t ByteToCodepoint(uint8_t b) { return GetTables().byte_to_cpt[b]; }

int CodepointToByte(uint32_t cpt) {
  return cpt < 512 ? GetTables().cpt_to_byte[cpt] : -1;
}

std::string Encode(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    utf8::AppendEncoded(ByteToCodepoint(static_cast<uint8_t>(c)), &out);
  }
  return out;
}

bool Decode(absl::string_view text, std::string* bytes) {
  std::vector<uint32_t> cpts;
  std::vector<uint32_t> offsets;
  utf8::DecodeLenient(text, &cpts, &offsets);
  bool all_mapped = true;
  for (size_t i = 0; i < cpts.size(); ++i) {
    const int b = CodepointToByte(cpts[i]);
    if (b >= 0) {
      bytes->push_back(static_cast<char>(b));
    } else {
      all_mapped = false;
      const size_t end = i + 1 < cpts.size() ? offsets[i + 1] : text.size();
      bytes->append(text.data() + offsets[i], end - offsets[i]);
    }
  }
  return all_mapped;
}

}  // namespace baton::byte_level
