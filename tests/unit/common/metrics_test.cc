#include "common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics_http.h"
#include "gtest/gtest.h"

namespace shardtrain {
namespace {

TEST(MetricsTest, SerializesExactText) {
  MetricsRegistry registry;
  auto& steps = registry.AddCounter("shardtrain_worker_steps_total", "Optimizer steps done.",
                                    {"job_id", "rank"});
  steps.WithLabels({"job-b", "1"}).Increment(2);
  steps.WithLabels({"job-a", "0"}).Increment();
  auto& up = registry.AddGauge("shardtrain_worker_up", "1 while the worker runs.");
  up.WithLabels({}).Set(1);
  auto& loss =
      registry.AddGauge("shardtrain_worker_loss", "Latest training loss.\nPer job.", {"job_id"});
  loss.WithLabels({"we\"ird\\na\nme"}).Set(5.5);
  auto& step_s = registry.AddHistogram("shardtrain_worker_step_seconds", "Step wall time.",
                                       {"job_id"}, {0.1, 0.5, 1});
  Histogram& h = step_s.WithLabels({"job-a"});
  h.Observe(0.05);
  h.Observe(0.1);  // le is inclusive
  h.Observe(0.7);
  h.Observe(30);
  auto& empty = registry.AddHistogram("shardtrain_a_bytes", "No labels, no data.", {}, {1024});
  (void)empty;

  const std::string want =
      "# HELP shardtrain_a_bytes No labels, no data.\n"
      "# TYPE shardtrain_a_bytes histogram\n"
      "shardtrain_a_bytes_bucket{le=\"1024\"} 0\n"
      "shardtrain_a_bytes_bucket{le=\"+Inf\"} 0\n"
      "shardtrain_a_bytes_sum 0\n"
      "shardtrain_a_bytes_count 0\n"
      "# HELP shardtrain_worker_loss Latest training loss.\\nPer job.\n"
      "# TYPE shardtrain_worker_loss gauge\n"
      "shardtrain_worker_loss{job_id=\"we\\\"ird\\\\na\\nme\"} 5.5\n"
      "# HELP shardtrain_worker_step_seconds Step wall time.\n"
      "# TYPE shardtrain_worker_step_seconds histogram\n"
      "shardtrain_worker_step_seconds_bucket{job_id=\"job-a\",le=\"0.1\"} 2\n"
      "shardtrain_worker_step_seconds_bucket{job_id=\"job-a\",le=\"0.5\"} 2\n"
      "shardtrain_worker_step_seconds_bucket{job_id=\"job-a\",le=\"1\"} 3\n"
      "shardtrain_worker_step_seconds_bucket{job_id=\"job-a\",le=\"+Inf\"} 4\n"
      "shardtrain_worker_step_seconds_sum{job_id=\"job-a\"} 30.85\n"
      "shardtrain_worker_step_seconds_count{job_id=\"job-a\"} 4\n"
      "# HELP shardtrain_worker_steps_total Optimizer steps done.\n"
      "# TYPE shardtrain_worker_steps_total counter\n"
      "shardtrain_worker_steps_total{job_id=\"job-a\",rank=\"0\"} 1\n"
      "shardtrain_worker_steps_total{job_id=\"job-b\",rank=\"1\"} 2\n"
      "# HELP shardtrain_worker_up 1 while the worker runs.\n"
      "# TYPE shardtrain_worker_up gauge\n"
      "shardtrain_worker_up 1\n";
  EXPECT_EQ(registry.Serialize(), want);
}

TEST(MetricsTest, ReferencesAreStableAndFamiliesIdempotent) {
  MetricsRegistry registry;
  auto& f1 = registry.AddCounter("x_total", "X.", {"op"});
  Counter* c = &f1.WithLabels({"a"});
  for (int i = 0; i < 100; ++i) f1.WithLabels({"k" + std::to_string(i)});  // grow the map
  auto& f2 = registry.AddCounter("x_total", "X.", {"op"});
  EXPECT_EQ(&f1, &f2);
  EXPECT_EQ(c, &f2.WithLabels({"a"}));
  c->Increment(3);
  c->Increment(-1);  // ignored: counters only go up
  EXPECT_EQ(c->Value(), 3);
  f1.Remove({"k0"});
  EXPECT_EQ(registry.Serialize().find("op=\"k0\""), std::string::npos);
}

TEST(MetricsTest, ValueFormatting) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(-3), "-3");
  EXPECT_EQ(FormatMetricValue(0.1), "0.1");
  EXPECT_EQ(FormatMetricValue(1e-9), "1e-09");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatMetricValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_EQ(LinearBuckets(0, 5, 3), (std::vector<double>{0, 5, 10}));
}

TEST(MetricsTest, CollectorsRunAtScrapeTime) {
  MetricsRegistry registry;
  auto& workers =
      registry.AddGauge("shardtrain_coordinator_workers", "Workers by state.", {"state"});
  int scrapes = 0;
  registry.AddCollector([&] {
    ++scrapes;
    workers.WithLabels({"idle"}).Set(scrapes);
    // Collectors may register families themselves.
    registry.AddGauge("shardtrain_coordinator_scrapes", "Scrapes so far.")
        .WithLabels({})
        .Set(scrapes);
  });
  std::string first = registry.Serialize();
  EXPECT_NE(first.find("shardtrain_coordinator_workers{state=\"idle\"} 1\n"), std::string::npos)
      << first;
  std::string second = registry.Serialize();
  EXPECT_NE(second.find("shardtrain_coordinator_workers{state=\"idle\"} 2\n"), std::string::npos)
      << second;
  EXPECT_NE(second.find("shardtrain_coordinator_scrapes 2\n"), std::string::npos) << second;
}

TEST(MetricsDeathTest, MisuseAborts) {
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddCounter("steps", "no _total suffix");
      },
      "must end in _total");
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddGauge("g", "G.", {"job_id"}).WithLabels({"a", "b"});
      },
      "2 label values for 1 labels");
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddGauge("g_total", "G.");
        r.AddCounter("g_total", "G.");
      },
      "registered twice");
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddHistogram("h", "H.", {}, {1, 1});
      },
      "strictly increasing");
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddGauge("bad-name", "B.");
      },
      "invalid metric name");
}

TEST(MetricsTest, ConcurrentUpdatesAndScrapes) {
  MetricsRegistry registry;
  auto& counter = registry.AddCounter("c_total", "C.", {"rank"});
  auto& gauge = registry.AddGauge("g", "G.");
  auto& hist = registry.AddHistogram("h_seconds", "H.", {"rank"}, {0.5});
  constexpr int kThreads = 4;
  constexpr int kIters = 20000;
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done.load()) {
      std::string text = registry.Serialize();
      ASSERT_NE(text.find("# TYPE c_total counter"), std::string::npos);
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter& mine = counter.WithLabels({std::to_string(t % 2)});
      Histogram& h = hist.WithLabels({std::to_string(t % 2)});
      for (int i = 0; i < kIters; ++i) {
        mine.Increment();
        gauge.WithLabels({}).Increment(0.5);
        h.Observe(i % 2 == 0 ? 0.25 : 1.0);
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  scraper.join();
  EXPECT_EQ(counter.WithLabels({"0"}).Value(), 2.0 * kIters);
  EXPECT_EQ(counter.WithLabels({"1"}).Value(), 2.0 * kIters);
  EXPECT_EQ(gauge.WithLabels({}).Value(), 0.5 * kThreads * kIters);
  Histogram::Snapshot s = hist.WithLabels({"0"}).Collect();
  EXPECT_EQ(s.count, 2u * kIters);
  EXPECT_EQ(s.cumulative[0], 1u * kIters);
  EXPECT_DOUBLE_EQ(s.sum, kIters * 0.25 + kIters * 1.0);
}

// --- HTTP -------------------------------------------------------------------

struct HttpResponse {
  int status = 0;
  std::string headers;
  std::string body;
};

// A plain HTTP/1.0 GET over a socket, so the test needs no client library.
HttpResponse HttpGet(int port, const std::string& path) {
  HttpResponse r;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return r;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return r;
  }
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return r;
  }
  std::string raw;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) raw.append(buf, n);
  close(fd);
  size_t split = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.", 0) != 0 || split == std::string::npos) return r;
  r.status = std::atoi(raw.c_str() + raw.find(' ') + 1);
  r.headers = raw.substr(0, split);
  r.body = raw.substr(split + 4);
  return r;
}

TEST(MetricsHttpTest, ServesMetricsHealthAndNotFound) {
  MetricsRegistry registry;
  registry.AddCounter("shardtrain_test_requests_total", "Requests.", {"op"})
      .WithLabels({"get"})
      .Increment(7);
  std::atomic<bool> healthy{true};
  auto server = MetricsHttpServer::Start("127.0.0.1:0", &registry, [&] { return healthy.load(); });
  ASSERT_TRUE(server.ok()) << server.status();
  int port = (*server)->port();
  ASSERT_GT(port, 0);

  HttpResponse metrics = HttpGet(port, "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.headers.find("Content-Type: text/plain; version=0.0.4; charset=utf-8"),
            std::string::npos)
      << metrics.headers;
  EXPECT_EQ(metrics.body, registry.Serialize());
  EXPECT_NE(metrics.body.find("shardtrain_test_requests_total{op=\"get\"} 7\n"), std::string::npos);

  HttpResponse health = HttpGet(port, "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok\n");
  healthy = false;
  EXPECT_EQ(HttpGet(port, "/healthz").status, 503);
  EXPECT_EQ(HttpGet(port, "/livez").status, 200);  // alive, though not ready
  EXPECT_EQ(HttpGet(port, "/nope").status, 404);
  EXPECT_EQ(HttpGet(port, "/metrics/extra").status, 404);
}

TEST(MetricsHttpTest, BindFailureIsUnavailableNamingTheAddress) {
  MetricsRegistry registry;
  auto first = MetricsHttpServer::Start("127.0.0.1:0", &registry);
  ASSERT_TRUE(first.ok()) << first.status();
  std::string taken = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = MetricsHttpServer::Start(taken, &registry);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_NE(second.status().message().find(taken), absl::string_view::npos) << second.status();

  auto malformed = MetricsHttpServer::Start("localhost", &registry);
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  auto null_registry = MetricsHttpServer::Start("127.0.0.1:0", nullptr);
  EXPECT_EQ(null_registry.status().code(), absl::StatusCode::kInvalidArgument);
}

// The served text passes `promtool check metrics` (Prometheus's own linter).
TEST(MetricsHttpTest, PromtoolAcceptsTheOutput) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool not installed";
  }
  MetricsRegistry registry;
  auto& steps = registry.AddCounter("shardtrain_worker_steps_total", "Optimizer steps done.",
                                    {"job_id", "rank"});
  steps.WithLabels({"job \"1\"\\x\ny", "0"}).Increment(3);
  registry.AddGauge("shardtrain_worker_loss_nats", "Latest loss.", {"job_id"})
      .WithLabels({"job-1"})
      .Set(5.25);
  registry.AddGauge("shardtrain_coordinator_workers", "Workers by state.", {"state"})
      .WithLabels({"idle"})
      .Set(2);
  auto& step_s = registry.AddHistogram("shardtrain_worker_step_seconds", "Step wall time.",
                                       {"job_id"}, ExponentialBuckets(0.001, 4, 8));
  step_s.WithLabels({"job-1"}).Observe(0.02);
  step_s.WithLabels({"job-1"}).Observe(3);
  registry.AddHistogram("shardtrain_worker_allreduce_bytes", "Bytes per all-reduce.", {},
                        {1e3, 1e6});

  auto server = MetricsHttpServer::Start("127.0.0.1:0", &registry);
  ASSERT_TRUE(server.ok()) << server.status();
  HttpResponse metrics = HttpGet((*server)->port(), "/metrics");
  ASSERT_EQ(metrics.status, 200);

  char dir_template[] = "/tmp/metrics_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  std::string dir = dir_template;
  { std::ofstream(dir + "/metrics.txt") << metrics.body; }
  std::string cmd = "promtool check metrics < " + dir + "/metrics.txt > " + dir + "/out.txt 2>&1";
  int rc = std::system(cmd.c_str());
  std::ifstream out_file(dir + "/out.txt");
  std::string output((std::istreambuf_iterator<char>(out_file)), std::istreambuf_iterator<char>());
  std::printf("promtool check metrics: exit %d, output: %s\n", rc,
              output.empty() ? "(none)" : output.c_str());
  EXPECT_EQ(rc, 0) << "promtool output:\n" << output << "\nmetrics:\n" << metrics.body;
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace shardtrain
