// control_plane_bench's phases beyond the steady load, against the real
// coordinator program (--process): --list-jobs (submits until the
// coordinator holds that many jobs, then lists them all) and the kill -9 +
// restart with every worker heartbeating. Header-only, for the bench alone.
#ifndef SHARDTRAIN_BENCH_CONTROL_PLANE_PHASES_H_
#define SHARDTRAIN_BENCH_CONTROL_PLANE_PHASES_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/control_plane_load.h"
#include "bench/control_plane_rpc.h"
#include "bench/coordinator_process.h"
#include "shardtrain/v1/coordinator.grpc.pb.h"

namespace shardtrain::coordinator {

// Submits jobs until the coordinator holds cfg.list_jobs, client_threads at
// once; then lists all of them, 5 times.
inline absl::Status ListPhase(const std::string& address, int workers, const Config& cfg,
                              std::vector<Row>* rows, std::vector<std::string>* notes) {
  auto stub = v1::Coordinator::NewStub(NewChannel(address));
  const int64_t have = CountJobs(*stub);
  if (have < 0) return absl::InternalError("ListJobs failed");
  const int64_t need = std::max<int64_t>(0, cfg.list_jobs - have);
  auto stubs = NewStubs(address, cfg.client_threads);
  Samples bulk = RunThreads(cfg.client_threads, [&](int t, Samples* s) {
    const int64_t mine = need / cfg.client_threads + (t < need % cfg.client_threads ? 1 : 0);
    s->Merge(SubmitJobs(*stubs[t], static_cast<int>(mine), SteadyClock::duration::zero()));
  });
  if (bulk.errors > 0) return absl::InternalError(absl::StrCat(bulk.errors, " submits failed"));
  rows->push_back(MakeRow("submit_bulk", workers, std::move(bulk)));
  Samples list;
  int64_t listed = 0;
  const auto t0 = SteadyClock::now();
  for (int i = 0; i < 5; ++i) listed = CountJobs(*stub, &list);
  list.seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  notes->push_back(absl::StrFormat(
      "list_all_jobs      workers=%-5d %d jobs listed in %d pages of 1,000 per sample", workers,
      listed, (listed + 999) / 1000));
  rows->push_back(MakeRow("list_all_jobs", workers, std::move(list)));
  return absl::OkStatus();
}

// Heartbeats every worker paced (1 s) while the coordinator is killed
// (SIGKILL) and started again on the same state and port; measures when it
// listens again and when every worker's heartbeat is answered again.
inline absl::Status RestartPhase(CoordinatorProcess& proc, std::vector<std::string>& ids,
                                 std::vector<std::string>& secrets, const Config& cfg,
                                 std::vector<std::string>* notes) {
  const std::string address = proc.address();
  const size_t n = ids.size();
  auto admin = v1::Coordinator::NewStub(NewChannel(address));
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs;
  for (int t = 0; t < cfg.client_threads; ++t) {
    channels.push_back(NewChannel(address));
    stubs.push_back(v1::Coordinator::NewStub(channels.back()));
  }
  const int64_t jobs_before = CountJobs(*admin);
  const int alive_before = CountAlive(*admin);
  // Steady clock nanoseconds: of the kill (0 before it), and of each
  // worker's first answered heartbeat after it.
  std::atomic<int64_t> killed_at{0};
  std::vector<std::atomic<int64_t>> back(n);
  for (auto& b : back) b = 0;
  std::atomic<size_t> reattached{0};
  std::atomic<int64_t> not_found{0};
  auto ns = [] { return SteadyClock::now().time_since_epoch().count(); };
  const auto start = SteadyClock::now() + std::chrono::milliseconds(50);
  const auto give_up = start + std::chrono::seconds(150);
  std::vector<std::thread> pool;
  for (int t = 0; t < cfg.client_threads; ++t) {
    pool.emplace_back([&, t] {
      v1::HeartbeatRequest req;
      for (int64_t round = 0; reattached < n && SteadyClock::now() < give_up; ++round) {
        for (size_t k = t; k < n; k += cfg.client_threads) {
          const auto due = start + kHeartbeatPeriod * round +
                           std::chrono::nanoseconds(kHeartbeatPeriod) * static_cast<int64_t>(k) /
                               static_cast<int64_t>(n);
          std::this_thread::sleep_until(due);
          if (back[k] != 0) continue;
          req.set_worker_id(ids[k]);
          req.set_worker_secret(secrets[k]);
          v1::HeartbeatResponse resp;
          // A channel that is not ready is waited for (200 ms at most)
          // before the call: the wait drives its reconnect and TLS
          // handshake, as a worker's one heartbeat per period does. Calls
          // that fail at once on a reconnecting channel leave its handshake
          // unread (no thread of this process polls it), and the many
          // simulated workers sharing a channel would only ever fail at once.
          if (channels[t]->GetState(true) != GRPC_CHANNEL_READY) {
            channels[t]->WaitForConnected(std::chrono::system_clock::now() +
                                          std::chrono::milliseconds(200));
          }
          grpc::ClientContext ctx;
          ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
          if (!TheAuth().worker.empty()) {
            ctx.AddMetadata("authorization", "Bearer " + TheAuth().worker);
          }
          const int64_t sent = ns();
          grpc::Status st = stubs[t]->Heartbeat(&ctx, req, &resp);
          if (st.error_code() == grpc::StatusCode::NOT_FOUND) ++not_found;
          if (st.ok() && killed_at != 0 && sent > killed_at) {
            back[k] = ns();
            ++reattached;
          }
        }
      }
    });
  }
  std::this_thread::sleep_until(start + std::chrono::seconds(3));  // steady state first
  killed_at = ns();
  proc.Kill9();
  const int64_t down = ns();
  absl::Status restarted = proc.Restart();
  const int64_t listening = ns();
  if (!restarted.ok()) std::cerr << "control_plane_bench: restart: " << restarted << "\n";
  for (auto& th : pool) th.join();
  if (!restarted.ok()) return restarted;
  int64_t last = 0;
  for (auto& b : back) last = std::max<int64_t>(last, b);
  const int alive = CountAlive(*admin);
  const int64_t jobs_after = CountJobs(*admin);
  auto secs = [](int64_t a, int64_t b) { return (b - a) / 1e9; };
  notes->push_back(absl::StrFormat(
      "restart            workers=%-5d kill -9, then listening again after %.2f s (state "
      "load); %zu of %zu workers answered again %.2f s after the kill (ALIVE in ListWorkers: "
      "%d before the kill, %d after; %d NOT_FOUND answers); jobs listed before %d, after %d",
      n, secs(down, listening), reattached.load(), n,
      reattached == n ? secs(killed_at, last) : -1.0, alive_before, alive, not_found.load(),
      jobs_before, jobs_after));
  if (reattached != n) {
    return absl::InternalError(
        absl::StrCat("not every worker re-attached in 150 s: ", notes->back()));
  }
  return absl::OkStatus();
}

// Whether the coordinator at `address` serves (a standby on etcd answers
// UNAVAILABLE), polled until `within` passes.
inline bool WaitServing(const std::string& address, std::chrono::milliseconds within) {
  auto stub = v1::Coordinator::NewStub(NewChannel(address));
  const auto until = SteadyClock::now() + within;
  while (SteadyClock::now() < until) {
    if (CountJobs(*stub) >= 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// --state etcd --failovers N: a standby coordinator beside `leader`, then N
// times: kill -9 the one serving, time until the other serves, and start
// the killed one again (a standby now). Notes the failover times.
inline absl::Status FailoverPhase(CoordinatorProcess& first, const std::string& run_dir,
                                  int workers, const Config& cfg, std::vector<std::string>* notes) {
  const std::string dir = absl::StrCat(run_dir, "/standby-", workers);
  std::filesystem::create_directories(dir);
  auto standby = CoordinatorProcess::Start(cfg.coordinator_bin, dir,
                                           {"--lease-ms", absl::StrCat(cfg.lease_ms), "--state",
                                            absl::StrCat(cfg.etcd_url, "/cpbench-", workers),
                                            "--leader-ttl-s", absl::StrCat(cfg.leader_ttl_s)});
  if (!standby.ok()) return standby.status();
  CoordinatorProcess* procs[2] = {&first, standby->get()};
  std::vector<double> seconds;
  for (int k = 0; k < cfg.failovers; ++k) {
    int leader = -1;
    const auto until = SteadyClock::now() + std::chrono::seconds(60);
    while (leader < 0 && SteadyClock::now() < until) {
      for (int i = 0; i < 2 && leader < 0; ++i) {
        if (WaitServing(procs[i]->address(), std::chrono::milliseconds(1))) leader = i;
      }
    }
    if (leader < 0) return absl::DeadlineExceededError("no coordinator led within 60 s");
    const auto killed = SteadyClock::now();
    procs[leader]->Kill9();
    if (!WaitServing(procs[1 - leader]->address(), std::chrono::seconds(60))) {
      return absl::DeadlineExceededError("the standby did not take over within 60 s");
    }
    seconds.push_back(std::chrono::duration<double>(SteadyClock::now() - killed).count());
    if (absl::Status s = procs[leader]->Restart(); !s.ok()) return s;
  }
  std::sort(seconds.begin(), seconds.end());
  auto at = [&](double q) {
    return seconds[std::min(seconds.size() - 1, size_t(q * seconds.size()))];
  };
  notes->push_back(absl::StrFormat(
      "failover           workers=%-5d kill -9 of the leader -> the standby serving, over %d "
      "kills: p50 %.2f s, p99 %.2f s, min %.2f s, max %.2f s (leader lease TTL %d s)",
      workers, cfg.failovers, at(0.5), at(0.99), seconds.front(), seconds.back(),
      cfg.leader_ttl_s));
  return absl::OkStatus();
}

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_BENCH_CONTROL_PLANE_PHASES_H_
