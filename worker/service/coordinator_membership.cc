#include "worker/service/coordinator_membership.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace baton {
namespace {

bool IsIpLiteral(const std::string& host) {
  unsigned char buffer[sizeof(struct in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buffer) == 1 ||
         inet_pton(AF_INET6, host.c_str(), buffer) == 1;
}

std::string JoinHostPort(const std::string& host, const std::string& port) {
  return host.find(':') != std::string::npos
             ? absl::StrCat("[", host, "]:", port)
             : absl::StrCat(host, ":", port);
}

std::vector<std::string> Lookup(const CoordinatorEntry& entry, int family) {
  struct addrinfo hints = {};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* found = nullptr;
  std::set<std::string> addresses;
  if (getaddrinfo(entry.host.c_str(), entry.port.c_str(), &hints, &found) ==
      0) {
    for (struct addrinfo* a = found; a != nullptr; a = a->ai_next) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* raw =
          a->ai_family == AF_INET
              ? static_cast<const void*>(
                    &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
              : static_cast<const void*>(
                    &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
      if (inet_ntop(a->ai_family, raw, text, sizeof(text)) != nullptr) {
        addresses.insert(JoinHostPort(text, entry.port));
      }
    }
    freeaddrinfo(found);
  }
  return {addresses.begin(), addresses.end()};
}

}  // namespace

absl::StatusOr<std::vector<CoordinatorEntry>> ParseCoordinatorList(
    const std::string& list) {
  std::vector<CoordinatorEntry> entries;
  for (absl::string_view raw :
       absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    const std::string item(absl::StripAsciiWhitespace(raw));
    CoordinatorEntry entry;
    const size_t colon = item.rfind(':');
    bool ok = colon != std::string::npos && colon + 1 < item.size();
    if (ok) {
      entry.host = item.substr(0, colon);
      entry.port = item.substr(colon + 1);
      if (entry.host.size() >= 2 && entry.host.front() == '[' &&
          entry.host.back() == ']') {
        entry.host = entry.host.substr(1, entry.host.size() - 2);
      }
      int port = 0;
      ok = !entry.host.empty() && absl::SimpleAtoi(entry.port, &port) &&
           port > 0 && port < 65536;
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("--coordinator: '", item,
                       "' is not HOST:PORT (an IP address or a DNS name, and a "
                       "port in 1-65535)"));
    }
    entry.is_name = !IsIpLiteral(entry.host);
    entries.push_back(std::move(entry));
  }
  return entries;
}

std::vector<std::string> ResolveCoordinator(const CoordinatorEntry& entry) {
  if (!entry.is_name) return {JoinHostPort(entry.host, entry.port)};
  std::vector<std::string> v4 = Lookup(entry, AF_INET);
  return v4.empty() ? Lookup(entry, AF_INET6) : v4;
}

CoordinatorMembership::CoordinatorMembership(
    std::vector<CoordinatorEntry> entries, MakeRegistrar make,
    absl::Duration resolve_interval)
    : entries_(std::move(entries)),
      make_(std::move(make)),
      resolve_interval_(resolve_interval) {
  Reconcile();
  const bool names = std::any_of(entries_.begin(), entries_.end(),
                                 [](const auto& e) { return e.is_name; });
  if (names) {
    resolver_ = std::thread([this] {
      while (true) {
        {
          absl::MutexLock lock(&mu_);
          mu_.AwaitWithTimeout(absl::Condition(&stop_), resolve_interval_);
          if (stop_) return;
        }
        Reconcile();
      }
    });
  }
}

CoordinatorMembership::~CoordinatorMembership() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (resolver_.joinable()) resolver_.join();
  std::map<std::string, std::unique_ptr<Registrar>> registrars;
  {
    absl::MutexLock lock(&mu_);
    registrars.swap(registrars_);
  }
  registrars.clear();
}

void CoordinatorMembership::Reconcile() {
  // Address -> the DNS name it was found through ("" for a literal). A name
  // that resolves to nothing keeps the replicas it had (a failed lookup is
  // not a replica leaving).
  std::map<std::string, std::string> wanted;
  std::set<std::string> unresolved_names;
  for (const CoordinatorEntry& entry : entries_) {
    const std::vector<std::string> found = ResolveCoordinator(entry);
    if (found.empty()) unresolved_names.insert(entry.host);
    for (const std::string& address : found) {
      wanted.emplace(address, entry.is_name ? entry.host : std::string());
    }
  }
  std::vector<std::unique_ptr<Registrar>> gone;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    for (auto it = registrars_.begin(); it != registrars_.end();) {
      // A replica that left the name but still answers (a draining one:
      // not ready any more) keeps its registration, so the streams it
      // carries keep their leases; it goes once out of reach (its leases
      // here were freed then).
      if (wanted.contains(it->first) ||
          unresolved_names.contains(it->second->server_name()) ||
          !it->second->unreachable()) {
        ++it;
        continue;
      }
      gone.push_back(std::move(it->second));
      it = registrars_.erase(it);
    }
    for (const auto& [address, name] : wanted) {
      if (registrars_.contains(address)) continue;
      std::unique_ptr<Registrar> registrar = make_(address, name);
      if (draining_) registrar->StartDraining();
      registrars_.emplace(address, std::move(registrar));
    }
  }
  gone.clear();  // each stops and deregisters, outside the lock
}

void CoordinatorMembership::StartDraining() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
  for (auto& [address, registrar] : registrars_) registrar->StartDraining();
}

bool CoordinatorMembership::CoordinatorsHoldLeases() {
  absl::MutexLock lock(&mu_);
  return std::any_of(registrars_.begin(), registrars_.end(), [](auto& entry) {
    return entry.second->coordinator_leases() != 0;
  });
}

}  // namespace baton
