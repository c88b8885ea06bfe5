# The worker daemon: control loop, coordinator client, job runner.
add_library(shardtrain_worker_core STATIC
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_commit.cc
  ${CMAKE_CURRENT_LIST_DIR}/coordinator_client.cc
  ${CMAKE_CURRENT_LIST_DIR}/daemon.cc
  ${CMAKE_CURRENT_LIST_DIR}/job_reporter.cc
  ${CMAKE_CURRENT_LIST_DIR}/job_runner.cc
  ${CMAKE_CURRENT_LIST_DIR}/kv_rendezvous_store.cc
  ${CMAKE_CURRENT_LIST_DIR}/mfu.cc
  ${CMAKE_CURRENT_LIST_DIR}/recent_collectives.cc
  ${CMAKE_CURRENT_LIST_DIR}/report_outbox.cc
  ${CMAKE_CURRENT_LIST_DIR}/trainer.cc
  ${CMAKE_CURRENT_LIST_DIR}/trainer_mesh.cc
  ${CMAKE_CURRENT_LIST_DIR}/trainer_moe.cc
  ${CMAKE_CURRENT_LIST_DIR}/trainer_weights.cc
)
target_link_libraries(shardtrain_worker_core PUBLIC
  shardtrain_proto shardtrain_common shardtrain_metrics shardtrain_process
  shardtrain_engine_cpu shardtrain_optim shardtrain_data shardtrain_comm shardtrain_checkpoint_format
  shardtrain_parallel shardtrain_planner
  absl::status absl::statusor absl::strings Threads::Threads)
# With CUDA the trainer also builds GPU engines (engine/cuda).
if(TARGET shardtrain_engine_cuda_gpt)
  target_link_libraries(shardtrain_worker_core PUBLIC shardtrain_engine_cuda_gpt)
  target_compile_definitions(shardtrain_worker_core PUBLIC SHARDTRAIN_HAVE_CUDA=1)
else()
  target_compile_definitions(shardtrain_worker_core PUBLIC SHARDTRAIN_HAVE_CUDA=0)
endif()
# parallel.comm: nccl — the NCCL communicator (runtime and NCCL only).
if(TARGET shardtrain_comm_nccl)
  target_link_libraries(shardtrain_worker_core PUBLIC shardtrain_comm_nccl)
  target_compile_definitions(shardtrain_worker_core PRIVATE SHARDTRAIN_HAVE_NCCL=1)
else()
  target_compile_definitions(shardtrain_worker_core PRIVATE SHARDTRAIN_HAVE_NCCL=0)
endif()

# The device a worker drives and this machine's GPUs (device_probe.h): the
# CUDA runtime in a CUDA build (never the driver library: the worker still
# starts without a GPU), a stub that says the build has none otherwise.
# Outside the worker core, so the CLI, which links the core, links no CUDA
# for it (`shardtrain local` asks `shardtrain-worker --probe-devices`).
if(SHARDTRAIN_HAVE_CUDA)
  set(gpu_probe ${CMAKE_CURRENT_LIST_DIR}/gpu_probe_cuda.cc)
else()
  set(gpu_probe ${CMAKE_CURRENT_LIST_DIR}/gpu_probe_none.cc)
endif()
add_library(shardtrain_device_probe STATIC ${CMAKE_CURRENT_LIST_DIR}/device_probe.cc ${gpu_probe})
target_link_libraries(shardtrain_device_probe
  PUBLIC shardtrain_proto absl::status absl::statusor
  PRIVATE shardtrain_process absl::strings)
if(SHARDTRAIN_HAVE_CUDA)
  target_link_libraries(shardtrain_device_probe PRIVATE CUDA::cudart)
endif()

add_executable(shardtrain-worker ${CMAKE_CURRENT_LIST_DIR}/main.cc)
target_link_libraries(shardtrain-worker PRIVATE shardtrain_worker_core shardtrain_device_probe
                      shardtrain_version CLI11::CLI11)
