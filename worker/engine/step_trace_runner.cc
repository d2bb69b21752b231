#include "worker/engine/step_trace_runner.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/engine/wrapped_runner.h"

namespace baton {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

class StepTraceRunner : public WrappedRunner {
 public:
  StepTraceRunner(std::unique_ptr<ForwardRunner> inner,
                  std::unique_ptr<std::FILE, FileCloser> file)
      : WrappedRunner(std::move(inner)), file_(std::move(file)) {}

  absl::Status Forward(std::span<const ForwardItem> items,
                       std::vector<float>* logits,
                       const LayerDoneFn& on_layer_done) override {
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = inner().Forward(items, logits, on_layer_done);
    const auto end = std::chrono::steady_clock::now();
    line_.clear();
    absl::StrAppendFormat(
        &line_, "{\"start\":%.6f,\"seconds\":%.6f,\"ok\":%s,\"items\":[",
        std::chrono::duration<double>(start.time_since_epoch()).count(),
        std::chrono::duration<double>(end - start).count(),
        status.ok() ? "true" : "false");
    for (size_t i = 0; i < items.size(); ++i) {
      absl::StrAppend(&line_, i == 0 ? "" : ",", "[", items[i].start_pos, ",",
                      items[i].tokens.size(), ",",
                      static_cast<int>(items[i].logits), "]");
    }
    line_ += "]}\n";
    // A trace that stops being written says nothing about the steps, so a
    // failed write is not the request's failure.
    std::fwrite(line_.data(), 1, line_.size(), file_.get());
    std::fflush(file_.get());
    return status;
  }

 private:
  const std::unique_ptr<std::FILE, FileCloser> file_;
  std::string line_;  // the engine thread's
};

}  // namespace

ForwardRunnerFactory StepTraceRunnerFactory(ForwardRunnerFactory make_runner,
                                            std::string path) {
  return WrapRunnerFactory(
      std::move(make_runner),
      [path = std::move(path)](std::unique_ptr<ForwardRunner> inner)
          -> absl::StatusOr<std::unique_ptr<ForwardRunner>> {
        std::unique_ptr<std::FILE, FileCloser> file(
            std::fopen(path.c_str(), "w"));
        if (file == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("--step_trace: cannot open '", path,
                           "': ", std::strerror(errno)));
        }
        return std::make_unique<StepTraceRunner>(std::move(inner),
                                                 std::move(file));
      });
}

}  // namespace baton
