#include "common/auth/client_flags.h"

#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle that signed the coordinator's certificate (TLS); "
          "empty: plaintext");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate, for a coordinator started with "
          "--tls_client_ca");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, api_key, "",
          "API key (sent as 'authorization: Bearer KEY'); empty: "
          "$BATON_API_KEY if set");

namespace baton {

ClientSecurity ClientSecurityFromFlags() {
  ClientSecurity security;
  security.tls.ca = absl::GetFlag(FLAGS_tls_ca);
  security.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  security.tls.key = absl::GetFlag(FLAGS_tls_key);
  security.api_key = absl::GetFlag(FLAGS_api_key);
  if (const char* env = std::getenv("BATON_API_KEY");
      security.api_key.empty() && env != nullptr) {
    security.api_key = env;
  }
  return security;
}

}  // namespace baton
