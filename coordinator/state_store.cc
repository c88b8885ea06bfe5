#include "coordinator/state_store.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardtrain::coordinator {
namespace {

// ------------------------------------------------------------------ SQLite

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta    (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workers (id TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS jobs    (id TEXT PRIMARY KEY, submitted_ms INTEGER NOT NULL,
                                    data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS plans   (job TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS events  (job TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL,
                                    PRIMARY KEY (job, seq));
CREATE TABLE IF NOT EXISTS steps   (job TEXT NOT NULL, step INTEGER NOT NULL, data BLOB NOT NULL,
                                    PRIMARY KEY (job, step));
INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', 'shardtrain.v1');
)sql";

// Thread-safe: every call holds mu_ (the coordinator commits a submit
// outside its own lock).
class SqliteStateStore final : public StateStore {
 public:
  explicit SqliteStateStore(sqlite3* db) : db_(db) {}
  ~SqliteStateStore() override { sqlite3_close(db_); }

  absl::Status Init() {
    for (const char* sql : {"PRAGMA journal_mode=WAL;", "PRAGMA synchronous=FULL;", kSchema}) {
      if (auto s = Exec(sql); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status PutWorker(const v1::WorkerInfo& w) override {
    std::lock_guard<std::mutex> lock(mu_);
    return InTransaction([&] {
      return Upsert("INSERT OR REPLACE INTO workers VALUES (?1, ?2)", w.worker_id(), 0, w,
                    /*has_int=*/false);
    });
  }
  absl::Status PutJob(const v1::Job& job) override {
    std::lock_guard<std::mutex> lock(mu_);
    return InTransaction([&] { return PutJobRow(job); });
  }
  absl::Status PutPlan(const v1::Plan& plan) override {
    std::lock_guard<std::mutex> lock(mu_);
    return InTransaction([&] {
      return Upsert("INSERT OR REPLACE INTO plans VALUES (?1, ?2)", plan.job_id(), 0, plan, false);
    });
  }
  absl::Status PutJobWithEvent(const v1::Job& job, const v1::JobEvent& event) override {
    std::lock_guard<std::mutex> lock(mu_);
    return InTransaction([&]() -> absl::Status {
      if (auto s = PutJobRow(job); !s.ok()) return s;
      return Upsert("INSERT OR REPLACE INTO events (job, seq, data) VALUES (?1, ?3, ?2)",
                    event.job_id(), event.seq(), event, true);
    });
  }
  absl::Status PutStep(const v1::StepReport& step) override {
    std::lock_guard<std::mutex> lock(mu_);
    return InTransaction([&] {
      return Upsert("INSERT OR REPLACE INTO steps (job, step, data) VALUES (?1, ?3, ?2)",
                    step.job_id(), step.step(), step, true);
    });
  }

  absl::StatusOr<StoredState> Load() override {
    std::lock_guard<std::mutex> lock(mu_);
    StoredState out;
    if (auto s = ReadAll("SELECT data FROM workers ORDER BY id", &out.workers); !s.ok()) return s;
    if (auto s = ReadAll("SELECT data FROM jobs ORDER BY submitted_ms, id", &out.jobs); !s.ok())
      return s;
    if (auto s = ReadAll("SELECT data FROM events ORDER BY job, seq", &out.events); !s.ok())
      return s;
    if (auto s = ReadAll("SELECT data FROM steps ORDER BY job, step", &out.steps); !s.ok())
      return s;
    if (auto s = ReadAll("SELECT data FROM plans ORDER BY job", &out.plans); !s.ok()) return s;
    return out;
  }

 private:
  // Every SQLite error is UNAVAILABLE with context: the caller may retry.
  absl::Status SqlError(const char* what) const {
    return absl::UnavailableError(absl::StrCat("state store: ", what, ": ", sqlite3_errmsg(db_)));
  }

  absl::Status Exec(const char* sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
      std::string msg = err ? err : "unknown error";
      sqlite3_free(err);
      return absl::UnavailableError(absl::StrCat("state store: ", msg));
    }
    return absl::OkStatus();
  }

  template <typename Fn>
  absl::Status InTransaction(Fn fn) {
    if (auto s = Exec("BEGIN IMMEDIATE;"); !s.ok()) return s;
    absl::Status s = fn();
    if (!s.ok()) {
      Exec("ROLLBACK;").IgnoreError();
      return s;
    }
    return Exec("COMMIT;");
  }

  absl::Status PutJobRow(const v1::Job& job) {
    return Upsert("INSERT OR REPLACE INTO jobs (id, submitted_ms, data) VALUES (?1, ?3, ?2)",
                  job.job_id(), job.submitted_ms(), job, true);
  }

  // Binds ?1 = key, ?2 = serialized message, ?3 = number (when has_int).
  absl::Status Upsert(const char* sql, const std::string& key, int64_t number,
                      const google::protobuf::MessageLite& msg, bool has_int) {
    std::string blob;
    if (!msg.SerializeToString(&blob)) return absl::InternalError("state store: serialize failed");
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db_, sql, -1, &st, nullptr) != SQLITE_OK) return SqlError("prepare");
    sqlite3_bind_text(st, 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
    sqlite3_bind_blob(st, 2, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
    if (has_int) sqlite3_bind_int64(st, 3, number);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? absl::OkStatus() : SqlError("write");
  }

  template <typename Msg>
  absl::Status ReadAll(const char* sql, std::vector<Msg>* out) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db_, sql, -1, &st, nullptr) != SQLITE_OK) return SqlError("prepare");
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      Msg m;
      const void* data = sqlite3_column_blob(st, 0);
      int n = sqlite3_column_bytes(st, 0);
      if (!m.ParseFromArray(data, n)) {
        sqlite3_finalize(st);
        return absl::DataLossError(absl::StrCat("state store: corrupt record in '", sql, "'"));
      }
      out->push_back(std::move(m));
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? absl::OkStatus() : SqlError("read");
  }

  std::mutex mu_;
  sqlite3* db_;
};

// ------------------------------------------------------------------ memory

class MemoryStateStore final : public StateStore {
 public:
  absl::Status PutWorker(const v1::WorkerInfo& w) override {
    std::lock_guard<std::mutex> lock(mu_);
    workers_[w.worker_id()] = w;
    return absl::OkStatus();
  }
  absl::Status PutJob(const v1::Job& job) override {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_[job.job_id()] = job;
    return absl::OkStatus();
  }
  absl::Status PutPlan(const v1::Plan& plan) override {
    std::lock_guard<std::mutex> lock(mu_);
    plans_[plan.job_id()] = plan;
    return absl::OkStatus();
  }
  absl::Status PutJobWithEvent(const v1::Job& job, const v1::JobEvent& event) override {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_[job.job_id()] = job;
    events_[{event.job_id(), event.seq()}] = event;
    return absl::OkStatus();
  }
  absl::Status PutStep(const v1::StepReport& step) override {
    std::lock_guard<std::mutex> lock(mu_);
    steps_[{step.job_id(), step.step()}] = step;
    return absl::OkStatus();
  }
  absl::StatusOr<StoredState> Load() override {
    std::lock_guard<std::mutex> lock(mu_);
    StoredState out;
    for (auto& [id, w] : workers_) out.workers.push_back(w);
    std::multimap<std::pair<int64_t, std::string>, v1::Job> by_time;
    for (auto& [id, j] : jobs_) by_time.emplace(std::make_pair(j.submitted_ms(), id), j);
    for (auto& [k, j] : by_time) out.jobs.push_back(j);
    for (auto& [k, e] : events_) out.events.push_back(e);
    for (auto& [k, s] : steps_) out.steps.push_back(s);
    for (auto& [k, p] : plans_) out.plans.push_back(p);
    return out;
  }

 private:
  std::map<std::string, v1::WorkerInfo> workers_;
  std::map<std::string, v1::Job> jobs_;
  std::map<std::string, v1::Plan> plans_;
  std::map<std::pair<std::string, int64_t>, v1::JobEvent> events_;
  std::map<std::pair<std::string, int64_t>, v1::StepReport> steps_;
  std::mutex mu_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StateStore>> OpenSqliteStateStore(const std::string& dir) {
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::UnavailableError(
        absl::StrCat("state store: cannot create --state-dir ", dir, ": ", std::strerror(errno)));
  }
  std::string path = dir + "/state.db";
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("state store: cannot open ", path, ": ", msg));
  }
  sqlite3_busy_timeout(db, 5000);
  auto store = std::make_unique<SqliteStateStore>(db);
  if (auto s = store->Init(); !s.ok()) {
    return absl::UnavailableError(absl::StrCat(s.message(), " (", path, ")"));
  }
  return store;
}

std::unique_ptr<StateStore> NewMemoryStateStore() { return std::make_unique<MemoryStateStore>(); }

}  // namespace shardtrain::coordinator
