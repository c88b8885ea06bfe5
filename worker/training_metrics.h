// TrainingMetrics: the job runner's Prometheus series of one worker
// (worker/job_runner.cc), registered once per registry.
#ifndef SHARDTRAIN_WORKER_TRAINING_METRICS_H_
#define SHARDTRAIN_WORKER_TRAINING_METRICS_H_

#include <string>
#include <vector>

#include "common/metrics.h"

namespace shardtrain::worker {

// The worker's training metrics, labelled by job_id and rank (never by step;
// not `job`, which Prometheus keeps for the scrape target).
struct TrainingMetrics {
  explicit TrainingMetrics(MetricsRegistry* r)
      : steps(r->AddCounter("shardtrain_worker_steps_total", "Optimizer steps completed.",
                            {"job_id", "rank"})),
        tokens(r->AddCounter("shardtrain_worker_tokens_total", "Tokens trained on.",
                             {"job_id", "rank"})),
        step_seconds(r->AddHistogram("shardtrain_worker_step_seconds",
                                     "Wall time of one optimizer step.", {"job_id", "rank"},
                                     ExponentialBuckets(0.001, 2, 20))),
        collective_seconds(r->AddCounter("shardtrain_worker_collective_seconds_total",
                                         "Time blocked waiting for collectives, by op.",
                                         {"job_id", "rank", "op"})),
        sent_bytes(r->AddCounter("shardtrain_worker_sent_bytes_total",
                                 "Bytes this rank sent in collectives.", {"job_id", "rank"})),
        loss(r->AddGauge("shardtrain_worker_loss", "Loss of the last step on this rank.",
                         {"job_id", "rank"})),
        mfu(r->AddGauge("shardtrain_worker_mfu",
                        "Model FLOPs utilisation of the last step on this rank: its share of "
                        "the model's FLOPs per second over its device's dense peak for the "
                        "job's precision (common/device_peaks.h); absent where that peak is "
                        "unknown (CPUs, unlisted GPUs).",
                        {"job_id", "rank"})),
        val_loss(r->AddGauge("shardtrain_worker_val_loss",
                             "Validation loss of the last evaluation (eval.every), the job's "
                             "mean over its validation windows (the same on every rank).",
                             {"job_id", "rank"})),
        memory(r->AddGauge("shardtrain_worker_memory_bytes",
                           "Bytes this rank holds by kind (params, grads, optimizer, "
                           "activations, comm_buffers, working: ZeRO-2/3 whole units alive); "
                           "compare with `shardtrain plan`.",
                           {"job_id", "rank", "kind"})),
        moe(r->AddGauge("shardtrain_worker_moe",
                        "Mixture-of-Experts layers of this rank's slice, last step, by figure: "
                        "aux_loss and z_loss (the balancing losses with their coefficients, "
                        "summed over the layers), max_load (the busiest expert's tokens over "
                        "the mean's; 1 is balanced), dropped (the fraction of tokens over "
                        "capacity); absent without MoE layers.",
                        {"job_id", "rank", "figure"})),
        peak_rss(r->AddGauge("shardtrain_worker_peak_rss_bytes",
                             "Peak resident memory of the worker process.")
                     .WithLabels({})) {}

  Family<Counter>& steps;
  Family<Counter>& tokens;
  Family<Histogram>& step_seconds;
  Family<Counter>& collective_seconds;
  Family<Counter>& sent_bytes;
  Family<Gauge>& loss;
  Family<Gauge>& mfu;
  Family<Gauge>& val_loss;
  Family<Gauge>& memory;
  Family<Gauge>& moe;
  Gauge& peak_rss;

  // Stops exporting every series of (job_id, rank): the job ended on this
  // worker (finished, failed, cancelled or re-ganged elsewhere).
  void Drop(const std::string& job_id, const std::string& rank) {
    const std::vector<std::string> labels = {job_id, rank};
    steps.Remove(labels);
    tokens.Remove(labels);
    step_seconds.Remove(labels);
    collective_seconds.Remove({job_id, rank, "allreduce"});
    sent_bytes.Remove(labels);
    loss.Remove(labels);
    mfu.Remove(labels);
    val_loss.Remove(labels);
    for (const char* kind : kMemoryKinds) memory.Remove({job_id, rank, kind});
    for (const char* figure : kMoeFigures) moe.Remove({job_id, rank, figure});
  }
  static constexpr const char* kMoeFigures[] = {"aux_loss", "z_loss", "max_load", "dropped"};

  static constexpr const char* kMemoryKinds[] = {"params",      "grads",        "optimizer",
                                                 "activations", "comm_buffers", "working"};
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_TRAINING_METRICS_H_
