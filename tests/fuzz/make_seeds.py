#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer targets (tests/fuzz/corpus/).

Run from the repository root after a checkpoint of the tiny model was saved
(see --checkpoint); the files written are checked in, so only a change of a
format needs a rerun.

  job_spec     the example specs (and one with --set overrides)
  manifest     a committed manifest, as is (mode byte 1) and with its
               checksum recomputed by the target (mode byte 0)
  shard        a rank's shard file, the same two ways
  coordinator  call sequences (coordinator_fuzz.cc's format) of a job's life:
               register, submit, schedule, steps, a checkpoint committed,
               done; a failure and recovery; a cancel; the KV
"""
import argparse
import glob
import os
import shutil
import struct
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")

# coordinator_fuzz.cc's Op numbers.
OPS = ["Register", "Heartbeat", "ListWorkers", "Tick", "Submit", "GetJob", "ListJobs", "Cancel",
       "WaitEvents", "GetHistory", "GetPlan", "ReportStep", "ReportDone", "ReportCheckpoint",
       "WaitShards", "Commit", "ListCheckpoints", "ReportFailure", "ReportEvent", "KvSet",
       "KvGet", "KvAdd", "AdvanceClock"]
MESSAGES = {
    "Register": "RegisterWorkerRequest", "Heartbeat": "HeartbeatRequest",
    "ListWorkers": "ListWorkersRequest", "Submit": "SubmitJobRequest", "GetJob": "GetJobRequest",
    "ListJobs": "ListJobsRequest", "Cancel": "CancelJobRequest", "WaitEvents": "WatchJobRequest",
    "GetHistory": "GetHistoryRequest", "GetPlan": "GetPlanRequest",
    "ReportStep": "ReportStepRequest", "ReportDone": "ReportDoneRequest",
    "ReportCheckpoint": "ReportCheckpointRequest", "WaitShards": "WaitCheckpointShardsRequest",
    "Commit": "CommitCheckpointRequest", "ListCheckpoints": "ListCheckpointsRequest",
    "ReportFailure": "ReportFailureRequest", "ReportEvent": "ReportEventRequest",
    "KvSet": "KvSetRequest", "KvGet": "KvGetRequest", "KvAdd": "KvAddRequest",
}

SPEC = ("name: seed\\n"
        "model: {layers: 1, heads: 1, dim: 8, context: 8, vocab: 256}\\n"
        "data: {train: data/fortunes.txt, format: text, tokenizer: byte}\\n"
        "batch: {global: 4, micro: 2, seq_len: 8}\\n"
        "parallel: {dp: 2, zero: 2}\\n"
        "steps: 2\\n"
        "checkpoint: {every: 1, dir: ckpt/seed, keep: 1}\\n"
        "max_restarts: 2\\n")


def encode(op, text=""):
    if op == "AdvanceClock":
        body = struct.pack(">H", int(text))
    elif op == "Tick":
        body = b""
    else:
        body = subprocess.run(
            ["protoc", "-I", os.path.join(ROOT, "proto"),
             f"--encode=shardtrain.v1.{MESSAGES[op]}", "shardtrain/v1/coordinator.proto"],
            input=text.encode(), capture_output=True, check=True).stdout
    return bytes([OPS.index(op)]) + struct.pack("<H", len(body)) + body


def register(n):
    return [encode("Register", f'host: "h{i}" collective_address: "127.0.0.1" '
                               f'devices {{name: "cpu" kind: "cpu" memory_bytes: 1000000000}} threads: 1')
            for i in range(n)]


def scheduled():
    return register(2) + [
        encode("Submit", f'spec_yaml: "{SPEC}"'), encode("Tick"),
        encode("Heartbeat", 'worker_id: "0"'), encode("Heartbeat", 'worker_id: "1"'),
        encode("Heartbeat", 'worker_id: "0" job_id: "$" generation: 1'),
        encode("Heartbeat", 'worker_id: "1" job_id: "$" generation: 1')]


def steps(step, gen=1):
    return [encode("ReportStep", f'worker_id: "{r}" report {{job_id: "$" generation: {gen} rank: {r} '
                                 f'step: {step} loss: 5.5 grad_norm: 1 lr: 0.001 step_ms: 10}}')
            for r in (0, 1)]


def checkpoint(step, gen=1):
    out = []
    for r in (0, 1):
        out.append(encode("ReportCheckpoint",
                          f'worker_id: "{r}" shard {{job_id: "$" generation: {gen} rank: {r} step: {step} '
                          f'path: "ckpt/seed/step-{step}/rank-{r}.shard" bytes: 100 crc64: 7 '
                          f'ranges {{begin: {r * 100} end: {r * 100 + 100}}}}}'))
    out.append(encode("WaitShards", f'job_id: "$" generation: {gen} rank: 0 worker_id: "0" step: {step}'))
    out.append(encode("Commit", f'job_id: "$" generation: {gen} rank: 0 worker_id: "0" step: {step} '
                                f'dir: "ckpt/seed/step-{step}" manifest_path: "ckpt/seed/step-{step}/manifest.txt"'))
    return out


def coordinator_seeds():
    life = (scheduled() + steps(1) + checkpoint(1) + steps(2) +
            [encode("ReportDone", f'job_id: "$" generation: 1 rank: {r} worker_id: "{r}" steps: 2')
             for r in (0, 1)] +
            [encode("GetJob", 'job_id: "$"'), encode("GetHistory", 'job_id: "$"'),
             encode("ListCheckpoints", 'job_id: "$"'), encode("WaitEvents", 'job_id: "$"'),
             encode("ListJobs"), encode("ListWorkers"), encode("GetPlan", 'job_id: "$"')])
    failure = (scheduled() + steps(1) + checkpoint(1) +
               [encode("ReportFailure", 'job_id: "$" generation: 1 rank: 1 worker_id: "1" '
                                        'reason: "UNAVAILABLE: peer gone" step: 2'),
                encode("ReportEvent", 'job_id: "$" generation: 1 rank: 0 worker_id: "0" message: "hi"'),
                encode("Tick"), encode("AdvanceClock", "20000"), encode("Heartbeat", 'worker_id: "0"'),
                encode("Tick"), encode("Heartbeat", 'worker_id: "0"'),
                encode("Register", 'host: "h1" previous_worker_id: "1" devices {name: "cpu" kind: "cpu"}'),
                encode("Tick"), encode("Heartbeat", 'worker_id: "1"'),
                encode("GetJob", 'job_id: "$"')] + steps(2, 2))
    cancel = scheduled() + steps(1) + [encode("Cancel", 'job_id: "$" reason: "seed"'),
                                       encode("Heartbeat", 'worker_id: "0" job_id: "$" generation: 1'),
                                       encode("Tick")]
    kv = scheduled() + [
        encode("KvSet", 'job_id: "$" generation: 1 key: "rank0" value: "addr"'),
        encode("KvGet", 'job_id: "$" generation: 1 key: "rank0"'),
        encode("KvAdd", 'job_id: "$" generation: 1 key: "barrier" delta: 1'),
        encode("KvAdd", 'job_id: "$" generation: 1 key: "barrier" delta: 9223372036854775807')]
    return {"life": life, "failure": failure, "cancel": cancel, "kv": kv}


def write(target, name, data):
    os.makedirs(os.path.join(CORPUS, target), exist_ok=True)
    with open(os.path.join(CORPUS, target, name), "wb") as f:
        f.write(data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True,
                    help="a step directory (manifest.txt, rank-0.shard) of a small model")
    a = ap.parse_args()
    for path in sorted(glob.glob(os.path.join(ROOT, "examples", "*.yaml"))):
        shutil.copy(path, os.path.join(CORPUS, "job_spec", os.path.basename(path)))
    with open(os.path.join(ROOT, "examples", "fortunes-tiny.yaml"), "rb") as f:
        write("job_spec", "overrides.yaml", f.read() + b"\n---overrides---\nparallel.dp=2\n"
              b"parallel.zero=3\nsteps=20\noptimizer.betas=[0.9,0.99]\ncheckpoint.every=5\n")
    with open(os.path.join(a.checkpoint, "manifest.txt"), "rb") as f:
        manifest = f.read()
    write("manifest", "as-is", b"\x01" + manifest)
    write("manifest", "fixed-crc", b"\x00" + manifest)
    with open(os.path.join(a.checkpoint, "rank-0.shard"), "rb") as f:
        shard = f.read()
    write("shard", "as-is", b"\x01" + shard)
    write("shard", "fixed-crc", b"\x00" + shard)
    for name, calls in coordinator_seeds().items():
        write("coordinator", name, b"".join(calls))


if __name__ == "__main__":
    main()
