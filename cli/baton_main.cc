// `baton`: the command-line tool.
//   baton inspect  --model=PATH [--metadata]
//   baton tokenize --model=PATH [--decode] [--chat]       (stdin -> stdout)
//   baton generate --model=PATH --prompt=TEXT | --prompts_file=FILE [...]
//   baton generate --server=HOST:PORT --prompt=TEXT | --prompts_file=FILE [...]
//   baton status   --server=HOST:PORT [--json] [--include_down]
//   baton synth    --shape=NAME --out=FILE.gguf [--type=q4_1|f16] [--seed=N]
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "cli/generate_command.h"
#include "cli/inspect_command.h"
#include "cli/remote_generate.h"
#include "cli/status_command.h"
#include "cli/synth_command.h"
#include "cli/tokenize_command.h"
#include "common/auth/client_flags.h"

ABSL_FLAG(std::string, model, "",
          "Model: a .gguf file, or an HF folder (config.json, tokenizer.json, "
          "*.safetensors)");
// inspect
ABSL_FLAG(bool, metadata, false, "inspect: also print every GGUF metadata key");
// tokenize
ABSL_FLAG(bool, decode, false, "tokenize: read token ids, print text");
ABSL_FLAG(bool, chat, false, "tokenize: apply the chat template to the input");
// generate
ABSL_FLAG(std::string, prompt, "", "generate: the prompt");
ABSL_FLAG(std::string, prompts_file, "",
          "generate: one prompt per line, batched together; prints JSON lines");
ABSL_FLAG(bool, raw, false, "generate: do not apply the chat template");
ABSL_FLAG(bool, json, false,
          "generate: print one JSON object per request; status: print JSON");
ABSL_FLAG(
    bool, show_probs, false,
    "generate: per token, the top candidates of the sampled distribution");
ABSL_FLAG(int32_t, max_tokens, 128, "generate: most tokens to generate");
ABSL_FLAG(double, temperature, 0.0, "generate: 0 = greedy");
ABSL_FLAG(int32_t, top_k, 0, "generate: 0 = off");
ABSL_FLAG(double, top_p, 1.0, "generate: nucleus mass in (0, 1]");
ABSL_FLAG(double, min_p, 0.0, "generate: in [0, 1]");
ABSL_FLAG(double, repetition_penalty, 1.0, "generate: > 0, 1 = off");
ABSL_FLAG(double, frequency_penalty, 0.0, "generate: in [-2, 2]");
ABSL_FLAG(double, presence_penalty, 0.0, "generate: in [-2, 2]");
ABSL_FLAG(int64_t, seed, -1, "generate: sampling seed; -1 = random");
ABSL_FLAG(bool, ignore_eos, false, "generate: keep going past end-of-sequence");
ABSL_FLAG(int32_t, logprobs, -1,
          "generate: -1 = none; N in [0, 20] = chosen token's logprob + N "
          "alternatives");
ABSL_FLAG(int32_t, threads, 0,
          "generate/synth: compute threads; 0 = all cores (ignored with "
          "--server)");
ABSL_FLAG(int64_t, kv_cache_mib, 512, "generate: KV cache size in MiB");
ABSL_FLAG(int64_t, max_num_batched_tokens, 512,
          "generate: token budget per step");
ABSL_FLAG(int64_t, max_num_seqs, 64,
          "generate: most sequences decoding at once");
// against a running cluster
ABSL_FLAG(std::string, server, "",
          "generate/status: HOST:PORT of a baton-coordinator; generate then "
          "runs there (--model, --threads and the engine flags are ignored)");
ABSL_FLAG(std::string, model_id, "",
          "generate --server: model id as the cluster lists it; empty = the "
          "only model served");
ABSL_FLAG(int64_t, deadline_ms, 0,
          "generate/status --server: RPC deadline in ms; 0 = none");
ABSL_FLAG(bool, include_down, false,
          "status: also list workers whose lease expired");
// synth
ABSL_FLAG(std::string, shape, "smollm2-135m",
          "synth: tiny, smollm2-135m, llama-3.2-1b or llama-3-8b");
ABSL_FLAG(std::string, out, "", "synth: output .gguf path");
ABSL_FLAG(std::string, type, "q4_1", "synth: q4_1, q4_0, q8_0, f16 or bf16");

namespace {

constexpr char kUsage[] =
    "baton SUBCOMMAND [--flags]   (--help lists every flag)\n"
    "  inspect  --model=PATH [--metadata]\n"
    "  tokenize --model=PATH [--decode] [--chat]    reads stdin\n"
    "  generate --model=PATH --prompt=TEXT | --prompts_file=FILE [--stop=S "
    "...]\n"
    "  generate --server=HOST:PORT --prompt=TEXT | --prompts_file=FILE "
    "[--deadline_ms=N ...]\n"
    "  status   --server=HOST:PORT [--json] [--include_down]\n"
    "  synth    --shape=NAME --out=FILE.gguf [--type=q4_1] [--seed=N]\n";

int Fail(const absl::Status& status) {
  std::cerr << "baton: " << status << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

// Set by SIGINT during a remote generate; the streams are then cancelled.
std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free);

void OnInterrupt(int) { g_interrupted.store(true); }

// A first SIGINT cancels the RPCs (the server then frees the request's KV
// blocks); a second one kills the process.
void CatchInterrupt() {
  struct sigaction action = {};
  action.sa_handler = OnInterrupt;
  action.sa_flags = SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
}

int Threads() {
  int t = absl::GetFlag(FLAGS_threads);
  return t > 0 ? t
               : static_cast<int>(
                     std::max(1u, std::thread::hardware_concurrency()));
}

// --stop may be given several times; absl flags keep only the last, so the
// occurrences are taken out of argv first.
std::vector<std::string> TakeStops(int& argc, char** argv) {
  std::vector<std::string> stops;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--stop=", 7) == 0) {
      stops.emplace_back(argv[i] + 7);
    } else if (std::strcmp(argv[i], "--stop") == 0 && i + 1 < argc) {
      stops.emplace_back(argv[++i]);
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
  return stops;
}

baton::cli::GenerateOptions GenerateFlags(std::vector<std::string> stops) {
  baton::cli::GenerateOptions o;
  o.model_path = absl::GetFlag(FLAGS_model);
  o.prompt = absl::GetFlag(FLAGS_prompt);
  o.prompts_file = absl::GetFlag(FLAGS_prompts_file);
  o.raw = absl::GetFlag(FLAGS_raw);
  o.json = absl::GetFlag(FLAGS_json);
  o.show_probs = absl::GetFlag(FLAGS_show_probs);
  baton::SamplingParams& s = o.sampling;
  s.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  s.temperature = absl::GetFlag(FLAGS_temperature);
  s.top_k = absl::GetFlag(FLAGS_top_k);
  s.top_p = absl::GetFlag(FLAGS_top_p);
  s.min_p = absl::GetFlag(FLAGS_min_p);
  s.repetition_penalty = absl::GetFlag(FLAGS_repetition_penalty);
  s.frequency_penalty = absl::GetFlag(FLAGS_frequency_penalty);
  s.presence_penalty = absl::GetFlag(FLAGS_presence_penalty);
  if (absl::GetFlag(FLAGS_seed) >= 0) s.seed = absl::GetFlag(FLAGS_seed);
  s.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  if (absl::GetFlag(FLAGS_logprobs) >= 0)
    s.logprobs = absl::GetFlag(FLAGS_logprobs);
  s.stop = std::move(stops);
  o.engine.num_threads = Threads();
  o.engine.kv_cache_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_kv_cache_mib)) << 20;
  o.engine.scheduler.max_num_batched_tokens =
      absl::GetFlag(FLAGS_max_num_batched_tokens);
  o.engine.scheduler.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<std::string> stops = TakeStops(argc, argv);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string command = args[1];
  // -1 is "unset"; anything below it is a mistake, not another "unset".
  struct Unset {
    const char* flag;
    int64_t value;
    const char* means;
  };
  for (const Unset& f :
       {Unset{"seed", absl::GetFlag(FLAGS_seed), "random"},
        Unset{"logprobs", absl::GetFlag(FLAGS_logprobs), "none"}}) {
    if (f.value < -1) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--", f.flag, " must be >= 0, or -1 for ", f.means,
                       ", got ", f.value)));
    }
  }
  absl::Status status;
  if (command == "inspect") {
    baton::cli::InspectOptions o;
    o.model_path = absl::GetFlag(FLAGS_model);
    o.show_metadata = absl::GetFlag(FLAGS_metadata);
    status = baton::cli::RunInspect(o, std::cout);
  } else if (command == "tokenize") {
    baton::cli::TokenizeOptions o;
    o.model_path = absl::GetFlag(FLAGS_model);
    o.decode = absl::GetFlag(FLAGS_decode);
    o.chat = absl::GetFlag(FLAGS_chat);
    status = baton::cli::RunTokenize(o, std::cin, std::cout);
  } else if (command == "generate" && !absl::GetFlag(FLAGS_server).empty()) {
    baton::cli::RemoteGenerateOptions o;
    o.server = absl::GetFlag(FLAGS_server);
    o.security = baton::ClientSecurityFromFlags();
    o.model_id = absl::GetFlag(FLAGS_model_id);
    o.deadline_ms = absl::GetFlag(FLAGS_deadline_ms);
    o.generate = GenerateFlags(std::move(stops));
    o.interrupted = &g_interrupted;
    CatchInterrupt();
    status = baton::cli::RunRemoteGenerate(o, std::cout, std::cerr);
    if (g_interrupted.load()) {
      std::cerr << "baton: interrupted, request cancelled\n";
      return 130;
    }
  } else if (command == "generate") {
    status = baton::cli::RunGenerate(GenerateFlags(std::move(stops)), std::cout,
                                     std::cerr);
  } else if (command == "status") {
    baton::cli::StatusOptions o;
    o.server = absl::GetFlag(FLAGS_server);
    o.security = baton::ClientSecurityFromFlags();
    o.include_down = absl::GetFlag(FLAGS_include_down);
    o.json = absl::GetFlag(FLAGS_json);
    o.deadline_ms = absl::GetFlag(FLAGS_deadline_ms);
    status = baton::cli::RunStatus(o, std::cout);
  } else if (command == "synth") {
    baton::cli::SynthOptions o;
    o.shape = absl::GetFlag(FLAGS_shape);
    o.out_path = absl::GetFlag(FLAGS_out);
    o.type = absl::GetFlag(FLAGS_type);
    o.seed =
        static_cast<uint64_t>(std::max<int64_t>(0, absl::GetFlag(FLAGS_seed)));
    o.threads = absl::GetFlag(FLAGS_threads);
    status = baton::cli::RunSynth(o, std::cerr);
  } else {
    std::cerr << "baton: unknown subcommand '" << command << "'\n" << kUsage;
    return 2;
  }
  return status.ok() ? 0 : Fail(status);
}
