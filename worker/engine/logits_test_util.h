// Comparing two forward passes' logits (top-1 agreement, KL, largest
// difference) over a fixed text: what the precision tests of the CPU and GPU
// runners share. No CUDA.
#ifndef BATON_WORKER_ENGINE_LOGITS_TEST_UTIL_H_
#define BATON_WORKER_ENGINE_LOGITS_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace baton {

// About 200 tokens of plain English for teacher forcing.
inline constexpr char kTeacherText[] =
    "The old lighthouse stood at the end of a narrow stone pier, and for "
    "more than a century its keepers had climbed the spiral stairs every "
    "evening to light the lamp. The last keeper, a quiet woman named Ada, "
    "kept a notebook in which she wrote down the weather, the ships that "
    "passed, and the birds that rested on the railing. In winter the waves "
    "broke over the pier and the salt froze on the windows, so she scraped "
    "the glass with a wooden spoon before the light could shine through. "
    "When the harbour office finally installed an automatic lamp, Ada "
    "packed her notebooks into a wooden crate and carried them to the town "
    "library. The librarian read them for weeks. She found tides measured "
    "to the minute, storms described hour by hour, and a list of every "
    "vessel that had sought shelter in the bay. Scientists later used the "
    "notes to study how the coast had changed, and children still visit the "
    "library to read about the night a fishing boat came home guided only by "
    "the lamp and a stubborn keeper who refused to sleep.";

// Index of the largest value, ties to the lowest index.
inline int32_t Argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

struct LogitsComparison {
  double top1_agreement = 0;  // fraction of rows with the same argmax
  double mean_kl = 0;         // mean over rows of KL(ref || got), nats
  double max_kl = 0;
  double max_abs_diff = 0;  // largest |ref - got| over all logits
  // Rows whose argmax differs, with ref[ref argmax] - ref[got argmax] (how
  // close to a tie the reference was there).
  std::vector<std::pair<int64_t, double>> mismatches;
};

// `rows` rows of `vocab` logits each; log-softmax in double.
inline LogitsComparison CompareLogits(const std::vector<float>& ref,
                                      const std::vector<float>& got,
                                      int64_t rows, int64_t vocab) {
  LogitsComparison c;
  int64_t agree = 0;
  auto log_z = [vocab](const float* row) {
    const double m = *std::max_element(row, row + vocab);
    double s = 0;
    for (int64_t i = 0; i < vocab; ++i) s += std::exp(row[i] - m);
    return m + std::log(s);
  };
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = ref.data() + r * vocab;
    const float* b = got.data() + r * vocab;
    const int32_t ta = Argmax(a, vocab), tb = Argmax(b, vocab);
    if (ta == tb) {
      ++agree;
    } else {
      c.mismatches.push_back({r, static_cast<double>(a[ta]) - a[tb]});
    }
    const double za = log_z(a), zb = log_z(b);
    double kl = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      const double la = a[i] - za, lb = b[i] - zb;
      kl += std::exp(la) * (la - lb);
      c.max_abs_diff =
          std::max(c.max_abs_diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    }
    c.mean_kl += kl / rows;
    c.max_kl = std::max(c.max_kl, kl);
  }
  c.top1_agreement = rows > 0 ? static_cast<double>(agree) / rows : 0;
  return c;
}

// The rows of every step of generations shaped [prompt][step][vocab], one
// after another, as CompareLogits takes them.
inline std::vector<float> FlattenRows(
    const std::vector<std::vector<std::vector<float>>>& logits) {
  std::vector<float> out;
  for (const auto& prompt : logits) {
    for (const auto& row : prompt)
      out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_LOGITS_TEST_UTIL_H_
