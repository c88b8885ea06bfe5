# moe_bench: an MoE model's training step next to a dense one's of the same
# active parameters (CPU engine, one rank), as a ratio. Not a test.
if(TARGET shardtrain_engine_cpu)
  add_executable(moe_bench ${CMAKE_CURRENT_LIST_DIR}/moe_bench.cc)
  target_link_libraries(moe_bench PRIVATE shardtrain_engine_cpu CLI11::CLI11)
endif()
