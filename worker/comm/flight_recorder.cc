#include "worker/comm/flight_recorder.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/enum_names.h"

namespace shardtrain::comm {

absl::string_view OpStateName(OpState state) {
  static constexpr absl::string_view kNames[] = {"queued", "running", "done", "failed"};
  return NameIn(kNames, state);
}

FlightRecorder::FlightRecorder(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {
  ring_.resize(capacity_);
}

void FlightRecorder::Queued(const FlightRecord& record) {
  absl::MutexLock lock(&mu_);
  ring_[next_index_ % capacity_] = record;
  ++next_index_;
}

FlightRecord* FlightRecorder::Find(uint64_t seq) {
  // Records are appended in seq order, so search backwards from the newest.
  const uint64_t n = next_index_ < capacity_ ? next_index_ : capacity_;
  for (uint64_t i = 0; i < n; ++i) {
    FlightRecord& r = ring_[(next_index_ - 1 - i) % capacity_];
    if (r.seq == seq) return &r;
  }
  return nullptr;
}

void FlightRecorder::Running(uint64_t seq) {
  absl::MutexLock lock(&mu_);
  if (FlightRecord* r = Find(seq)) {
    r->state = OpState::kRunning;
    r->start_time = absl::Now();
  }
}

void FlightRecorder::Done(uint64_t seq) {
  absl::MutexLock lock(&mu_);
  if (FlightRecord* r = Find(seq)) {
    r->state = OpState::kDone;
    r->end_time = absl::Now();
  }
}

void FlightRecorder::Failed(uint64_t seq, absl::string_view error) {
  absl::MutexLock lock(&mu_);
  if (FlightRecord* r = Find(seq)) {
    r->state = OpState::kFailed;
    r->end_time = absl::Now();
    r->error = std::string(error);
  }
}

std::vector<FlightRecord> FlightRecorder::Dump() const {
  absl::MutexLock lock(&mu_);
  std::vector<FlightRecord> out;
  const uint64_t n = next_index_ < capacity_ ? next_index_ : capacity_;
  out.reserve(n);
  for (uint64_t i = next_index_ - n; i < next_index_; ++i) {
    out.push_back(ring_[i % capacity_]);
  }
  return out;
}

std::string FlightRecorder::DumpText() const {
  std::string text;
  for (const FlightRecord& r : Dump()) {
    absl::StrAppend(
        &text, "seq=", r.seq, " ", OpTypeName(r.op), " group=", r.group, " bytes=", r.bytes, " ",
        DataTypeName(r.dtype), " peer=", r.peer, " state=", OpStateName(r.state),
        " queued=", absl::FormatTime("%H:%M:%E3S", r.enqueue_time, absl::UTCTimeZone()));
    if (r.start_time != absl::InfinitePast()) {
      const absl::Time end = r.end_time != absl::InfinitePast() ? r.end_time : absl::Now();
      absl::StrAppend(
          &text,
          absl::StrFormat(" %s=%.3fms", r.end_time != absl::InfinitePast() ? "ran" : "running_for",
                          absl::ToDoubleMilliseconds(end - r.start_time)));
    }
    if (!r.error.empty()) absl::StrAppend(&text, " error=", r.error);
    text.push_back('\n');
  }
  return text;
}

}  // namespace shardtrain::comm
