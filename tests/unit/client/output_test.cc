// The CLI's rendering of step reports: history as JSON, table and CSV, and
// the progress lines of local / watch / submit --wait. The validation loss
// appears exactly on the steps that carry one; fp16's loss scale and skipped
// steps likewise.
#include "client/output.h"

#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace shardtrain::client {
namespace {

v1::StepReport Step(int64_t step, double loss) {
  v1::StepReport s;
  s.set_step(step);
  s.set_loss(loss);
  s.set_grad_norm(0.5);
  s.set_lr(0.001);
  s.set_tokens_per_s(1000);
  s.set_step_ms(20);
  s.set_comm_ms(2);
  return s;
}

// Step 1 did not evaluate; step 2 did.
v1::GetHistoryResponse History() {
  v1::GetHistoryResponse h;
  *h.add_steps() = Step(1, 2.5);
  v1::StepReport evaluated = Step(2, 2.25);
  evaluated.set_val_loss(2.3125);
  *h.add_steps() = evaluated;
  return h;
}

TEST(OutputTest, StepsJsonCarriesValLossOnlyOnEvaluatedSteps) {
  EXPECT_EQ(
      StepsJson(History()),
      "{\"steps\": ["
      "{\"step\": 1, \"loss\": 2.5, \"grad_norm\": 0.5, \"lr\": 0.001, \"tokens_per_s\": 1000, "
      "\"step_ms\": 20, \"comm_ms\": 2, \"comm_bytes\": 0, \"peak_rss_bytes\": 0}, "
      "{\"step\": 2, \"loss\": 2.25, \"val_loss\": 2.3125, \"grad_norm\": 0.5, \"lr\": 0.001, "
      "\"tokens_per_s\": 1000, \"step_ms\": 20, \"comm_ms\": 2, \"comm_bytes\": 0, "
      "\"peak_rss_bytes\": 0}]}");
  // A NaN loss (a diverged run) stays valid JSON.
  v1::StepReport nan = Step(3, 1.0);
  nan.set_val_loss(std::numeric_limits<double>::quiet_NaN());
  EXPECT_NE(StepJson(nan).find("\"val_loss\": null"), std::string::npos) << StepJson(nan);
}

TEST(OutputTest, HistoryTableAndCsvHaveAValLossColumn) {
  EXPECT_EQ(HistoryText(History(), /*csv=*/true),
            "step,loss,val_loss,grad_norm,lr,tokens_per_s,step_ms,comm_ms,loss_scale,skipped,mfu\n"
            "1,2.5,,0.5,0.001,1000.0,20.00,2.00,,false,\n"
            "2,2.25,2.3125,0.5,0.001,1000.0,20.00,2.00,,false,\n");
  // Without loss scaling the table has no fp16 columns.
  EXPECT_EQ(HistoryText(History(), /*csv=*/false),
            "step  loss  val_loss  grad_norm  lr     tokens_per_s  step_ms  comm_ms\n"
            "1     2.5   -         0.5        0.001  1000.0        20.00    2.00\n"
            "2     2.25  2.3125    0.5        0.001  1000.0        20.00    2.00\n");
}

TEST(OutputTest, ProgressLinesShowValLossOnEvaluatedSteps) {
  const v1::GetHistoryResponse h = History();
  EXPECT_EQ(StepLine(h.steps(0), 60, 1.2),
            "step  1/60  loss 2.5000      1000 tok/s     20.0 ms/step  ETA 1s");
  EXPECT_EQ(StepLine(h.steps(1), 60, 1.2),
            "step  2/60  loss 2.2500      1000 tok/s     20.0 ms/step  ETA 1s  val 2.3125");
  // Watch and local print step events through EventLine.
  v1::JobEvent e;
  e.set_kind(v1::EVENT_KIND_STEP);
  *e.mutable_step() = h.steps(1);
  EtaEstimator eta;
  EXPECT_NE(EventLine(e, 60, &eta).find("ms/step  ETA "), std::string::npos);
  EXPECT_NE(EventLine(e, 60, &eta).find("  val 2.3125"), std::string::npos);
  v1::StepReport sent = h.steps(1);
  sent.set_comm_bytes(2500000);
  EXPECT_NE(StepLine(sent, 60, 1.2).find("sent 2.5 MB  val 2.3125"), std::string::npos)
      << StepLine(sent, 60, 1.2);
}

// MFU (the worker's, where it knows its device's dense peak): in the
// progress line after ms/step, in JSON and the history only where known.
TEST(OutputTest, MfuShowsWhereTheWorkerKnowsIt) {
  v1::GetHistoryResponse h = History();
  h.mutable_steps(1)->set_mfu(0.4123);
  EXPECT_EQ(
      StepLine(h.steps(1), 60, 1.2),
      "step  2/60  loss 2.2500      1000 tok/s     20.0 ms/step  MFU 41.2%  ETA 1s  val 2.3125");
  EXPECT_NE(StepJson(h.steps(1)).find("\"mfu\": 0.4123"), std::string::npos)
      << StepJson(h.steps(1));
  EXPECT_EQ(StepJson(h.steps(0)).find("mfu"), std::string::npos);
  EXPECT_EQ(HistoryText(h, /*csv=*/true),
            "step,loss,val_loss,grad_norm,lr,tokens_per_s,step_ms,comm_ms,loss_scale,skipped,mfu\n"
            "1,2.5,,0.5,0.001,1000.0,20.00,2.00,,false,\n"
            "2,2.25,2.3125,0.5,0.001,1000.0,20.00,2.00,,false,0.4123\n");
  EXPECT_EQ(HistoryText(h, /*csv=*/false),
            "step  loss  val_loss  grad_norm  lr     tokens_per_s  step_ms  comm_ms  mfu\n"
            "1     2.5   -         0.5        0.001  1000.0        20.00    2.00     -\n"
            "2     2.25  2.3125    0.5        0.001  1000.0        20.00    2.00     0.4123\n");
}

// An fp16 history: step 1 overflowed at 65536 (skipped), step 2 ran at 32768.
v1::GetHistoryResponse Fp16History() {
  v1::GetHistoryResponse h = History();
  h.mutable_steps(0)->set_loss_scale(65536);
  h.mutable_steps(0)->set_skipped(true);
  h.mutable_steps(1)->set_loss_scale(32768);
  return h;
}

TEST(OutputTest, StepsJsonCarriesLossScaleAndSkippedOnlyWhereTheyApply) {
  const v1::GetHistoryResponse h = Fp16History();
  EXPECT_EQ(StepJson(h.steps(0)),
            "{\"step\": 1, \"loss\": 2.5, \"grad_norm\": 0.5, \"lr\": 0.001, \"tokens_per_s\": "
            "1000, \"step_ms\": 20, \"comm_ms\": 2, \"comm_bytes\": 0, \"peak_rss_bytes\": 0, "
            "\"loss_scale\": 65536, \"skipped\": true}");
  const std::string clean = StepJson(h.steps(1));
  EXPECT_NE(clean.find("\"loss_scale\": 32768}"), std::string::npos) << clean;
  EXPECT_EQ(clean.find("skipped"), std::string::npos) << clean;
  // fp32 / bf16 steps carry neither.
  const std::string fp32 = StepsJson(History());
  EXPECT_EQ(fp32.find("loss_scale"), std::string::npos) << fp32;
  EXPECT_EQ(fp32.find("skipped"), std::string::npos) << fp32;
}

TEST(OutputTest, HistoryOfAnFp16JobHasLossScaleAndSkippedColumns) {
  EXPECT_EQ(HistoryText(Fp16History(), /*csv=*/true),
            "step,loss,val_loss,grad_norm,lr,tokens_per_s,step_ms,comm_ms,loss_scale,skipped,mfu\n"
            "1,2.5,,0.5,0.001,1000.0,20.00,2.00,65536,true,\n"
            "2,2.25,2.3125,0.5,0.001,1000.0,20.00,2.00,32768,false,\n");
  EXPECT_EQ(HistoryText(Fp16History(), /*csv=*/false),
            "step  loss  val_loss  grad_norm  lr     tokens_per_s  step_ms  comm_ms  loss_scale  "
            "skipped\n"
            "1     2.5   -         0.5        0.001  1000.0        20.00    2.00     65536       "
            "yes\n"
            "2     2.25  2.3125    0.5        0.001  1000.0        20.00    2.00     32768       "
            "-\n");
}

TEST(OutputTest, ProgressLineOfASkippedStepSaysSoWithTheLossScale) {
  const v1::GetHistoryResponse h = Fp16History();
  EXPECT_EQ(StepLine(h.steps(0), 60, 1.2),
            "step  1/60  loss 2.5000      1000 tok/s     20.0 ms/step  ETA 1s  skipped (fp16 "
            "overflow at loss scale 65536)");
  // A clean fp16 step reads as any other.
  EXPECT_EQ(StepLine(h.steps(1), 60, 1.2),
            "step  2/60  loss 2.2500      1000 tok/s     20.0 ms/step  ETA 1s  val 2.3125");
  v1::JobEvent e;
  e.set_kind(v1::EVENT_KIND_STEP);
  *e.mutable_step() = h.steps(0);
  EtaEstimator eta;
  EXPECT_NE(EventLine(e, 60, &eta).find("skipped (fp16 overflow at loss scale 65536)"),
            std::string::npos);
}

TEST(OutputTest, WorkerJsonNamesTheDeviceModelMemoryAndPrecisions) {
  v1::WorkerInfo w;
  w.set_worker_id("w-0001");
  w.set_state(v1::WORKER_STATE_ALIVE);
  v1::Device* d = w.mutable_device();
  d->set_name("cuda:1");
  d->set_kind("cuda");
  d->set_model("NVIDIA H100 80GB HBM3, compute capability 9.0");
  d->set_memory_bytes(85'029'158'912);
  for (const char* p : {"fp32", "bf16", "fp16"}) d->add_precisions(p);
  const std::string json = WorkerJson(w);
  EXPECT_NE(json.find("\"device\": \"cuda:1\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"kind\": \"cuda\", \"model\": \"NVIDIA H100 80GB HBM3, compute "
                      "capability 9.0\", \"memory_bytes\": 85029158912, \"precisions\": [\"fp32\", "
                      "\"bf16\", \"fp16\"]}"),
            std::string::npos)
      << json;
}

TEST(OutputTest, LayoutLineNamesTheMeshAndThePipelineBubble) {
  const std::string spec =
      "name: l\nmodel: {layers: 4, heads: 4, dim: 32, context: 32, vocab: 256}\n"
      "data: {train: t.txt}\nbatch: {global: 32, micro: 4, seq_len: 16}\n"
      "parallel: {dp: 2, tp: 2, pp: 2, zero: 1, schedule: gpipe}\nsteps: 1\n";
  v1::Job job;
  job.set_spec_yaml(spec);
  EXPECT_EQ(LayoutLine(job),
            "layout: dp 2 × tp 2 × pp 2 = 8 ranks, ZeRO-1; pipeline gpipe, 4 micro-batches per "
            "step, bubble 20.0% ((pp-1)/(m+pp-1))");
  job.set_spec_yaml(
      "name: l\nmodel: {layers: 4, heads: 4, dim: 32, context: 32, vocab: 256}\n"
      "data: {train: t.txt}\nbatch: {global: 8, micro: 2, seq_len: 16}\n"
      "parallel: {dp: 4}\nsteps: 1\n");
  EXPECT_EQ(LayoutLine(job), "layout: dp 4 × tp 1 × pp 1 = 4 ranks, ZeRO-0");
  job.set_spec_yaml("not: [a spec");
  EXPECT_EQ(LayoutLine(job), "");
}

// A checkpoint not committed is a warning the user sees wherever the job's
// events are: `watch` and `local` (EventLine), `status` (JobText, with the
// newest committed step next to the current one), `history` (WarningLines,
// and "warnings" in its JSON).
TEST(OutputTest, WarningsShowInWatchStatusAndHistory) {
  const std::string warning =
      "checkpoint step 20 not committed: rank 0: No space left on device (/v/ck/step-20)";
  v1::JobEvent e;
  e.set_kind(v1::EVENT_KIND_WARNING);
  e.set_state(v1::JOB_STATE_RUNNING);
  e.set_seq(7);
  e.set_time_ms(1234);
  e.set_message(warning);
  EtaEstimator eta;
  EXPECT_EQ(EventLine(e, 60, &eta), "[WARNING] " + warning);

  v1::Job job;
  job.set_job_id("j-000001");
  job.set_name("f");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_spec_yaml(
      "name: f\nmodel: {layers: 1, heads: 2, dim: 16, context: 16, vocab: 256}\n"
      "data: {train: t.txt}\nbatch: {global: 2, micro: 2, seq_len: 8}\nsteps: 60\n"
      "checkpoint: {every: 10, dir: ck}\n");
  job.mutable_progress()->set_step(55);
  job.mutable_progress()->set_total_steps(60);
  job.mutable_progress()->set_loss(2.5);
  job.mutable_progress()->set_last_committed_checkpoint_step(10);
  job.mutable_progress()->set_checkpoint_failures_in_a_row(4);
  job.add_warnings(warning);
  const std::string text = JobText(job);
  EXPECT_NE(text.find("progress step 55/60, loss 2.5000, 0 tok/s; checkpoint: step 10 committed "
                      "(a crash now costs 45 steps), 4 not committed since\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\n[WARNING] " + warning + "\n"), std::string::npos) << text;
  const std::string json = JobJson(job);
  EXPECT_NE(json.find("\"last_committed_step\": 10, \"checkpoint_failures_in_a_row\": 4, "
                      "\"warnings\": [\"" +
                      warning + "\"]}"),
            std::string::npos)
      << json;
  // A job that does not checkpoint says nothing of it.
  job.set_spec_yaml(
      "name: f\nmodel: {layers: 1, heads: 2, dim: 16, context: 16, vocab: 256}\n"
      "data: {train: t.txt}\nbatch: {global: 2, micro: 2, seq_len: 8}\nsteps: 60\n");
  job.mutable_progress()->set_last_committed_checkpoint_step(0);
  EXPECT_EQ(JobText(job).find("checkpoint:"), std::string::npos) << JobText(job);

  v1::GetHistoryResponse h = History();
  EXPECT_EQ(WarningLines(h), "");
  EXPECT_EQ(StepsJson(h).find("warnings"), std::string::npos);  // the shape as before
  *h.add_warnings() = e;
  EXPECT_EQ(WarningLines(h), "[WARNING] " + warning + "\n");
  const std::string steps = StepsJson(h);
  EXPECT_NE(steps.find("\"peak_rss_bytes\": 0}], \"warnings\": [{\"seq\": 7, \"time_ms\": 1234, "
                       "\"message\": \"" +
                       warning + "\"}]}"),
            std::string::npos)
      << steps;
}

}  // namespace
}  // namespace shardtrain::client
