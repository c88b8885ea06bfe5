# pipeline_bench: the pipeline bubble (GPipe, 1F1B) against (pp-1)/(m+pp-1),
# activation memory per stage of 1F1B vs GPipe, and tensor-parallel bytes
# against the formula, on CPU thread ranks (Gloo). Not a test.
if(TARGET shardtrain_worker_core)
  add_executable(pipeline_bench ${CMAKE_CURRENT_LIST_DIR}/pipeline_bench.cc)
  target_link_libraries(pipeline_bench PRIVATE shardtrain_worker_core CLI11::CLI11)
endif()
