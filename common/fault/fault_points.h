// Fault points: named places on the serving path where a test makes a
// process fail on purpose, at a known point of a request instead of at a
// moment picked by a sleep. A process arms them from a flag
// (baton-worker --fault=SPEC), and the code at each point calls
// FaultPoints::Global().Hit(kFaultPrefillStep).
//
// SPEC is a comma-separated list of POINT:ACTION[@N]: the N-th hit of POINT
// (1-based, default 1) performs ACTION once; later hits pass.
//   crash  the process dies at once (SIGKILL to itself): a kill at exactly
//          that point.
//   stop   the process stops itself (SIGSTOP) after announcing
//          "fault point POINT: stopped" on stderr; whoever started it
//          decides what follows (SIGKILL, SIGTERM, SIGCONT). The hit
//          returns OK once the process is continued.
//   error  the hit returns Internal naming the point, which the caller
//          handles as the failure that can happen there.
//   hang   the hitting thread blocks for good after announcing "fault point
//          POINT: hung" (a wedged engine: the rest of the process, its
//          heartbeats included, goes on); only a signal ends the process.
// Unarmed points cost one relaxed atomic load.
#ifndef BATON_COMMON_FAULT_FAULT_POINTS_H_
#define BATON_COMMON_FAULT_FAULT_POINTS_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace baton {

// The points, and where each is hit.
// Engine step whose batch prefills part of a prompt, before the model runs.
inline constexpr absl::string_view kFaultPrefillStep = "prefill_step";
// Engine step whose batch decodes (one token of a running sequence), before
// the model runs.
inline constexpr absl::string_view kFaultDecodeStep = "decode_step";
// A KV handoff's sender has sent one layer to the decode worker (the
// sender's thread, after the layer left): `stop@N` pauses the prefill
// worker with N layers sent, mid-transfer; `error` fails the handoff there;
// `crash` kills the prefill worker there.
inline constexpr absl::string_view kFaultKvLayerSent = "kv_layer_sent";
// A decode worker has reserved blocks for a ReserveKv, before its reply:
// `error` replies UNAVAILABLE while the blocks stay reserved (a reply lost
// on its way back); `crash` kills the decode worker there.
inline constexpr absl::string_view kFaultKvReserved = "kv_reserved";
// A decode worker's KV receiver has taken the first frame of a transfer
// (the sender proved its secret), before any layer is written: `stop`
// pauses the decode worker mid-import; `error` rejects the transfer.
inline constexpr absl::string_view kFaultKvImportStarted = "kv_import_started";
// A decode worker's KV receiver has written one more layer of a transfer
// (the receiver's thread, after the layer landed): `stop@N` pauses the
// decode worker mid-import with N layers written; `crash` kills it there
// (the hit's status is not used: `error` does nothing here).
inline constexpr absl::string_view kFaultKvLayerImported = "kv_layer_imported";
// A KV handoff's TCP sender is about to send one layer: `error` flips one
// bit of that layer's checksum trailer, so the receiver's checksum of the
// bytes it got disagrees with the trailer, as for a payload byte corrupted
// on the wire, and it fails the transfer with DATA_LOSS.
inline constexpr absl::string_view kFaultKvLayerCorrupt = "kv_layer_corrupt";

// Every point above; a spec naming another is refused.
const std::vector<absl::string_view>& KnownFaultPoints();

enum class FaultAction { kCrash, kStop, kError, kHang };

struct FaultSpec {
  std::string point;
  FaultAction action = FaultAction::kError;
  // The hit (1-based) that performs the action.
  int64_t hit = 1;
};

// Parses a --fault value (see the header comment); "" is no fault.
// InvalidArgument naming the bad part and what is allowed.
absl::StatusOr<std::vector<FaultSpec>> ParseFaultSpecs(absl::string_view spec);

class FaultPoints {
 public:
  // The process's fault points (unarmed until Arm).
  static FaultPoints& Global();

  FaultPoints() = default;
  FaultPoints(const FaultPoints&) = delete;
  FaultPoints& operator=(const FaultPoints&) = delete;

  // Replaces the armed faults and restarts every hit count.
  void Arm(std::vector<FaultSpec> specs);
  void Disarm() { Arm({}); }

  // Whether any fault is armed: callers skip working out which points a
  // hot path hits when none is.
  bool armed() const { return armed_.load(std::memory_order_relaxed); }

  // One hit of `point`: OK, or the armed action (see the header comment).
  absl::Status Hit(absl::string_view point);

 private:
  struct Armed {
    FaultSpec spec;
    int64_t hits = 0;
    bool fired = false;
  };
  std::atomic<bool> armed_{false};
  absl::Mutex mu_;
  std::vector<Armed> faults_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_COMMON_FAULT_FAULT_POINTS_H_
