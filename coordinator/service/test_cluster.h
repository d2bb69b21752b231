// An in-process Cluster for tests that register workers themselves.
#ifndef BATON_COORDINATOR_SERVICE_TEST_CLUSTER_H_
#define BATON_COORDINATOR_SERVICE_TEST_CLUSTER_H_

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/test_util.h"
#include "coordinator/clock.h"
#include "coordinator/service/cluster.h"
#include "coordinator/service/served_model.h"

namespace baton::coordinator {

// A cluster serving the default model on the real clock whose workers stay
// healthy for a test's length without a heartbeat.
inline absl::StatusOr<std::unique_ptr<Cluster>> ClusterWithoutHeartbeats() {
  auto model = ServedModel::Load(testing::DefaultModelPath());
  if (!model.ok()) return model.status();
  ClusterOptions options;
  options.registry.heartbeat_interval = absl::Seconds(30);
  options.registry.suspect_after = absl::Seconds(60);
  options.registry.lease_ttl = absl::Seconds(120);
  return Cluster::Create(options, std::move(*model), RealClock());
}

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_SERVICE_TEST_CLUSTER_H_
