#include "common/address.h"

#include <arpa/inet.h>

#include <array>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace shardtrain {
namespace {

// gRPC's target schemes; anything else before a ':' is a host name.
constexpr std::array<absl::string_view, 7> kGrpcSchemes = {"dns",           "ipv4",  "ipv6", "unix",
                                                           "unix-abstract", "vsock", "xds"};

absl::Status Bad(const std::string& why) { return absl::InvalidArgumentError(why); }

absl::StatusOr<int> ParsePort(absl::string_view text, AddressUse use) {
  if (text.empty()) return Bad("no port after ':'");
  if (text.find_first_not_of("0123456789") != absl::string_view::npos) {
    return Bad(absl::StrCat("port \"", text, "\" is not a number"));
  }
  int port = 0;
  const int lowest = use == AddressUse::kListen ? 0 : 1;
  if (text.size() > 5 || !absl::SimpleAtoi(text, &port) || port < lowest || port > 65535) {
    return Bad(absl::StrCat("port ", text, " is out of range (", lowest, "-65535)"));
  }
  return port;
}

absl::Status CheckHostName(absl::string_view host) {
  if (host.empty()) return Bad("no host before ':'");
  if (host.find_first_not_of("0123456789.") == absl::string_view::npos) {
    in_addr ignored;
    if (inet_pton(AF_INET, std::string(host).c_str(), &ignored) != 1) {
      return Bad(absl::StrCat("\"", host, "\" is not an IPv4 address"));
    }
    return absl::OkStatus();
  }
  for (absl::string_view label : absl::StrSplit(host, '.')) {
    if (label.empty()) return Bad(absl::StrCat("host \"", host, "\" has an empty label"));
    for (char c : label) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') {
        return Bad(absl::StrCat("host \"", host, "\" holds '", std::string(1, c),
                                "', which no host name or address does"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string AddressForms(AddressUse use) {
  return use == AddressUse::kListen ? "HOST:PORT or [IPV6]:PORT"
                                    : "HOST:PORT, [IPV6]:PORT or dns:///HOST:PORT";
}

absl::StatusOr<HostPort> ParseAddress(absl::string_view text, AddressUse use) {
  if (text.empty()) return Bad("empty address");
  if (const size_t colon = text.find(':'); colon != absl::string_view::npos) {
    const absl::string_view scheme = text.substr(0, colon);
    bool known = false;
    for (absl::string_view s : kGrpcSchemes) known = known || s == scheme;
    if (known || absl::StartsWith(text.substr(colon), "://")) {
      if (use == AddressUse::kDial && absl::StartsWith(text, "dns:///")) {
        text.remove_prefix(7);
      } else {
        return Bad(absl::StrCat("the scheme \"", scheme, ":\" is not supported here"));
      }
    }
  }
  HostPort out;
  absl::string_view port;
  if (absl::StartsWith(text, "[")) {
    const size_t close = text.find(']');
    if (close == absl::string_view::npos) return Bad("'[' without ']'");
    out.host = std::string(text.substr(1, close - 1));
    absl::string_view rest = text.substr(close + 1);
    if (!absl::StartsWith(rest, ":")) return Bad("no :PORT after ']'");
    port = rest.substr(1);
    // A zone ("fe80::1%eth0") is the kernel's to check.
    in6_addr ignored;
    if (inet_pton(AF_INET6, out.host.substr(0, out.host.find('%')).c_str(), &ignored) != 1) {
      return Bad(absl::StrCat("\"", out.host, "\" is not an IPv6 address"));
    }
  } else {
    const size_t colon = text.rfind(':');
    if (colon == absl::string_view::npos) return Bad("no port");
    if (text.find(':') != colon) {
      return Bad("an IPv6 address needs brackets, as in [::1]:7070");
    }
    out.host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
    if (absl::Status s = CheckHostName(out.host); !s.ok()) return s;
  }
  absl::StatusOr<int> p = ParsePort(port, use);
  if (!p.ok()) return p.status();
  out.port = *p;
  return out;
}

absl::Status CheckAddressFlag(absl::string_view flag, absl::string_view value, AddressUse use) {
  absl::StatusOr<HostPort> parsed = ParseAddress(value, use);
  if (parsed.ok()) return absl::OkStatus();
  return Bad(absl::StrCat(flag, " \"", value, "\": ", parsed.status().message(), "; expected ",
                          AddressForms(use)));
}

absl::Status CheckAddressListFlag(absl::string_view flag, absl::string_view value, AddressUse use) {
  bool any = false;
  for (absl::string_view a : absl::StrSplit(value, ',')) {
    a = absl::StripAsciiWhitespace(a);
    if (a.empty()) {
      return Bad(absl::StrCat(flag, " \"", value, "\": an empty address in the list; expected ",
                              AddressForms(use), ", comma-separated"));
    }
    if (auto s = CheckAddressFlag(flag, a, use); !s.ok()) return s;
    any = true;
  }
  if (!any) return CheckAddressFlag(flag, value, use);
  return absl::OkStatus();
}

}  // namespace shardtrain
