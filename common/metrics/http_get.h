// A minimal HTTP/1.0 GET over a plain socket, for checking /metrics
// endpoints in tests and tools without an HTTP client library.
#ifndef BATON_COMMON_METRICS_HTTP_GET_H_
#define BATON_COMMON_METRICS_HTTP_GET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace baton::metrics {

// The body of GET http://`address``path` ("host:port", an IPv4 host or
// "localhost"). InvalidArgument for a malformed address; Unavailable if the
// connection fails; DeadlineExceeded after `timeout`; Internal naming the
// status line for a reply other than 200.
absl::StatusOr<std::string> HttpGet(absl::string_view address,
                                    absl::string_view path,
                                    absl::Duration timeout = absl::Seconds(5));

}  // namespace baton::metrics

#endif  // BATON_COMMON_METRICS_HTTP_GET_H_
