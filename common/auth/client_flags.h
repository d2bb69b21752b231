// The client-side security flags shared by Baton's command-line clients
// (baton, baton-bench): --tls_ca, --tls_cert, --tls_key and --api_key (or
// $BATON_API_KEY). Link baton_client_flags to get the flags.
#ifndef BATON_COMMON_AUTH_CLIENT_FLAGS_H_
#define BATON_COMMON_AUTH_CLIENT_FLAGS_H_

#include "common/auth/bearer_interceptor.h"

namespace baton {

// The flags' values; api_key falls back to $BATON_API_KEY when the flag is
// empty.
ClientSecurity ClientSecurityFromFlags();

}  // namespace baton

#endif  // BATON_COMMON_AUTH_CLIENT_FLAGS_H_
