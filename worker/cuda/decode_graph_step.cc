// CudaModelRunner's CUDA-graph decode step (see cuda_model_runner.h and
// decode_graph_plan.h): pack the metadata into the pinned staging buffer,
// upload it, launch the key's graph (or, on the key's first step, run the
// same padded batch kernel by kernel and capture it afterwards), download
// the real rows' logits.
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/cuda/cuda_model_runner.h"

namespace baton {

absl::Status CudaModelRunner::GraphStep(std::span<const ForwardItem> items,
                                        std::vector<float>* logits, bool* ran) {
  *ran = false;
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t bucket = DecodeGraphBucket(n, graph_max_batch_);
  if (bucket == 0) return absl::OkStatus();
  const DecodeGraphLayout layout =
      MakeDecodeGraphLayout(bucket, max_blocks_per_seq_);
  // The previous step synchronized its stream, so no copy reads the staging
  // buffer while it is rewritten.
  const DecodeGraphPacked packed = PackDecodeGraphStep(
      items, layout_.block_size, layout, graph_staging_.span());
  const DecodeGraphKey key{
      bucket,
      DecodeGraphContextBound(packed.max_context_len, config_.context_length)};
  if (graphs_->failed(key)) return absl::OkStatus();

  StepView v;
  v.num_tokens = bucket;
  v.num_seqs = bucket;
  v.all_single_token = true;
  v.max_queries_per_seq = 1;
  v.max_context_len = static_cast<int32_t>(key.context_bound);
  v.num_logit_rows = bucket;
  v.meta = graph_meta_.as<int32_t>();
  v.offsets = layout.offsets;
  v.decode_workspace = graph_workspace_.get();
  v.decode_workspace_bytes = graph_workspace_.bytes();
  v.record_kv_event = false;
  const cudaGraphExec_t exec = graphs_->Find(key);

  // The step runs on the graph path; any failure from here fails it.
  *ran = true;
  // From pinned memory, so the copy is asynchronous; it and the work after
  // it are ordered on stream_.
  BATON_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(graph_meta_.get(), graph_staging_.data(),
                      static_cast<size_t>(packed.used) * sizeof(int32_t),
                      cudaMemcpyHostToDevice, stream_),
      "decode graph metadata upload"));
  if (exec != nullptr) {
    BATON_RETURN_IF_ERROR(
        CudaStatus(cudaGraphLaunch(exec, stream_),
                   absl::StrCat("cudaGraphLaunch (bucket ", key.bucket,
                                ", context ", key.context_bound, ")")));
  } else {
    // The key's first step: the padded batch kernel by kernel, which also
    // warms up what a capture must not do first (cuBLAS's choice for this
    // M, module loading); the capture follows once the step is done.
    BATON_RETURN_IF_ERROR(Body(v, nullptr));
    BATON_RETURN_IF_ERROR(LmHeadRows(v, 0, bucket));
  }
  const int64_t vocab = config_.vocab_size;
  logits->resize(static_cast<size_t>(n * vocab));
  // Into pageable memory: returns once the rows are on the host.
  BATON_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(logits->data(), logits_.get(),
                                 static_cast<size_t>(n * vocab) * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_),
                 "logits download"));
  BATON_RETURN_IF_ERROR(
      CudaStatus(cudaStreamSynchronize(stream_), "end of decode graph step"));
  if (exec != nullptr) {
    ++graph_launches_;
    return absl::OkStatus();
  }
  ++eager_steps_;
  // Nothing captured runs now. A failure is remembered (graph_failures())
  // and the key runs eagerly from now on; the step itself succeeded.
  graphs_
      ->Capture(key, stream_,
                [&]() -> absl::Status {
                  BATON_RETURN_IF_ERROR(Body(v, nullptr));
                  return LmHeadRows(v, 0, bucket);
                })
      .IgnoreError();
  return absl::OkStatus();
}

}  // namespace baton
