// Shared by the training and recovery integration tests: the example spec,
// the corpus, parsing of the CLI's JSON, and fixtures that start a
// coordinator and workers on 127.0.0.1.
#ifndef SHARDTRAIN_TESTS_INTEGRATION_TRAINING_UTIL_H_
#define SHARDTRAIN_TESTS_INTEGRATION_TRAINING_UTIL_H_

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace shardtrain::testing {

using std::chrono::milliseconds;
using std::chrono::seconds;

inline const std::string kDdpSpec = SourceDir() + "/examples/fortunes-ddp.yaml";
inline const std::string kData = SourceDir() + "/data/fortunes.txt";

inline std::vector<double> Losses(const std::string& json) {
  // The "steps" array of `local --output json` / `history --output json`.
  std::vector<double> out;
  const size_t steps = json.find("\"steps\": [");
  static const std::regex re("\"loss\": ([-0-9.e+]+)");
  std::string tail = steps == std::string::npos ? "" : json.substr(steps);
  for (auto it = std::sregex_iterator(tail.begin(), tail.end(), re); it != std::sregex_iterator();
       ++it) {
    out.push_back(std::stod((*it)[1]));
  }
  return out;
}

// step -> val_loss of the steps of that array which evaluated.
inline std::map<int, double> ValLosses(const std::string& json) {
  std::map<int, double> out;
  static const std::regex re("\"step\": (\\d+), \"loss\": [^,]+, \"val_loss\": ([-0-9.e+]+)");
  for (auto it = std::sregex_iterator(json.begin(), json.end(), re); it != std::sregex_iterator();
       ++it) {
    out[std::stoi((*it)[1])] = std::stod((*it)[2]);
  }
  return out;
}

inline std::string Field(const std::string& json, const std::string& key) {
  std::smatch m;
  std::regex re("\"" + key + "\": \"([^\"]*)\"");
  return std::regex_search(json, m, re) ? m[1].str() : "";
}

class TrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kData)) << kData << " is missing: run scripts/setup";
  }
};

// `shardtrain local` on the example DDP spec over the corpus, with `sets`
// overrides, checkpoints in `ckpt`, 1 thread per worker, JSON output (or the
// human one), and `extra` arguments. No validation loss unless `sets` asks
// (eval.every, data.val): the example's data.val is a path relative to the
// source tree.
inline CommandResult RunLocal(const std::vector<std::string>& sets, const std::string& ckpt,
                              const std::vector<std::string>& extra = {}, bool json = true) {
  std::vector<std::string> args = {SHARDTRAIN_CLI_BIN,
                                   "local",
                                   kDdpSpec,
                                   "--output",
                                   json ? "json" : "table",
                                   "--threads",
                                   "1",
                                   "--set",
                                   "data.train=" + kData,
                                   "--set",
                                   "checkpoint.dir=" + ckpt,
                                   "--set",
                                   "eval.every=0"};
  for (const auto& s : sets) args.insert(args.end(), {"--set", s});
  args.insert(args.end(), extra.begin(), extra.end());
  return RunCommand(args, std::chrono::seconds(300));
}

class ClusterTest : public TrainingTest {
 protected:
  void Start(int workers, int64_t lease_ms = 10'000) {
    c_ = StartCoordinator(dir_.path(), lease_ms);
    ASSERT_GT(c_.port, 0) << c_.process.Log();
    for (int i = 0; i < workers; ++i) workers_.push_back(StartWorker(dir_.path(), c_.address(), i));
  }
  std::string Submit(const std::vector<std::string>& sets) {
    std::vector<std::string> args = {"submit", kDdpSpec,
                                     "--set",  "data.train=" + kData,
                                     "--set",  "checkpoint.dir=" + dir_.path() + "/ckpt",
                                     "--set",  "eval.every=0"};
    for (const auto& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    CommandResult r = Cli(args, c_.address());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::string id = r.out;
    while (!id.empty() && id.back() == '\n') id.pop_back();
    return id;
  }
  std::string Status(const std::string& job) {
    return Cli({"status", job, "-o", "json"}, c_.address()).out;
  }
  std::string State(const std::string& job) { return Field(Status(job), "state"); }
  int Step(const std::string& job) {
    std::smatch m;
    std::string s = Status(job);
    return std::regex_search(s, m, std::regex("\"step\": (\\d+)")) ? std::stoi(m[1]) : -1;
  }

  // SIGKILLs the worker holding `rank` of `job`; returns its id ("" if none).
  std::string KillRank(const std::string& job, int rank) {
    std::smatch m;
    const std::string st = Status(job);
    const std::regex re("\"rank\": " + std::to_string(rank) + ", \"worker_id\": \"(w-\\d+)\"");
    if (!std::regex_search(st, m, re)) return "";
    const std::string victim = m[1];
    for (Process& w : workers_) {
      if (w.Log().find(" as " + victim + " ") != std::string::npos) w.Signal(SIGKILL);
    }
    return victim;
  }

  TempDir dir_;
  Coordinator c_;
  std::vector<Process> workers_;
};

}  // namespace shardtrain::testing

#endif  // SHARDTRAIN_TESTS_INTEGRATION_TRAINING_UTIL_H_
