// docs/spec.md cannot drift from the spec's own schema: every field the
// parser accepts (JobSpecFieldPaths) has exactly one row, every row names a
// field, each row states a type, a constraint and a meaning, and a default
// written as a value (`...`) is the one the parser fills in, as
// JobSpecToYaml writes it for a spec that sets only the required fields.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "common/job_spec.h"
#include "yaml-cpp/yaml.h"

namespace shardtrain {
namespace {

struct Row {
  std::string type, default_value, constraint, meaning;
};

std::map<std::string, Row> DocRows(std::vector<std::string>* duplicates) {
  std::ifstream in(std::string(SHARDTRAIN_SOURCE_DIR) + "/docs/spec.md");
  EXPECT_TRUE(in.good()) << "docs/spec.md is missing";
  // | `field.path` | type | default | constraint | meaning |
  const std::regex row(R"(^\| `([a-z_.]+)` \| ([^|]*) \| ([^|]*) \| ([^|]*) \| (.*) \|$)");
  std::map<std::string, Row> out;
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (!std::regex_match(line, m, row)) continue;
    if (out.count(m[1])) duplicates->push_back(m[1]);
    out[m[1]] = Row{m[2], m[3], m[4], m[5]};
  }
  return out;
}

// The value at a dotted path of `root`, as the doc writes it: a scalar
// as is, a list in flow style ("[0.9, 0.95]").
std::string ValueAt(const YAML::Node& root, const std::string& path) {
  YAML::Node n = YAML::Clone(root);
  std::stringstream parts(path);
  for (std::string key; std::getline(parts, key, '.');) n = n[key];
  if (!n.IsDefined() || n.IsNull()) return "";
  if (n.IsScalar()) return n.Scalar();
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

TEST(SpecReferenceTest, EveryFieldHasOneCompleteRowAndItsDefaultIsTheParsers) {
  std::vector<std::string> duplicates;
  const std::map<std::string, Row> rows = DocRows(&duplicates);
  EXPECT_TRUE(duplicates.empty()) << "fields with two rows: " << duplicates.front();
  const std::vector<std::string> fields = JobSpecFieldPaths();
  ASSERT_GT(fields.size(), 40u);
  for (const std::string& f : fields) {
    EXPECT_TRUE(rows.count(f)) << "docs/spec.md has no row for " << f;
  }
  const std::set<std::string> known(fields.begin(), fields.end());
  for (const auto& [f, r] : rows) {
    EXPECT_TRUE(known.count(f)) << "docs/spec.md documents " << f << ", which no spec may hold";
    for (const std::string* cell : {&r.type, &r.default_value, &r.constraint, &r.meaning}) {
      EXPECT_FALSE(cell->empty() || *cell == " ") << f << " has an empty cell";
    }
  }
  // The parser's defaults: a spec with only the required fields, written
  // back with every field explicit.
  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      "name: minimal\n"
      "model: {layers: 2, heads: 2, dim: 16, context: 32, vocab: 256}\n"
      "data: {train: corpus.txt}\n"
      "batch: {global: 4, micro: 4, seq_len: 32}\n"
      "steps: 10\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const YAML::Node canonical = YAML::Load(JobSpecToYaml(*spec));
  // The fields only a Llama model has: their defaults from a minimal one.
  absl::StatusOr<JobSpec> llama = ParseJobSpec(
      "name: minimal\n"
      "model: {arch: llama, layers: 2, heads: 2, dim: 16, ffn_dim: 48, context: 32, vocab: 256}\n"
      "data: {train: corpus.txt}\n"
      "batch: {global: 4, micro: 4, seq_len: 32}\n"
      "steps: 10\n");
  ASSERT_TRUE(llama.ok()) << llama.status();
  const YAML::Node llama_canonical = YAML::Load(JobSpecToYaml(*llama));
  const std::regex literal(R"(^`([^`]*)`$)");
  int compared = 0;
  for (const auto& [f, r] : rows) {
    std::smatch m;
    if (!std::regex_match(r.default_value, m, literal)) continue;  // "required", "derived: ..."
    const std::string value = ValueAt(canonical, f);
    EXPECT_EQ(m[1].str(), value.empty() ? ValueAt(llama_canonical, f) : value)
        << "the default of " << f;
    ++compared;
  }
  std::printf("[spec-reference] %zu fields, %zu rows, %d defaults compared with the parser's\n",
              fields.size(), rows.size(), compared);
  EXPECT_GT(compared, 25);
}

}  // namespace
}  // namespace shardtrain
