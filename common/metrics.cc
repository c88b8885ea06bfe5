#include "common/metrics.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/enum_names.h"

namespace shardtrain {
namespace {

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "shardtrain metrics: %s\n", message.c_str());
  std::abort();
}

void AtomicAdd(std::atomic<double>& target, double v) {
  double old = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}

bool IsMetricName(const std::string& s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

bool IsLabelName(const std::string& s) {
  if (s.empty() || s.rfind("__", 0) == 0) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

// HELP text escapes backslash and newline only.
std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string_view TypeName(MetricType t) {
  static constexpr std::string_view kNames[] = {"counter", "gauge", "histogram"};
  return NameIn(kNames, t, std::string_view("untyped"));
}

// `{a="x",b="y"}` (with `extra` appended as a last, pre-escaped pair), or ""
// when there are no labels at all.
std::string LabelText(const std::vector<std::string>& names, const std::vector<std::string>& values,
                      const std::string& extra = "") {
  std::vector<std::string> pairs;
  for (size_t i = 0; i < names.size(); ++i) {
    pairs.push_back(absl::StrCat(names[i], "=\"", EscapeLabelValue(values[i]), "\""));
  }
  if (!extra.empty()) pairs.push_back(extra);
  if (pairs.empty()) return "";
  return absl::StrCat("{", absl::StrJoin(pairs, ","), "}");
}

}  // namespace

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

// --- Counter, Gauge, Histogram ---------------------------------------------

void Counter::Increment(double v) {
  if (!(v >= 0.0)) return;
  AtomicAdd(value_, v);
}

void Gauge::Increment(double v) { AtomicAdd(value_, v); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  size_t bucket = 0;
  while (bucket < bounds_.size() && !(v <= bounds_[bucket])) ++bucket;
  absl::MutexLock lock(&mu_);
  ++counts_[bucket];
  sum_ += v;
}

Histogram::Snapshot Histogram::Collect() const {
  Snapshot s;
  s.bounds = bounds_;
  absl::MutexLock lock(&mu_);
  uint64_t running = 0;
  for (uint64_t c : counts_) {
    running += c;
    s.cumulative.push_back(running);
  }
  s.sum = sum_;
  s.count = running;
  return s;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  std::vector<double> out;
  for (int i = 0; i < count; ++i) out.push_back(start + i * width);
  return out;
}

// --- Family ----------------------------------------------------------------

template <typename T>
Family<T>::Family(std::string name, std::string help, std::vector<std::string> label_names,
                  std::vector<double> bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(label_names)),
      bounds_(std::move(bounds)) {}

template <typename T>
T* Family<T>::NewChild() {
  if constexpr (std::is_same_v<T, Histogram>) {
    return new Histogram(bounds_);
  } else {
    return new T();
  }
}

template <typename T>
T& Family<T>::WithLabels(const std::vector<std::string>& label_values) {
  if (label_values.size() != label_names_.size()) {
    Fail(absl::StrCat(name_, ": got ", label_values.size(), " label values for ",
                      label_names_.size(), " labels (", absl::StrJoin(label_names_, ", "), ")"));
  }
  absl::MutexLock lock(&mu_);
  std::unique_ptr<T>& child = children_[label_values];
  if (child == nullptr) child.reset(NewChild());
  return *child;
}

template <typename T>
void Family<T>::Remove(const std::vector<std::string>& label_values) {
  absl::MutexLock lock(&mu_);
  children_.erase(label_values);
}

template <typename T>
void Family<T>::ForEach(
    const std::function<void(const std::vector<std::string>&, const T&)>& fn) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [labels, child] : children_) fn(labels, *child);
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// --- MetricsRegistry -------------------------------------------------------

MetricsRegistry::Entry& MetricsRegistry::AddEntry(MetricType type, const std::string& name,
                                                  const std::string& help,
                                                  const std::vector<std::string>& label_names,
                                                  const std::vector<double>& bounds) {
  if (!IsMetricName(name)) Fail(absl::StrCat("invalid metric name \"", name, "\""));
  if (type == MetricType::kCounter &&
      (name.size() < 6 || name.compare(name.size() - 6, 6, "_total") != 0)) {
    Fail(absl::StrCat("counter ", name, " must end in _total"));
  }
  for (size_t i = 0; i < label_names.size(); ++i) {
    const std::string& l = label_names[i];
    if (!IsLabelName(l)) Fail(absl::StrCat(name, ": invalid label name \"", l, "\""));
    if (type == MetricType::kHistogram && l == "le") {
      Fail(absl::StrCat(name, ": histograms may not use the label le"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (label_names[j] == l) Fail(absl::StrCat(name, ": label ", l, " repeated"));
    }
  }
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1]))) {
      Fail(absl::StrCat(name, ": bucket bounds must be finite and strictly increasing"));
    }
  }

  auto it = families_.find(name);
  if (it != families_.end()) {
    Entry& e = it->second;
    bool same = e.type == type;
    if (same && type == MetricType::kCounter) {
      same = e.counter->label_names() == label_names;
    } else if (same && type == MetricType::kGauge) {
      same = e.gauge->label_names() == label_names;
    } else if (same) {
      same = e.histogram->label_names() == label_names && e.histogram->bounds() == bounds;
    }
    if (!same) Fail(absl::StrCat(name, ": registered twice with different definitions"));
    return e;
  }
  Entry& e = families_[name];
  e.type = type;
  switch (type) {
    case MetricType::kCounter:
      e.counter = std::make_unique<Family<Counter>>(name, help, label_names, bounds);
      if (label_names.empty()) e.counter->WithLabels({});
      break;
    case MetricType::kGauge:
      e.gauge = std::make_unique<Family<Gauge>>(name, help, label_names, bounds);
      if (label_names.empty()) e.gauge->WithLabels({});
      break;
    case MetricType::kHistogram:
      e.histogram = std::make_unique<Family<Histogram>>(name, help, label_names, bounds);
      if (label_names.empty()) e.histogram->WithLabels({});
      break;
  }
  return e;
}

Family<Counter>& MetricsRegistry::AddCounter(const std::string& name, const std::string& help,
                                             const std::vector<std::string>& label_names) {
  absl::MutexLock lock(&mu_);
  return *AddEntry(MetricType::kCounter, name, help, label_names, {}).counter;
}

Family<Gauge>& MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                                         const std::vector<std::string>& label_names) {
  absl::MutexLock lock(&mu_);
  return *AddEntry(MetricType::kGauge, name, help, label_names, {}).gauge;
}

Family<Histogram>& MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                                 const std::vector<std::string>& label_names,
                                                 const std::vector<double>& bounds) {
  absl::MutexLock lock(&mu_);
  return *AddEntry(MetricType::kHistogram, name, help, label_names, bounds).histogram;
}

void MetricsRegistry::AddCollector(std::function<void()> collect) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collect));
}

std::string MetricsRegistry::Serialize() {
  {
    std::lock_guard<std::mutex> collect_lock(collect_mu_);
    std::vector<std::function<void()>> collectors;
    {
      absl::MutexLock lock(&mu_);
      collectors = collectors_;
    }
    for (const auto& collect : collectors) collect();
  }

  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, e] : families_) {
    const std::string* help = nullptr;
    const std::vector<std::string>* label_names = nullptr;
    switch (e.type) {
      case MetricType::kCounter:
        help = &e.counter->help();
        label_names = &e.counter->label_names();
        break;
      case MetricType::kGauge:
        help = &e.gauge->help();
        label_names = &e.gauge->label_names();
        break;
      case MetricType::kHistogram:
        help = &e.histogram->help();
        label_names = &e.histogram->label_names();
        break;
    }
    absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(*help), "\n");
    absl::StrAppend(&out, "# TYPE ", name, " ", std::string(TypeName(e.type)), "\n");
    auto scalar = [&](const std::vector<std::string>& labels, double value) {
      absl::StrAppend(&out, name, LabelText(*label_names, labels), " ", FormatMetricValue(value),
                      "\n");
    };
    switch (e.type) {
      case MetricType::kCounter:
        e.counter->ForEach(
            [&](const auto& labels, const Counter& c) { scalar(labels, c.Value()); });
        break;
      case MetricType::kGauge:
        e.gauge->ForEach([&](const auto& labels, const Gauge& g) { scalar(labels, g.Value()); });
        break;
      case MetricType::kHistogram:
        e.histogram->ForEach([&](const auto& labels, const Histogram& h) {
          Histogram::Snapshot s = h.Collect();
          for (size_t i = 0; i < s.cumulative.size(); ++i) {
            std::string le = i < s.bounds.size() ? FormatMetricValue(s.bounds[i]) : "+Inf";
            absl::StrAppend(&out, name, "_bucket",
                            LabelText(*label_names, labels, absl::StrCat("le=\"", le, "\"")), " ",
                            s.cumulative[i], "\n");
          }
          absl::StrAppend(&out, name, "_sum", LabelText(*label_names, labels), " ",
                          FormatMetricValue(s.sum), "\n");
          absl::StrAppend(&out, name, "_count", LabelText(*label_names, labels), " ", s.count,
                          "\n");
        });
        break;
    }
  }
  return out;
}

}  // namespace shardtrain
