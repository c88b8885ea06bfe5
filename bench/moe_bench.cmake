# moe_bench: an MoE model's training step next to a dense one's of the same
# active parameters (CPU engine, one rank), as a ratio, and the all-to-all
# bytes of an expert-parallel run next to the plan's. Not a test.
if(TARGET shardtrain_worker_core)
  add_executable(moe_bench ${CMAKE_CURRENT_LIST_DIR}/moe_bench.cc)
  target_link_libraries(moe_bench PRIVATE shardtrain_worker_core shardtrain_planner CLI11::CLI11)
endif()
