#include "client/why.h"

#include <algorithm>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/output.h"

namespace shardtrain::client {
namespace {

bool IsPending(const v1::CollectiveRecord& r) {
  return r.state() == "running" || r.state() == "queued";
}

std::string Seconds(int64_t ms) { return absl::StrFormat("%.1f s", ms / 1000.0); }

std::string HeartbeatAge(const RankView& r) {
  return r.since_heartbeat_ms < 0 ? "never" : absl::StrCat(Seconds(r.since_heartbeat_ms), " ago");
}

std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

std::string CollectiveName(const v1::CollectiveRecord& c) {
  return absl::StrCat("collective #", c.seq(), " ", c.op(), " on ", c.group(), " (",
                      HumanBytes(c.bytes()), ")");
}

// Per-rank facts, stale heartbeats marked.
std::vector<RankView> Views(const v1::JobDiagnostics& d, const WhyOptions& o) {
  std::vector<RankView> views;
  for (const v1::RankDiagnostics& r : d.ranks()) {
    RankView v;
    v.rank = r.rank();
    v.worker_id = r.worker_id();
    v.worker_state = r.worker_state();
    v.since_heartbeat_ms = r.since_heartbeat_ms();
    double total = 0;
    for (const v1::CollectiveRecord& c : r.recent_collectives()) {
      if (c.seq() >= v.newest_seq) {
        v.newest_seq = c.seq();
        v.newest_state = c.state();
      }
      if (c.state() == "done" && c.start_ms() > 0 && c.end_ms() >= c.start_ms()) {
        ++v.done;
        total += static_cast<double>(c.end_ms() - c.start_ms());
      }
    }
    if (v.done > 0) v.mean_wait_ms = total / v.done;
    views.push_back(std::move(v));
  }
  for (RankView& v : views) {
    int64_t freshest_other = std::numeric_limits<int64_t>::max();
    for (const RankView& w : views) {
      if (w.rank != v.rank && w.since_heartbeat_ms >= 0) {
        freshest_other = std::min(freshest_other, w.since_heartbeat_ms);
      }
    }
    if (freshest_other == std::numeric_limits<int64_t>::max()) freshest_other = 0;
    v.stale = v.worker_state == v1::WORKER_STATE_DEAD || v.since_heartbeat_ms < 0 ||
              (v.since_heartbeat_ms > o.stale_heartbeat_ms &&
               v.since_heartbeat_ms > 3 * freshest_other + 1000);
  }
  return views;
}

// The stuck collective: among running records waited in for at least
// stuck_after_ms by ranks whose heartbeats are fresh (a stale rank's last
// records say where it was, not where the others wait), the one that started
// first. False when none.
bool FindStuck(const v1::JobDiagnostics& d, const std::vector<RankView>& views, const WhyOptions& o,
               v1::CollectiveRecord* out) {
  bool found = false;
  for (int i = 0; i < d.ranks_size(); ++i) {
    const v1::RankDiagnostics& r = d.ranks(i);
    if (views[i].stale) continue;
    for (const v1::CollectiveRecord& c : r.recent_collectives()) {
      if (c.state() != "running" || c.start_ms() <= 0) continue;
      if (d.now_ms() - c.start_ms() < o.stuck_after_ms) continue;
      if (!found || c.start_ms() < out->start_ms() ||
          (c.start_ms() == out->start_ms() && c.seq() < out->seq())) {
        *out = c;
        found = true;
      }
    }
  }
  return found;
}

void Explain(const v1::JobDiagnostics& d, WhyVerdict* v) {
  const v1::CollectiveRecord& s = v->collective;
  std::map<int, const RankView*> by_rank;
  for (const RankView& r : v->ranks) by_rank[r.rank] = &r;
  std::map<int, const v1::RankDiagnostics*> diag;
  for (const v1::RankDiagnostics& r : d.ranks()) diag[r.rank()] = &r;
  int64_t longest = 0;
  for (const RankView& r : v->ranks) {
    int64_t newest_in_group = 0;
    const v1::CollectiveRecord* in_it = nullptr;
    for (const v1::CollectiveRecord& c : diag[r.rank]->recent_collectives()) {
      if (c.group() != s.group()) continue;
      newest_in_group = std::max(newest_in_group, c.seq());
      if (c.seq() == s.seq()) in_it = &c;
    }
    const bool member = newest_in_group > 0 || diag[r.rank]->recent_collectives_size() == 0;
    if (!member) continue;  // another group's rank, not part of this collective
    if (in_it && IsPending(*in_it) && !r.stale) {
      v->waiting.push_back(r.rank);
      if (in_it->start_ms() > 0) longest = std::max(longest, d.now_ms() - in_it->start_ms());
    } else if (newest_in_group < s.seq() || r.stale) {
      v->missing.push_back(r.rank);
    }
  }
  v->waited_s = longest / 1000.0;
  const std::string waited =
      v->waiting.empty()
          ? ""
          : absl::StrCat("; ", RankList(v->waiting), v->waiting.size() == 1 ? " has" : " have",
                         " waited ", absl::StrFormat("%.1f s", v->waited_s), " in it");
  if (v->missing.empty()) {
    v->summary = absl::StrCat("no rank is missing from ", CollectiveName(s), waited,
                              ": every rank joined it; suspect the network between them");
    return;
  }
  std::vector<std::string> lines;
  for (int m : v->missing) {
    const RankView& r = *by_rank[m];
    std::string where;
    if (r.newest_seq == 0) {
      where = ", no collective recorded";
    } else if (r.newest_seq >= s.seq()) {
      where = ", stopped inside it";
    } else {
      where = absl::StrCat(", last seen at #", r.newest_seq, " ", r.newest_state);
    }
    lines.push_back(absl::StrCat("rank ", m, " (worker ", r.worker_id, ", last heartbeat ",
                                 HeartbeatAge(r), where, ") is missing from ", CollectiveName(s)));
  }
  lines.back() += waited;
  v->summary = absl::StrJoin(lines, "\n");
}

std::string MeanWait(const RankView& r) {
  return r.done == 0 ? "-" : absl::StrFormat("%.1f ms", r.mean_wait_ms);
}

}  // namespace

std::string HumanBytes(int64_t bytes) {
  if (bytes < 1000) return absl::StrCat(bytes, " B");
  const double b = static_cast<double>(bytes);
  if (b < 1e6) return absl::StrFormat("%.1f kB", b / 1e3);
  if (b < 1e9) return absl::StrFormat("%.1f MB", b / 1e6);
  return absl::StrFormat("%.1f GB", b / 1e9);
}

WhyVerdict AnalyzeWhy(const v1::JobDiagnostics& d, const WhyOptions& options) {
  WhyVerdict v;
  v.ranks = Views(d, options);
  if (d.state() != v1::JOB_STATE_RUNNING) {
    v.kind = WhyKind::kNotRunning;
    // Why it failed or recovers, then what it waits for (a PENDING job's
    // missing workers, e.g. of a device kind no alive worker has).
    std::vector<std::string> why;
    for (const std::string* s : {&d.failure_reason(), &d.pending_reason()}) {
      if (!s->empty()) why.push_back(*s);
    }
    v.summary = absl::StrCat("job ", d.job_id(), " is ", StateName(d.state()), ", not RUNNING",
                             why.empty() ? "" : ": ", absl::StrJoin(why, "; "));
    return v;
  }
  if (FindStuck(d, v.ranks, options, &v.collective)) {
    v.kind = WhyKind::kMissing;
    Explain(d, &v);
    return v;
  }
  std::vector<const RankView*> measured;
  for (const RankView& r : v.ranks) {
    if (r.done > 0) measured.push_back(&r);
  }
  if (measured.empty()) {
    v.kind = WhyKind::kNoRecords;
    v.summary = "no rank has recorded a finished collective yet (a world-1 job runs none)";
    return v;
  }
  v.kind = WhyKind::kSlowest;
  const RankView* slowest = *std::min_element(
      measured.begin(), measured.end(),
      [](const RankView* a, const RankView* b) { return a->mean_wait_ms < b->mean_wait_ms; });
  v.slowest = slowest->rank;
  std::vector<std::string> others;
  for (const RankView* r : measured) {
    if (r != slowest) others.push_back(absl::StrCat(r->rank, ": ", MeanWait(*r)));
  }
  v.summary = absl::StrCat("no collective is stuck; rank ", slowest->rank, " (worker ",
                           slowest->worker_id, ") is the slowest: it waited ", MeanWait(*slowest),
                           " on average in its recent collectives");
  if (!others.empty()) {
    absl::StrAppend(&v.summary, ", the others waited for it (", absl::StrJoin(others, ", "), ")");
  }
  return v;
}

std::string WhyText(const v1::JobDiagnostics& d, const WhyVerdict& v) {
  std::string out = absl::StrCat(v.summary, "\n");
  if (v.ranks.empty()) return out;
  std::vector<std::vector<std::string>> rows;
  for (const RankView& r : v.ranks) {
    rows.push_back({absl::StrCat(r.rank), r.worker_id, WorkerStateName(r.worker_state),
                    r.since_heartbeat_ms < 0 ? "never" : Seconds(r.since_heartbeat_ms),
                    r.newest_seq == 0 ? "-" : absl::StrCat("#", r.newest_seq, " ", r.newest_state),
                    MeanWait(r)});
  }
  absl::StrAppend(
      &out, "\njob ", d.job_id(), " generation ", d.generation(), "\n",
      FormatTable({"RANK", "WORKER", "STATE", "LAST HEARTBEAT", "NEWEST COLLECTIVE", "MEAN WAIT"},
                  rows));
  return out;
}

std::string WhyJson(const v1::JobDiagnostics& d, const WhyVerdict& v) {
  static const char* const kKinds[] = {"not_running", "no_records", "missing", "slowest"};
  std::string out = absl::StrCat("{\"job_id\": ", JsonString(d.job_id()),
                                 ", \"state\": ", JsonString(StateName(d.state())),
                                 ", \"generation\": ", d.generation(),
                                 ", \"verdict\": ", JsonString(kKinds[static_cast<int>(v.kind)]),
                                 ", \"summary\": ", JsonString(v.summary));
  if (!d.failure_reason().empty()) {
    absl::StrAppend(&out, ", \"failure_reason\": ", JsonString(d.failure_reason()));
  }
  if (!d.pending_reason().empty()) {
    absl::StrAppend(&out, ", \"pending_reason\": ", JsonString(d.pending_reason()));
  }
  if (v.kind == WhyKind::kMissing) {
    const v1::CollectiveRecord& c = v.collective;
    absl::StrAppend(&out, ", \"collective\": {\"seq\": ", c.seq(), ", \"op\": ", JsonString(c.op()),
                    ", \"group\": ", JsonString(c.group()), ", \"bytes\": ", c.bytes(),
                    "}, \"missing_ranks\": [", absl::StrJoin(v.missing, ", "),
                    "], \"waiting_ranks\": [", absl::StrJoin(v.waiting, ", "),
                    "], \"waited_s\": ", absl::StrFormat("%.1f", v.waited_s));
  }
  if (v.kind == WhyKind::kSlowest) absl::StrAppend(&out, ", \"slowest_rank\": ", v.slowest);
  std::vector<std::string> ranks;
  for (const RankView& r : v.ranks) {
    ranks.push_back(absl::StrCat(
        "{\"rank\": ", r.rank, ", \"worker_id\": ", JsonString(r.worker_id),
        ", \"worker_state\": ", JsonString(WorkerStateName(r.worker_state)),
        ", \"since_heartbeat_ms\": ", r.since_heartbeat_ms, ", \"newest_seq\": ", r.newest_seq,
        ", \"newest_state\": ", JsonString(r.newest_state),
        ", \"mean_wait_ms\": ", absl::StrFormat("%.3f", r.mean_wait_ms), "}"));
  }
  absl::StrAppend(&out, ", \"ranks\": [", absl::StrJoin(ranks, ", "), "]}");
  return out;
}

}  // namespace shardtrain::client
