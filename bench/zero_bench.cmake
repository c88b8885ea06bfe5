# zero_bench: ZeRO stages 0-3 on 2 and 4 ranks (forked processes, Gloo):
# tok/s, memory per rank predicted (planner) vs measured. Not a test.
if(TARGET shardtrain_worker_core)
  add_executable(zero_bench ${CMAKE_CURRENT_LIST_DIR}/zero_bench.cc)
  target_link_libraries(zero_bench PRIVATE shardtrain_worker_core shardtrain_planner CLI11::CLI11)
endif()
