# The worker daemon: control loop, coordinator client, job runner.
add_library(shardtrain_worker_core STATIC
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_commit.cc
  ${CMAKE_CURRENT_LIST_DIR}/coordinator_client.cc
  ${CMAKE_CURRENT_LIST_DIR}/daemon.cc
  ${CMAKE_CURRENT_LIST_DIR}/job_runner.cc
  ${CMAKE_CURRENT_LIST_DIR}/kv_rendezvous_store.cc
  ${CMAKE_CURRENT_LIST_DIR}/recent_collectives.cc
  ${CMAKE_CURRENT_LIST_DIR}/trainer.cc
)
target_link_libraries(shardtrain_worker_core PUBLIC
  shardtrain_proto shardtrain_common shardtrain_metrics shardtrain_process
  shardtrain_engine_cpu shardtrain_optim shardtrain_data shardtrain_comm shardtrain_checkpoint_format
  shardtrain_parallel
  absl::status absl::statusor absl::strings Threads::Threads)
# With CUDA the trainer also builds GPU engines (engine/cuda).
if(TARGET shardtrain_engine_cuda_gpt)
  target_link_libraries(shardtrain_worker_core PUBLIC shardtrain_engine_cuda_gpt)
  target_compile_definitions(shardtrain_worker_core PUBLIC SHARDTRAIN_HAVE_CUDA=1)
else()
  target_compile_definitions(shardtrain_worker_core PUBLIC SHARDTRAIN_HAVE_CUDA=0)
endif()

add_executable(shardtrain-worker ${CMAKE_CURRENT_LIST_DIR}/main.cc)
target_link_libraries(shardtrain-worker PRIVATE shardtrain_worker_core shardtrain_version CLI11::CLI11)
