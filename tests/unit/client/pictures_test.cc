// The CLI's pictures (client/pictures.h): the pipeline timeline drawn from
// the schedule's simulation, memory bars, the terminal chart and the SVG.
#include "client/pictures.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_split.h"

namespace shardtrain::client {
namespace {

std::vector<std::string> Lines(const std::string& s) { return absl::StrSplit(s, '\n'); }

// The rows of a 2-stage 1F1B pipeline of 4 micro-batches, unit by unit
// (3 characters per forward): stage 1 starts one forward late, stage 0
// waits for B0 to come back; both idle 3 of 15 units = (p-1)/(m+p-1).
TEST(PipelineTimelineTest, OneFOneBOnTwoStagesShowsTheBubble) {
  const std::vector<std::string> lines = Lines(PipelineTimeline(PipelineSchedule::k1F1B, 2, 4));
  ASSERT_GE(lines.size(), 4u);
  EXPECT_EQ(lines[1], "  stage 0 |F0-F1-......B0====F2-B1====F3-B2====...B3====|  idle 20.0%");
  EXPECT_EQ(lines[2], "  stage 1 |...F0-B0====F1-B1====F2-B2====F3-B3====......|  idle 20.0%");
  EXPECT_NE(lines[3].find("bubble: 20.0%"), std::string::npos) << lines[3];
}

// Interleaved, 2 chunks: stage 0 forwards F0 F1 (chunk 0) then F0.1 F1.1,
// each half a unit (4 characters); the simulated bubble is (p-1)/(v·m+p-1)
// = 1/5 at m 2.
TEST(PipelineTimelineTest, InterleavedLabelsChunks) {
  const std::string t = PipelineTimeline(PipelineSchedule::k1F1B, 2, 2, 96, /*chunks=*/2);
  const std::vector<std::string> lines = Lines(t);
  ASSERT_GE(lines.size(), 4u) << t;
  EXPECT_NE(lines[0].find("interleaved 1F1B, 2 chunks per stage"), std::string::npos) << t;
  EXPECT_EQ(lines[1].rfind("  stage 0 |F0--F1--F0.1F1.1", 0), 0u) << t;
  EXPECT_NE(lines[3].find("(p-1)/(v·m+p-1) = 20.0%"), std::string::npos) << t;
}

TEST(PipelineTimelineTest, GpipeRunsEveryForwardFirst) {
  const std::vector<std::string> lines = Lines(PipelineTimeline(PipelineSchedule::kGpipe, 2, 4));
  ASSERT_GE(lines.size(), 3u);
  EXPECT_EQ(lines[1], "  stage 0 |F0-F1-F2-F3-.........B0====B1====B2====B3====|  idle 20.0%");
}

TEST(PipelineTimelineTest, OneStageHasNoneAndLongSchedulesAreScaledToTheWidth) {
  EXPECT_EQ(PipelineTimeline(PipelineSchedule::k1F1B, 1, 8), "");
  const std::vector<std::string> lines =
      Lines(PipelineTimeline(PipelineSchedule::k1F1B, 4, 64, /*max_width=*/80));
  ASSERT_GE(lines.size(), 5u);
  EXPECT_NE(lines[0].find("reduced scale"), std::string::npos) << lines[0];
  for (int s = 1; s <= 4; ++s) {
    const size_t open = lines[s].find('|'), close = lines[s].rfind('|');
    EXPECT_LE(close - open - 1, 80u) << lines[s];
    EXPECT_EQ(lines[s].find_first_not_of("FB.", open + 1), close) << lines[s];
  }
}

// Bars scale to the largest total; each kind gets its letter, at least one
// when it holds any bytes; offloaded optimizer state is a host bar.
TEST(MemoryBarsTest, KindsInProportionAndHostApart) {
  v1::MemoryEstimate a;
  a.set_params_bytes(100);
  a.set_grads_bytes(100);
  a.set_optimizer_bytes(200);
  a.set_activations_bytes(400);
  a.set_total_bytes(800);
  v1::MemoryEstimate b = a;
  b.set_host_bytes(200);  // optimizer offloaded
  b.set_total_bytes(600);
  const std::vector<std::string> lines = Lines(MemoryBars({{"dev", a}, {"off", b}}, 40));
  ASSERT_GE(lines.size(), 4u);
  EXPECT_EQ(lines[0], "  dev  |PPPPPGGGGGOOOOOOOOOOAAAAAAAAAAAAAAAAAAAA| 800 B");
  EXPECT_EQ(lines[1], "  off  |PPPPPGGGGGAAAAAAAAAAAAAAAAAAAA          | 600 B");
  EXPECT_EQ(lines[2], "  host |OOOOOOOOOO                              | 200 B");
}

TEST(ChartTest, TerminalChartPlacesExtremesOnTheFrame) {
  const std::string chart =
      TerminalChart({{"loss", {{1, 5.0}, {2, 3.0}, {3, 1.0}}}, {"val_loss", {{3, 2.0}}}}, 20, 5);
  const std::vector<std::string> lines = Lines(chart);
  ASSERT_GE(lines.size(), 8u);
  EXPECT_EQ(lines[0], "5 |*                   ");  // (1, 5): top left
  EXPECT_EQ(lines[4], "1 |                   *");  // (3, 1): bottom right
  EXPECT_EQ(lines[2].substr(0, 4), "3 | ");        // the middle label
  EXPECT_EQ(lines[3][3 + 19], 'o');                // (3, 2): 3/4 down, at the right edge
  EXPECT_NE(chart.find("* loss"), std::string::npos);
  EXPECT_NE(chart.find("o val_loss"), std::string::npos);
  EXPECT_EQ(TerminalChart({{"empty", {}}}), "(no points)\n");
}

TEST(ChartTest, SvgHasAPolylinePerCurveAndEscapesText) {
  const std::string svg =
      SvgChart({{"j-1 <loss>", {{1, 2.0}, {2, 1.0}}}, {"j-2 loss", {{1, 3.0}, {2, 0.5}}}}, "a & b");
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  size_t polylines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos;
       at = svg.find("<polyline", at + 1)) {
    ++polylines;
  }
  EXPECT_EQ(polylines, 2u);
  EXPECT_NE(svg.find("j-1 &lt;loss&gt;"), std::string::npos);
  EXPECT_NE(svg.find("a &amp; b"), std::string::npos);
  EXPECT_EQ(svg.find("<loss>"), std::string::npos);
}

}  // namespace
}  // namespace shardtrain::client
