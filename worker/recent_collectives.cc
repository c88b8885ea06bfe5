#include "worker/recent_collectives.h"

#include <string>

#include "absl/time/time.h"

namespace shardtrain::worker {

v1::CollectiveRecord ToCollectiveRecord(const comm::FlightRecord& f) {
  v1::CollectiveRecord c;
  c.set_seq(static_cast<int64_t>(f.seq));
  c.set_op(std::string(comm::OpTypeName(f.op)));
  c.set_group(f.group);
  c.set_bytes(static_cast<int64_t>(f.bytes));
  c.set_dtype(std::string(comm::DataTypeName(f.dtype)));
  c.set_start_ms(f.start_time == absl::InfinitePast() ? 0 : absl::ToUnixMillis(f.start_time));
  c.set_end_ms(f.end_time == absl::InfinitePast() ? 0 : absl::ToUnixMillis(f.end_time));
  c.set_state(std::string(comm::OpStateName(f.state)));
  return c;
}

void RecentCollectives::Attach(const comm::FlightRecorder* recorder) {
  std::lock_guard<std::mutex> lock(mu_);
  recorder_ = recorder;
}

void RecentCollectives::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  recorder_ = nullptr;
}

std::vector<v1::CollectiveRecord> RecentCollectives::Snapshot(size_t max) const {
  std::vector<comm::FlightRecord> records;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (recorder_) records = recorder_->Dump();
  }
  std::vector<v1::CollectiveRecord> out;
  const size_t first = records.size() > max ? records.size() - max : 0;
  for (size_t i = first; i < records.size(); ++i) out.push_back(ToCollectiveRecord(records[i]));
  return out;
}

ScopedRecorderAttach::ScopedRecorderAttach(RecentCollectives* recent,
                                           const comm::FlightRecorder* recorder)
    : recent_(recorder ? recent : nullptr) {
  if (recent_) recent_->Attach(recorder);
}

ScopedRecorderAttach::~ScopedRecorderAttach() {
  if (recent_) recent_->Detach();
}

}  // namespace shardtrain::worker
