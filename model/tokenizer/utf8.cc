#include "model/tokenizer/utf8.h"

#include "common/check.h"

namespace baton::utf8 {
namespace {

bool IsCont(uint8_t b) { return (b & 0xC0) == 0x80; }

}  // namespace

void DecodeLenient(absl::string_view bytes, std::vector<uint32_t>* cpts,
                   std::vector<uint32_t>* byte_offsets) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t b = p[i];
    if (byte_offsets != nullptr)
      byte_offsets->push_back(static_cast<uint32_t>(i));
    int len = 0;
    uint32_t cpt = 0;
    if (b < 0x80) {
      len = 1;
      cpt = b;
    } else if ((b & 0xE0) == 0xC0) {
      len = 2;
      cpt = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3;
      cpt = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4;
      cpt = b & 0x07;
    }
    bool ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) {
      if (!IsCont(p[i + k])) {
        ok = false;
      } else {
        cpt = (cpt << 6) | (p[i + k] & 0x3F);
      }
    }
    if (ok) {
      cpts->push_back(cpt);
      i += len;
    } else {
      cpts->push_back(kReplacementChar);
      i += 1;
    }
  }
}

int EncodedLength(uint32_t cpt) {
  if (cpt < 0x80) return 1;
  if (cpt < 0x800) return 2;
  if (cpt < 0x10000) return 3;
  return 4;
}

void AppendEncoded(uint32_t cpt, std::string* out) {
  BATON_CHECK_LE(cpt, 0x1FFFFFu);
  if (cpt < 0x80) {
    out->push_back(static_cast<char>(cpt));
  } else if (cpt < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cpt >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

Seq ScanOne(absl::string_view bytes) {
  BATON_CHECK(!bytes.empty());
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const uint8_t b = p[0];
  if (b < 0x80) return {SeqKind::kValid, 1};
  int len;
  // Allowed range of the second byte (RFC 3629 table).
  uint8_t lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return {SeqKind::kInvalid, 1};
  }
  for (int k = 1; k < len; ++k) {
    if (static_cast<size_t>(k) >= bytes.size())
      return {SeqKind::kIncomplete, k};
    const uint8_t c = p[k];
    const bool ok = k == 1 ? (c >= lo && c <= hi) : IsCont(c);
    if (!ok) return {SeqKind::kInvalid, k};
  }
  return {SeqKind::kValid, len};
}

bool IsValid(absl::string_view bytes) {
  while (!bytes.empty()) {
    const Seq s = ScanOne(bytes);
    if (s.kind != SeqKind::kValid) return false;
    bytes.remove_prefix(s.length);
  }
  return true;
}

size_t AppendSanitized(absl::string_view bytes, bool keep_incomplete_tail,
                       std::string* out) {
  size_t i = 0;
  while (i < bytes.size()) {
    const Seq s = ScanOne(bytes.substr(i));
    if (s.kind == SeqKind::kValid) {
      out->append(bytes.data() + i, s.length);
      i += s.length;
    } else if (s.kind == SeqKind::kIncomplete && keep_incomplete_tail) {
      return i;
    } else {
      AppendEncoded(kReplacementChar, out);
      i += s.length;
    }
  }
  return i;
}

}  // namespace baton::utf8
