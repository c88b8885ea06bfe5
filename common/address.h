// Network addresses as the programs take them on their command lines
// (--coordinator, --listen, --metrics-listen), checked once at startup so a
// typo is a usage error naming the flag instead of a gRPC failure later
// (gRPC reads "127.0.0.1:notaport" as port 0).
//
// Pure: no name resolution, no sockets.
#ifndef SHARDTRAIN_COMMON_ADDRESS_H_
#define SHARDTRAIN_COMMON_ADDRESS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardtrain {

enum class AddressUse {
  // A local address to bind: HOST:PORT or [IPV6]:PORT; port 0-65535, 0 picks
  // a free port.
  kListen,
  // A server to call: HOST:PORT, [IPV6]:PORT or gRPC's dns:///HOST:PORT;
  // port 1-65535.
  kDial,
};

struct HostPort {
  std::string host;  // a DNS name, an IPv4 address, or an IPv6 address without brackets
  int port = 0;
};

// The forms `use` accepts, for messages and --help: "HOST:PORT, [IPV6]:PORT
// or dns:///HOST:PORT".
std::string AddressForms(AddressUse use);

// Parses `text`. INVALID_ARGUMENT says what is wrong ("port \"notaport\" is
// not a number"); the caller names the flag (see CheckAddressFlag).
absl::StatusOr<HostPort> ParseAddress(absl::string_view text, AddressUse use);

// OK, or INVALID_ARGUMENT naming `flag` and `value` with the reason and the
// accepted forms: `--coordinator "127.0.0.1:notaport": port "notaport" is
// not a number; expected HOST:PORT, [IPV6]:PORT or dns:///HOST:PORT`.
absl::Status CheckAddressFlag(absl::string_view flag, absl::string_view value, AddressUse use);
// CheckAddressFlag of each address of a comma-separated list (at least one):
// several coordinators, of which one leads.
absl::Status CheckAddressListFlag(absl::string_view flag, absl::string_view value, AddressUse use);

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_ADDRESS_H_
