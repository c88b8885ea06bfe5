#include "coordinator/etcd_state_store.h"

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"

namespace shardtrain::coordinator {
namespace {

constexpr char kSchema[] = "shardtrain.v1";
constexpr char kPartsMark = '\0';  // a value that is a part count (protobuf never starts so)
constexpr char kPartSep = '\1';    // <key>\1<index>: a part of a split record

std::string Padded(int64_t n) { return absl::StrFormat("%020d", n); }

class EtcdStateStore final : public StateStore {
 public:
  EtcdStateStore(std::unique_ptr<EtcdClient> client, std::optional<EtcdWriteGuard> guard)
      : client_(std::move(client)), prefix_(client_->options().prefix), guard_(std::move(guard)) {}

  absl::Status PutWorker(const v1::WorkerInfo& w) override {
    return Write({Record("workers/" + w.worker_id(), w)});
  }
  absl::Status PutJob(const v1::Job& job) override { return Write({JobRecord(job)}); }
  absl::Status PutPlan(const v1::Plan& plan) override {
    Writes w = Record("plans/" + plan.job_id(), plan);
    w.may_split = true;
    return Write({w});
  }
  absl::Status PutJobWithEvent(const v1::Job& job, const v1::JobEvent& event) override {
    return Write({JobRecord(job), EventRecord(event)});
  }
  absl::Status PutStep(const v1::StepReport& step) override {
    return Write({Record("steps/" + step.job_id() + "/" + Padded(step.step()), step)});
  }

  absl::StatusOr<StoredState> Load() override {
    absl::StatusOr<std::vector<EtcdKv>> all = client_->RangePrefix(prefix_);
    if (!all.ok()) return all.status();
    std::map<std::string, std::string> parts;  // split records' parts, by key
    for (const EtcdKv& kv : *all) {
      if (kv.key.find(kPartSep) != std::string::npos) parts[kv.key] = kv.value;
    }
    StoredState out;
    for (const EtcdKv& kv : *all) {
      if (kv.key.find(kPartSep) != std::string::npos) continue;
      const std::string name = kv.key.substr(prefix_.size());
      absl::StatusOr<std::string> value = Joined(kv, parts);
      if (!value.ok()) return value.status();
      absl::Status s;
      if (absl::StartsWith(name, "workers/")) {
        s = Parse(*value, kv.key, &out.workers.emplace_back());
      } else if (absl::StartsWith(name, "jobs/")) {
        s = Parse(*value, kv.key, &out.jobs.emplace_back());
      } else if (absl::StartsWith(name, "plans/")) {
        s = Parse(*value, kv.key, &out.plans.emplace_back());
      } else if (absl::StartsWith(name, "events/")) {
        s = Parse(*value, kv.key, &out.events.emplace_back());
      } else if (absl::StartsWith(name, "steps/")) {
        s = Parse(*value, kv.key, &out.steps.emplace_back());
      }
      if (!s.ok()) return s;
    }
    // Keys sort workers, plans, events and steps as the SQLite store's
    // queries do; jobs go in submission order.
    std::stable_sort(out.jobs.begin(), out.jobs.end(), [](const v1::Job& a, const v1::Job& b) {
      return std::make_tuple(a.submitted_ms(), a.job_id()) <
             std::make_tuple(b.submitted_ms(), b.job_id());
    });
    return out;
  }

  absl::Status CheckSchema() {
    absl::StatusOr<std::string> schema = client_->PutIfAbsent(prefix_ + "schema", kSchema);
    if (!schema.ok()) return schema.status();
    if (*schema != kSchema) {
      return absl::FailedPreconditionError(absl::StrCat("etcd prefix ", prefix_, " holds schema '",
                                                        *schema, "', not ", kSchema,
                                                        ": not a shardtrain state"));
    }
    return absl::OkStatus();
  }

 private:
  // One record's writes: `main` goes into the call's one Txn; a record
  // beyond etcd's request limit first writes its parts, one request each,
  // under a fresh nonce, and `main` then holds the nonce and the part count:
  // the Txn swaps the whole record at once, and the old parts go after it.
  struct Writes {
    std::vector<EtcdPut> parts;
    EtcdPut main;
    std::string key;         // the record's
    bool may_split = false;  // a kind of record that can outgrow a request (jobs, plans)
  };
  Writes Record(const std::string& name, const google::protobuf::Message& m) const {
    Writes w;
    w.key = prefix_ + name;
    std::string bytes = m.SerializeAsString();
    if (bytes.size() <= kEtcdMaxValueBytes) {
      w.main = {w.key, std::move(bytes)};
      return w;
    }
    const std::string nonce = absl::StrFormat("%016x", rng_());
    size_t n = 0;
    for (size_t at = 0; at < bytes.size(); at += kEtcdMaxValueBytes, ++n) {
      w.parts.push_back({PartKey(w.key, nonce, n), bytes.substr(at, kEtcdMaxValueBytes)});
    }
    w.main = {w.key, absl::StrCat(std::string(1, kPartsMark), nonce, ":", n)};
    return w;
  }
  static std::string PartKey(const std::string& key, const std::string& nonce, size_t i) {
    return absl::StrCat(key, std::string(1, kPartSep), nonce, std::string(1, kPartSep),
                        absl::StrFormat("%06d", i));
  }
  Writes JobRecord(const v1::Job& job) const {
    Writes w = Record("jobs/" + job.job_id(), job);
    w.may_split = true;
    return w;
  }
  Writes EventRecord(const v1::JobEvent& e) const {
    return Record("events/" + e.job_id() + "/" + Padded(e.seq()), e);
  }

  // A write etcd could not take: UNAVAILABLE says the store's part
  // (kStateStoreUnavailable), so a client does not take it for an
  // unreachable coordinator.
  static absl::Status Refused(absl::Status s) {
    if (!absl::IsUnavailable(s) || absl::StrContains(s.message(), kCoordinatorStandby)) return s;
    return absl::UnavailableError(absl::StrCat(kStateStoreUnavailable, s.message()));
  }

  absl::Status Write(const std::vector<Writes>& records) { return Refused(WriteAll(records)); }

  absl::Status WriteAll(const std::vector<Writes>& records) {
    std::vector<EtcdPut> mains;
    std::vector<std::string> stale;  // part-key prefixes of the records' old versions
    for (const Writes& w : records) {
      if (!w.parts.empty()) {
        for (const EtcdPut& part : w.parts) {
          if (absl::Status s = client_->PutAll({part}); !s.ok()) return s;
        }
      }
      mains.push_back(w.main);
    }
    // Parts of what these records held before (only records that were ever
    // split have any).
    for (const Writes& w : records) {
      if (!w.may_split) continue;
      absl::StatusOr<std::vector<EtcdKv>> old =
          client_->RangePrefix(w.key + std::string(1, kPartSep), /*keys_only=*/true);
      if (!old.ok()) return old.status();
      const std::string keep = w.parts.empty() ? "" : w.parts[0].key.substr(0, w.key.size() + 18);
      for (const EtcdKv& kv : *old) {
        if (keep.empty() || !absl::StartsWith(kv.key, keep)) stale.push_back(kv.key);
      }
    }
    if (absl::Status s = client_->PutAll(mains, guard_ ? &guard_->leader : nullptr); !s.ok()) {
      if (guard_ && absl::IsFailedPrecondition(s)) {
        if (guard_->fenced) guard_->fenced(std::string(s.message()));
        // To a client this coordinator is a standby now: UNAVAILABLE, so it
        // goes to the new leader (and a worker holds its report meanwhile).
        return absl::UnavailableError(absl::StrCat(kCoordinatorStandby, s.message()));
      }
      return s;
    }
    for (const std::string& k : stale) client_->Delete(k).IgnoreError();  // garbage at worst
    return absl::OkStatus();
  }

  // The record at kv: its value, or its parts joined.
  static absl::StatusOr<std::string> Joined(const EtcdKv& kv,
                                            const std::map<std::string, std::string>& parts) {
    if (kv.value.empty() || kv.value[0] != kPartsMark) return kv.value;
    const size_t colon = kv.value.find(':');
    int64_t n = 0;
    if (colon == std::string::npos || !absl::SimpleAtoi(kv.value.substr(colon + 1), &n) || n < 1) {
      return absl::DataLossError(absl::StrCat("etcd key ", kv.key, ": a bad part count"));
    }
    const std::string nonce = kv.value.substr(1, colon - 1);
    std::string joined;
    for (int64_t i = 0; i < n; ++i) {
      auto it = parts.find(PartKey(kv.key, nonce, size_t(i)));
      if (it == parts.end()) {
        return absl::DataLossError(
            absl::StrCat("etcd key ", kv.key, ": part ", i, " of ", n, " is missing"));
      }
      joined += it->second;
    }
    return joined;
  }

  static absl::Status Parse(const std::string& value, const std::string& key,
                            google::protobuf::Message* m) {
    if (!m->ParseFromString(value)) {
      return absl::DataLossError(absl::StrCat("etcd key ", key, ": not a ", m->GetTypeName()));
    }
    return absl::OkStatus();
  }

  std::unique_ptr<EtcdClient> client_;
  const std::string prefix_;
  const std::optional<EtcdWriteGuard> guard_;
  mutable std::mt19937_64 rng_{std::random_device{}()};
};

}  // namespace

absl::StatusOr<std::unique_ptr<StateStore>> OpenEtcdStateStore(
    const EtcdOptions& options, std::optional<EtcdWriteGuard> guard) {
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(options);
  if (!client.ok()) return client.status();
  auto store = std::make_unique<EtcdStateStore>(*std::move(client), std::move(guard));
  if (absl::Status s = store->CheckSchema(); !s.ok()) return s;
  return store;
}

absl::StatusOr<FencingKey> EtcdFencingKey(const EtcdOptions& options) {
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(options);
  if (!client.ok()) return client.status();
  absl::StatusOr<std::string> key =
      (*client)->PutIfAbsent(options.prefix + "fencing.key", FencingKey::Random().bytes());
  if (!key.ok()) return key.status();
  return FencingKey::FromBytes(*std::move(key));
}

}  // namespace shardtrain::coordinator
