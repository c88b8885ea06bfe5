#include "coordinator/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/grpc_status.h"
#include "etcd/etcdserver/api/v3election/v3electionpb/v3election.grpc.pb.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace shardtrain::coordinator {
namespace {

namespace pb = etcdserverpb;

// The end of the range of keys that start with `prefix` (etcd's "prefix +
// 1": the last byte that is not 0xff incremented, what follows dropped).
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    unsigned char& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last < 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

bool MemberUnreachable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

bool TokenRejected(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
         absl::StrContains(s.error_message(), "invalid auth token");
}

}  // namespace

struct EtcdClient::Impl {
  struct Member {
    std::string endpoint;
    std::unique_ptr<pb::KV::Stub> kv;
    std::unique_ptr<pb::Auth::Stub> auth;
    std::unique_ptr<pb::Lease::Stub> lease;
    std::unique_ptr<v3electionpb::Election::Stub> election;
  };
  std::vector<Member> members;
  std::mutex mu;
  size_t current = 0;  // GUARDED_BY(mu): the member that answered last
  std::string token;   // GUARDED_BY(mu): etcd's auth token, when authenticating
  // Set when a call found no member that answered, cleared by the next that
  // did: meanwhile calls wait 1 s at most, so a cluster without a majority
  // makes each write fail quickly instead of stalling the coordinator.
  bool degraded = false;  // GUARDED_BY(mu)
};

EtcdClient::EtcdClient(EtcdOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {}
EtcdClient::~EtcdClient() = default;

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(const EtcdOptions& options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("etcd: no endpoint");
  if (options.user.empty() != options.password.empty()) {
    return absl::InvalidArgumentError("etcd: a user needs a password and a password a user");
  }
  std::unique_ptr<EtcdClient> c(new EtcdClient(options));
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.ca;
    ssl.pem_cert_chain = options.cert;
    ssl.pem_private_key = options.key;
    creds = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 250);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 250);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetMaxReceiveMessageSize(64 << 20);
  for (const std::string& ep : options.endpoints) {
    auto channel = grpc::CreateCustomChannel(ep, creds, args);
    c->impl_->members.push_back({ep, pb::KV::NewStub(channel), pb::Auth::NewStub(channel),
                                 pb::Lease::NewStub(channel),
                                 v3electionpb::Election::NewStub(channel)});
  }
  return c;
}

namespace {

// Runs `call(member, context)` on each member in turn from the one that
// answered last, until one answers: its status converted. A rejected auth
// token is renewed once per member.
template <typename Call>
absl::Status OnAnyMember(EtcdClient::Impl& impl, const EtcdOptions& o, const char* what,
                         Call call) {
  size_t first;
  int64_t budget_ms = o.timeout_ms;
  {
    std::lock_guard<std::mutex> lock(impl.mu);
    first = impl.current;
    if (impl.degraded) budget_ms = std::min<int64_t>(budget_ms, 1000);
  }
  grpc::Status last;
  std::string last_member;
  const size_t n = impl.members.size();
  // One budget for the whole call, whichever members it tries: a member that
  // is down refuses at once, one without a quorum holds the call until then.
  const auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(budget_ms);
  for (size_t i = 0; i < n; ++i) {
    const size_t index = (first + i) % n;
    auto& m = impl.members[index];
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::string token;
      if (!o.user.empty()) {
        std::lock_guard<std::mutex> lock(impl.mu);
        token = impl.token;
      }
      if (!o.user.empty() && token.empty()) {
        grpc::ClientContext ctx;
        ctx.set_deadline(deadline);
        pb::AuthenticateRequest req;
        req.set_name(o.user);
        req.set_password(o.password);
        pb::AuthenticateResponse resp;
        grpc::Status s = m.auth->Authenticate(&ctx, req, &resp);
        if (!s.ok()) {
          if (MemberUnreachable(s)) {
            last = s;
            last_member = m.endpoint;
            break;  // the next member
          }
          return FromGrpcStatus(s,
                                absl::StrCat("etcd ", m.endpoint, ": authenticating as ", o.user));
        }
        token = resp.token();
        std::lock_guard<std::mutex> lock(impl.mu);
        impl.token = token;
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline);
      if (!token.empty()) ctx.AddMetadata("token", token);
      grpc::Status s = call(m, ctx);
      if (s.ok()) {
        std::lock_guard<std::mutex> lock(impl.mu);
        impl.current = index;
        impl.degraded = false;
        return absl::OkStatus();
      }
      if (!o.user.empty() && TokenRejected(s) && attempt == 0) {
        std::lock_guard<std::mutex> lock(impl.mu);
        impl.token.clear();
        continue;
      }
      if (MemberUnreachable(s)) {
        last = s;
        last_member = m.endpoint;
        break;
      }
      return FromGrpcStatus(s, absl::StrCat("etcd ", m.endpoint, ": ", what));
    }
  }
  {
    std::lock_guard<std::mutex> lock(impl.mu);
    impl.degraded = true;
  }
  return absl::UnavailableError(absl::StrCat("etcd: no member answered ", what, " within ",
                                             budget_ms, " ms (", absl::StrJoin(o.endpoints, ","),
                                             "; last, ", last_member, ": ", last.error_message(),
                                             "): are a majority of the members up?"));
}

}  // namespace

absl::StatusOr<std::vector<EtcdKv>> EtcdClient::RangePrefix(const std::string& prefix,
                                                            bool keys_only) {
  std::vector<EtcdKv> out;
  const std::string end = PrefixEnd(prefix);
  std::string from = prefix;
  int64_t revision = 0;  // the first page's: every page reads the same snapshot
  while (true) {
    pb::RangeRequest req;
    req.set_key(from);
    req.set_range_end(end);
    req.set_limit(1000);
    req.set_revision(revision);
    req.set_keys_only(keys_only);
    pb::RangeResponse resp;
    absl::Status s = OnAnyMember(
        *impl_, options_, "Range",
        [&](Impl::Member& m, grpc::ClientContext& ctx) { return m.kv->Range(&ctx, req, &resp); });
    if (!s.ok()) return s;
    if (revision == 0) revision = resp.header().revision();
    for (const mvccpb::KeyValue& kv : resp.kvs()) {
      out.push_back({kv.key(), kv.value(), kv.mod_revision()});
    }
    if (!resp.more() || resp.kvs().empty()) return out;
    from = resp.kvs().rbegin()->key() + std::string(1, '\0');
  }
}

absl::StatusOr<EtcdKv> EtcdClient::Get(const std::string& key) {
  pb::RangeRequest req;
  req.set_key(key);
  pb::RangeResponse resp;
  absl::Status s = OnAnyMember(
      *impl_, options_, "Range",
      [&](Impl::Member& m, grpc::ClientContext& ctx) { return m.kv->Range(&ctx, req, &resp); });
  if (!s.ok()) return s;
  if (resp.kvs().empty()) return absl::NotFoundError(absl::StrCat("etcd: no key ", key));
  const mvccpb::KeyValue& kv = resp.kvs(0);
  return EtcdKv{kv.key(), kv.value(), kv.mod_revision()};
}

absl::Status EtcdClient::PutAll(const std::vector<EtcdPut>& puts, const EtcdLeaderKey* guard) {
  if (puts.size() > size_t(kEtcdMaxTxnOps)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "etcd: ", puts.size(), " writes in one transaction; etcd takes ", kEtcdMaxTxnOps));
  }
  pb::TxnRequest req;
  if (guard) {
    pb::Compare* held = req.add_compare();
    held->set_key(guard->key);
    held->set_target(pb::Compare::CREATE);
    held->set_result(pb::Compare::EQUAL);
    held->set_create_revision(guard->rev);
  }
  for (const EtcdPut& p : puts) {
    pb::PutRequest* put = req.add_success()->mutable_request_put();
    put->set_key(p.key);
    put->set_value(p.value);
  }
  pb::TxnResponse resp;
  absl::Status s = OnAnyMember(
      *impl_, options_, "Txn",
      [&](Impl::Member& m, grpc::ClientContext& ctx) { return m.kv->Txn(&ctx, req, &resp); });
  if (s.ok() && !resp.succeeded()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "etcd refused the write: the leader key ", guard->key, " (created at revision ", guard->rev,
        ") is gone, so this coordinator no longer leads"));
  }
  return s;
}

absl::StatusOr<int64_t> EtcdClient::GrantLease(int64_t ttl_s) {
  pb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  pb::LeaseGrantResponse resp;
  absl::Status s =
      OnAnyMember(*impl_, options_, "LeaseGrant", [&](Impl::Member& m, grpc::ClientContext& ctx) {
        return m.lease->LeaseGrant(&ctx, req, &resp);
      });
  if (!s.ok()) return s;
  if (!resp.error().empty()) return absl::UnavailableError("etcd LeaseGrant: " + resp.error());
  return resp.id();
}

absl::StatusOr<int64_t> EtcdClient::KeepAlive(int64_t id) {
  pb::LeaseKeepAliveResponse resp;
  absl::Status s = OnAnyMember(*impl_, options_, "LeaseKeepAlive",
                               [&](Impl::Member& m, grpc::ClientContext& ctx) {
                                 auto stream = m.lease->LeaseKeepAlive(&ctx);
                                 pb::LeaseKeepAliveRequest req;
                                 req.set_id(id);
                                 if (stream->Write(req)) {
                                   stream->WritesDone();
                                   if (stream->Read(&resp)) {
                                     ctx.TryCancel();  // one renewal is all this call wants
                                     stream->Finish().ok();
                                     return grpc::Status::OK;
                                   }
                                 }
                                 return stream->Finish();
                               });
  if (!s.ok()) return s;
  return resp.ttl();
}

absl::Status EtcdClient::RevokeLease(int64_t id) {
  pb::LeaseRevokeRequest req;
  req.set_id(id);
  pb::LeaseRevokeResponse resp;
  return OnAnyMember(*impl_, options_, "LeaseRevoke",
                     [&](Impl::Member& m, grpc::ClientContext& ctx) {
                       return m.lease->LeaseRevoke(&ctx, req, &resp);
                     });
}

absl::StatusOr<EtcdLeaderKey> EtcdClient::Campaign(const std::string& name, int64_t lease,
                                                   const std::string& value,
                                                   const std::atomic<bool>& stop) {
  v3electionpb::CampaignRequest req;
  req.set_name(name);
  req.set_lease(lease);
  req.set_value(value);
  for (size_t i = 0; !stop; ++i) {
    Impl::Member& m = impl_->members[i % impl_->members.size()];
    grpc::ClientContext ctx;  // no deadline: etcd answers once this one leads
    std::string token;
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      token = impl_->token;
    }
    if (!token.empty()) ctx.AddMetadata("token", token);
    std::atomic<bool> done{false};
    std::thread canceller([&] {
      while (!done && !stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (!done) ctx.TryCancel();
    });
    v3electionpb::CampaignResponse resp;
    grpc::Status s = m.election->Campaign(&ctx, req, &resp);
    done = true;
    canceller.join();
    if (s.ok()) {
      const v3electionpb::LeaderKey& k = resp.leader();
      return EtcdLeaderKey{k.name(), k.key(), k.rev(), k.lease()};
    }
    if (stop) break;
    if (!MemberUnreachable(s) && !TokenRejected(s)) {
      return FromGrpcStatus(s, absl::StrCat("etcd ", m.endpoint, ": Campaign"));
    }
    if (TokenRejected(s)) {
      // Renewed by the next call through OnAnyMember.
      Leader(name).IgnoreError();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return absl::CancelledError("campaign stopped");
}

absl::StatusOr<std::string> EtcdClient::Leader(const std::string& name) {
  v3electionpb::LeaderRequest req;
  req.set_name(name);
  v3electionpb::LeaderResponse resp;
  absl::Status s =
      OnAnyMember(*impl_, options_, "Leader", [&](Impl::Member& m, grpc::ClientContext& ctx) {
        return m.election->Leader(&ctx, req, &resp);
      });
  if (!s.ok()) return s;
  return resp.kv().value();
}

absl::Status EtcdClient::Delete(const std::string& key) {
  pb::DeleteRangeRequest req;
  req.set_key(key);
  pb::DeleteRangeResponse resp;
  return OnAnyMember(*impl_, options_, "DeleteRange",
                     [&](Impl::Member& m, grpc::ClientContext& ctx) {
                       return m.kv->DeleteRange(&ctx, req, &resp);
                     });
}

absl::StatusOr<std::string> EtcdClient::PutIfAbsent(const std::string& key,
                                                    const std::string& value) {
  pb::TxnRequest req;
  pb::Compare* absent = req.add_compare();
  absent->set_key(key);
  absent->set_target(pb::Compare::CREATE);
  absent->set_result(pb::Compare::EQUAL);
  absent->set_create_revision(0);
  pb::PutRequest* put = req.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  req.add_failure()->mutable_request_range()->set_key(key);
  pb::TxnResponse resp;
  absl::Status s = OnAnyMember(
      *impl_, options_, "Txn",
      [&](Impl::Member& m, grpc::ClientContext& ctx) { return m.kv->Txn(&ctx, req, &resp); });
  if (!s.ok()) return s;
  if (resp.succeeded()) return value;
  const pb::RangeResponse& held = resp.responses(0).response_range();
  if (held.kvs().empty()) return absl::InternalError("etcd: " + key + " vanished meanwhile");
  return held.kvs(0).value();
}

}  // namespace shardtrain::coordinator
