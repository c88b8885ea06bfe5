#ifndef SHARDTRAIN_COMMON_METRICS_H_
#define SHARDTRAIN_COMMON_METRICS_H_

// A small Prometheus metrics registry (prometheus-cpp is not packaged in
// Debian), exposing the text exposition format 0.0.4.
//
// Usage: build families once at start-up, keep the child pointers, and update
// them on hot paths without any lookup:
//
//   MetricsRegistry registry;
//   auto& steps = registry.AddCounter("shardtrain_worker_steps_total",
//                                     "Optimizer steps completed.", {"job_id", "rank"});
//   Counter* my_steps = &steps.WithLabels({"job-1", "0"});
//   my_steps->Increment();
//
//   auto& step_s = registry.AddHistogram("shardtrain_worker_step_seconds",
//       "Wall time of one optimizer step.", {"job_id"}, ExponentialBuckets(0.001, 2, 16));
//   step_s.WithLabels({"job-1"}).Observe(0.25);
//
//   // Values computed when scraped (e.g. workers by state):
//   auto& workers = registry.AddGauge("shardtrain_coordinator_workers",
//                                     "Attached workers by state.", {"state"});
//   registry.AddCollector([&] { workers.WithLabels({"idle"}).Set(CountIdle()); });
//
//   std::string text = registry.Serialize();
//
// Thread-safety: everything here is thread-safe. Counter/Gauge updates are
// lock-free; Histogram::Observe takes a per-child mutex. References returned
// by Add* and WithLabels stay valid for the registry's lifetime (children:
// until Family::Remove of their labels).
//
// Misuse (an invalid metric or label name, a counter not ending in "_total",
// a name registered twice with a different type/labels/buckets, the wrong
// number of label values) is a programming error: it prints the reason to
// stderr and aborts, like a failed CHECK.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace shardtrain {

// A value that only goes up (reset only by a process restart).
class Counter {
 public:
  // Adds `v`, which must be >= 0 (negative values are ignored).
  void Increment(double v = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Increment(double v = 1.0);
  void Decrement(double v = 1.0) { Increment(-v); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Counts observations into buckets with fixed upper bounds (plus +Inf), and
// keeps their sum and count.
class Histogram {
 public:
  // `bounds`: strictly increasing, finite upper bounds (validated by the registry).
  explicit Histogram(std::vector<double> bounds);

  void Observe(double v);

  struct Snapshot {
    std::vector<double> bounds;        // without +Inf
    std::vector<uint64_t> cumulative;  // bounds.size() + 1 entries, last is +Inf
    double sum = 0.0;
    uint64_t count = 0;
  };
  // A consistent copy (count == cumulative.back()).
  Snapshot Collect() const;

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // per bucket, not cumulative
  double sum_ ABSL_GUARDED_BY(mu_) = 0.0;
};

// Bucket bounds start, start·factor, … (`count` of them).
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// Bucket bounds start, start+width, … (`count` of them).
std::vector<double> LinearBuckets(double start, double width, int count);

enum class MetricType { kCounter, kGauge, kHistogram };

// Children of one metric, one per distinct list of label values.
template <typename T>
class Family {
 public:
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> bounds);

  // The child for these label values (created on first use, value 0). The
  // number of values must equal the number of label names given at
  // registration (zero for an unlabelled family). Values may be any UTF-8.
  T& WithLabels(const std::vector<std::string>& label_values);

  // Drops a child (e.g. when a job ends), so it is no longer exported.
  // References to it become dangling. No-op when absent.
  void Remove(const std::vector<std::string>& label_values);

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  const std::vector<double>& bounds() const { return bounds_; }

  // Calls fn(label_values, child) for each child in label-value order.
  void ForEach(const std::function<void(const std::vector<std::string>&, const T&)>& fn) const;

 private:
  T* NewChild();

  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;  // histograms only
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_ ABSL_GUARDED_BY(mu_);
};

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Registers (or returns the identical existing) family. `name` matches
  // [a-zA-Z_:][a-zA-Z0-9_:]*; counters must end in "_total"; label names match
  // [a-zA-Z_][a-zA-Z0-9_]* and do not start with "__"; histograms may not use
  // the label "le". A family without labels exports its single child at 0
  // from the start.
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              const std::vector<std::string>& label_names = {});
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          const std::vector<std::string>& label_names = {});
  // `bounds`: strictly increasing finite upper bounds; +Inf is implied.
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  const std::vector<std::string>& label_names,
                                  const std::vector<double>& bounds);

  // Registers a function run at the start of every Serialize(), before values
  // are read, to refresh gauges computed on demand. Collectors run one scrape
  // at a time, in registration order, without the registry's lock held (they
  // may call Add*/WithLabels/Remove).
  void AddCollector(std::function<void()> collect);

  // Every family, sorted by name, in the text exposition format 0.0.4:
  // "# HELP", "# TYPE", then one sample per child sorted by label values
  // (histograms: _bucket{le=...} cumulative incl. +Inf, _sum, _count).
  std::string Serialize();

 private:
  struct Entry {
    MetricType type;
    std::unique_ptr<Family<Counter>> counter;
    std::unique_ptr<Family<Gauge>> gauge;
    std::unique_ptr<Family<Histogram>> histogram;
  };
  Entry& AddEntry(MetricType type, const std::string& name, const std::string& help,
                  const std::vector<std::string>& label_names, const std::vector<double>& bounds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::mutex collect_mu_;  // serializes collectors; taken before mu_
  absl::Mutex mu_;
  std::map<std::string, Entry> families_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(mu_);
};

// Text-format helpers, exposed for tests.
// Escapes a label value: backslash, double quote and newline.
std::string EscapeLabelValue(const std::string& value);
// Formats a sample value: shortest exact decimal, "+Inf", "-Inf", "NaN".
std::string FormatMetricValue(double v);

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_METRICS_H_
