// ParseAddress / CheckAddressFlag: the forms each flag accepts, and the
// reason given for each kind of mistake.
#include "common/address.h"

#include <gtest/gtest.h>

#include <string>

namespace shardtrain {
namespace {

struct Good {
  std::string text;
  AddressUse use;
  std::string host;
  int port;
};

TEST(AddressTest, AcceptsHostPortBracketedIpv6AndDnsTargets) {
  const Good cases[] = {
      {"127.0.0.1:7070", AddressUse::kDial, "127.0.0.1", 7070},
      {"localhost:1", AddressUse::kDial, "localhost", 1},
      {"coordinator.shardtrain.svc.cluster.local:65535", AddressUse::kDial,
       "coordinator.shardtrain.svc.cluster.local", 65535},
      {"my_host-2:80", AddressUse::kDial, "my_host-2", 80},
      {"[::1]:7070", AddressUse::kDial, "::1", 7070},
      {"[fe80::1%eth0]:7070", AddressUse::kDial, "fe80::1%eth0", 7070},
      {"dns:///coordinator:7070", AddressUse::kDial, "coordinator", 7070},
      {"dns:///[::1]:7070", AddressUse::kDial, "::1", 7070},
      {"127.0.0.1:0", AddressUse::kListen, "127.0.0.1", 0},
      {"0.0.0.0:7070", AddressUse::kListen, "0.0.0.0", 7070},
      {"[::]:0", AddressUse::kListen, "::", 0},
  };
  for (const Good& c : cases) {
    absl::StatusOr<HostPort> got = ParseAddress(c.text, c.use);
    ASSERT_TRUE(got.ok()) << c.text << ": " << got.status();
    EXPECT_EQ(got->host, c.host) << c.text;
    EXPECT_EQ(got->port, c.port) << c.text;
  }
}

struct Bad {
  std::string text;
  AddressUse use;
  std::string reason;  // a substring of the message
};

TEST(AddressTest, RefusesEachMistakeWithItsReason) {
  const Bad cases[] = {
      {"127.0.0.1:notaport", AddressUse::kDial, "port \"notaport\" is not a number"},
      {"127.0.0.1:-1", AddressUse::kDial, "port \"-1\" is not a number"},
      {"127.0.0.1:7070 ", AddressUse::kDial, "port \"7070 \" is not a number"},
      {"127.0.0.1", AddressUse::kDial, "no port"},
      {"127.0.0.1:", AddressUse::kDial, "no port after ':'"},
      {":7070", AddressUse::kDial, "no host"},
      {"", AddressUse::kListen, "empty address"},
      {"127.0.0.1:65536", AddressUse::kDial, "port 65536 is out of range (1-65535)"},
      {"127.0.0.1:99999999999", AddressUse::kListen, "out of range (0-65535)"},
      {"127.0.0.1:0", AddressUse::kDial, "port 0 is out of range (1-65535)"},
      {"127.0.0.300:7070", AddressUse::kDial, "\"127.0.0.300\" is not an IPv4 address"},
      {"::1:7070", AddressUse::kDial, "an IPv6 address needs brackets"},
      {"[::1]", AddressUse::kDial, "no :PORT after ']'"},
      {"[::1:7070", AddressUse::kDial, "'[' without ']'"},
      {"[zz]:7070", AddressUse::kDial, "\"zz\" is not an IPv6 address"},
      {"host..name:7070", AddressUse::kDial, "empty label"},
      {"ho/st:7070", AddressUse::kDial, "holds '/'"},
      {"unix:/tmp/coordinator.sock", AddressUse::kDial, "scheme \"unix:\" is not supported"},
      {"http://127.0.0.1:7070", AddressUse::kDial, "scheme \"http:\" is not supported"},
      {"dns://8.8.8.8/host:7070", AddressUse::kDial, "scheme \"dns:\" is not supported"},
      {"dns:///host:7070", AddressUse::kListen, "scheme \"dns:\" is not supported"},
      {"dns:///host", AddressUse::kDial, "no port"},
  };
  for (const Bad& c : cases) {
    absl::StatusOr<HostPort> got = ParseAddress(c.text, c.use);
    ASSERT_FALSE(got.ok()) << c.text << " parsed as " << got->host << " " << got->port;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(got.status().message().find(c.reason), std::string::npos)
        << c.text << "\n  want: " << c.reason << "\n  got:  " << got.status().message();
  }
}

TEST(AddressTest, FlagErrorNamesTheFlagTheValueAndTheForms) {
  EXPECT_TRUE(CheckAddressFlag("--coordinator", "127.0.0.1:7070", AddressUse::kDial).ok());
  absl::Status s = CheckAddressFlag("--coordinator", "127.0.0.1:notaport", AddressUse::kDial);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "--coordinator \"127.0.0.1:notaport\": port \"notaport\" is not a number; expected "
            "HOST:PORT, [IPV6]:PORT or dns:///HOST:PORT");
  s = CheckAddressFlag("--listen", "0.0.0.0", AddressUse::kListen);
  EXPECT_EQ(s.message(), "--listen \"0.0.0.0\": no port; expected HOST:PORT or [IPV6]:PORT");
}

}  // namespace
}  // namespace shardtrain

namespace shardtrain {
namespace {

// Several coordinators on one etcd: a comma-separated list, each checked.
TEST(AddressTest, ListFlagChecksEveryAddressOfTheList) {
  EXPECT_TRUE(CheckAddressListFlag("--coordinator", "10.0.0.5:7070", AddressUse::kDial).ok());
  EXPECT_TRUE(
      CheckAddressListFlag("--coordinator", "10.0.0.5:7070, [::1]:7071", AddressUse::kDial).ok());
  absl::Status s = CheckAddressListFlag("--coordinator", "10.0.0.5:7070,b:x", AddressUse::kDial);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("\"b:x\""), std::string::npos) << s;
  s = CheckAddressListFlag("--coordinator", "10.0.0.5:7070,", AddressUse::kDial);
  EXPECT_NE(s.message().find("an empty address in the list"), std::string::npos) << s;
}

}  // namespace
}  // namespace shardtrain
