// Invariant checks for programming errors (never for bad input, which gets an
// absl::Status). A failed check prints file:line, the condition and any
// streamed context to stderr, then aborts.
#ifndef BATON_COMMON_CHECK_H_
#define BATON_COMMON_CHECK_H_

#include <sstream>

namespace baton::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `cond ? (void)0 : Voidify() & stream << ...` type-check.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace baton::internal

#define BATON_CHECK(cond)                                                 \
  (cond) ? (void)0                                                        \
         : ::baton::internal::Voidify() &                                 \
               ::baton::internal::CheckFailure(__FILE__, __LINE__, #cond) \
                   .stream()

#define BATON_CHECK_OP_(a, op, b) \
  BATON_CHECK((a)op(b)) << (a) << " vs " << (b) << " "
#define BATON_CHECK_EQ(a, b) BATON_CHECK_OP_(a, ==, b)
#define BATON_CHECK_NE(a, b) BATON_CHECK_OP_(a, !=, b)
#define BATON_CHECK_LT(a, b) BATON_CHECK_OP_(a, <, b)
#define BATON_CHECK_LE(a, b) BATON_CHECK_OP_(a, <=, b)
#define BATON_CHECK_GE(a, b) BATON_CHECK_OP_(a, >=, b)
#define BATON_CHECK_GT(a, b) BATON_CHECK_OP_(a, >, b)
// Aborts if a Status / StatusOr is not OK.
#define BATON_CHECK_OK(expr)                \
  do {                                      \
    const auto& _baton_s = (expr);          \
    BATON_CHECK(_baton_s.ok()) << _baton_s; \
  } while (false)

#endif  // BATON_COMMON_CHECK_H_
